"""Which inspector reads which file: by its content (magic bytes, :mod:`fastdata.inspection`) for
a local file, else by suffix. Add one with :func:`register_inspector`."""

from __future__ import annotations

from collections.abc import Callable

from fastdata.formats.video import VIDEO_EXTENSIONS
from fastdata.inspection._media import HDF5_SUFFIXES, inspect_hdf5, inspect_video
from fastdata.inspection._report import FileReport
from fastdata.inspection._sniff import sniff
from fastdata.inspection._tar import inspect_tar

Inspector = Callable[[str, bool], FileReport]  # (url, compute sha256) -> report
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2", ".tar.zst", ".tzst")
INSPECTORS: dict[str, Inspector] = dict.fromkeys(TAR_SUFFIXES, inspect_tar)
for _suffix in (*HDF5_SUFFIXES, ".nc", ".nc4", ".h5ad", ".hdf", ".loom"):
    INSPECTORS[_suffix] = inspect_hdf5
for _suffix in sorted(VIDEO_EXTENSIONS):
    INSPECTORS[_suffix] = inspect_video
BY_CONTENT: dict[str, Inspector] = {"tar": inspect_tar, "hdf5": inspect_hdf5, "video": inspect_video}
_REGISTERED: set[str] = set()  # suffixes given by register_inspector: they win over the content
# never data fastdata inspects, and common in the folders it does: not opened to sniff (a photo folder)
NOT_SNIFFED = (
    ".idx", ".json", ".txt", ".md", ".csv", ".cls", ".py", ".jpg", ".jpeg", ".png", ".gif", ".bmp",
    ".webp", ".tif", ".tiff", ".ppm", ".pgm",
)  # fmt: skip


def register_inspector(suffix: str, inspector: Inspector) -> None:
    """Make :func:`~fastdata.inspection.inspect_paths` use ``inspector`` for files ending in ``suffix``
    (before any look at their content)."""
    INSPECTORS[suffix] = inspector
    _REGISTERED.add(suffix)


def _by_name(name: str) -> Inspector | None:
    low = name.lower()
    return next((INSPECTORS[s] for s in sorted(INSPECTORS, key=len, reverse=True) if low.endswith(s)), None)


def is_known(name: str) -> bool:
    """Whether some inspector reads files named like ``name`` (by suffix alone: for S3 objects, which are
    not opened to be told apart)."""
    return _by_name(name) is not None


def inspector_for(url: str, *, sniffed: bool = True) -> Inspector | None:
    """The inspector of ``url``: one registered for its suffix, else, for a local file, the one its
    first bytes call for (``sniffed``), else the one of its suffix; None when none applies."""
    from fastdata.storage import scheme

    low = url.lower()
    for suffix in _REGISTERED:
        if low.endswith(suffix):
            return INSPECTORS[suffix]
    if sniffed and not scheme(url):
        kind = sniff(url)
        if kind is not None:
            return BY_CONTENT[kind]
    return _by_name(url)


def worth_sniffing(name: str) -> bool:
    """Whether a file met in a folder walk is opened to be told by its content (not an image, an index
    or a text file, which fastdata never inspects)."""
    return not name.lower().endswith(NOT_SNIFFED) and not name.startswith(".")
