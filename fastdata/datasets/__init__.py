"""The public Dataset classes, one module each, composing a storage, a format, the world and an error
policy (see ``_base``). Imported on first use: a backend whose libraries are missing fails only when used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.datasets._s3 import S3Dataset
    from fastdata.datasets.hdf5._dataset import HDF5Dataset
    from fastdata.datasets.mix._mix import Mix
    from fastdata.datasets.tar._indexed import IndexedTarDataset
    from fastdata.datasets.tar._shards import TarShardDataset
    from fastdata.datasets.video._dataset import VideoClipDataset

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "HDF5Dataset",
    "IndexedTarDataset",
    "Mix",
    "S3Dataset",
    "TarShardDataset",
    "VideoClipDataset",
]
