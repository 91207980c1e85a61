"""The small parts of :class:`fastdata.Mix`: its sources named and weighed, the check that a mixed batch's
samples collate together, and a ``per_source`` batch with the collate that uses its source's own."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

from torch.utils.data import IterableDataset

from fastdata.core.errors import ConfigError
from fastdata.loading import Collating
from fastdata.loading.transport import checked_default_collate

SOURCE_KEY = "__source__"
"""The key a :class:`~fastdata.Mix` adds to every sample dict (and every collated batch of dicts): the source's
name."""


class SourceBatch(Sequence[Any]):
    """The samples of one ``per_source`` batch (as the source returned them: an ``HDF5Dataset``'s keep their
    columns), and the source they came from, for its own collate."""

    def __init__(self, name: str, samples: Any, source: Any) -> None:
        self.name, self.samples, self.source = name, samples, source

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: Any) -> Any:
        return _with_source(self.samples[i], self.name)

    def __iter__(self) -> Any:
        # taken apart (the hybrid's threads read a batch in runs, then join their samples), each sample says
        # its source itself
        return (_with_source(x, self.name) for x in self.samples)


def _with_source(sample: Any, name: str) -> Any:
    if isinstance(sample, dict):
        sample[SOURCE_KEY] = name
    return sample


def collate_per_source(batch: Any) -> Any:
    """Collate a ``per_source`` batch with its source's own collate (``HDF5Dataset``'s keeps its columns);
    a batch of dicts gets ``"__source__"``: the source's name for each sample. A batch taken apart on the way
    (a plain list: its samples carry ``"__source__"`` themselves) is collated by the default collate."""
    if not isinstance(batch, SourceBatch):
        return checked_default_collate(batch)
    source = batch.source
    out = source.collate(batch.samples) if isinstance(source, Collating) else checked_default_collate(batch.samples)
    if isinstance(out, dict):
        out[SOURCE_KEY] = [batch.name] * len(batch)
    return out


def is_tar(ds: Any) -> bool:
    """Whether ``ds`` reads its passes as a ``TarShardDataset`` does (asked by method, so that mix imports
    no other dataset family)."""
    return callable(getattr(ds, "whole_pass", None))


def named(datasets: Mapping[str, Any] | Sequence[Any]) -> tuple[list[str], list[Any]]:
    if isinstance(datasets, Mapping):
        names, sources = [str(k) for k in datasets], list(datasets.values())
    else:
        sources = list(datasets)
        names = [str(i) for i in range(len(sources))]
    if not sources:
        raise ConfigError("Mix needs at least one dataset")
    for name, ds in zip(names, sources):
        if isinstance(ds, IterableDataset) and not is_tar(ds):
            raise ConfigError(
                f"Mix: source {name!r} ({type(ds).__name__}) is iterable; a mix reads its sources by position: "
                "use a map-style dataset or TarShardDataset"
            )
        if not (is_tar(ds) or (hasattr(ds, "__getitem__") and hasattr(ds, "__len__"))):
            raise ConfigError(f"Mix: source {name!r} ({type(ds).__name__}) has no __len__ and __getitem__")
    return names, sources


def weights_of(
    weights: Mapping[str, float] | Sequence[float] | None, names: list[str], sizes: list[int]
) -> list[float]:
    """Each source's share (summing to 1) of ``weights`` (by name or in order; None: by size), each checked."""
    if weights is None:
        given: list[Any] = list(sizes)
    elif isinstance(weights, Mapping):
        by_name = {str(k): v for k, v in weights.items()}
        if set(by_name) != set(names) or len(by_name) != len(weights):
            raise ConfigError(f"weights name {sorted(by_name)}; the sources are {names}: name each once")
        given = [by_name[n] for n in names]
    elif isinstance(weights, (str, bytes)) or not isinstance(weights, Iterable):
        raise ConfigError(f"weights={weights!r}: give a number per source, by name (a dict) or in order (a list)")
    else:
        given = list(weights)
        if len(given) != len(names):
            raise ConfigError(f"{len(given)} weights for {len(names)} sources: give one weight per source")
    w = []
    for name, x in zip(names, given):
        # a string ("0.7") or None is refused, not parsed: float() would take one and not the other
        ok = isinstance(x, numbers.Real) and not isinstance(x, bool)
        value = float(x) if ok else math.nan
        if not ok or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"weight {x!r} of source {name!r}: weights must be positive and finite numbers")
        w.append(value)
    top = max(w)  # scaled first: the sum of weights near the float maximum (1e308 + 1e308) would overflow
    scaled = [x / top for x in w]
    total = sum(scaled)
    return [x / total for x in scaled]


def check_alike(first: dict[int, Any], names: list[str]) -> None:
    """Mixed batches are collated together: refuse, naming the sources, samples of unlike keys (``first``: a
    sample of each source in the batch)."""
    keys = [(s, frozenset(x)) for s, x in first.items() if isinstance(x, dict)]
    for (a, ka), (b, kb) in pairwise(keys):
        if ka != kb:
            raise ConfigError(
                f"Mix: samples of source {names[a]!r} have keys {sorted(ka)}, of {names[b]!r} {sorted(kb)}: a mixed "
                "batch collates them together; give each source a transform that returns the same keys, or use "
                'batches="per_source"'
            )


__all__ = ["SOURCE_KEY", "SourceBatch", "check_alike", "collate_per_source", "is_tar", "named", "weights_of"]
