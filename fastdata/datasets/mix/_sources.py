"""How :class:`fastdata.Mix` reads one of its sources: by draw number, each source's passes one after the other.

A source's draws are numbered from the first mix epoch on (``g = epoch * c + k`` for its ``c`` draws per mix
epoch), so draw ``g`` is position ``g mod n`` of the source's pass ``g // n`` (``n``: its samples): the
source is read without repetition within each of its passes, and a source that runs out starts its next
pass, in a new order. A pass's order:

* a map-style dataset (``IndexedTarDataset``, ``HDF5Dataset``, ``VideoClipDataset``, ``S3Dataset``, any torch
  map-style dataset): a permutation of its indices from (seed, pass), or, for a dataset with
  ``block_starts()`` (``HDF5Dataset``: its chunks), blocks permuted and shuffled within (as
  :class:`~fastdata.loading.ChunkBatchSampler` orders them), so that a batch's rows come from few chunks. A
  batch's indices are read through ``__getitems__`` (in index order, then put back in the draws' order; per-source
  batches in the draws' order, as the source's own batch, for its own collate);
* ``TarShardDataset``: its own plan of a pass (shards in a seeded order, samples shuffled within windows of
  its ``shuffle_window``; in order without its ``shuffle``), read through its shards' indexes.

Samples come back in the order of their draws. Under ``on_error="skip"`` a bad sample's place is taken by the
next good sample of the same source (a map-style source's own substitute, ``ds[i]``; a tar source's next good
sample in its pass), so that every batch keeps its share of each source.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from typing import Any

import numpy as np

from fastdata.core import SKIP, stages
from fastdata.core.epoch import EXACT_ORDER_MAX, WindowShuffle, derive_seed, epoch_order, order_at
from fastdata.core.errors import ConfigError, collecting
from fastdata.core.process import SharedState
from fastdata.datasets._substitute import find_substitute
from fastdata.datasets.mix._lanes import SegmentShuffle, pass_bounds
from fastdata.loading import block_sequence


class SourceReader:
    """Reads one source by draw number (see the module doc).

    Args:
        ds: the source dataset.
        seed (int): the seed of its passes' orders.
        shuffle (bool): map-style sources: a new order every pass. (A ``TarShardDataset`` follows its own.)
    """

    def __init__(self, ds: Any, seed: int, shuffle: bool) -> None:
        self.ds, self.seed, self.shuffle = ds, seed, shuffle
        if getattr(ds, "stream", False) is True:
            raise ConfigError(
                f"Mix: {ds!r} is streamed (stream=True): it counts no samples, so a mix cannot draw from it by "
                "position; build it without stream=True"
            )
        self.n = int(ds.total) if isinstance(self, TarReader) else len(ds)  # TarShardDataset's len is its rank's
        self._orders: dict[int, Any] = {}  # pass -> its order (two kept: a batch may straddle passes)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_orders": {}}  # orders are rebuilt where they are used

    def _order(self, q: int) -> Any:
        got = self._orders.get(q)
        if got is None:
            got = self._make_order(q)
            if len(self._orders) >= 2:
                self._orders.pop(next(iter(self._orders)))
            self._orders[q] = got
        return got

    def _make_order(self, q: int) -> Any:
        raise NotImplementedError

    def read(self, draws: np.ndarray) -> tuple[Any, int]:
        """``(samples, stand-ins)``: a sample for each of ``draws``, in their order (a bad one's place taken by
        the next good sample of this source), and how many stood in for bad ones."""
        raise NotImplementedError


class MapReader(SourceReader):
    """A map-style source.

    Args:
        keep (bool): return the source's own batch as ``__getitems__`` gives it (read in the draws' order), for
            its own collate; else a list of samples (read in index order). Defaults to False.
    """

    def __init__(self, ds: Any, seed: int, shuffle: bool, keep: bool = False) -> None:
        super().__init__(ds, seed, shuffle)
        self.blocks = callable(getattr(ds, "block_starts", None))
        self.keep = keep

    def _make_order(self, q: int) -> Any:
        if self.blocks:
            starts = self.ds.block_starts()
            return block_sequence(starts, self.n, shuffle=self.shuffle, seed=self.seed, epoch=q)
        if self.n > EXACT_ORDER_MAX and self.shuffle:
            return None  # computed at the positions asked for (fastdata.core.epoch._sharding.keyed_permutation)
        return epoch_order(self.n, shuffle=self.shuffle, seed=self.seed, epoch=q)

    def indices(self, draws: np.ndarray) -> np.ndarray:
        passes, at = np.divmod(draws, self.n)
        out = np.empty(len(draws), dtype=np.int64)
        for q in np.unique(passes).tolist():
            mine = passes == q
            order = self._order(q)
            if order is None:
                out[mine] = order_at(at[mine], self.n, shuffle=True, seed=self.seed, epoch=q)
            else:
                out[mine] = order[at[mine]]
        return out

    def read(self, draws: np.ndarray) -> tuple[Any, int]:
        idx = self.indices(draws)
        getitems = getattr(self.ds, "__getitems__", None)
        if getitems is None:
            return [self.ds[int(i)] for i in idx], 0
        if self.keep:  # the source's own batch (an HDF5Dataset's columns), in the draws' order
            got = getitems(idx.tolist())
        else:  # rows in index order are read as runs; then put back in the draws' order
            order = np.argsort(idx, kind="stable")
            rows = getitems(idx[order].tolist())
            got = rows
            if len(rows) == len(idx):
                got = [None] * len(idx)
                for k, sample in zip(order.tolist(), rows):
                    got[k] = sample
        if len(got) == len(idx):
            return got, 0
        # a bad sample was left out: each read alone, a bad one's ds[i] is its own substitute (the next good
        # index, counted by the source too), so every sample keeps its place. The bad ones were counted as
        # skipped by the read above: read again, they are collected, not counted twice
        with collecting():
            return [self.ds[int(i)] for i in idx], len(idx) - len(got)


BLOCKS_HELD = 2  # blocks of a remote tar source's pass a process holds (a batch may straddle two)


class TarReader(SourceReader):
    """A ``TarShardDataset`` source, read through its shards' indexes.

    A remote source (read from the store, no cache) is fetched a block at a time: the samples of the pass
    that the source reads together (its ``shuffle_window`` cut to ``shuffle_bytes``, the span its shuffle
    permutes), shard by shard in few ranged GETs, held until drawn (:data:`BLOCKS_HELD` blocks per process).
    Draws fall anywhere in their block, so reading each batch's few samples alone fetched each stored byte
    5-9 times per epoch, at a tenth of the source's own speed."""

    _found: SharedState | None = None
    _blocks: dict[tuple[int, int], dict[int, Any]] | None = None  # (pass, block) -> raw samples not yet drawn
    lanes: np.ndarray | None = None  # with Mix(lanes=): where each lane's draws of an epoch start (see _lanes)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_blocks": None}

    def _make_order(self, q: int) -> tuple[Any, WindowShuffle | SegmentShuffle]:
        reader, shuffled = self.ds.whole_pass(self.seed, q)
        if self.lanes is None:
            return reader, shuffled
        # each lane's blocks in a segment of the pass of its own (see fastdata.datasets.mix._lanes)
        block = max(1, int(getattr(self.ds, "_reads", 1)))
        bounds = pass_bounds(self.lanes, self.n)
        seed = derive_seed(self.seed, 0x1A7E)
        return reader, SegmentShuffle(self.n, bounds, block, shuffle=self.ds.window > 1, seed=seed, epoch=q)

    def _raw(self, q: int, reader: Any, positions: np.ndarray, shuffled: Any = None) -> dict[int, Any]:
        """The raw samples at ``positions`` of pass ``q`` (bad ones left out): remote, through the blocks held
        (with lanes, the blocks of ``shuffled``, a :class:`SegmentShuffle`)."""
        block = int(getattr(self.ds, "_reads", 0))
        if not getattr(self.ds, "remote", False) or block <= 1:
            return reader.raw(positions)  # type: ignore[no-any-return]
        if self._blocks is None:
            self._blocks = {}
        segments = shuffled if isinstance(shuffled, SegmentShuffle) else None
        keys = segments.block_of(positions) if segments is not None else positions // block
        lanes = 1 if self.lanes is None else len(self.lanes) - 1
        out: dict[int, Any] = {}
        for b in np.unique(keys).tolist():
            key = (q, b)
            held = self._blocks.pop(key, None)
            if held is None:
                span = (
                    segments.span(b)
                    if segments is not None
                    else np.arange(b * block, min(self.n, (b + 1) * block), dtype=np.int64)
                )
                held = reader.raw(span)
            for p in positions[keys == b].tolist():
                if p in held:
                    out[p] = held.pop(p)
            if held:
                self._blocks[key] = held  # most recently used last
                # a process reading every lane (no workers) draws from a block of each at once
                while len(self._blocks) > BLOCKS_HELD * lanes:
                    self._blocks.pop(next(iter(self._blocks)))
        return out

    def read(self, draws: np.ndarray) -> tuple[Any, int]:
        passes, at = np.divmod(draws, self.n)
        out: list[Any] = [None] * len(draws)
        pipeline = self.ds.source.pipeline
        bad = []
        for q in np.unique(passes).tolist():
            reader, shuffled = self._order(q)
            mine = np.flatnonzero(passes == q)
            positions = shuffled.at(at[mine])
            # read shard by shard in file order (a shard's samples in one call, a remote one's in few ranged
            # GETs), decoded in the draws' order (bad ones handled by the source's policy)
            raw = self._raw(q, reader, positions, shuffled)
            t = stages.clock()  # 0.0 unless `fastdata bench` probes this process
            for k, p in zip(mine.tolist(), positions.tolist()):
                sample = raw.pop(p, None)
                if sample is not None:
                    sample, t = pipeline(sample, t)
                if sample is None or sample is SKIP:
                    bad.append(k)
                else:
                    out[k] = sample
        for k in bad:
            out[k] = self._next_good(int(draws[k]))[1]
        return out, len(bad)

    def _next_good(self, after: int) -> tuple[int, Any]:
        """The next good sample after draw ``after`` in its pass's order (wrapping within the pass)."""
        q, p = divmod(after, self.n)
        reader, shuffled = self._order(q)
        pipeline = self.ds.source.pipeline
        base = q * self.n
        shards = reader.shards_at(shuffled.at(np.asarray([p], dtype=np.int64)))  # looked in, for a refusal

        def good(slots: list[int]) -> list[tuple[int, Any]]:
            where = shuffled.at(np.asarray(slots, dtype=np.int64))
            shards.extend(s for s in reader.shards_at(where) if s not in shards)
            raw = reader.raw(where)
            for slot, at in zip(slots, where.tolist()):
                if at in raw:
                    sample, _ = pipeline(raw[at])
                    if sample is not SKIP:
                        return [(base + slot, sample)]
            return []

        if self._found is None:  # the mix counts its stand-ins itself: not as the source's own substitutes
            self._found = SharedState(("substituted",))
        return find_substitute(
            good,
            chain(range(p + 1, self.n), range(p)),
            shared=self._found,
            owner=repr(self.ds),
            bad=f"a sample of pass {q}",
            order="the order of its pass",
            unit="draw",
            sources=shards,
            errors_name_samples=True,  # a tar sample's error names its key
        )


def reader_for(ds: Any, seed: int, shuffle: bool, is_tar: Callable[[Any], bool], keep: bool) -> SourceReader:
    """The reader of source ``ds`` (``keep``: see :class:`MapReader`)."""
    return TarReader(ds, seed, shuffle) if is_tar(ds) else MapReader(ds, seed, shuffle, keep)


__all__ = ["MapReader", "SourceReader", "TarReader", "reader_for"]
