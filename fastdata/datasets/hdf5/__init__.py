"""``HDF5Dataset`` (``_dataset``) and the batch its ``__getitems__`` returns with the collate that reads its
columns (``_batch``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.datasets.hdf5._dataset import HDF5Dataset

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "HDF5Dataset",
]
