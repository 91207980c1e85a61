"""``TarShardDataset``: WebDataset-format tar shards, streamed by every worker of every rank."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from fastdata.core import process
from fastdata.core.errors import BadSample, ConfigError, OnError, PlanError, check_choice, check_positive
from fastdata.core.resume import ResumeState, load_state
from fastdata.core.seeding import on_epoch
from fastdata.core.sharding import Remainder, WindowShuffle, epoch_order, locate, rank_span, split_counts, worker_ranges
from fastdata.core.world import World
from fastdata.datasets.base import DatasetBase
from fastdata.datasets.tar_source import Sample, TarSource, remote_counters
from fastdata.formats.decode import DecodeMode, Decoder, make_decoder
from fastdata.loading.transport import batch_default_collate
from fastdata.storage import expand_urls


class TarShardDataset(DatasetBase, IterableDataset[Any]):
    """Samples of WebDataset-format tar shards, each exactly once per epoch across ranks and workers.

    Every rank reads an equal, contiguous part of the epoch (shards in a seeded order, then samples);
    samples are shuffled within windows of ``shuffle_window``; each worker reads its own part. Shards are
    indexed (from ``manifest.json`` and ``.idx`` files written by ``fastdata convert``, or by scanning
    their headers), so shards may be fewer than workers and any worker can start mid-shard.

    With ``batch_size``, the dataset yields whole batches (use ``DataLoader(ds, batch_size=None)``): each
    rank then sees the same batches in the same order for any ``num_workers``, a skipped bad sample
    makes one batch smaller instead of shifting all later ones, and ``state_dict``/``load_state_dict``
    resume mid-epoch exactly: through :class:`fastdata.Loader` with any ``num_workers``, or through
    torchdata's ``StatefulDataLoader`` with the same ``num_workers`` (see docs/distributed.md).

    Args:
        urls (str | list[str]): shard paths or URLs; brace ranges (``train-{000000..000099}.tar``) and
            globs expand.
        shuffle (bool): new shard order and sample order every epoch, from (seed, epoch). Defaults to False.
        seed (int): Defaults to 0.
        shuffle_window (int): samples shuffled together (a window of the rank's part of the epoch).
            Defaults to 4096.
        batch_size (int | None): yield batches of this size, collated by ``collate_fn``. Defaults to None
            (yield samples; the order then depends on ``num_workers``).
        collate_fn (Callable | None): Defaults to ``torch.utils.data.default_collate`` (precisely
            :func:`fastdata.loading.transport.batch_default_collate`, which is ``default_collate`` except
            that in a worker whose batches go through reused slots it stacks straight into the slot).
        drop_last (bool): with ``batch_size``, drop the rank's last, smaller batch. Defaults to False.
        decode ("raw" | "pil" | "numpy" | "torch" | Decoder | Callable): Defaults to "raw" (bytes).
        transform (Callable | None): applied to each decoded sample dict.
        on_error ("raise" | "skip"): bad-input policy. Defaults to "raise".
        remainder ("drop" | "pad" | "uneven"): see :data:`fastdata.core.sharding.Remainder`. Defaults to "drop".
        rank, world_size (int | None): Default to the detected ones.
        max_open (int | None): shard readers open at once per worker. Defaults to
            :func:`fastdata.core.handles.default_max_open`.
        storage_options (dict | None): for ``s3://`` shards: ``endpoint_url``, credentials, retries ... (the
            fields of ``fastdata.storage.s3_client.S3Config``) and ``S3Reader`` options. Defaults to the
            environment's settings (``AWS_ENDPOINT_URL``, profiles).
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_window: int = 4096,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
        decode: DecodeMode | Decoder | Callable[[Sample], Sample] = "raw",
        transform: Callable[[Sample], Any] | None = None,
        on_error: OnError = "raise",
        remainder: Remainder = "drop",
        rank: int | None = None,
        world_size: int | None = None,
        max_open: int | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        check_positive("shuffle_window", shuffle_window)
        if batch_size is not None:
            check_positive("batch_size", batch_size)
        check_choice("remainder", remainder, Remainder)
        shard_urls = expand_urls(urls)
        self._init_base(
            seed=seed, on_error=on_error, rank=rank, world_size=world_size, counters=remote_counters(shard_urls)
        )
        self.shuffle, self.shuffle_window = shuffle, shuffle_window
        self.batch_size, self.drop_last, self.remainder = batch_size, drop_last, remainder
        self.collate_fn = collate_fn or batch_default_collate
        self.source = TarSource(
            shard_urls,
            policy=self._policy,
            decoder=make_decoder(decode),
            transform=transform,
            max_open=max_open,
            storage_options=storage_options,
            stats=self._shared,
            dealt=batch_size is not None,
        )
        self.total = sum(self.source.counts)
        self._span = rank_span(self.total, self.rank, self.world_size, remainder)
        # the last rank reads the fewest (remainder="uneven"): every rank refuses a plan that starves it
        fewest = rank_span(self.total, self.world_size - 1, self.world_size, remainder)[1]
        if self.batch_size is not None and drop_last and fewest < self.batch_size:
            raise PlanError(
                f"rank {self.world_size - 1} reads {fewest} samples per epoch, fewer than batch_size="
                f"{self.batch_size}, so drop_last=True leaves it no batch; use a smaller batch_size, "
                "fewer ranks, or drop_last=False"
            )
        # (epoch, batches, worker, num_workers): where the next pass starts; worker None = the whole rank
        self._resume: tuple[int, int, int | None, int | None] | None = None
        # (pid, epoch, next batch, worker, num_workers) of this process's latest pass, for state_dict()
        self._progress: tuple[int, int, int, int, int] | None = None

    @property
    def urls(self) -> list[str]:
        return self.source.urls

    def samples_per_rank(self) -> int:
        """Samples this rank reads per epoch (equal on every rank unless ``remainder="uneven"``)."""
        return self._span[1]

    def __len__(self) -> int:
        """Samples per epoch on this rank, or batches when ``batch_size`` is set."""
        n = self._span[1]
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the resume position is taken now, when the DataLoader (or its worker) asks
        # for the iterator, so it applies to exactly one pass.
        world = self.worker_world()
        on_epoch(world)
        start, length = self._span
        if self.batch_size is not None and self.drop_last:
            length -= length % self.batch_size
        first, stride, worker = self._first_batch(world)
        order = epoch_order(len(self.urls), shuffle=self.shuffle, seed=self.seed, epoch=world.epoch)
        offsets = split_counts(self.source.counts, order)
        window = self.shuffle_window if self.shuffle else 1
        shuffled = WindowShuffle(length, window, seed=self.seed, epoch=world.epoch, rank=self.rank)
        read = functools.partial(self._read_positions, shuffled, start, offsets, order)
        if self.batch_size is None:
            return self._samples(read, world, length, window)
        where = functools.partial(self._shards_at, shuffled, start, offsets, order)
        self._progress = (process.pid(), world.epoch, first, world.worker, world.num_workers)
        return self._batches(read, where, world, length, first, stride, worker)

    def _first_batch(self, world: World) -> tuple[int, int, int]:
        """``(first batch, stride, worker slot)`` of this worker's pass, from a pending resume."""
        resume = self._resume
        if resume is None or resume[0] != world.epoch:
            return world.worker, world.num_workers, world.worker
        self._resume = None
        _, batches, saved_worker, saved_workers = resume
        if saved_worker is None:  # a rank-level position: deal batches from ``batches`` on afresh
            return batches + world.worker, world.num_workers, world.worker
        if (saved_worker, saved_workers) != (world.worker, world.num_workers):
            raise ConfigError(
                f"this state was saved by worker {saved_worker} of {saved_workers} and is being "
                f"loaded in worker {world.worker} of {world.num_workers}; a per-worker state "
                "(from StatefulDataLoader) needs the same num_workers, or resume through "
                "fastdata.Loader, which allows any"
            )
        return batches, world.num_workers, 0

    def _samples(self, read: Callable[[int, int], list[Any]], world: World, length: int, window: int) -> Iterator[Any]:
        try:
            for lo, hi in worker_ranges(length, worker=world.worker, num_workers=world.num_workers, unit=None):
                # one worker's contiguous range: read it a window at a time
                step = max(window, 256)
                for wlo in range(lo, hi, step):
                    yield from read(wlo, min(hi, wlo + step))
        finally:
            self.source.close()

    def _batches(
        self,
        read: Callable[[int, int], list[Any]],
        where: Callable[[int, int], list[str]],
        world: World,
        length: int,
        first: int,
        stride: int,
        worker: int,
    ) -> Iterator[Any]:
        unit = self.batch_size
        assert unit is not None
        # batch ``first + j * stride`` is this worker's j-th: worker_ranges deals units from ``first``
        # to slot ``worker`` of ``stride`` (slot 0 when ``first`` is already this worker's own)
        base = (first - worker) * unit
        try:
            for lo, hi in worker_ranges(length, worker=worker, num_workers=stride, unit=unit, start=base):
                batch = read(lo, hi)
                # counted before the yield, so that a state taken right after this batch resumes past it
                self._progress = (process.pid(), world.epoch, lo // unit + stride, world.worker, world.num_workers)
                if not batch:
                    # leaving the batch out would give this rank fewer batches than the others (a hang at
                    # the next collective) and shift every later batch (a wrong resume)
                    shards = where(lo, hi)
                    raise BadSample(
                        f"every sample of batch {lo // unit} ({hi - lo} samples, from {', '.join(shards)}) "
                        "was bad and skipped; an empty batch cannot be collated; see the warnings above",
                        shards[0],
                    )
                yield self.collate_fn(batch)
        finally:
            self.source.close()

    def _read_positions(
        self, shuffled: WindowShuffle, start: int, offsets: np.ndarray, order: np.ndarray, lo: int, hi: int
    ) -> list[Any]:
        """Samples at positions ``lo .. hi-1`` of this rank's part of the epoch, in order."""
        positions = (start + shuffled.positions(lo, hi)) % self.total
        shards, local = locate(offsets, order, positions)
        out: list[Any] = []
        # read runs of consecutive positions that fall in the same shard together
        cuts = np.flatnonzero(np.diff(shards)) + 1
        for run_shards, run_local in zip(np.split(shards, cuts), np.split(local, cuts)):
            out.extend(self.source.read(int(run_shards[0]), run_local.tolist()))
        return out

    def _shards_at(
        self, shuffled: WindowShuffle, start: int, offsets: np.ndarray, order: np.ndarray, lo: int, hi: int
    ) -> list[str]:
        """The shards that positions ``lo .. hi-1`` of this rank's part of the epoch fall in."""
        shards, _ = locate(offsets, order, (start + shuffled.positions(lo, hi)) % self.total)
        return [self.urls[i] for i in dict.fromkeys(shards.tolist())]

    def _plan(self) -> dict[str, int]:
        plan = {"size": self.total, "world_size": self.world_size, "seed": self.seed}
        if self.batch_size is not None:
            plan["batch_size"] = self.batch_size
        return plan

    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        """Where to resume: a :class:`~fastdata.core.resume.ResumeState` (as a dict) counting the batches of
        the current epoch the rank has consumed.

        Args:
            batches (int | None): batches of this epoch the rank has consumed (what
                :class:`fastdata.Loader` passes). Defaults to this process's own position: in the main
                process (no workers), the batches it has yielded; in a DataLoader worker, that worker's next
                batch (``worker``/``num_workers`` set), which is what ``torchdata``'s ``StatefulDataLoader``
                collects from each worker.
        """
        plan = self._plan()
        if batches is not None:
            return ResumeState(self.epoch, batches, "batches", plan).to_dict()
        if self._resume is not None and self._resume[0] == self.epoch:
            epoch, batches, worker, workers = self._resume
        elif self._progress is not None and self._progress[:2] == (process.pid(), self.epoch):
            _, epoch, batches, worker, workers = self._progress
            if workers == 1:
                worker = None
        else:
            return ResumeState(self.epoch, 0, "batches", plan).to_dict()
        if worker is None:
            workers = None
        return ResumeState(epoch, batches, "batches", plan, worker, workers).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next pass over the state's epoch start after the batches it counts.

        Needs ``batch_size`` (so that a batch means the same samples for any number of workers). A state
        with ``worker``/``num_workers`` (one worker's, as ``StatefulDataLoader`` saves) resumes that worker
        and needs the same ``num_workers``; one without resumes the whole rank, with any ``num_workers``.
        Reads the ``{"epoch", "batches"}`` states older fastdata versions saved too.

        Raises:
            ConfigError: when the state lies outside this rank's epoch, was saved for another plan (batch
                size, dataset size, world size, seed), or resumes mid-epoch without ``batch_size``.
        """
        s = load_state(
            state, into="TarShardDataset", unit="batches", plan=self._plan(), length=len(self), per_worker=True
        )
        if s.position and self.batch_size is None:
            raise ConfigError(
                "resuming mid-epoch needs TarShardDataset(batch_size=...), so that the "
                "order of batches does not depend on num_workers"
            )
        self.set_epoch(s.epoch)
        self._resume = (s.epoch, s.position, s.worker, s.num_workers)

    def close(self) -> None:
        self.source.close()

    def __repr__(self) -> str:
        return (
            f"TarShardDataset({len(self.urls)} shards, {self.total} samples, rank {self.rank}/"
            f"{self.world_size}, shuffle={self.shuffle}, batch_size={self.batch_size})"
        )
