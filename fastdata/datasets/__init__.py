"""The public Dataset classes, one module each, composing a storage, a format, the world and an error
policy (see ``_base``). Imported on first use: a backend whose libraries are missing fails only when used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.datasets._hdf5 import HDF5Dataset
    from fastdata.datasets._indexed_tar import IndexedTarDataset
    from fastdata.datasets._mix import Mix
    from fastdata.datasets._s3 import S3Dataset
    from fastdata.datasets._tar_shards import TarShardDataset
    from fastdata.datasets._video import VideoClipDataset

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "HDF5Dataset": "._hdf5",
        "IndexedTarDataset": "._indexed_tar",
        "Mix": "._mix",
        "S3Dataset": "._s3",
        "TarShardDataset": "._tar_shards",
        "VideoClipDataset": "._video",
    },
)

__all__ = ["HDF5Dataset", "IndexedTarDataset", "Mix", "S3Dataset", "TarShardDataset", "VideoClipDataset"]
