"""fastdata: fast, worker-safe PyTorch datasets for tar shards, HDF5, video and S3.

Every public name is imported on first use: ``import fastdata`` (and so the ``fastdata`` command) does
not pay for torch until a dataset is asked for, and a backend whose optional libraries (h5py, decord,
boto3) are missing fails with an install hint only when it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fastdata.core.errors import (
    BadSample,
    BadSampleWarning,
    ConfigError,
    CorruptShard,
    DecodeFailed,
    FastdataError,
    PlanError,
    SourceNotFound,
    SourceUnavailable,
    SourceUnreadable,
    SubstituteWarning,
    TooManyBadSamples,
    UnsafeMember,
)
from fastdata.core.version import __version__ as __version__

if TYPE_CHECKING:
    from fastdata import bench
    from fastdata.core import errors
    from fastdata.core.seeding import WorkerInit, compose_worker_init, worker_init_fn
    from fastdata.core.world import World
    from fastdata.datasets.hdf5 import HDF5Dataset
    from fastdata.datasets.indexed_tar import IndexedTarDataset
    from fastdata.datasets.s3 import S3Dataset
    from fastdata.datasets.tar_shards import TarShardDataset
    from fastdata.datasets.video import VideoClipDataset
    from fastdata.formats.decode import Decoder
    from fastdata.loading.autotune import AutoTune
    from fastdata.loading.loader import Loader, as_is
    from fastdata.loading.monitor import Monitor, monitor
    from fastdata.loading.sampler import EpochSampler


# name -> (module, the extra that provides its libraries, or None when it needs only the core)
_LAZY: dict[str, tuple[str, str | None]] = {
    "as_is": ("fastdata.loading.loader", None),
    "AutoTune": ("fastdata.loading.autotune", None),
    "bench": ("fastdata.bench", None),
    "errors": ("fastdata.core.errors", None),
    "Decoder": ("fastdata.formats.decode", None),
    "EpochSampler": ("fastdata.loading.sampler", None),
    "HDF5Dataset": ("fastdata.datasets.hdf5", "hdf5"),
    "IndexedTarDataset": ("fastdata.datasets.indexed_tar", None),
    "Loader": ("fastdata.loading.loader", None),
    "Monitor": ("fastdata.loading.monitor", None),
    "S3Dataset": ("fastdata.datasets.s3", "s3"),
    "TarShardDataset": ("fastdata.datasets.tar_shards", None),
    "VideoClipDataset": ("fastdata.datasets.video", "video"),
    "WorkerInit": ("fastdata.core.seeding", None),
    "World": ("fastdata.core.world", None),
    "compose_worker_init": ("fastdata.core.seeding", None),
    "monitor": ("fastdata.loading.monitor", None),
    "worker_init_fn": ("fastdata.core.seeding", None),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fastdata' has no attribute {name!r}")
    module, extra = _LAZY[name]
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        if extra is None:
            raise
        raise ImportError(f"fastdata.{name} needs {e.name}; install it with pip install 'fastdata[{extra}]'") from e
    # a module named like the name is the value (fastdata.bench), unless it holds the name (fastdata.monitor)
    value = mod if module.endswith(name) and not hasattr(mod, name) else getattr(mod, name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AutoTune",
    "BadSample",
    "BadSampleWarning",
    "ConfigError",
    "CorruptShard",
    "DecodeFailed",
    "Decoder",
    "EpochSampler",
    "FastdataError",
    "HDF5Dataset",
    "IndexedTarDataset",
    "Loader",
    "Monitor",
    "PlanError",
    "S3Dataset",
    "SourceNotFound",
    "SourceUnavailable",
    "SourceUnreadable",
    "SubstituteWarning",
    "TarShardDataset",
    "TooManyBadSamples",
    "UnsafeMember",
    "VideoClipDataset",
    "WorkerInit",
    "World",
    "as_is",
    "bench",
    "errors",
    "compose_worker_init",
    "monitor",
    "worker_init_fn",
]
