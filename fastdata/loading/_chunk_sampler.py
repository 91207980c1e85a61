"""``ChunkBatchSampler``: batches of indices that lie in the same HDF5 chunks, shuffled chunk by chunk.

A random index order makes every read land in a different chunk: HDF5 then loads (and, for compressed
data, decompresses) a whole chunk for one row, and variable-length rows each cost a separate heap read.
This sampler shuffles *blocks* (a file's chunks) instead of indices: each epoch, the blocks are permuted
from (seed, epoch), the indices inside each window of ``mix`` consecutive blocks are shuffled, and the
resulting sequence is cut into batches, each sorted (a batch is a set to the model; sorted, its rows are
read as runs). A batch therefore touches one or a few chunks; the order still changes every epoch and
every index appears exactly once.

Ranks take equal, contiguous parts of the epoch sequence (:func:`fastdata.core.epoch.rank_span` and its
remainder policy), so each rank's batches also stay within chunks. The DataLoader hands whole batches
to its workers round-robin, so the batches a rank sees do not depend on ``num_workers``.

How much randomness is given up: a batch holds rows that were written near each other. ``fastdata
convert --format hdf5`` writes samples in a shuffled order for this reason; for files written in class
order, raise ``mix`` so that each batch draws from several blocks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from fastdata.core.epoch import (
    REMAINDERS,
    Base,
    Remainder,
    ResumeState,
    current_rank,
    ints_digest,
    load_state,
    rank_span,
)
from fastdata.core.errors import ConfigError, check_positive
from fastdata.core.process import SharedEpoch, SharedState


def block_sequence(starts: np.ndarray, n: int, *, shuffle: bool, seed: int, epoch: int, mix: int = 1) -> np.ndarray:
    """The epoch sequence of ``n`` indices laid out in blocks starting at ``starts``.

    Without ``shuffle``: ``0 .. n-1``. With it: blocks in an order permuted from (seed, epoch), and the
    indices of every ``mix`` consecutive blocks of that order shuffled together.

    Args:
        starts (np.ndarray): first index of each block, increasing, starting at 0.
        n (int): indices in all.
        shuffle (bool), seed (int), epoch (int): what the order depends on.
        mix (int): blocks whose indices are shuffled together. Defaults to 1.
    """
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    lengths = np.diff(np.append(starts, n))
    rng = np.random.default_rng([seed, epoch, 0xC4A7])
    order = rng.permutation(len(starts))
    seq_lengths = lengths[order]
    seq_starts = np.cumsum(seq_lengths) - seq_lengths
    seq = np.repeat(starts[order] - seq_starts, seq_lengths) + np.arange(n, dtype=np.int64)
    window = np.repeat(np.arange(len(order), dtype=np.int64) // mix, seq_lengths)
    # a random key in [window, window + 1): sorting keeps windows in place and shuffles inside each
    return seq[np.argsort(window + rng.random(n), kind="stable")]


class ChunkBatchSampler(SharedEpoch, Sampler[list[int]]):
    """Batches of a map-style dataset for this rank, each from one or a few chunks; see the module doc.

    Pass as ``DataLoader(ds, batch_sampler=...)``. :meth:`fastdata.HDF5Dataset.chunk_sampler` builds one
    from the files' chunk layout.

    Args:
        starts (Sequence[int]): first dataset index of each block (chunk), increasing, starting at 0.
        n (int): samples in the dataset.
        batch_size (int): indices per batch.
        shuffle (bool): a new block order (and order inside blocks) every epoch. Defaults to True.
        seed (int): Defaults to 0.
        drop_last (bool): drop the rank's last, smaller batch. Defaults to False.
        remainder ("drop" | "pad" | "uneven"): see :data:`fastdata.core.epoch.Remainder`. Defaults to "drop".
        mix (int): consecutive blocks whose indices are shuffled together before batching: more
            randomness per batch, less locality. Defaults to 1.
        rank, world_size (int | None): Default to the detected ones.
        shared (SharedState | None): the dataset's shared state, to follow its ``set_epoch``.
    """

    sorted_batches = True  # each batch in index order: its rows are read as runs

    def __init__(
        self,
        starts: Sequence[int] | np.ndarray,
        n: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        remainder: Remainder = "drop",
        mix: int = 1,
        rank: int | None = None,
        world_size: int | None = None,
        shared: SharedState | None = None,
    ) -> None:
        check_positive("batch_size", batch_size)
        check_positive("mix", mix)
        self.starts = np.asarray(starts, dtype=np.int64)
        self._chunks = ints_digest(self.starts)  # for resume states: once, not per state
        if n > 0 and (
            not len(self.starts) or self.starts[0] != 0 or (np.diff(self.starts) <= 0).any() or self.starts[-1] >= n
        ):
            raise ConfigError(f"block starts must increase from 0 and stay below n={n}")
        detected = current_rank()
        self.rank = detected[0] if rank is None else rank
        self.world_size = detected[1] if world_size is None else world_size
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.drop_last, self.remainder, self.mix = drop_last, remainder, mix
        _, self._length = rank_span(n, self.rank, self.world_size, remainder)  # fails early
        self._shared = shared if shared is not None else SharedState(())
        self._resume: tuple[int, int] | None = None  # (epoch, samples consumed) loaded, not yet iterated
        self._position: list[int] | None = None  # [epoch, batches handed out] of the latest iteration

    @property
    def samples(self) -> int:
        """Indices this rank reads per epoch (before ``drop_last``)."""
        return self._length

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch, in batch order."""
        return self.rank_order(self.rank, self.world_size, self.batch_size)

    def sequence(self) -> np.ndarray:
        """The epoch's sequence of indices, the same on every rank (ranks take contiguous parts of it)."""
        return block_sequence(self.starts, self.n, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch, mix=self.mix)

    def rank_order(self, rank: int, world_size: int, batch_size: int) -> np.ndarray:
        """Rank ``rank``'s indices of the current epoch, in batch order, in a plan of ``world_size`` ranks
        with batches of ``batch_size`` (which this order does not depend on)."""
        start, length = rank_span(self.n, rank, world_size, self.remainder)
        return self.sequence()[(start + np.arange(length)) % self.n]

    # --- resuming on another number of ranks (fastdata.core.epoch._elastic; fastdata.Loader drives it) ---

    def elastic_base(self, world_size: int, batch_size: int, drop_last: bool = False) -> Base:
        """This epoch's plan on ``world_size`` ranks with batches of ``batch_size`` (``drop_last`` is this
        sampler's own)."""
        lengths = []
        for r in range(world_size):
            n = rank_span(self.n, r, world_size, self.remainder)[1]
            lengths.append(n - n % batch_size if self.drop_last else n)
        return Base(tuple(lengths), batch_size)

    def elastic_items(self, world_size: int, batch_size: int, ranks: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The indices at ``positions`` of ranks ``ranks``'s parts in this epoch's plan on ``world_size`` ranks."""
        out = np.empty(len(positions), dtype=np.int64)
        for r in np.unique(ranks).tolist():
            mine = ranks == r
            out[mine] = self.rank_order(r, world_size, batch_size)[positions[mine]]
        return out

    def __iter__(self) -> Iterator[list[int]]:
        # A generator: the resume position is taken at the first next(), not at iter(). The DataLoader's
        # multiprocessing iterator calls iter() on its batch sampler twice (at construction and in its
        # reset) and draws from the second only; an eager iter() would spend the resume on the first.
        order = self.indices()
        first = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            first = -(-self._resume[1] // self.batch_size)  # whole batches, or the whole epoch
            self._resume = None
        # [epoch, batches handed out]: what state_dict() reports when it is not told what was consumed
        position = self._position = [self.epoch, first]
        for b in range(first, len(self)):
            position[1] = b + 1  # before the yield: a state taken right after next() counts this batch
            # sorted: a batch is a set to the model, and rows in file order are read as runs
            yield np.sort(order[b * self.batch_size : (b + 1) * self.batch_size]).tolist()

    def __len__(self) -> int:
        if self.drop_last:
            return self._length // self.batch_size
        return -(-self._length // self.batch_size)

    def _plan(self) -> dict[str, int]:
        return {
            "batch_size": self.batch_size,
            "size": self.n,
            "world_size": self.world_size,
            "seed": self.seed,
            "shuffle": int(self.shuffle),
            "block_mix": self.mix,
            "chunks": self._chunks,
            "remainder": REMAINDERS.index(self.remainder),
            "drop_last": int(self.drop_last),
        }

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """The position to resume from: a :class:`~fastdata.core.epoch.ResumeState` (as a dict) counting
        the samples of the current epoch already consumed, in whole batches.

        Args:
            consumed (int | None): samples of this epoch already consumed (whole batches, or the whole
                epoch). Defaults to the samples of the batches the latest iteration has handed out, which is
                right when nothing reads ahead (no DataLoader workers, or ``torchdata``'s
                ``StatefulDataLoader``, which snapshots this per batch); a plain ``DataLoader`` with workers
                prefetches, so pass the count, or use :class:`fastdata.Loader`.
        """
        if consumed is None:
            if self._resume is not None and self._resume[0] == self.epoch:
                consumed = self._resume[1]
            elif self._position is not None and self._position[0] == self.epoch:
                consumed = min(self._position[1] * self.batch_size, self._length)
            else:
                consumed = 0
        return ResumeState(self.epoch, consumed, "samples", self._plan()).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration of the state's epoch skip the batches holding the samples it counts as
        consumed (a multiple of ``batch_size``, or the whole epoch).

        Raises:
            ConfigError: when the state is not a whole number of batches, lies outside this rank's epoch,
                or was saved for another batch size, dataset size, world size or seed.
        """
        s = load_state(state, into="ChunkBatchSampler", unit="samples", plan=self._plan(), length=self._length)
        consumed = s.position
        if consumed % self.batch_size and consumed != self._length:
            raise ConfigError(f"consumed={consumed} is not a whole number of batches of {self.batch_size}")
        self.set_epoch(s.epoch)
        self._resume = (s.epoch, consumed)
