"""What every fastdata dataset has: the rank read at construction and checked where it reads, the epoch
and skip counters shared with its workers, the bad-input policy (with the substitute rule of
:mod:`fastdata.datasets`), and ``close``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from fastdata.core import process
from fastdata.core.epoch import (
    RankFollower,
    Remainder,
    RepeatedEpochWarning,
    World,
    current_worker,
    on_epoch,
    on_pass,
    pass_token,
    refuse_second_split,
)
from fastdata.core.errors import ErrorPolicy, OnError
from fastdata.core.process import DATASET_LOG, REPEAT_FLAG, SharedEpoch, SharedState
from fastdata.datasets._substitute import Read, after_index, find_substitute
from fastdata.loading import EpochSampler


class DatasetBase(SharedEpoch, RankFollower):
    """Mixin for fastdata datasets (map-style and iterable).

    Args:
        seed (int): seeds every shuffle and per-worker stream. Defaults to 0.
        on_error ("raise" | "skip"): bad-input policy, see :mod:`fastdata.core.errors`. Defaults to "raise".
        rank, world_size (int | None): Default to the detected ones, read now, at construction, and checked
            again in the process that reads (a dataset built before the ranks existed learns its rank there:
            :class:`fastdata.core.epoch.RankFollower`).
        counters (tuple[str, ...]): names of extra counters shared with the workers.
    """

    def _init_base(
        self,
        *,
        seed: int,
        on_error: OnError,
        rank: int | None,
        world_size: int | None,
        counters: tuple[str, ...] = (),
    ) -> None:
        self._init_rank(rank, world_size)
        self.seed = seed
        self._shared = SharedState(("skipped", "substituted", *counters))
        self._policy = ErrorPolicy(on_error, self._shared)
        World(self.rank, self.world_size, seed=seed)  # checks rank and world size
        self._seen_epoch: tuple[int, int] | None = None  # (pid, epoch) last reseeded for: see follow_epoch
        self._iters = (-1, 0)  # (pid, passes this process began from __iter__)
        self._began = -1  # the pid of the process that last began a pass

    @property
    def on_error(self) -> OnError:
        return self._policy.on_error  # type: ignore[return-value]

    @property
    def skipped(self) -> int:
        """Samples skipped under ``on_error="skip"``, summed over the main process and every worker."""
        return self._shared.total("skipped")

    @property
    def substituted(self) -> int:
        """Substitute samples given for bad ones under ``on_error="skip"`` (an all-bad batch, ``ds[i]`` of a
        bad sample), summed over every process; see :mod:`fastdata.datasets`."""
        return self._shared.total("substituted")

    def counters(self) -> dict[str, int]:
        """Every shared counter: ``skipped`` (bad samples left out), ``substituted`` (samples that stood in for
        bad ones, see :mod:`fastdata.datasets`), and backend-specific ones like retries."""
        return self._shared.totals()

    def _stand_in(self, bad: Sequence[int], read: Read, sources: Sequence[str] = ()) -> tuple[int, Any]:
        """Map-style: ``(index, sample)`` of the substitute for the bad samples ``bad`` (a batch's indices, or
        ``[i]`` for ``ds[i]``): the next good index after the last of them in index order, wrapping to 0
        (see :mod:`fastdata.datasets`). ``read`` reads candidate indices."""
        what = f"sample {bad[0]}" if len(bad) == 1 else f"every sample of a batch of {len(bad)}"
        return find_substitute(
            read,
            after_index(bad[-1], len(self), bad),  # type: ignore[arg-type]
            shared=self._shared,
            owner=repr(self),
            bad=what,
            order="index order",
            sources=sources,
        )

    def worker_world(self) -> World:
        """The :class:`World` of the calling process (its worker id and count filled in), reading as the rank
        the running job says (:meth:`follow_rank`)."""
        self.follow_rank()
        worker, num_workers = current_worker()
        return World(self.rank, self.world_size, worker, num_workers, self.seed, self.epoch)

    def follow_epoch(self) -> None:
        """Reseed this process's random streams (:func:`fastdata.core.epoch.on_epoch`) when the shared epoch
        has moved since it last looked: map-style datasets call it on every read, so persistent workers
        get new streams each epoch even without ``worker_init_fn``. Keyed by pid too: a worker forked
        from a parent that already read (``ds[0]`` before training) still seeds its own streams. The first
        read in a process starts its first pass (:meth:`begin_pass`), unless ``worker_init_fn`` did."""
        pid = process.pid()
        seen = (pid, self.epoch)
        if self._seen_epoch != seen:
            self._seen_epoch = seen
            if self._began != pid:
                self.begin_pass(first=True)
            on_epoch(self.worker_world())

    def begin_pass(self, *, first: bool = False) -> bool:
        """Start a pass (one iteration over the dataset) in the calling process and say whether the epoch
        was set for it; reseed the process for it (when ``worker_init_fn`` asked for that); warn once
        when it repeats an epoch already read while the dataset's own randomness (a shuffle, random clip
        starts) depends on the epoch.

        Args:
            first (bool): the process's first pass, from ``worker_init_fn`` or a first read; an iterable
                dataset's ``__iter__`` then joins that pass instead of starting another. Defaults to False
                (``__iter__``: the next pass).

        Returns:
            bool: whether the epoch was set (``set_epoch``) since the previous pass began.
        """
        pid = process.pid()
        if self._iters[0] != pid:
            self._iters = (pid, 0)
        k = self._iters[1] + 1
        if not first:
            self._iters = (pid, k)
        self._began = pid
        token = pass_token(k)
        start = self._shared.begin_pass(DATASET_LOG, token)
        world = self.worker_world()
        refuse_second_split(repr(self), world.world_size)
        on_pass(world, token, start.epoch_set)
        what = self._epoch_randomness()
        if start.repeated and what and world.worker == 0 and self._shared.once(REPEAT_FLAG):
            warnings.warn(
                f"{self!r}: a new pass started at epoch {world.epoch}, which was read before, and the epoch was "
                f"not set again: {what} is the same as in the last pass. Call ds.set_epoch(epoch) at the start of "
                "every epoch (as well as sampler.set_epoch), or iterate through fastdata.Loader, which does it",
                RepeatedEpochWarning,
                stacklevel=3,
            )
        return start.epoch_set

    def _epoch_randomness(self) -> str | None:
        """What of this dataset's own randomness follows the epoch (for the repeated-epoch warning), or None."""
        return None

    def _count_reads(self, n: int) -> None:
        """Count ``n`` samples read (a map-style dataset with a ``"reads"`` counter); warn, once, when more
        were read at this epoch than one pass of this rank holds while the dataset's own randomness follows
        the epoch: a sampler the dataset does not see (torch's ``DistributedSampler``) iterated again
        without ``ds.set_epoch``, in the main process or in persistent workers, where no pass boundary shows."""
        shared = self._shared
        shared.add("reads", n)
        what = self._epoch_randomness()
        if what is None:
            return
        per_pass = -(-len(self) // self.world_size) + self.world_size  # type: ignore[arg-type]  # a rank's share, padded
        if shared.reads_this_epoch() > per_pass and shared.once(REPEAT_FLAG):
            warnings.warn(
                f"{self!r}: more samples were read at epoch {self.epoch} than one pass holds ({per_pass}), and "
                f"the epoch was not set again: {what} is the same as in the last pass. Call "
                "ds.set_epoch(epoch) at the start of every epoch (as well as sampler.set_epoch), or iterate "
                "through fastdata.Loader, which does it",
                RepeatedEpochWarning,
                stacklevel=4,
            )

    def close(self) -> None:
        """Close every handle this process opened. Idempotent; the dataset reopens on next use."""

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MapDatasetBase(DatasetBase):
    """Mixin for map-style fastdata datasets: :class:`DatasetBase` and the rank-aware sampler that reads them."""

    def sampler(self, *, shuffle: bool = True, remainder: Remainder = "drop") -> EpochSampler:
        """A rank-aware :class:`~fastdata.loading.EpochSampler` that follows this dataset's ``set_epoch``.

        Args:
            shuffle (bool): a new order every epoch (from the dataset's seed). Defaults to True.
            remainder ("drop" | "pad" | "uneven"): an epoch that does not split evenly over the ranks, see
                :data:`fastdata.core.epoch.Remainder`. Defaults to "drop".
        """
        return EpochSampler(
            len(self),  # type: ignore[arg-type]
            shuffle=shuffle,
            seed=self.seed,
            remainder=remainder,
            rank=self.rank,
            world_size=self.world_size,
            rank_of=self,
            shared=self._shared,
            publish=self._publish_order(),
            owner=repr(self),
        )

    def _publish_order(self) -> Callable[..., Any] | None:
        """Where the sampler publishes each epoch's order for the workers to read ahead by, or None."""
        return None
