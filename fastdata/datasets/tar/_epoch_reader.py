"""How :class:`~fastdata.TarShardDataset` shuffles: windows of samples, bounded in count and in bytes, whose
undecoded bytes are held and decoded only as each sample leaves.

* **The window's size** (:func:`window_size`): ``shuffle_window`` samples, and no more than
  ``shuffle_bytes`` of them by the shards' bytes per sample (the largest mean of any shard, headers
  included), so that a worker's window stays under the bound however large the samples are.
* **Per-sample mode** (no ``batch_size``): each worker reads one contiguous range of the rank's part of
  the epoch, its ends moved to the nearest shard boundary when one is close (:func:`worker_span`), so that
  a shard is read by one worker; the range is shuffled window by window (:func:`window_order`).
* **Raw, then decoded**: a window's samples are read undecoded; each is decoded (and transformed) when it
  is yielded. A local shard is read a few samples at a time, in the window's shuffled order (its bytes
  are in the page cache: holding them would only copy them); a remote shard's window is fetched whole,
  shard by shard, each shard's part in as few ranged GETs as its size allows, and the next window is
  fetched in the background once half of the current one is out (:class:`Ahead`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from typing import Any, Generic, TypeVar

import numpy as np

from fastdata.core import SKIP, stages
from fastdata.core.epoch import locate
from fastdata.core.process import ProcessLocal
from fastdata.datasets.tar._source import Sample, TarSource

DEFAULT_WINDOW = 4096  # samples
DEFAULT_WINDOW_BYTES = 64 * 2**20  # bytes of undecoded samples
LOCAL_CHUNK = 64  # samples of a local shard read at once in per-sample mode
SNAP = 0.1  # a worker's range end moves to a shard boundary within this share of a worker's part

T = TypeVar("T")


def bytes_per_sample(counts: list[int], sizes: list[int]) -> float:
    """The largest mean bytes per sample of any shard whose size is known (0.0 when none is)."""
    means = [size / n for n, size in zip(counts, sizes) if n > 0 and size > 0]
    return max(means, default=0.0)


def window_size(shuffle_window: int, shuffle_bytes: int | None, counts: list[int], sizes: list[int]) -> int:
    """Samples of a window: ``shuffle_window``, cut to ``shuffle_bytes`` worth of samples."""
    per = bytes_per_sample(counts, sizes)
    if shuffle_bytes is None or per <= 0:
        return shuffle_window
    return max(1, min(shuffle_window, int(shuffle_bytes // per)))


def worker_span(length: int, worker: int, num_workers: int, boundaries: np.ndarray) -> tuple[int, int]:
    """One worker's contiguous range of ``length`` positions in per-sample mode: the even split, each end
    moved to the nearest of ``boundaries`` (where shards start) when one lies within ``SNAP`` of a
    worker's part, so that a shard is read by one worker only."""
    share = length / num_workers

    def cut(k: int) -> int:
        ideal = round(k * share)
        if k in (0, num_workers) or not len(boundaries):
            return ideal
        near = int(boundaries[np.abs(boundaries - ideal).argmin()])
        return near if abs(near - ideal) <= SNAP * share else ideal

    return cut(worker), cut(worker + 1)


def window_order(lo: int, hi: int, *, seed: int, epoch: int, rank: int) -> np.ndarray:
    """Positions ``lo .. hi-1`` (one window of a worker's range in per-sample mode) in a shuffled order
    seeded by (seed, epoch, rank, lo)."""
    return lo + np.random.default_rng([seed, epoch, rank, lo, 0x3A1E]).permutation(hi - lo)


def _shutdown(pool: ThreadPoolExecutor) -> None:
    pool.shutdown(wait=False, cancel_futures=True)


# one thread per process fills the next window of a remote shard while the current one is decoded
_fill_threads: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(
    lambda: ThreadPoolExecutor(1, thread_name_prefix="fastdata-window"), _shutdown, close_inherited=False
)


class Ahead(Generic[T]):
    """Raw windows, filled one ahead: iterating gives ``(window, {position: sample})`` for each window;
    :meth:`fetch_next` (called once half of a window is used) starts filling the next one in the background.

    Only one fill runs at a time, in this process's window thread or the caller's, so ``fill`` (which
    reads through the dataset's shard readers) never runs twice at once.

    Args:
        fill: reads a window's samples, undecoded: ``{position: sample}``.
        windows: the windows, in order.
    """

    def __init__(self, fill: Callable[[T], dict[int, Sample]], windows: Iterator[T]) -> None:
        self._fill, self._windows = fill, windows
        self._next: T | None = next(windows, None)
        self._pending: Future[dict[int, Sample]] | None = None

    def __iter__(self) -> Iterator[tuple[T, dict[int, Sample]]]:
        while self._next is not None:
            window, pending, self._pending = self._next, self._pending, None
            raw = pending.result() if pending is not None else self._fill(window)
            self._next = next(self._windows, None)
            yield window, raw

    def fetch_next(self) -> None:
        """Start filling the next window now (no-op when there is none, or it is under way)."""
        if self._next is not None and self._pending is None:
            self._pending = _fill_threads.get().submit(self._fill, self._next)

    def settle(self) -> None:
        """Wait for a fill under way, keeping its result for the next window: the caller may then read
        through the shard readers itself (a substitute search)."""
        if self._pending is not None:
            wait_for([self._pending])

    def close(self) -> None:
        """Wait for a fill under way (the readers it uses are closed next), dropping its result."""
        pending, self._pending = self._pending, None
        if pending is not None and not pending.cancel():
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - the pass is over: what it would have read is not wanted
                pass


Batch = tuple[int, int, np.ndarray]  # (first position, end, the positions it reads)


def by_window(batches: Iterator[Batch], window: int) -> Iterator[list[Batch]]:
    """Consecutive batches grouped by the window their first position falls in."""
    group: list[Batch] = []
    for batch in batches:
        if group and batch[0] // window != group[0][0] // window:
            yield group
            group = []
        group.append(batch)
    if group:
        yield group


class EpochReader:
    """The samples at positions of one rank's part of one epoch, read through a dataset's shards.

    Args:
        source (TarSource): the dataset's shards and readers.
        start, length (int): the part of the epoch sequence (see :mod:`fastdata.core.epoch`).
        offsets (np.ndarray): where shard ``order[i]`` starts in the epoch sequence (``split_counts``).
        order (np.ndarray): the shards in this epoch's order.
    """

    def __init__(self, source: TarSource, start: int, length: int, offsets: np.ndarray, order: np.ndarray) -> None:
        self.source, self.start, self.length, self.offsets, self.order = source, start, length, offsets, order
        self.total = int(offsets[-1])

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, sample number in it)`` of ``positions`` of the part."""
        return locate(self.offsets, self.order, (self.start + positions) % self.total)

    def decoded(self, positions: np.ndarray, views: bool = False) -> list[Any]:
        """The samples at ``positions``, decoded, in order (bad ones left out); ``views``: see
        :meth:`TarSource.read`."""
        shards, local = self.locate(positions)
        out: list[Any] = []
        # read runs of consecutive positions that fall in the same shard together
        cuts = np.flatnonzero(np.diff(shards)) + 1
        for run_shards, run_local in zip(np.split(shards, cuts), np.split(local, cuts)):
            out.extend(self.source.read(int(run_shards[0]), run_local.tolist(), views=views))
        return out

    def raw(self, positions: np.ndarray) -> dict[int, Sample]:
        """The samples at ``positions`` undecoded, by position; read shard by shard in file order, so that a
        remote shard's part comes in as few ranged GETs as its size allows. Bad samples are left out
        (handled by the policy)."""
        shards, local = self.locate(positions)
        by_file = np.lexsort((local, shards))
        out: dict[int, Sample] = {}
        for run in np.split(by_file, np.flatnonzero(np.diff(shards[by_file])) + 1):
            if not len(run):
                continue
            which = local[run].tolist()
            kept: list[int] = []
            got = self.source.read(int(shards[run[0]]), which, decode=False, kept=kept)
            sample_of = dict(zip(kept, got))
            for p, i in zip(positions[run].tolist(), which):
                if i in sample_of:
                    out[p] = sample_of[i]
        return out

    def raw_group(self, group: list[Batch]) -> dict[int, Sample]:
        """:meth:`raw` of every position of a group of batches."""
        return self.raw(np.concatenate([positions for _, _, positions in group]))

    def finish(self, raw: dict[int, Sample], positions: np.ndarray) -> Iterator[Any]:
        """The samples at ``positions``, taken out of ``raw`` and decoded one by one (bad ones skipped)."""
        pipeline = self.source.pipeline
        t = stages.clock()  # 0.0 unless `fastdata bench` probes this process
        for p in positions.tolist():
            sample = raw.pop(p, None)
            if sample is not None:
                done, t = pipeline(sample, t)
                if done is not SKIP:
                    yield done

    def shards_at(self, positions: np.ndarray) -> list[str]:
        """The shards that ``positions`` fall in."""
        shards, _ = self.locate(positions)
        return [self.source.urls[i] for i in dict.fromkeys(shards.tolist())]


class WindowWarning(UserWarning):
    """A ``shuffle_window`` asked for is cut by ``shuffle_bytes``."""


__all__ = [
    "DEFAULT_WINDOW",
    "DEFAULT_WINDOW_BYTES",
    "Ahead",
    "EpochReader",
    "WindowWarning",
    "by_window",
    "bytes_per_sample",
    "window_order",
    "window_size",
    "worker_span",
]
