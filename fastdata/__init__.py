"""fastdata: fast, worker-safe PyTorch datasets for tar shards, HDF5, video and S3.

Backends that need optional libraries (h5py, decord, boto3) are imported on first use, so
``import fastdata`` stays light and a missing extra fails with an install hint.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fastdata.datasets.indexed_tar import IndexedTarDataset
from fastdata.datasets.tar_shards import TarShardDataset
from fastdata.decode import Decoder
from fastdata.errors import (
    BadSample,
    ConfigError,
    CorruptShard,
    DecodeFailed,
    FastdataError,
    PlanError,
    SourceNotFound,
    SourceUnreadable,
    UnsafeMember,
)
from fastdata.loader import Loader
from fastdata.sampler import EpochSampler
from fastdata.worker import WorkerInit, compose_worker_init, worker_init_fn
from fastdata.world import World

if TYPE_CHECKING:
    from fastdata import bench
    from fastdata.datasets.hdf5 import HDF5Dataset
    from fastdata.datasets.s3 import S3Dataset
    from fastdata.datasets.video import VideoClipDataset

__version__ = "0.1.0"

# name -> (module, the extra that provides its libraries)
_LAZY: dict[str, tuple[str, str | None]] = {
    "bench": ("fastdata.bench", None),
    "HDF5Dataset": ("fastdata.datasets.hdf5", "hdf5"),
    "S3Dataset": ("fastdata.datasets.s3", "s3"),
    "VideoClipDataset": ("fastdata.datasets.video", "video"),
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
    return mod if module.endswith(name) else getattr(mod, name)


__all__ = [
    "BadSample",
    "ConfigError",
    "CorruptShard",
    "DecodeFailed",
    "Decoder",
    "EpochSampler",
    "FastdataError",
    "HDF5Dataset",
    "IndexedTarDataset",
    "Loader",
    "PlanError",
    "S3Dataset",
    "SourceNotFound",
    "SourceUnreadable",
    "TarShardDataset",
    "UnsafeMember",
    "VideoClipDataset",
    "WorkerInit",
    "World",
    "bench",
    "compose_worker_init",
    "worker_init_fn",
]
