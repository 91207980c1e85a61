"""``VideoClipDataset`` (``_dataset``) and where its clips start (``_plan``: pure functions of seed, epoch,
video and clip)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.datasets.video._dataset import VideoClipDataset

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "VideoClipDataset",
]
