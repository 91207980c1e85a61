"""A batch as ``HDF5Dataset.__getitems__`` returns it, and the collate function that uses its columns.

The DataLoader hands ``__getitems__``'s result to ``collate_fn``. ``default_collate`` builds every sample
dict and stacks their arrays into a new tensor: a second copy of every batch. A dataset that already read
a batch's fixed-size fields into one array per field (as :class:`fastdata.HDF5Dataset` does) returns a
:class:`SampleBatch` carrying those arrays, and :func:`collate` hands them to torch as they are.

A worker may send the batch itself to the main process (``collate_fn=lambda b: b``, the usual way to
get lists of variable-length samples), so a :class:`SampleBatch` holds only data (no functions) and
pickles: the rows, when its sample dicts were not built yet, else the dicts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from fastdata.formats.hdf5 import as_dict
from fastdata.loading import explain
from fastdata.loading.transport import checked_default_collate

Sample = dict[str, Any]


def build_samples(
    keys: tuple[str, ...],
    indices: np.ndarray,
    rows: Mapping[str, Any],
    dicts: tuple[str, ...] = (),
    positions: Sequence[int] | None = None,
) -> list[Sample]:
    """The sample dicts ``{field: row, ..., "__index__": i}`` of the rows at ``positions`` (all when None).

    Args:
        keys (tuple[str, ...]): the fields, then ``"__index__"``.
        indices (np.ndarray): the dataset index at each position.
        rows (Mapping[str, np.ndarray | list]): each field's rows, one per position (fixed-size rows as
            one array: a sample gets a view of its row).
        dicts (tuple[str, ...]): fields of compound rows, which samples get as dicts of their members.
        positions (Sequence[int] | None): which positions. Defaults to all.
    """
    index = indices.tolist()
    todo = range(len(index)) if positions is None else positions
    if not dicts:  # the common case, kept to one dict comprehension per sample
        plain = [(name, rows[name]) for name in keys[:-1]]
        return [{**{name: src[j] for name, src in plain}, "__index__": index[j]} for j in todo]
    sources = [(name, rows[name], name in dicts) for name in keys[:-1]]
    return [
        {**{name: as_dict(src[j]) if compound else src[j] for name, src, compound in sources}, "__index__": index[j]}
        for j in todo
    ]


class SampleBatch(Sequence[Any]):
    """The samples of one batch, as ``__getitems__`` returns them: a sequence of sample dicts that also
    carries the batch's fixed-size fields as whole arrays, so that :func:`collate` need not build the
    dicts nor copy the rows a second time. The dicts are built from ``rows`` on first access (then
    kept), unless ``samples`` gives them.

    Args:
        keys (tuple[str, ...]): the keys of each sample dict (the fields, then ``"__index__"``).
        indices (np.ndarray): the dataset index of each sample.
        columns (dict[str, np.ndarray] | None): field -> the whole batch's rows, row ``j`` belonging to
            sample ``j``; None when the samples may differ from them (a transform or a skipped sample).
        samples (list | None): the finished samples; None to build them from ``rows``.
        rows (Mapping[str, np.ndarray | list] | None): each field's rows, one per sample (see
            :func:`build_samples`); needed when ``samples`` is None.
        dicts (tuple[str, ...]): fields of compound rows (built as dicts).
        ragged (tuple[str, ...] | None): fields of variable-length rows (numbers, strings): :func:`collate`
            gives the list of their values where they do not stack. Other fields that do not stack (images
            of different sizes, decoded from byte fields) raise :class:`~fastdata.core.errors.CannotBatch`.
            Defaults to None: not known, every field that does not stack comes back as a list.

    Attributes:
        columns, indices, keys, ragged: as given.
    """

    def __init__(
        self,
        keys: tuple[str, ...],
        indices: np.ndarray,
        columns: dict[str, np.ndarray] | None,
        samples: list[Any] | None = None,
        *,
        rows: Mapping[str, Any] | None = None,
        dicts: tuple[str, ...] = (),
        ragged: tuple[str, ...] | None = None,
    ) -> None:
        self.keys, self.indices, self.columns = keys, indices, columns
        self.ragged = ragged
        self._samples = samples
        self._rows = rows
        self._dicts = dicts

    def _all(self) -> list[Any]:
        if self._samples is None:
            assert self._rows is not None
            self._samples = build_samples(self.keys, self.indices, self._rows, self._dicts)
            self._rows = None
        return self._samples

    def __len__(self) -> int:
        return len(self.indices) if self._samples is None else len(self._samples)

    def __getitem__(self, j: Any) -> Any:
        return self._all()[j]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._all())

    def __getstate__(self) -> dict[str, Any]:
        if self._samples is None:  # the rows (columns and rows share their arrays: pickled once)
            return {"keys": self.keys, "indices": self.indices, "columns": self.columns, "rows": self._rows,
                    "dicts": self._dicts, "samples": None, "ragged": self.ragged}  # fmt: skip
        # the dicts hold views of the columns, which pickle as copies: send the dicts alone
        return {"keys": self.keys, "indices": self.indices, "columns": None, "rows": None, "dicts": (),
                "samples": self._samples, "ragged": self.ragged}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.keys, self.indices, self.columns = state["keys"], state["indices"], state["columns"]
        self._samples, self._rows, self._dicts = state["samples"], state["rows"], state["dicts"]
        self.ragged = state.get("ragged")

    def __repr__(self) -> str:
        return f"SampleBatch({len(self)} samples, keys={self.keys})"


def collate(samples: Sequence[Sample]) -> Any:
    """``default_collate``, without copying the fields that :class:`HDF5Dataset` already read as whole
    batches: pass ``collate_fn=ds.collate`` (or ``fastdata.datasets.hdf5._dataset.collate``) to the DataLoader.

    The result is the same as ``default_collate``'s: a dict of tensors (and lists for strings and bytes;
    compound fields as dicts of their members). Where ``default_collate`` fails, a field comes back as the
    batch's numpy array when torch has no tensor type for it (``np.longdouble``, fixed-length strings in
    rows of several values), and as the list of its values when they cannot be stacked (variable-length
    arrays, rows of variable-length strings), with or without a decode or a transform that keeps the
    sample a dict of its fields. Images decoded from byte fields that differ in size raise
    :class:`~fastdata.core.errors.CannotBatch` naming the field, the rows and the fixes.
    """
    columns = samples.columns if isinstance(samples, SampleBatch) else None
    if not len(samples):
        return default_collate(samples)  # type: ignore[arg-type]
    if not columns:
        first = samples[0]
        if (
            isinstance(samples, SampleBatch)
            and isinstance(first, dict)
            and all(isinstance(s, dict) and s.keys() == first.keys() for s in samples)
        ):  # fields as read (or decoded, or transformed into a dict of the same keys): field by field
            return {key: _collate_values(key, samples, _ragged(samples, key)) for key in first}
        return checked_default_collate(list(samples))
    assert isinstance(samples, SampleBatch)
    out: dict[str, Any] = {}
    for key in samples.keys:
        col = columns.get(key)
        if col is not None:
            out[key] = _collate_column(col)
        elif key == "__index__":
            out[key] = torch.from_numpy(samples.indices)
        else:
            out[key] = _collate_values(key, samples, _ragged(samples, key))
    return out


def _ragged(samples: SampleBatch, key: str) -> bool:
    return samples.ragged is None or key in samples.ragged


def _collate_values(key: str, samples: Sequence[Any], ragged: bool) -> Any:
    """``default_collate`` of field ``key`` of ``samples``, or the list of its values where it cannot batch
    them and the field is ``ragged`` (rows of different lengths, arrays of strings); values of another
    field that do not stack (images of different sizes, decoded from bytes) raise
    :class:`~fastdata.core.errors.CannotBatch` saying why."""
    values = [s[key] for s in samples]
    try:
        return default_collate(values)
    except (TypeError, RuntimeError):  # default_collate's errors for what it cannot stack
        if ragged:
            return values
        why = explain([{key: v, "__index__": s.get("__index__")} for v, s in zip(values, samples)])
        if why is None:
            return values  # what torch has no type for (long doubles, fixed strings): as it comes
        raise why from None


def _collate_column(col: np.ndarray) -> Any:
    """One field's batch array as ``default_collate`` would collate its rows, without copying it."""
    if col.dtype.names is not None:  # compound rows: a dict of the members, as for dict samples
        return {name: _collate_column(np.ascontiguousarray(col[name])) for name in col.dtype.names}
    try:
        return torch.from_numpy(col)
    except TypeError:  # a dtype torch has no tensor for
        pass
    if col.ndim == 1 and col.dtype.kind in "SUO":
        return list(col)  # strings and bytes: a list, as default_collate gives
    return col
