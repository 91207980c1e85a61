"""``Mix``: samples drawn from several fastdata datasets in set proportions, exactly, every epoch."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from time import perf_counter
from typing import Any, Literal

import numpy as np
from torch.utils.data import Dataset

from fastdata.core.epoch import (
    MixSequence,
    Remainder,
    apportion,
    current_worker,
    derive_seed,
    digest,
    ints_digest,
    rank_span,
)
from fastdata.core.errors import ConfigError, EgressWarning, TooManyBadSamples, check_choice, check_positive
from fastdata.core.process import REPEAT_FLAG
from fastdata.datasets._base import MapDatasetBase
from fastdata.datasets.mix._ahead import ReadAhead
from fastdata.datasets.mix._lanes import lane_draws
from fastdata.datasets.mix._parts import (
    SOURCE_KEY,
    SourceBatch,
    check_alike,
    collate_per_source,
    is_tar,
    named,
    weights_of,
)
from fastdata.datasets.mix._sources import SourceReader, TarReader, reader_for
from fastdata.loading import EpochSampler
from fastdata.loading.transport import checked_default_collate

Batches = Literal["mixed", "per_source"]
"""What a batch of a :class:`Mix` holds: ``"mixed"``, samples of every source in the mix's proportions (their
samples must collate together: give the sources transforms that make them alike); ``"per_source"``, batches
of ``batch_size`` samples of one source each, in the proportions counted in batches (sources whose samples
do not batch together)."""


class Mix(MapDatasetBase, Dataset[Any]):
    """Samples of several datasets, each source supplying exactly its share of every epoch.

    Each epoch of ``epoch_size`` samples takes ``c_s`` samples from source ``s``: its weight's share, apportioned
    so that the counts sum to the epoch (each within one sample of ``weight * epoch_size``); they are the same
    every epoch. The sources' samples are interleaved as evenly as integers allow (Webster's apportionment,
    :mod:`fastdata.core.epoch`): every batch, on every rank, holds each source's share to within about one
    sample, and the epoch holds it exactly. Each source is read without repetition within its own pass; one
    that runs out starts its next pass in a new order (see :mod:`fastdata.datasets.mix`). Everything
    follows from (``seed``, epoch): every rank computes the same sequence, and reads an equal, contiguous
    part of it (:meth:`sampler`, with the remainder policies of :mod:`fastdata.core.epoch`).

    Read it through ``fastdata.Loader`` (processes, threads, slots, the monitor, ``num_workers="auto"``, and
    exact resume mid-epoch with any ``num_workers``, or on another number of ranks), like any map-style
    fastdata dataset::

        mix = fd.Mix({"web": tar_ds, "books": hdf5_ds}, weights={"web": 0.7, "books": 0.3}, seed=1)
        loader = fd.Loader(mix, batch_size=256, num_workers=8)

    Every sample dict gets ``"__source__"``, its source's name. ``mix[i]`` is the ``i``-th sample of the
    current epoch's sequence.

    Args:
        datasets (Mapping[str, Dataset] | Sequence[Dataset]): the sources, by name (a sequence: named
            ``"0"``, ``"1"`` ...): map-style datasets (``IndexedTarDataset``, ``HDF5Dataset``,
            ``VideoClipDataset``, ``S3Dataset``, or any torch map-style dataset) and ``TarShardDataset`` (local
            or ``s3://`` shards). Their own rank and world size do not matter: the mix splits the work.
        weights (Mapping[str, float] | Sequence[float] | None): each source's share (any positive scale).
            Defaults to None: proportional to the sources' sizes.
        seed (int): seeds the sources' orders (source ``s``'s from ``(seed, s)``; their own ``seed`` is not
            used). Defaults to 0.
        epoch_size (int | str | None): samples per mix epoch; or a source's name: the epoch is one pass of that
            source (it supplies exactly its size; the others their shares of the rest). Defaults to None: the
            sum of the sources' sizes.
        batches ("mixed" | "per_source"): see :data:`Batches`. Defaults to "mixed".
        batch_size (int | None): with ``batches="per_source"``, the batch size (required; the Loader must
            read in batches of it); with ``lanes``, the Loader's batch size (required). Defaults to None.
        shuffle (bool): map-style sources: a new order every pass. A ``TarShardDataset`` follows its own
            ``shuffle`` and ``shuffle_window``. Defaults to True.
        lanes (int): for remote ``TarShardDataset`` sources read without a cache by ``n`` Loader workers: pass
            ``lanes=n`` (and ``batch_size=``, the Loader's), and each worker's batches draw from blocks of the
            source of their own, so each stored byte is fetched about once per epoch, not ``n`` times (a
            source's shuffle then spans a ``1 / lanes`` share of its pass; the order depends on ``lanes`` and
            ``batch_size``, never on the workers that read; see :mod:`fastdata.datasets.mix`). ``batches="mixed"``
            only. Defaults to 1.
        rank, world_size (int | None): Default to the detected ones.

    Under ``on_error="skip"`` (set on the sources), a bad sample is left out by its source and the next good
    sample of the same source stands in for it (counted in ``counters()["substituted"]``), so that every
    batch keeps each source's share.

    Raises:
        ConfigError: no source, a source that is empty or cannot be read by position (an iterable dataset
            other than ``TarShardDataset``), weights that are not positive or do not name the sources, an
            ``epoch_size`` too small to give every source a sample, or ``batches="per_source"`` without
            ``batch_size``.
    """

    def __init__(
        self,
        datasets: Mapping[str, Any] | Sequence[Any],
        weights: Mapping[str, float] | Sequence[float] | None = None,
        *,
        seed: int = 0,
        epoch_size: int | str | None = None,
        batches: Batches = "mixed",
        batch_size: int | None = None,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        lanes: int = 1,
    ) -> None:
        check_choice("batches", batches, Batches)
        check_positive("lanes", lanes)
        if lanes > 1 and (batch_size is None or batches != "mixed"):
            raise ConfigError(
                f"Mix(lanes={lanes}) lays each Loader worker's batches out in a lane of their own: it needs "
                'batch_size= (the Loader\'s batch size) and batches="mixed"'
            )
        self.names, self.sources = named(datasets)
        self._init_base(
            seed=seed,
            on_error="raise",
            rank=rank,
            world_size=world_size,
            counters=("reads", *(f"{k}/{name}" for name in self.names for k in ("samples", "read_us"))),
        )
        self.batches, self.shuffle = batches, shuffle
        if batches == "per_source":
            if batch_size is None:
                raise ConfigError('Mix(batches="per_source") needs batch_size=: the batches are laid out by source')
            check_positive("batch_size", batch_size)
        self.batch_size = batch_size
        self.unit = batch_size if batches == "per_source" and batch_size else 1
        self._readers: list[SourceReader] = [
            reader_for(ds, derive_seed(seed, s), shuffle, is_tar, keep=batches == "per_source")
            for s, ds in enumerate(self.sources)
        ]
        self.sizes = [r.n for r in self._readers]
        for name, n in zip(self.names, self.sizes):
            if n < 1:
                raise ConfigError(f"Mix: source {name!r} has no samples")
        self.weights = weights_of(weights, self.names, self.sizes)
        units = self._epoch_units(epoch_size)
        self.counts = units * self.unit  # samples of each source per epoch
        """Samples each source supplies per epoch (``numpy`` array, by source)."""
        self.sequence = MixSequence(units)
        self.lanes = lanes
        # with lanes: per remote-capable tar source, the lane-major number of each draw of an epoch
        self._relabel: dict[int, np.ndarray] = {}
        if lanes > 1:
            assert batch_size is not None
            every, draws = self.sequence.at(np.arange(int(units.sum()), dtype=np.int64))
            for s, reader in enumerate(self._readers):
                if isinstance(reader, TarReader):
                    relabel, reader.lanes = lane_draws(every, draws, self.counts, s, batch_size, lanes)
                    self._relabel[s] = relabel
        self._ahead = ReadAhead()
        self._plan: dict[str, int] | None = None  # resume_plan(), made on first use
        self._end = len(self)  # where this rank's part of the sequence ends (set by sampler()): read no further
        for ds in self.sources:  # the mix sets their epoch every pass, and reads more than one pass of some
            shared = getattr(ds, "_shared", None)
            if shared is not None:
                shared.once(REPEAT_FLAG)

    def _epoch_units(self, epoch_size: int | str | None) -> np.ndarray:
        """Units (samples, or batches with ``per_source``) of each source per epoch."""
        unit, w = self.unit, self.weights
        if isinstance(epoch_size, str):
            if epoch_size not in self.names:
                raise ConfigError(f"epoch_size={epoch_size!r} names no source; the sources are {self.names}")
            s = self.names.index(epoch_size)
            own = self.sizes[s] // unit
            if own < 1:
                raise ConfigError(f"source {epoch_size!r} holds fewer samples than a batch of {unit}")
            total = max(own, round(own / w[s]))
            others = [i for i in range(len(w)) if i != s]
            units = np.zeros(len(w), dtype=np.int64)
            units[s] = own
            if others:
                units[others] = apportion(total - own, [w[i] for i in others])
        else:
            size = sum(self.sizes) if epoch_size is None else epoch_size
            if isinstance(size, bool) or not isinstance(size, int):
                raise ConfigError(f"epoch_size={epoch_size!r}: pass a count of samples, a source's name, or None")
            units = apportion(size // unit, w)
        if (units < 1).any():
            short = [n for n, u in zip(self.names, units.tolist()) if u < 1]
            raise ConfigError(
                f"Mix: an epoch of {int(units.sum()) * unit} samples gives no {'batch' if unit > 1 else 'sample'} to "
                f"{', '.join(map(repr, short))} at these weights; raise epoch_size or their weights"
            )
        return units

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ahead": ReadAhead()}  # what a worker holds is its own

    # --- the epoch ---

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (every source's too: their per-epoch randomness, their workers' streams)."""
        super().set_epoch(epoch)
        for ds in self.sources:
            if callable(getattr(ds, "set_epoch", None)):
                ds.set_epoch(epoch)

    def _epoch_randomness(self) -> str | None:
        return "the samples each source supplies (its passes follow the epoch)"

    def __len__(self) -> int:
        return int(self.counts.sum())

    def sampler(self, *, shuffle: bool = True, remainder: Remainder = "drop") -> EpochSampler:
        """This rank's part of each epoch's sequence, in order (an :class:`~fastdata.loading.EpochSampler`).

        Args:
            shuffle (bool): accepted for the Loader's sake and not used: the sequence is already interleaved,
                and shuffling its positions would undo the even spread; the sources' orders are shuffled by
                ``Mix(shuffle=...)`` and their own settings. Defaults to True.
            remainder ("drop" | "pad" | "uneven"): an epoch that does not split evenly over the ranks (in
                batches with ``per_source``), see :data:`fastdata.core.epoch.Remainder`. Defaults to "drop":
                the sequence's last ``len(mix) % world_size`` samples are left out, so the counts read are the
                apportionment of the samples read.
        """
        self._remainder: Remainder | None = remainder
        self._rank_changed()
        return EpochSampler(
            len(self),
            shuffle=False,
            seed=self.seed,
            remainder=remainder,
            rank=self.rank,
            world_size=self.world_size,
            rank_of=self,
            shared=self._shared,
            owner=repr(self),
            unit=self.unit,
            tag=self.resume_plan(),
        )

    def resume_plan(self) -> dict[str, int]:
        """What the sequence and the sources' orders depend on besides (seed, epoch), for resume states: the
        sources (names and sizes), the samples each supplies per epoch (from the weights and ``epoch_size``),
        and the orders of their passes (``shuffle``; a ``TarShardDataset``'s own shuffle, window and shards; an
        ``HDF5Dataset``'s chunks), as digests."""
        if self._plan is None:  # once: the sources do not change
            orders: list[Any] = [self.shuffle, *(("lanes", self.lanes, self.batch_size) if self.lanes > 1 else ())]
            for ds in self.sources:
                if is_tar(ds):
                    orders.append({k: v for k, v in ds.resume_plan().items() if k in ("shuffle", "window", "shards")})
                elif callable(getattr(ds, "block_starts", None)):
                    orders.append(ints_digest(ds.block_starts()))
                else:
                    orders.append(None)
            self._plan = {
                "mix": digest(self.names, self.sizes),
                "mix_counts": digest(self.counts.tolist()),
                "mix_orders": digest(orders),
            }
        return dict(self._plan)

    def _rank_changed(self) -> None:
        """Where this rank's part of the sequence ends, for the rank read now (once a sampler laid it out)."""
        remainder = getattr(self, "_remainder", None)
        if remainder is not None:
            start, length = rank_span(len(self) // self.unit, self.rank, self.world_size, remainder)
            self._end = min(len(self), (start + length) * self.unit)

    # --- reading ---

    def locate(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source, draw)`` of each position of the current epoch: the source's index, and the draw's number
        counted from the first epoch on (see :mod:`fastdata.datasets.mix`)."""
        at = np.asarray(positions, dtype=np.int64).reshape(-1)
        n = len(self)
        if len(at) and (at.min() < -n or at.max() >= n):
            raise IndexError(f"position {int(at[(at < -n) | (at >= n)][0])} is out of range for a mix epoch of {n}")
        at = at % n
        units, offset = np.divmod(at, self.unit)
        sources, draws = self.sequence.at(units)
        for s, relabel in self._relabel.items():  # lanes: a tar source's draws numbered lane by lane
            mine = sources == s
            draws[mine] = relabel[draws[mine]]
        return sources, self.epoch * self.counts[sources] + draws * self.unit + offset

    def __getitem__(self, i: int) -> Any:
        return self.__getitems__([i])[0]

    def __getitems__(self, positions: Sequence[int]) -> Any:
        """The samples at ``positions`` of the current epoch, in their order (this worker's next batch is read
        along with them, and held: :mod:`fastdata.datasets.mix`)."""
        self.follow_epoch()
        self._count_reads(len(positions))
        sources, draws = self.locate(positions)
        if self.unit > 1 and len(positions) and len(np.unique(np.asarray(positions) // self.unit)) > 1:
            raise ConfigError(
                f'Mix(batches="per_source", batch_size={self.unit}) must be read in batches of {self.unit} '
                "(fastdata.Loader(mix, batch_size=...) with the same size): a batch of other positions mixes sources"
            )
        if self.unit > 1:  # one source (checked above)
            s = int(sources[0])
            return SourceBatch(self.names[s], self._read(s, draws), self.sources[s])
        at = np.asarray(positions, dtype=np.int64)
        held = self._ahead.take(self.epoch, at)
        if held is not None:
            return held
        nxt = self._ahead.plan(self.epoch, at, self._end)
        if nxt is None:
            return self._mixed(sources, draws)
        more_sources, more_draws = self.locate(nxt)
        both = self._mixed(np.concatenate([sources, more_sources]), np.concatenate([draws, more_draws]))
        self._ahead.hold(self.epoch, nxt, both[len(at) :])
        return both[: len(at)]

    def _mixed(self, sources: np.ndarray, draws: np.ndarray) -> list[Any]:
        """The samples of ``draws`` of ``sources``, in their order, each source read once."""
        out: list[Any] = [None] * len(draws)
        first: dict[int, Any] = {}
        for s in np.unique(sources).tolist():
            mine = np.flatnonzero(sources == s)
            got = self._read(s, draws[mine])
            for k, sample in zip(mine.tolist(), got):
                out[k] = sample
            first[s] = out[mine[0]]
        if len(first) > 1:
            check_alike(first, self.names)
        return out  # in the positions' order: a batch read in runs (the hybrid's threads) comes out the same

    def _read(self, s: int, draws: np.ndarray) -> Any:
        """Source ``s``'s samples of ``draws``, in their order, bad ones stood in for from the same source."""
        name, reader = self.names[s], self._readers[s]
        start = perf_counter()
        try:
            got, stood_in = reader.read(draws)
        except TooManyBadSamples as e:
            raise TooManyBadSamples(f"Mix source {name!r}: {e}") from e
        if stood_in:
            self._shared.add("substituted", stood_in)
        if self.unit == 1:
            for sample in got:
                if isinstance(sample, dict):
                    sample[SOURCE_KEY] = name
        self._shared.add(f"samples/{name}", len(draws))
        self._shared.add(f"read_us/{name}", int((perf_counter() - start) * 1e6))
        return got

    @property
    def collate(self) -> Any:
        """The collate function (``fd.Loader`` uses it): the default collate for mixed batches (it then
        stacks straight into the slots), the batch's source's own (``HDF5Dataset.collate`` ...) for
        ``per_source`` batches."""
        return checked_default_collate if self.unit == 1 else collate_per_source

    # --- counters, for the monitor: which source is slow ---

    def counters(self) -> dict[str, int]:
        """The mix's counters (``substituted``: samples of a source standing in for its bad ones in a batch; per
        source, ``samples/NAME`` read and ``read_us/NAME``, microseconds spent reading them, summed over every
        process) and the sources' own, as ``NAME/counter``; ``skipped`` sums the sources' bad samples."""
        own = self._shared.totals()
        out = {"skipped": 0, "substituted": own["substituted"]}
        for name, ds in zip(self.names, self.sources):
            theirs = ds.counters() if callable(getattr(ds, "counters", None)) else {}
            out["skipped"] += int(theirs.get("skipped", 0))
            out.update({f"{name}/{k}": int(v) for k, v in theirs.items()})
        out.update({k: v for k, v in own.items() if "/" in k})
        return out

    @property
    def skipped(self) -> int:
        return self.counters()["skipped"]

    @property
    def substituted(self) -> int:
        return self.counters()["substituted"]

    def source_stats(self) -> dict[str, dict[str, float]]:
        """Per source: ``samples`` read, ``seconds`` spent reading them (summed over every worker: divide by
        ``samples`` for the cost of one), ``skipped`` and ``substituted``. The slow source is the one whose
        seconds per sample, times its share, is the largest."""
        c = self.counters()
        return {
            name: {
                "samples": c[f"samples/{name}"],
                "seconds": c[f"read_us/{name}"] / 1e6,
                "skipped": c.get(f"{name}/skipped", 0),
                "substituted": c.get(f"{name}/substituted", 0),
            }
            for name in self.names
        }

    # --- lifetime ---

    def warm(self) -> None:
        """Called by ``worker_init_fn``: warm every source up (open its first file ...); say when the workers
        will fetch remote sources' bytes once each (see :meth:`_warn_egress`)."""
        self._warn_egress()
        for ds in self.sources:
            if callable(getattr(ds, "warm", None)):
                ds.warm()

    def _warn_egress(self) -> None:
        """In a worker of ``n > 1`` with ``lanes != n``: an :class:`~fastdata.core.errors.EgressWarning` naming
        the remote tar sources read without a cache, whose blocks every worker draws from (about ``n`` times
        their bytes per epoch: measured 1.97x with 2 workers, 0.99x with ``lanes=2``;
        ``benchmarks/bench_remote.py``)."""
        worker, workers = current_worker()
        if worker != 0 or workers <= 1 or self.lanes == workers:
            return
        remote = [
            name
            for name, r in zip(self.names, self._readers)
            if isinstance(r, TarReader) and getattr(r.ds, "remote", False) and int(getattr(r.ds, "_reads", 0)) > 1
        ]
        if not remote:
            return
        batch = self.batch_size if self.batch_size is not None else "the Loader's batch size"
        warnings.warn(
            f"Mix(lanes={self.lanes}) read by {workers} workers: each worker draws from every block of the remote "
            f"source(s) {', '.join(map(repr, remote))}, so their stored bytes are fetched about "
            f"{workers if self.lanes == 1 else 'several'} times per epoch; pass Mix(..., lanes={workers}, "
            f"batch_size={batch}), or give the sources a cache_dir=",
            EgressWarning,
            stacklevel=2,
        )

    def close(self) -> None:
        for ds in self.sources:
            if callable(getattr(ds, "close", None)):
                ds.close()

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}: {c}" for n, c in zip(self.names, self.counts.tolist()))
        return f"Mix({shares} samples per epoch, batches={self.batches!r}, rank {self.rank}/{self.world_size})"


__all__ = ["Batches", "Mix"]
