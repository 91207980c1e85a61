"""Which inspector reads which file: by suffix. Add one with :func:`register_inspector`."""

from __future__ import annotations

from collections.abc import Callable

from fastdata.formats.video import VIDEO_EXTENSIONS
from fastdata.inspection._media import HDF5_SUFFIXES, inspect_hdf5, inspect_video
from fastdata.inspection._report import FileReport
from fastdata.inspection._tar import inspect_tar

Inspector = Callable[[str, bool], FileReport]  # (url, compute sha256) -> report
INSPECTORS: dict[str, Inspector] = {".tar": inspect_tar, ".tar.gz": inspect_tar, ".tgz": inspect_tar}
for _suffix in HDF5_SUFFIXES:
    INSPECTORS[_suffix] = inspect_hdf5
for _suffix in sorted(VIDEO_EXTENSIONS):
    INSPECTORS[_suffix] = inspect_video


def register_inspector(suffix: str, inspector: Inspector) -> None:
    """Make :func:`~fastdata.inspection._paths.inspect_paths` use ``inspector`` for files ending in ``suffix``."""
    INSPECTORS[suffix] = inspector


def is_known(name: str) -> bool:
    """Whether some inspector reads files named like ``name``."""
    return any(name.lower().endswith(s) for s in INSPECTORS)


def inspector_for(url: str) -> Inspector:
    """The inspector of ``url``'s suffix (see :func:`is_known`)."""
    return INSPECTORS[next(s for s in INSPECTORS if url.lower().endswith(s))]
