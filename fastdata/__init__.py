"""fastdata: fast, worker-safe PyTorch datasets for tar shards, HDF5, video and S3.

Every public name is imported on first use: ``import fastdata`` (and so the ``fastdata`` command) does
not pay for torch until a dataset is asked for, and a backend whose optional libraries (h5py, decord,
boto3) are missing fails with an install hint only when it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fastdata.core import __version__ as __version__
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

if TYPE_CHECKING:
    from fastdata import bench
    from fastdata.core.epoch import worker_init_fn
    from fastdata.datasets import S3Dataset
    from fastdata.datasets.hdf5 import HDF5Dataset
    from fastdata.datasets.mix import Mix
    from fastdata.datasets.tar import IndexedTarDataset, TarShardDataset
    from fastdata.datasets.video import VideoClipDataset
    from fastdata.formats import Decoder
    from fastdata.loading import Loader, as_is
    from fastdata.loading.observe._autotune_types import AutoTune
    from fastdata.loading.observe._monitor import monitor


# name -> (module, the extra that provides its libraries, or None when it needs only the core)
_LAZY: dict[str, tuple[str, str | None]] = {
    "as_is": ("fastdata.loading", None),
    "AutoTune": ("fastdata.loading.observe", None),
    "bench": ("fastdata.bench", None),
    "Decoder": ("fastdata.formats", None),
    "HDF5Dataset": ("fastdata.datasets", "hdf5"),
    "IndexedTarDataset": ("fastdata.datasets", None),
    "Loader": ("fastdata.loading", None),
    "Mix": ("fastdata.datasets", None),
    "S3Dataset": ("fastdata.datasets", "s3"),
    "TarShardDataset": ("fastdata.datasets", None),
    "VideoClipDataset": ("fastdata.datasets", "video"),
    "monitor": ("fastdata.loading.observe", None),
    "worker_init_fn": ("fastdata.core", None),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fastdata' has no attribute {name!r}")
    module, extra = _LAZY[name]
    try:
        mod = importlib.import_module(module)
        # a module named like the name is the value (fastdata.bench); a face's lazy name imports its libraries
        value = mod if module.endswith(name) else getattr(mod, name)
    except ImportError as e:
        if extra is None:
            raise
        raise ImportError(f"fastdata.{name} needs {e.name}; install it with pip install 'fastdata[{extra}]'") from e
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
    "FastdataError",
    "HDF5Dataset",
    "IndexedTarDataset",
    "Loader",
    "Mix",
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
    "as_is",
    "bench",
    "monitor",
    "worker_init_fn",
]
