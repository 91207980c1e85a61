"""The HDF5 and video inspectors of ``fastdata inspect`` (see :mod:`fastdata.inspection`).

Both formats are read from local files only (h5py
and the decoders open paths); an object of either kind under an ``s3://`` prefix is listed, not opened.
"""

from __future__ import annotations

import os
from typing import Any

from fastdata.inspection._report import FileReport, sha256_of


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

    try:
        dtype = ds.dtype
    except (TypeError, ValueError) as e:  # no numpy type (HDF5 time types, quad precision)
        return f"unreadable by h5py ({e})"
    strings = h5py.check_string_dtype(dtype)
    if strings is not None and strings.length is None:
        return "str (variable length)"
    vlen = h5py.check_vlen_dtype(dtype)
    return f"{vlen} (variable length)" if vlen is not None else str(dtype)


def _attrs(obj: Any) -> dict[str, Any]:
    """An object's attributes as JSON types; one h5py cannot read is reported as such, not raised."""
    out: dict[str, Any] = {}
    for key in obj.attrs:
        try:
            out[key] = _plain(obj.attrs[key])
        except (OSError, TypeError, ValueError) as e:
            out[key] = f"<unreadable: {e}>"
    return out


def _field(url: str, name: str, ds: Any) -> tuple[dict[str, Any], str]:
    """One dataset's facts, and why ``HDF5Dataset`` would refuse it as a field ("" when it reads it)."""
    from fastdata.core.errors import FastdataError
    from fastdata.formats.hdf5 import field_info

    shape = ds.shape  # None: a null dataspace (h5py.Empty)
    fact: dict[str, Any] = {
        "length": int(shape[0]) if shape else None,
        "shape": list(shape) if shape is not None else None,
        "dtype": _h5_dtype(ds),
        "chunks": list(ds.chunks) if ds.chunks else None,
        "compression": ds.compression,
    }
    attrs = _attrs(ds)
    if attrs:
        fact["attrs"] = attrs
    if not shape:
        return fact, ""
    try:
        info = field_info(ds, name, url)
    except FastdataError as e:  # a datatype or filter it refuses (or a linked file gone meanwhile)
        return fact, str(e)
    if info.source is not None:
        fact["linked_file"] = info.source
    return fact, ""


def _datasets(f: Any) -> tuple[dict[str, Any], list[str]]:
    """Every dataset reachable from the file's links (external links too), and a line per broken link."""
    import h5py

    found: dict[str, Any] = {}
    broken: list[str] = []

    def visit(name: str, link: Any) -> None:
        if isinstance(link, h5py.HardLink):
            obj = f.get(name)
        else:  # a soft or external link: follow it, as HDF5Dataset does
            try:
                obj = f[name]
            except (KeyError, OSError):
                target = f"{link.filename}:{link.path}" if isinstance(link, h5py.ExternalLink) else link.path
                broken.append(f"{name!r} -> {target} (a link to nothing)")
                return
        if isinstance(obj, h5py.Dataset):
            found[name] = obj

    if hasattr(f, "visititems_links"):  # h5py >= 3.11
        f.visititems_links(visit)
    else:  # older h5py: objects reached through hard links only
        f.visititems(lambda name, obj: found.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return found, broken


def inspect_hdf5(url: str, checksum: bool = False) -> FileReport:
    """Open an HDF5 file read-only and report every dataset in it (each one a candidate field) and the
    file's attributes; fields of unequal lengths are a problem (a sample is one row of every field).
    Scalar, empty and null-dataspace datasets are listed (not fields); datasets ``HDF5Dataset`` refuses
    (datatypes it does not read, a missing compression filter) and broken links are noted with why."""
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
        found, broken = _datasets(f)
        fields: dict[str, dict[str, Any]] = {}
        refused: dict[str, str] = {}
        for name, ds in sorted(found.items()):
            fields[name], why = _field(url, name, ds)
            if why:
                refused[name] = why
        attrs = _attrs(f)
        pandas = _pandas_layouts(f)
    # pandas' format='fixed' keeps column names beside the columns (axis0, blockN_items): not rows
    labels = {name for group, kind in pandas.items() for name in fields if _pandas_label(group, kind, name)}
    lengths = {name: d["length"] for name, d in fields.items() if d["length"] is not None and name not in labels}
    scalars = sorted(set(fields) - set(lengths) - labels)
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
        report.bad.append(
            f"{url}: fields have unequal lengths ({listed}); HDF5Dataset reads one row of every "
            "field it is given per sample: pass fields=(...) of equal length, or fix the file"
        )
    if not lengths:
        report.notes.append("no dataset with rows: nothing HDF5Dataset can read")
    if scalars:
        report.notes.append(f"scalar or null-dataspace datasets (not fields): {', '.join(map(repr, scalars))}")
    for group, kind in pandas.items():
        report.notes.append(_pandas_note(group, kind, sorted(n for n in lengths if n.startswith(f"{group}/"))))
    for name, why in refused.items():
        report.notes.append(f"field {name!r} cannot be read by HDF5Dataset: {why}")
    for line in broken:
        report.notes.append(f"broken link: {line}")
    report.samples = min(lengths.values(), default=0)
    report.extensions = lengths
    report.details = {"fields": fields, "attrs": attrs}
    if checksum:
        report.sha256 = sha256_of(url)
    return report


def _pandas_layouts(f: Any) -> dict[str, str]:
    """Groups written by pandas' ``to_hdf`` (through PyTables), by name: their ``pandas_type``
    (``"frame"``/``"series"``: format='fixed'; ``"frame_table"``/``"series_table"``: format='table')."""
    out: dict[str, str] = {}

    def visit(name: str, obj: Any) -> None:
        kind = obj.attrs.get("pandas_type") if hasattr(obj, "keys") else None
        if kind is not None:
            out[name] = kind.decode() if isinstance(kind, bytes) else str(kind)

    f.visititems(visit)
    return out


def _pandas_label(group: str, kind: str, name: str) -> bool:
    """Whether dataset ``name`` holds the column names of a pandas format='fixed' frame in ``group``."""
    leaf = name[len(group) + 1 :] if name.startswith(f"{group}/") else None
    return (
        kind == "frame"
        and leaf is not None
        and (leaf == "axis0" or (leaf.startswith("block") and leaf.endswith("_items")))
    )


def _pandas_note(group: str, kind: str, rows: list[str]) -> str:
    """What ``fastdata inspect`` says about a pandas group: its layout and the fields that read it."""
    if kind.endswith("_table"):
        return (
            f"{group}: a pandas {kind.split('_')[0]} saved with format='table' (PyTables): one row per sample, "
            f"read it with HDF5Dataset(fields=({group + '/table'!r},)) (a record of every column)"
        )
    if kind in ("frame", "series"):
        listed = ", ".join(map(repr, rows)) + ("," if len(rows) == 1 else "")
        return (
            f"{group}: a pandas {kind} saved with format='fixed' (to_hdf's default): its rows are "
            f"{listed} (columns grouped by dtype; the column names are in {group}/axis0, "
            f"{group}/blockN_items): read them with HDF5Dataset(fields=({listed})), or save with "
            "format='table' for one record per row"
        )
    return (
        f"{group}: a pandas object of layout {kind!r}, which HDF5Dataset does not read: save the data with "
        "to_hdf(..., format='table')"
    )


HDF5_SUFFIXES = (".h5", ".hdf5", ".he5")


def inspect_video(url: str, checksum: bool = False) -> FileReport:
    """Probe a video through the video index (as :class:`fastdata.VideoClipDataset` does: open it, find
    the stream every decoder reads, count its frames, decode the first one) with the default ``pyav``
    decoder; name it if it cannot be read (a file cut short, damaged, not a video)."""
    from fastdata.formats.video import StreamInfo, VideoIndex, VideoMeta, reader_class

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
