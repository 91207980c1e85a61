"""The HDF5 and video inspectors of ``fastdata inspect`` (see :mod:`fastdata.inspection`).

Both formats are read from local files only (h5py
and the decoders open paths); an object of either kind under an ``s3://`` prefix is listed, not opened.
"""

from __future__ import annotations

import os
from typing import Any

from fastdata.inspection.report import FileReport, sha256_of


def _local_only(url: str, fmt: str, why: str) -> FileReport | None:
    """The report for a file of ``fmt`` on S3 (listed, not opened: ``why``), or None for a local file."""
    from fastdata.storage import open_reader, scheme

    if not scheme(url):
        return None
    reader = open_reader(url)
    try:
        return FileReport(url, fmt, bytes=reader.size, notes=[f"not opened: {why}"])
    finally:
        reader.close()


def _plain(value: Any) -> Any:
    """An HDF5 attribute as JSON types (bytes decoded, arrays as lists)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool)) or value is None else repr(value)


def _h5_dtype(ds: Any) -> str:
    import h5py

    strings = h5py.check_string_dtype(ds.dtype)
    if strings is not None and strings.length is None:
        return "str (variable length)"
    vlen = h5py.check_vlen_dtype(ds.dtype)
    return f"{vlen} (variable length)" if vlen is not None else str(ds.dtype)


def inspect_hdf5(url: str, checksum: bool = False) -> FileReport:
    """Open an HDF5 file read-only and report every dataset in it (each one a candidate field) and the
    file's attributes; fields of unequal lengths are a problem (a sample is one row of every field)."""
    import h5py

    remote = _local_only(url, "hdf5", "HDF5 files are read from local disk (copy the file first)")
    if remote is not None:
        return remote
    report = FileReport(url, "hdf5", bytes=os.path.getsize(url))
    try:
        f = h5py.File(url, "r")
    except OSError as e:
        report.bad.append(f"{url}: HDF5 cannot open it ({e}); the file is truncated or not HDF5: re-create it")
        report.complete = False
        return report
    with f:
        found: dict[str, Any] = {}

        def visit(name: str, obj: Any) -> None:  # (a visitor that returns a value stops the visit)
            if isinstance(obj, h5py.Dataset):
                found[name] = obj

        f.visititems(visit)
        fields: dict[str, dict[str, Any]] = {}
        for name, ds in sorted(found.items()):
            fields[name] = {
                "length": int(ds.shape[0]) if ds.ndim else None,
                "shape": list(ds.shape),
                "dtype": _h5_dtype(ds),
                "chunks": list(ds.chunks) if ds.chunks else None,
                "compression": ds.compression,
            }
            if ds.attrs:
                fields[name]["attrs"] = {k: _plain(v) for k, v in ds.attrs.items()}
        attrs = {k: _plain(v) for k, v in f.attrs.items()}
    lengths = {name: d["length"] for name, d in fields.items() if d["length"] is not None}
    scalars = sorted(set(fields) - set(lengths))
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
        report.bad.append(
            f"{url}: fields have unequal lengths ({listed}); HDF5Dataset reads one row of every "
            "field it is given per sample: pass fields=(...) of equal length, or fix the file"
        )
    if not lengths:
        report.notes.append("no dataset with rows: nothing HDF5Dataset can read")
    if scalars:
        report.notes.append(f"scalar datasets (not fields): {', '.join(map(repr, scalars))}")
    report.samples = min(lengths.values(), default=0)
    report.extensions = lengths
    report.details = {"fields": fields, "attrs": attrs}
    if checksum:
        report.sha256 = sha256_of(url)
    return report


HDF5_SUFFIXES = (".h5", ".hdf5", ".he5")


def inspect_video(url: str, checksum: bool = False) -> FileReport:
    """Probe a video through the video index (as :class:`fastdata.VideoClipDataset` does: open it, find
    the stream every decoder reads, count its frames, decode the first one) with the default ``pyav``
    decoder; name it if it cannot be read (a file cut short, damaged, not a video)."""
    from fastdata.formats.video import reader_class
    from fastdata.formats.video.base import VideoMeta
    from fastdata.formats.video.meta_cache import VideoIndex
    from fastdata.formats.video.stream import StreamInfo

    remote = _local_only(url, "video", "videos are decoded from local files (copy them first)")
    if remote is not None:
        return remote
    report = FileReport(url, "video", bytes=os.path.getsize(url))
    # no index file: inspecting must not change what a later training run finds in its cache
    outcome = VideoIndex(None, "pyav").build([url], reader_class("pyav").probe)[url]
    if not isinstance(outcome, VideoMeta):
        report.bad.append(str(outcome))
        report.complete = False
        return report
    info = StreamInfo.from_meta(outcome)
    assert info is not None  # the pyav probe stores it
    report.samples = outcome.frames
    report.extensions = {info.codec: 1}
    report.details = {
        "codec": info.codec,
        "frames": outcome.frames,
        "fps": round(outcome.fps, 3),
        "width": outcome.width,  # as displayed (after the display matrix)
        "height": outcome.height,
        "seconds": round(outcome.frames / outcome.fps, 3) if outcome.fps else None,
        "stream": info.index,
        "video_streams": info.streams,
        "rotation": info.display.angle if not info.display.mirrored else f"{info.display.angle} mirrored",
        "constant_frame_rate": info.table.constant_rate,
    }
    if info.streams > 1:
        report.notes.append(
            f"{info.streams} video streams: stream {info.index} is read (FFmpeg's choice); OpenCV can read "
            "only the first" + ("" if info.first else ", so decoder='opencv' refuses this file")
        )
    if checksum:
        report.sha256 = sha256_of(url)
    return report
