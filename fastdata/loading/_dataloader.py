"""``FastDataLoader``: torch's ``DataLoader``, less a profiler marker per batch when no profiler runs.

``DataLoader.__next__`` wraps every batch in ``torch.autograd.profiler.record_function``, whether or not a
profiler is recording: entering and leaving it costs 20-260 us per batch here (the exit calls into the
profiler's operator even when it is off), as much as making a batch of 64 raw tar samples in the
training process (~140 us). :class:`FastDataLoader` is a ``DataLoader`` (same arguments, same iterators,
same batches) whose iterators skip the marker while ``torch.autograd._profiler_enabled()`` is false, and
keep it, for the profiler's traces, while it is true. Measured here (2 cores, load 2-5): 64-sample batches
of ~3 KB raw tar samples through ``fd.Loader``, 0 workers 300k -> 470k samples/s, 2 workers with slots
100k -> 110-120k; of ~30 KB ones (``benchmarks/bench_transport.py --backends none --loader tar_bytes``,
one run each way), 0 workers 98.5k -> 103.6k, 2 workers with slots 62.2k -> 67.5k.

``fd.Loader`` and :func:`~fastdata.loading.build_dataloader` use it; ``fastdata bench`` measures a plain
``DataLoader`` where it recommends one (the figure is then what the pasted line gives).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import (
    _DatasetKind,
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)


class _Unmarked:
    """``__next__`` of torch's ``_BaseDataLoaderIter`` (torch 2.4-2.13), without ``record_function`` while
    no profiler is on."""

    def __next__(self) -> Any:
        if torch.autograd._profiler_enabled():
            return super().__next__()  # type: ignore[misc]
        it: Any = self
        if it._sampler_iter is None:
            it._reset()
        data = it._next_data()
        it._num_yielded += 1
        if (
            it._dataset_kind == _DatasetKind.Iterable
            and it._IterableDataset_len_called is not None
            and it._num_yielded > it._IterableDataset_len_called
        ):
            warnings.warn(
                f"Length of IterableDataset {it._dataset} was reported to be {it._IterableDataset_len_called}"
                f"(when accessing len(dataloader)), but {it._num_yielded} samples have been fetched. ",
                stacklevel=2,
            )
        return data


class _SingleProcess(_Unmarked, _SingleProcessDataLoaderIter):
    pass


class _MultiProcessing(_Unmarked, _MultiProcessingDataLoaderIter):
    pass


class FastDataLoader(DataLoader):  # type: ignore[type-arg]
    """A ``torch.utils.data.DataLoader`` whose iterators leave out the profiler marker per batch while no
    profiler runs (see the module doc). Takes exactly ``DataLoader``'s arguments."""

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return _SingleProcess(self)
        self.check_worker_number_rationality()
        return _MultiProcessing(self)


__all__ = ["FastDataLoader"]
