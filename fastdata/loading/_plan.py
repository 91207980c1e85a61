"""``ReadPlan``: how a dataset is read (its sampler, batching and collate function), whoever reads it.

One value names the seven choices a DataLoader's reading depends on; :func:`fastdata.loading.build_dataloader`
(worker processes), :class:`fastdata.loading.threads.ThreadLoader` (loader threads) and ``fd.Loader``
(either) all take a ``ReadPlan`` and resolve it the same way (:meth:`ReadPlan.resolve`):

- an iterable dataset that batches itself (``TarShardDataset(batch_size=...)``) is read with
  ``batch_size=None`` and ``as_is`` (its batches are already collated);
- a map-style fastdata dataset is read in the order of its rank-aware ``sampler()``, and batched by its
  own ``collate`` when it has one (``HDF5Dataset``); any other map-style dataset is shuffled by torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import IterableDataset, default_convert

from fastdata.core.epoch import Remainder
from fastdata.core.errors import ConfigError
from fastdata.loading._protocol import BatchingDataset, Collating, MapDataset, ResumableBatchSampler
from fastdata.loading.transport._collate import batch_as_is as as_is
from fastdata.loading.transport._collate import checked_default_collate

Collate = Callable[[Any], Any]


@dataclass(frozen=True)
class ReadPlan:
    """How to read a dataset: which samples, in what order, batched how.

    Attributes:
        batch_size (int | None): samples per batch, for the reader to batch. An iterable dataset that
            batches itself takes None (or its own batch size); None otherwise means one sample at a time.
            Defaults to None.
        sampler: map-style only: the sampler to read through instead of ``dataset.sampler()``.
        batch_sampler: map-style only: a sampler of whole batches (``HDF5Dataset.chunk_sampler(...)``);
            excludes ``batch_size``, ``sampler`` and ``drop_last``.
        shuffle (bool): map-style only: a new order every epoch. Defaults to True.
        remainder ("drop" | "pad" | "uneven" | None): map-style only: passed to ``dataset.sampler()``.
            Defaults to None (the sampler's default, "drop").
        drop_last (bool): drop the last, smaller batch (when the reader batches). Defaults to False.
        collate_fn (Callable | None): Defaults to the dataset's own ``collate`` (map-style, batched),
            ``as_is`` (a dataset that batches itself), else torch's ``default_collate`` (which, for
            samples that do not batch, raises ``CannotBatch`` naming the samples and the fixes).
    """

    batch_size: int | None = None
    sampler: Any = None
    batch_sampler: Any = None
    shuffle: bool = True
    remainder: Remainder | None = None
    drop_last: bool = False
    collate_fn: Collate | None = None

    def resolve(self, dataset: Any) -> Resolved:
        """What this plan means for ``dataset`` (see the module doc).

        Raises:
            ConfigError: for options that do not apply to this kind of dataset.
        """
        name = type(dataset).__name__
        batch_size, sampler, drop_last = self.batch_size, self.sampler, self.drop_last
        kwargs: dict[str, Any] = {}
        default: Collate
        if isinstance(dataset, IterableDataset):
            if sampler is not None or self.batch_sampler is not None:
                raise ConfigError(f"{name} is iterable and reads its own part of the epoch: pass no sampler")
            if isinstance(dataset, BatchingDataset) and dataset.batch_size is not None:
                own = dataset.batch_size
                if batch_size is not None and batch_size != own:
                    raise ConfigError(
                        f"batch_size={batch_size} differs from {name}(batch_size={own}); it batches itself: "
                        "pass batch_size=None or the same size"
                    )
                if drop_last:
                    raise ConfigError(f"{name} batches itself: set drop_last on the dataset, not here")
                batch_size, batched, default = None, False, as_is
            else:
                batched = batch_size is not None
                default = checked_default_collate if batched else default_convert
                kwargs["drop_last"] = drop_last
            kwargs["batch_size"] = batch_size
        elif self.batch_sampler is not None:
            if sampler is not None or batch_size is not None or drop_last:
                raise ConfigError(
                    "batch_sampler decides the batches: pass batch_size, drop_last and the order to the batch "
                    "sampler, not beside it"
                )
            kwargs["batch_sampler"] = self.batch_sampler
            batched = True
            default = dataset.collate if isinstance(dataset, Collating) else checked_default_collate
        else:
            if isinstance(sampler, ResumableBatchSampler):
                raise ConfigError(f"{type(sampler).__name__} yields whole batches: pass it as batch_sampler=")
            if sampler is None and isinstance(dataset, MapDataset):
                sampler = dataset.sampler(shuffle=self.shuffle, remainder=self.remainder or "drop")
            if sampler is not None:
                kwargs["sampler"] = sampler
            else:
                kwargs["shuffle"] = self.shuffle
            kwargs.update(batch_size=batch_size, drop_last=drop_last)
            batched = batch_size is not None
            if batched:
                default = dataset.collate if isinstance(dataset, Collating) else checked_default_collate
            else:
                default = default_convert
        collate = self.collate_fn or default
        return Resolved(kwargs, batched, collate, default=collate is checked_default_collate)


@dataclass
class Resolved:
    """A :class:`ReadPlan` resolved for one dataset.

    Attributes:
        kwargs (dict): the DataLoader's ``batch_size`` and ``drop_last``, and its ``sampler`` (with
            ``shuffle`` when there is none) or ``batch_sampler``.
        batched (bool): the reader batches (True), or the dataset yields finished batches or samples.
        collate (Callable): the collate function chosen (the caller's, the dataset's own, ``as_is``,
            or torch's default), before any wrapping.
        default (bool): ``collate`` is the default collate function, chosen here (torch's ``default_collate``
            that says why samples do not batch: a transport may stack its tensors elsewhere).
    """

    kwargs: dict[str, Any]
    batched: bool
    collate: Collate
    default: bool = False


__all__ = ["Collate", "ReadPlan", "Resolved"]
