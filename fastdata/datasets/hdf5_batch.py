"""A batch as ``HDF5Dataset.__getitems__`` returns it, and the collate function that uses its columns.

The DataLoader hands ``__getitems__``'s result to ``collate_fn``. ``default_collate`` builds every sample
dict and stacks their arrays into a new tensor: a second copy of every batch. A dataset that already read
a batch's fixed-size fields into one array per field (as :class:`fastdata.HDF5Dataset` does) returns a
:class:`SampleBatch` carrying those arrays, and :func:`collate` hands them to torch as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

Sample = dict[str, Any]


class SampleBatch(Sequence[Any]):
    """The samples of one batch, as ``__getitems__`` returns them: a sequence of sample dicts that also
    carries the batch's fixed-size fields as whole arrays, so that :func:`collate` need not build the
    dicts nor copy the rows a second time. The dicts are built on first access (then kept).

    Attributes:
        columns (dict[str, np.ndarray] | None): field -> the whole batch's rows, row ``j`` belonging to
            sample ``j``; None when the samples may differ from them (a transform or a skipped sample).
        indices (np.ndarray): the dataset index of each sample.
        keys (tuple[str, ...]): the keys of each sample dict (the fields, then ``"__index__"``).
    """

    def __init__(
        self,
        keys: tuple[str, ...],
        indices: np.ndarray,
        columns: dict[str, np.ndarray] | None,
        build: Callable[[], list[Any]],
    ) -> None:
        self.keys, self.indices, self.columns = keys, indices, columns
        self._build: Callable[[], list[Any]] | None = build
        self._samples: list[Any] = []

    def _all(self) -> list[Any]:
        if self._build is not None:
            self._samples, self._build = self._build(), None
        return self._samples

    def __len__(self) -> int:
        return len(self.indices) if self._build is not None else len(self._samples)

    def __getitem__(self, j: Any) -> Any:
        return self._all()[j]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._all())

    def __repr__(self) -> str:
        return f"SampleBatch({len(self)} samples, keys={self.keys})"


def collate(samples: Sequence[Sample]) -> Any:
    """``default_collate``, without copying the fields that :class:`HDF5Dataset` already read as whole
    batches: pass ``collate_fn=ds.collate`` (or ``fastdata.datasets.hdf5.collate``) to the DataLoader.

    The result is the same as ``default_collate``'s: a dict of tensors (and lists for strings and bytes).
    """
    columns = samples.columns if isinstance(samples, SampleBatch) else None
    if not columns or not len(samples):
        return default_collate(samples)  # type: ignore[arg-type]
    assert isinstance(samples, SampleBatch)
    out: dict[str, Any] = {}
    for key in samples.keys:
        col = columns.get(key)
        if col is not None:
            try:
                out[key] = torch.from_numpy(col)
                continue
            except TypeError:  # a dtype torch has no tensor for (fixed-length strings ...)
                pass
        if key == "__index__":
            out[key] = torch.from_numpy(samples.indices)
        else:
            out[key] = default_collate([s[key] for s in samples])
    return out
