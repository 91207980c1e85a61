"""The checks :class:`fastdata.Loader` makes at construction: who reads, and the dataset, batch size,
sampler and batch sampler it is given (so that a combination that cannot resume exactly fails now)."""

from __future__ import annotations

from typing import Any, Literal

from fastdata.core.epoch import Remainder
from fastdata.core.errors import ConfigError, check_choice, check_positive
from fastdata.loading._builder import Transport
from fastdata.loading._protocol import BatchingDataset, MapDataset, ResumableBatchSampler, ResumableSampler
from fastdata.loading.observe.tune import Requested

Workers = Literal["processes", "threads"]
"""Who reads: ``"processes"``, DataLoader worker processes (each with ``threads_per_worker`` threads), or
``"threads"``, threads of the training process (:mod:`fastdata.loading.threads`)."""


def check_mode(
    workers: str,
    num_workers: int | str,
    threads_per_worker: int,
    transport: str | None,
    worker_init_fn: Any,
    kwargs: dict[str, Any] | None = None,
) -> Requested:
    """Who reads, and how: refuse what does not go together (see :class:`fastdata.Loader`); ``num_workers``
    and ``prefetch_factor`` (in ``kwargs``) checked once, as the loader hands them to its session."""
    check_choice("workers", workers, Workers)
    prefetch = (kwargs or {}).get("prefetch_factor")
    auto = [
        f"{name}='auto'" for name, v in (("num_workers", num_workers), ("prefetch_factor", prefetch)) if v == "auto"
    ]
    if auto and workers == "threads":
        raise ConfigError(
            f"{' and '.join(auto)}: the autotuner moves worker processes (restarting them mid-epoch), and "
            'workers="threads" has none; pass counts (num_workers=4; `fastdata bench` says how many), or use '
            'workers="processes" to have them tuned'
        )
    requested = Requested.of(num_workers, prefetch)
    num_workers = requested.workers or 0
    check_positive("threads_per_worker", threads_per_worker)
    if transport is not None:
        check_choice("transport", transport, Transport)
    if workers == "threads":
        if not num_workers:
            raise ConfigError('workers="threads" reads in num_workers threads: pass num_workers >= 1')
        if threads_per_worker != 1 or transport is not None:
            raise ConfigError(
                'threads_per_worker and transport are for worker processes; with workers="threads" '
                "num_workers threads read, and batches stay in this process: leave them out"
            )
        if worker_init_fn is not None:
            raise ConfigError(
                'worker_init_fn runs in worker processes; with workers="threads" there are none (each '
                "thread's dataset copy is warmed up as a worker's would be): leave it out"
            )
    return requested


def check_iterable(
    ds: Any,
    batch_size: int | None,
    shuffle: bool | None,
    remainder: Remainder | None,
    drop_last: bool | None,
    sampler: Any,
    kwargs: dict[str, Any],
) -> int:
    name = type(ds).__name__
    if sampler is not None:
        raise ConfigError(f"{name} is iterable and reads its own part of the epoch: pass no sampler")
    if "collate_fn" in kwargs:
        raise ConfigError(f"{name} batches itself: pass collate_fn to the dataset, not the Loader")
    if not isinstance(ds, BatchingDataset) or ds.batch_size is None:
        raise ConfigError(
            f"Loader needs {name}(batch_size=...): an iterable dataset batches itself, so that "
            "its batches do not depend on num_workers and can be resumed"
        )
    own = ds.batch_size
    if batch_size is not None and batch_size != own:
        raise ConfigError(f"batch_size={batch_size} differs from {name}(batch_size={own}); pass one or the other")
    for option, given, planned in (
        ("shuffle", shuffle, ds.shuffle),
        ("remainder", remainder, ds.remainder),
        ("drop_last", drop_last, ds.drop_last),
    ):
        if given is not None and given != planned:
            raise ConfigError(
                f"{option}={given!r} differs from {name}({option}={planned!r}); "
                f"an iterable dataset plans its epoch itself, so set {option} there"
            )
    return int(own)


def check_plain_iterable(
    ds: Any,
    batch_size: int | None,
    shuffle: bool | None,
    remainder: Remainder | None,
    sampler: Any,
    batch_sampler: Any,
    workers: str,
    num_workers: int | str,
) -> int | None:
    """A plain ``IterableDataset`` (not a fastdata one) is read as is: its order, shuffling and split over
    workers are its own, so the options that would set them here are refused. Returns the batch size (None:
    items handed out as the dataset yields them)."""
    name = type(ds).__name__
    for option, given in (("shuffle", shuffle), ("remainder", remainder), ("sampler", sampler)):
        if given is not None:
            raise ConfigError(
                f"{option}= does not apply to {name}: an IterableDataset is read as is, its order and its split "
                "over workers and ranks are its own; leave it out (or give the dataset __getitem__ and __len__, "
                "and the Loader shuffles, splits and resumes it)"
            )
    if batch_sampler is not None:
        raise ConfigError(f"{name} is iterable: a batch_sampler cannot pick its items; pass batch_size= instead")
    if batch_size is not None:
        check_positive("batch_size", batch_size)
    if workers == "threads" and isinstance(num_workers, int) and num_workers > 1:
        raise ConfigError(
            f'workers="threads" with num_workers={num_workers}: each loader thread would read all of {name} '
            "(torch.utils.data.get_worker_info() is None in a thread, so the dataset cannot split itself); "
            'use worker processes (workers="processes"), or one thread'
        )
    return batch_size


def check_batch_sampler(
    batch_sampler: Any,
    batch_size: int | None,
    shuffle: bool | None,
    remainder: Remainder | None,
    drop_last: bool | None,
    sampler: Any,
) -> int:
    if not isinstance(batch_sampler, ResumableBatchSampler):
        raise ConfigError(
            f"batch_sampler {type(batch_sampler).__name__} cannot resume (it needs set_epoch, state_dict, "
            "load_state_dict, batch_size and samples); use HDF5Dataset.chunk_sampler(batch_size), or "
            "pass batch_size= and let the Loader batch"
        )
    if sampler is not None:
        raise ConfigError("pass a sampler or a batch_sampler, not both")
    if shuffle is not None or remainder is not None or drop_last is not None:
        raise ConfigError("pass shuffle/remainder/drop_last to the batch sampler you built, not to the Loader")
    if batch_size is not None and batch_size != batch_sampler.batch_size:
        raise ConfigError(
            f"batch_size={batch_size} differs from the batch sampler's {batch_sampler.batch_size}; "
            "pass one or the other"
        )
    return int(batch_sampler.batch_size)


def make_sampler(dataset: Any, sampler: Any, shuffle: bool | None, remainder: Remainder | None) -> Any:
    if sampler is None:
        if not isinstance(dataset, MapDataset):
            raise ConfigError(
                f"Loader needs {type(dataset).__name__}.sampler() (a rank-aware sampler), or pass sampler="
            )
        return dataset.sampler(shuffle=True if shuffle is None else shuffle, remainder=remainder or "drop")
    if shuffle is not None or remainder is not None:
        raise ConfigError("pass shuffle/remainder to the sampler you built, not to the Loader")
    if isinstance(sampler, ResumableBatchSampler):
        raise ConfigError(f"{type(sampler).__name__} yields whole batches: pass it as batch_sampler=")
    if not isinstance(sampler, ResumableSampler):
        raise ConfigError(
            f"sampler {type(sampler).__name__} cannot resume (it needs epoch, set_epoch, state_dict and "
            "load_state_dict); use fastdata.loading.EpochSampler"
        )
    return sampler


__all__ = ["Workers", "check_batch_sampler", "check_iterable", "check_mode", "check_plain_iterable", "make_sampler"]
