"""``EpochSampler``: the indices one rank reads in one epoch, for map-style datasets.

Like ``torch.utils.data.DistributedSampler``, with the remainder policy of :mod:`fastdata.core.epoch`,
the rank detected at construction, the epoch shared with the dataset (``dataset.set_epoch`` moves both),
and mid-epoch resume through ``state_dict``/``load_state_dict``. The order never depends on
``num_workers``: the DataLoader hands this order to its workers and returns batches in it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from torch.utils.data import DistributedSampler

from fastdata.core import process
from fastdata.core.epoch import (
    EXACT_ORDER_MAX,
    REMAINDERS,
    Base,
    RankFollower,
    Remainder,
    RepeatedEpochWarning,
    ResumeState,
    derive_seed,
    load_state,
    order_at,
    rank_index_blocks,
    rank_indices,
    rank_span,
    refuse_second_split,
)
from fastdata.core.errors import ConfigError, check_positive
from fastdata.core.process import SAMPLER_LOG, SAMPLER_REPEAT_FLAG, SharedEpoch, SharedState


class EpochSampler(SharedEpoch, RankFollower, DistributedSampler[int]):  # type: ignore[misc,override]
    """Indices of a map-style dataset for this rank, shuffled per epoch.

    Args:
        n (int): samples in the dataset.
        shuffle (bool): a new order every epoch, from (seed, epoch). Defaults to True.
        seed (int): Defaults to 0.
        remainder ("drop" | "pad" | "uneven"): see :data:`fastdata.core.epoch.Remainder`. Defaults to "drop".
        rank, world_size (int | None): Default to the detected ones (``torch.distributed``, else the launch
            environment), checked again where it is iterated (:class:`fastdata.core.epoch.RankFollower`).
        rank_of (RankFollower | None): the dataset whose rank this sampler follows (checked where it is
            iterated), instead of its own. Defaults to None.
        shared (SharedState | None): the dataset's shared state, to follow its ``set_epoch``.
        publish (Callable[[int, np.ndarray], None] | None): called with ``(epoch, order)`` at the start of
            each iteration, with the epoch's whole order (before any resume skip): how a dataset's workers
            learn what comes next (see :class:`fastdata.core.process.SharedPlan`). Defaults to None.
        owner (str | None): the dataset it orders, named in its warning when a new pass repeats a shuffled
            epoch already read because the epoch was not set again. Defaults to None.
        unit (int): indices that stay together, in order: the epoch is ordered and split over ranks in
            runs of ``unit`` consecutive indices (``n`` must be a multiple), so a batch of ``unit`` never
            mixes two runs (:class:`fastdata.Mix` with ``batches="per_source"``). Defaults to 1.
        tag (Mapping[str, int] | None): more of what the order depends on, saved in the state's plan (and
            checked on loading). Defaults to None.
    """

    def __init__(
        self,
        n: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        remainder: Remainder = "drop",
        rank: int | None = None,
        world_size: int | None = None,
        rank_of: RankFollower | None = None,
        shared: SharedState | None = None,
        publish: Callable[[int, Any], None] | None = None,
        owner: str | None = None,
        unit: int = 1,
        tag: Mapping[str, int] | None = None,
    ) -> None:
        # not DistributedSampler.__init__ (it needs a process group): the class is a base so that frameworks
        # which split an epoch over ranks unless the sampler already does (Lightning) leave this one alone
        self._init_rank(rank, world_size)
        self._rank_of = rank_of
        self.n, self.shuffle, self.seed, self.remainder = n, shuffle, seed, remainder
        check_positive("unit", unit)
        if n % unit:
            raise ConfigError(f"EpochSampler: n={n} is not a multiple of unit={unit}")
        self.unit = unit
        self._tag = dict(tag or {})
        self.drop_last = False  # DistributedSampler's attribute; the remainder policy says what is dropped
        self._rank_changed()
        self._shared = shared if shared is not None else SharedState(())
        self._publish = publish
        self._owner = owner
        self._passes = 0
        self._resume: tuple[int, int] | None = None
        self._position: list[int] | None = None

    def _rank_changed(self) -> None:
        # rank_span fails early (before any rank starts) when some rank would read nothing
        self._length = rank_span(self.n // self.unit, self.rank, self.world_size, self.remainder)[1] * self.unit

    def follow_rank(self, *, use: bool = True) -> None:
        """Read as the rank the running job says: the dataset's (``rank_of``), else as
        :meth:`fastdata.core.epoch.RankFollower.follow_rank` decides."""
        if self._rank_of is None:
            super().follow_rank(use=use)
            return
        self._rank_of.follow_rank(use=use)
        if (self._rank_of.rank, self._rank_of.world_size) != (self.rank, self.world_size):
            self.rank, self.world_size = self._rank_of.rank, self._rank_of.world_size
            self._rank_changed()

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        """``world_size``, by ``DistributedSampler``'s name for it."""
        return self.world_size

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        """``len(self)``, by ``DistributedSampler``'s name for it."""
        return len(self)

    def indices(self) -> Any:
        """This rank's indices for the current epoch (a numpy array)."""
        units = rank_indices(
            self.n // self.unit,
            rank=self.rank,
            world_size=self.world_size,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
            remainder=self.remainder,
        )
        return _expand(units, self.unit)

    def __iter__(self) -> Iterator[int]:
        self.follow_rank()
        refuse_second_split(f"EpochSampler of {self._owner or 'a dataset'}", self.world_size)
        lazy = self._publish is None and self.n > EXACT_ORDER_MAX
        order = None if lazy else self.indices()
        if self._publish is not None:
            self._publish(self.epoch, order)
        start = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            start = self._resume[1]
            self._resume = None
        # [epoch, indices handed out]: what state_dict() reports when it is not told what was consumed
        self._position = [self.epoch, start]
        if order is not None:
            return self._walk(order[start:].tolist(), self._position)
        # a huge epoch: its order computed block by block as the loader takes it (see EXACT_ORDER_MAX)
        unit = self.unit
        blocks = rank_index_blocks(
            self.n // unit,
            rank=self.rank,
            world_size=self.world_size,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
            remainder=self.remainder,
            start=start // unit,
        )
        return self._walk_blocks((_expand(b, unit) for b in blocks), self._position, start % unit)

    def _walk(self, indices: list[int], position: list[int]) -> Iterator[int]:
        # the pass begins with its first index: an iterator made and dropped unread (torchdata makes one
        # before it loads a state) is no pass
        self._begin_pass()
        yield from self._count(indices, position)

    @staticmethod
    def _count(indices: list[int], position: list[int]) -> Iterator[int]:
        for i in indices:
            position[1] += 1  # before the yield: a state taken right after next() counts this index
            yield i

    def _begin_pass(self) -> None:
        """Log the pass in the shared state; warn once when it repeats a shuffled epoch (not set again)."""
        self._passes += 1
        began = self._shared.begin_pass(SAMPLER_LOG, derive_seed(process.pid(), id(self), self._passes))
        if began.repeated and self.shuffle and self._shared.once(SAMPLER_REPEAT_FLAG):
            of = f" of {self._owner}" if self._owner else ""
            warnings.warn(
                f"EpochSampler{of}: a new pass started at epoch {self.epoch}, which was read before, and the "
                "epoch was not set again: the order is the same as in the last pass. Call "
                "sampler.set_epoch(epoch) (or ds.set_epoch) at the start of every epoch, or iterate through "
                "fastdata.Loader, which does it",
                RepeatedEpochWarning,
                stacklevel=3,
            )

    def _walk_blocks(self, blocks: Iterator[Any], position: list[int], skip: int = 0) -> Iterator[int]:
        self._begin_pass()  # once for the pass, not once per block
        for block in blocks:
            yield from self._count(block[skip:].tolist(), position)
            skip = 0

    def __len__(self) -> int:
        self.follow_rank(use=False)
        return self._length

    def _plan(self) -> dict[str, int]:
        return {
            "size": self.n,
            "world_size": self.world_size,
            "seed": self.seed,
            "shuffle": int(self.shuffle),
            "remainder": REMAINDERS.index(self.remainder),
            "unit": self.unit,
            **self._tag,
        }

    # --- resuming on another number of ranks (fastdata.core.epoch._elastic; fastdata.Loader drives it) ---

    def elastic_base(self, world_size: int, batch_size: int, drop_last: bool) -> Base:
        """This epoch's plan on ``world_size`` ranks read in batches of ``batch_size`` (by a DataLoader,
        dropping each rank's last short batch when ``drop_last``)."""
        nu, unit = self.n // self.unit, self.unit
        lengths = []
        for r in range(world_size):
            n = rank_span(nu, r, world_size, self.remainder)[1] * unit
            lengths.append(n - n % batch_size if drop_last else n)
        return Base(tuple(lengths), batch_size, keep_batches=unit > 1)

    def elastic_items(self, world_size: int, batch_size: int, ranks: Any, positions: Any) -> Any:
        """The indices at ``positions`` of ranks ``ranks``'s parts in this epoch's plan on ``world_size`` ranks
        (with batches of ``batch_size``, which this order does not depend on)."""
        nu, unit = self.n // self.unit, self.unit
        starts = np.array([rank_span(nu, r, world_size, self.remainder)[0] for r in range(world_size)], dtype=np.int64)
        at = (starts[ranks] + positions // unit) % nu
        units = order_at(at, nu, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch)
        return units * unit + positions % unit

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """The position to resume from: a :class:`~fastdata.core.epoch.ResumeState` (as a dict) counting
        the samples of the current epoch already consumed.

        Args:
            consumed (int | None): indices of this epoch already consumed. Defaults to the number the
                latest iteration has handed out, which is right when nothing reads ahead (no DataLoader
                workers, or ``torchdata``'s ``StatefulDataLoader``, which snapshots this per batch); a
                plain ``DataLoader`` with workers prefetches, so pass the count, or use
                :class:`fastdata.Loader`.
        """
        if consumed is None:
            if self._resume is not None and self._resume[0] == self.epoch:
                consumed = self._resume[1]
            elif self._position is not None and self._position[0] == self.epoch:
                consumed = self._position[1]
            else:
                consumed = 0
        return ResumeState(self.epoch, consumed, "samples", self._plan()).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration of the state's epoch skip the samples it counts as consumed.

        Raises:
            ConfigError: when the state lies outside this rank's epoch, or was saved for another dataset
                size, world size, seed, shuffle or remainder (naming each, with both values), or is not a
                state fastdata saved (a field of the wrong type or out of range, named).
        """
        s = load_state(state, into="EpochSampler", unit="samples", plan=self._plan(), length=self._length)
        self.set_epoch(s.epoch)
        self._resume = (s.epoch, s.position)


def _expand(units: np.ndarray, unit: int) -> np.ndarray:
    """The indices of runs ``units`` of ``unit`` consecutive indices each."""
    if unit == 1:
        return units
    return (units[:, None] * unit + np.arange(unit, dtype=np.int64)).reshape(-1)
