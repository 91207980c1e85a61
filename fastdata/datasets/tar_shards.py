"""``TarShardDataset``: WebDataset-format tar shards, streamed by every worker of every rank."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, default_collate

from fastdata.datasets.base import DatasetBase
from fastdata.datasets.tar_source import Sample, TarSource
from fastdata.decode import DecodeMode, Decoder, make_decoder
from fastdata.errors import ConfigError, OnError, check_choice, check_positive
from fastdata.sharding import Remainder, WindowShuffle, epoch_order, locate, rank_span, split_counts, worker_ranges
from fastdata.storage import expand_urls
from fastdata.worker import on_epoch


class TarShardDataset(DatasetBase, IterableDataset[Any]):
    """Samples of WebDataset-format tar shards, each exactly once per epoch across ranks and workers.

    Every rank reads an equal, contiguous part of the epoch (shards in a seeded order, then samples);
    samples are shuffled within windows of ``shuffle_window``; each worker reads its own part. Shards are
    indexed (from ``manifest.json`` and ``.idx`` files written by ``fastdata convert``, or by scanning
    their headers), so shards may be fewer than workers and any worker can start mid-shard.

    With ``batch_size``, the dataset yields whole batches (use ``DataLoader(ds, batch_size=None)``): each
    rank then sees the same batches in the same order for any ``num_workers``, a skipped bad sample
    makes one batch smaller instead of shifting all later ones, and ``state_dict``/``load_state_dict``
    resume mid-epoch exactly.

    Args:
        urls (str | list[str]): shard paths or URLs; brace ranges (``train-{000000..000099}.tar``) and
            globs expand.
        shuffle (bool): new shard order and sample order every epoch, from (seed, epoch). Defaults to False.
        seed (int): Defaults to 0.
        shuffle_window (int): samples shuffled together (a window of the rank's part of the epoch).
            Defaults to 4096.
        batch_size (int | None): yield batches of this size, collated by ``collate_fn``. Defaults to None
            (yield samples; the order then depends on ``num_workers``).
        collate_fn (Callable | None): Defaults to ``torch.utils.data.default_collate``.
        drop_last (bool): with ``batch_size``, drop the rank's last, smaller batch. Defaults to False.
        decode ("raw" | "pil" | "numpy" | "torch" | Decoder | Callable): Defaults to "raw" (bytes).
        transform (Callable | None): applied to each decoded sample dict.
        on_error ("raise" | "skip"): bad-input policy. Defaults to "raise".
        remainder ("drop" | "pad" | "uneven"): see :data:`fastdata.sharding.Remainder`. Defaults to "drop".
        rank, world_size (int | None): Default to the detected ones.
        max_open (int | None): shard readers open at once per worker. Defaults to
            :func:`fastdata.worker.default_max_open`.
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
    ) -> None:
        check_positive("shuffle_window", shuffle_window)
        if batch_size is not None:
            check_positive("batch_size", batch_size)
        check_choice("remainder", remainder, Remainder)
        self._init_base(seed=seed, on_error=on_error, rank=rank, world_size=world_size)
        self.shuffle, self.shuffle_window = shuffle, shuffle_window
        self.batch_size, self.drop_last, self.remainder = batch_size, drop_last, remainder
        self.collate_fn = collate_fn or default_collate
        self.source = TarSource(expand_urls(urls), policy=self._policy, decoder=make_decoder(decode),
                                transform=transform, max_open=max_open)
        self.total = sum(self.source.counts)
        self._span = rank_span(self.total, self.rank, self.world_size, remainder)
        self._resume: tuple[int, int] | None = None

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
        world = self.worker_world()
        on_epoch(world)
        start, length = self._span
        if self.batch_size is not None and self.drop_last:
            length -= length % self.batch_size
        first = 0
        if self._resume is not None and self._resume[0] == world.epoch:
            first = self._resume[1] * (self.batch_size or 1)
        order = epoch_order(len(self.urls), shuffle=self.shuffle, seed=self.seed, epoch=world.epoch)
        offsets = split_counts(self.source.counts, order)
        window = self.shuffle_window if self.shuffle else 1
        shuffled = WindowShuffle(length, window, seed=self.seed, epoch=world.epoch, rank=self.rank)
        try:
            for lo, hi in worker_ranges(length, worker=world.worker, num_workers=world.num_workers,
                                        unit=self.batch_size, start=first):
                if self.batch_size is None:
                    # one worker's contiguous range: read it a window at a time
                    for wlo in range(lo, hi, max(window, 256)):
                        yield from self._read_positions(shuffled, start, offsets, order,
                                                        wlo, min(hi, wlo + max(window, 256)))
                else:
                    batch = self._read_positions(shuffled, start, offsets, order, lo, hi)
                    if batch:
                        yield self.collate_fn(batch)
        finally:
            self.source.close()

    def _read_positions(self, shuffled: WindowShuffle, start: int, offsets: np.ndarray,
                        order: np.ndarray, lo: int, hi: int) -> list[Any]:
        """Samples at positions ``lo .. hi-1`` of this rank's part of the epoch, in order."""
        positions = (start + shuffled.positions(lo, hi)) % self.total
        shards, local = locate(offsets, order, positions)
        out: list[Any] = []
        # read runs of consecutive positions that fall in the same shard together
        cuts = np.flatnonzero(np.diff(shards)) + 1
        for run_shards, run_local in zip(np.split(shards, cuts), np.split(local, cuts)):
            out.extend(self.source.read(int(run_shards[0]), run_local.tolist()))
        return out

    def state_dict(self, batches: int = 0) -> dict[str, int]:
        """Where to resume: the epoch, and how many batches of it the rank has consumed."""
        return {"epoch": self.epoch, "batches": batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Make the next pass over ``state["epoch"]`` start after ``state["batches"]`` batches.

        Needs ``batch_size`` (so that a batch means the same samples for any number of workers).
        """
        batches = int(state.get("batches", 0))
        if batches and self.batch_size is None:
            raise ConfigError("resuming mid-epoch needs TarShardDataset(batch_size=...), so that the "
                              "order of batches does not depend on num_workers")
        if batches < 0 or batches > len(self):
            raise ConfigError(f"batches={batches} is outside this rank's epoch of {len(self)} batches")
        self.set_epoch(int(state["epoch"]))
        self._resume = (int(state["epoch"]), batches)

    def close(self) -> None:
        self.source.close()

    def __repr__(self) -> str:
        return (f"TarShardDataset({len(self.urls)} shards, {self.total} samples, rank {self.rank}/"
                f"{self.world_size}, shuffle={self.shuffle}, batch_size={self.batch_size})")
