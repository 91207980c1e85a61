"""fastdata: fast, worker-safe PyTorch datasets for tar shards, HDF5, video and S3.

Every public name is imported on first use: ``import fastdata`` (and so the ``fastdata`` command) does
not pay for torch until a dataset is asked for, and a backend whose optional libraries (h5py, decord,
boto3) are missing fails with an install hint only when it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fastdata.core._version import __version__ as __version__
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
    from fastdata.core.epoch._seeding import worker_init_fn
    from fastdata.datasets._s3 import S3Dataset
    from fastdata.datasets.hdf5._dataset import HDF5Dataset
    from fastdata.datasets.mix._mix import Mix
    from fastdata.datasets.tar._indexed import IndexedTarDataset
    from fastdata.datasets.tar._shards import TarShardDataset
    from fastdata.datasets.video._dataset import VideoClipDataset
    from fastdata.formats._decode import Decoder
    from fastdata.loading._loader import Loader, as_is
    from fastdata.loading.observe._autotune import AutoTune
    from fastdata.loading.observe._monitor import monitor


# name -> (module, the extra that provides its libraries, or None when it needs only the core)
_LAZY: dict[str, tuple[str, str | None]] = {
    "as_is": ("fastdata.loading._loader", None),
    "AutoTune": ("fastdata.loading.observe._autotune", None),
    "bench": ("fastdata.bench", None),
    "Decoder": ("fastdata.formats._decode", None),
    "HDF5Dataset": ("fastdata.datasets.hdf5._dataset", "hdf5"),
    "IndexedTarDataset": ("fastdata.datasets.tar._indexed", None),
    "Loader": ("fastdata.loading._loader", None),
    "Mix": ("fastdata.datasets.mix._mix", None),
    "S3Dataset": ("fastdata.datasets._s3", "s3"),
    "TarShardDataset": ("fastdata.datasets.tar._shards", None),
    "VideoClipDataset": ("fastdata.datasets.video._dataset", "video"),
    "monitor": ("fastdata.loading.observe._monitor", None),
    "worker_init_fn": ("fastdata.core.epoch._seeding", None),
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
