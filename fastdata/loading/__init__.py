"""Between a dataset and the training loop, blind to storage and formats: :class:`Loader` (resumable at any
batch with any worker count), the one DataLoader builder (:func:`build_dataloader`, by a :class:`ReadPlan`),
the rank-aware samplers, and the declared protocol of a fastdata dataset (``_protocol``). Sub-packages:
:mod:`~fastdata.loading.transport` (batches through reused shared-memory slots),
:mod:`~fastdata.loading.threads` (loader threads and the hybrid) and :mod:`~fastdata.loading.observe`
(the probe, the window, the diagnosis, the monitor and ``num_workers="auto"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.loading._batching import explain
    from fastdata.loading._builder import Transport, build_dataloader
    from fastdata.loading._checks import Workers
    from fastdata.loading._chunk_sampler import ChunkBatchSampler, block_sequence
    from fastdata.loading._dataloader import FastDataLoader
    from fastdata.loading._loader import DEFAULT_TRANSPORT, Loader
    from fastdata.loading._plan import ReadPlan
    from fastdata.loading._protocol import BatchingDataset, Collating, Dataset, MapDataset
    from fastdata.loading._sampler import EpochSampler
    from fastdata.loading._video_sampler import ClipBatchSampler
    from fastdata.loading.transport._collate import batch_as_is as as_is

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "DEFAULT_TRANSPORT",
    "BatchingDataset",
    "ChunkBatchSampler",
    "ClipBatchSampler",
    "Collating",
    "Dataset",
    "EpochSampler",
    "FastDataLoader",
    "Loader",
    "MapDataset",
    "ReadPlan",
    "Transport",
    "Workers",
    "as_is",
    "block_sequence",
    "build_dataloader",
    "explain",
]
