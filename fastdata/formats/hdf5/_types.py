"""What a field of an HDF5 file holds, judged by its datatype: the kind of value each row comes back as,
the native-byte-order numpy type it is read into, and the fields fastdata refuses (with the reason).

Values come back as h5py's ``ds[i]`` gives them, with the byte order made native (HDF5 converts while
reading), except where h5py's value would not collate or survive a batch: compound rows come back as
dicts of their members (``{"x": np.float64(..), ...}``; ``default_collate`` batches dicts), and
variable-length strings as ``str`` (as ``ds.asstr()[i]``). Datatypes h5py has no numpy type for (HDF5
time types, as PyTables' time columns use; floats wider than numpy's long double), opaque data, object
references and fields compressed with a filter this process cannot load are refused when the dataset is
built: :class:`UnsupportedField` names the file, the field, its datatype and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import h5py
import numpy as np
from h5py import h5t, h5z

from fastdata.core.errors import FastdataError

FieldKind = Literal["array", "compound", "bytes", "str", "object"]
"""How a field's rows come back: ``"array"`` fixed-size rows (numpy arrays or scalars; fixed-length
strings as ``bytes``), ``"compound"`` rows of an HDF5 compound type (a dict of the members),
``"bytes"`` variable-length ``uint8`` rows of a one-dimensional field (``bytes``; encoded images),
``"str"`` variable-length strings (``str``, or an array of them for rows of several), ``"object"``
other variable-length rows (numpy arrays of varying length)."""

PLUGIN_FILTERS = {
    307: "bzip2",
    32001: "blosc",
    32004: "lz4",
    32008: "bitshuffle",
    32013: "zfp",
    32015: "zstd",
    32017: "sz",
    32018: "fcidecomp",
    32024: "sz3",
    32026: "blosc2",
    32028: "sperr",
}
"""HDF5 filter ids registered with The HDF Group that the ``hdf5plugin`` package provides."""

_CLASS_NAMES = {
    h5t.INTEGER: "integer",
    h5t.FLOAT: "float",
    h5t.TIME: "time",
    h5t.STRING: "string",
    h5t.BITFIELD: "bitfield",
    h5t.OPAQUE: "opaque",
    h5t.COMPOUND: "compound",
    h5t.REFERENCE: "reference",
    h5t.ENUM: "enum",
    h5t.VLEN: "variable-length",
    h5t.ARRAY: "array",
}


class UnsupportedField(FastdataError, TypeError):
    """A field holds a datatype fastdata cannot read (or needs a filter this process lacks); raised when
    the dataset is built, whatever ``on_error`` says: leave the field out, or convert it as the message
    says."""


@dataclass(frozen=True)
class FieldType:
    """What :func:`field_type` found.

    Attributes:
        kind (FieldKind): how rows come back.
        dtype (np.dtype): numpy type of one element of the batch column, native byte order (for an HDF5
            array datatype, its element type: the array's shape joins ``row_shape``); for the
            variable-length kinds, h5py's object dtype with its metadata.
        read_dtype (np.dtype): numpy type of one element of the HDF5 dataset as read through HDF5
            (an HDF5 array datatype as a numpy subarray type), native byte order.
        row_shape (tuple[int, ...]): shape of one row as it comes back.
        plain (bool): rows are plain native bytes (numbers, or compounds and arrays of them) that could
            be read straight from the file when they are stored unfiltered.
    """

    kind: FieldKind
    dtype: np.dtype[Any]
    read_dtype: np.dtype[Any]
    row_shape: tuple[int, ...]
    plain: bool


def field_type(ds: Any, path: str, name: str) -> FieldType:
    """Classify the rows of the h5py dataset ``ds`` (field ``name`` of ``path``).

    Raises:
        UnsupportedField: a datatype fastdata does not read, with the reason and what to do.
    """
    tid = ds.id.get_type()
    try:
        dtype = ds.dtype
    except (TypeError, ValueError) as e:  # h5py has no numpy type for it
        raise UnsupportedField(_no_numpy_type(path, name, tid, e)) from None
    refused = _refusal(dtype, tid)
    if refused:
        what, fix = refused
        raise UnsupportedField(f"{path}: field {name!r} holds {what}, which fastdata does not read: {fix}")
    file_rows = tuple(int(s) for s in ds.shape[1:])
    strings = h5py.check_string_dtype(dtype)
    if strings is not None and strings.length is None:
        return FieldType("str", dtype, dtype, file_rows, False)
    vlen = h5py.check_vlen_dtype(dtype)
    if vlen is not None:
        one_d = not file_rows
        kind: FieldKind = "bytes" if one_d and vlen in (np.dtype(np.uint8), np.dtype(np.int8)) else "object"
        return FieldType(kind, dtype, dtype, file_rows, False)
    native = dtype.newbyteorder("=")  # all the way down (numpy's isnative misses subarrays' elements)
    element = native.base if native.subdtype is not None else native
    row_shape = file_rows + tuple(native.shape)
    kind = "compound" if element.names is not None else "array"
    return FieldType(kind, element, native, row_shape, _plain(dtype))  # plain as stored: byte order too


def _plain(dtype: np.dtype[Any]) -> bool:
    """Plain native numbers all the way down (no objects, strings or opaque bytes)."""
    if dtype.subdtype is not None:
        return _plain(dtype.subdtype[0])
    if dtype.names is not None:
        return all(_plain(dtype.fields[n][0]) for n in dtype.names)  # type: ignore[index]
    return dtype.kind in "biufc" and dtype.isnative


def _refusal(dtype: np.dtype[Any], tid: Any) -> tuple[str, str] | None:
    """``(what the field holds, what to do)`` for a datatype h5py maps to numpy that is still refused."""
    cls = tid.get_class()
    other = "leave the field out of fields=, or store it as numbers, strings or a compound of them"
    if h5py.check_ref_dtype(dtype) is not None:
        return (
            "HDF5 object or region references (pointers into the file, meaningless outside it)",
            "dereference them with h5py and store what they point to, or leave the field out of fields=",
        )
    if cls == h5t.OPAQUE:
        tag = tid.get_tag().decode("utf-8", "replace")
        return f"HDF5 opaque data ({tid.get_size()} bytes a row, tag {tag!r}; no numpy type says what it is)", other
    if cls == h5t.ARRAY and dtype.subdtype is not None and dtype.subdtype[0].kind == "O":
        return f"an HDF5 array datatype of variable-length elements ({dtype})", other
    return None


def _no_numpy_type(path: str, name: str, tid: Any, error: Exception) -> str:
    cls = tid.get_class()
    what = _CLASS_NAMES.get(cls, f"class {cls}")
    if cls == h5t.TIME:
        fix = (
            "HDF5 time types (PyTables' Time32/Time64 columns) have no numpy type: store the times as "
            "int64 or float64 seconds (PyTables reads them as float64), or leave the field out of fields="
        )
    elif cls == h5t.FLOAT:
        fix = (
            f"a {tid.get_size() * 8}-bit float (IEEE quadruple precision?) wider than numpy's long double: "
            "store it as float64 or np.longdouble, or leave the field out of fields="
        )
    else:
        fix = "leave the field out of fields=, or rewrite it in a numeric, string or compound type"
    return f"{path}: field {name!r} has an HDF5 {what} datatype that h5py cannot read ({error}); {fix}"


def filters(dcpl: Any) -> tuple[tuple[int, str], ...]:
    """``(filter id, name)`` of each filter of a dataset's creation property list, in pipeline order."""
    out = []
    for i in range(dcpl.get_nfilters()):
        code, _flags, _values, raw = dcpl.get_filter(i)
        name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw or "")
        out.append((int(code), name or PLUGIN_FILTERS.get(int(code), "")))
    return tuple(out)


def missing_filter(pipeline: tuple[tuple[int, str], ...]) -> str:
    """A sentence naming the first filter of ``pipeline`` that this process cannot load and how to get it;
    "" when every filter is available."""
    for code, name in pipeline:
        if h5z.filter_avail(code):
            continue
        label = f"HDF5 filter {code}" + (f" ({name})" if name else "")
        if code in PLUGIN_FILTERS:
            how = (
                "pip install hdf5plugin, and import hdf5plugin in your script before building the dataset "
                "(DataLoader workers started with spawn import your script too)"
            )
        else:
            how = "install the HDF5 plugin for this filter and point HDF5_PLUGIN_PATH at its folder"
        return f"it is compressed with {label}, which is not available in this process: {how}"
    return ""


def as_dict(value: Any) -> Any:
    """A compound value (``np.void`` or a structured array) as a dict of its members, nested compounds too;
    each member is what h5py's ``ds[i][member]`` gives."""
    names = value.dtype.names
    if names is None:
        return value
    return {n: as_dict(value[n]) for n in names}
