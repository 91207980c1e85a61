"""Why the samples of a batch do not collate, in words a user can act on.

torch's ``default_collate`` stops a batch of real photos (every one its own size) with ``stack expects
each tensor to be equal size``, and a batch of PIL images with ``default_collate: batch must contain
tensors ...``: raised from inside a worker or a slot, naming no key, no sample and no fix. The collate
functions of :mod:`fastdata.loading.transport` call :func:`explain` when collating fails (never
on a batch that collates: nothing is checked on the way to a good batch but the shapes ``torch.stack``
compares anyway), and raise the :class:`~fastdata.core.errors.CannotBatch` it returns: the key, the two
samples and their shapes, and the three fixes (resize as images are decoded, ``transform=``,
``collate_fn=``).

Rows of a variable-length HDF5 field (an :class:`~fastdata.HDF5Dataset` sample) name
``collate_fn=ds.collate``, which batches them as lists.

Samples with different members (shards storing some images as ``.jpg`` and others as ``.png``) stop
``default_collate`` with a bare ``KeyError: 'jpg'``: :func:`explain` names the two samples, their members,
their shards and the fix (the datasets' ``fields=`` alternatives).

A second, smaller nuisance lives here too: arrays that numpy marks read-only (what ``np.asarray`` of a
PIL image gives, so every ``decode="numpy"`` image) make ``torch.as_tensor`` warn that writing to the
tensor is undefined, once per process, from inside ``default_collate``. The collate functions only read
those arrays (they are stacked into a new batch), so :func:`as_tensors` converts them with that one
warning silenced.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fastdata.core.errors import CannotBatch

FIXES = (
    "resize them as they are decoded, decode=fastdata.Decoder('torch', size=(224, 224)) (or 'numpy'; "
    "an int keeps the aspect ratio, which does not batch); or resize or crop them in transform=; or batch "
    "them your own way with collate_fn= (collate_fn=list keeps each batch a list of samples)"
)

# a VideoClipDataset's clips (its samples carry "clip", "frames" and "fps"): it takes size=, not decode=
VIDEO_FIXES = (
    "pass size=(112, 112) (height, width) to VideoClipDataset, which resizes every frame alike whichever "
    "decoder reads it; or resize or crop the clips in transform=; or batch them your own way with "
    "collate_fn= (collate_fn=list keeps each batch a list of samples)"
)


class Unequal(Exception):
    """Raised by a stacking step (``_stack_later``) that found tensors of different shapes: turned into
    :class:`CannotBatch` by the collate function, which knows the samples."""


def check_shapes(tensors: Sequence[Any]) -> None:
    """Raise :class:`Unequal` unless every tensor or array of ``tensors`` has the first one's shape."""
    shape = tensors[0].shape
    for t in tensors:
        if t.shape != shape:
            raise Unequal


_silenced = threading.Lock()
_warned_once = False


def as_tensors(arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
    """``torch.as_tensor`` of each array (no copy), read-only ones included, without torch's warning
    about non-writable arrays: torch warns once per process (``TORCH_WARN_ONCE``), so the first read-only
    array is converted with the warning silenced and later ones cannot warn at all. The tensors are
    only read (stacked into the batch)."""
    global _warned_once
    if not _warned_once and not all(a.flags.writeable for a in arrays):
        with _silenced:
            if not _warned_once:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                    torch.as_tensor(next(a for a in arrays if not a.flags.writeable))
                _warned_once = True
    return [torch.as_tensor(a) for a in arrays]


def _is_array(v: Any) -> bool:
    return isinstance(v, (torch.Tensor, np.ndarray))


def _is_pil(v: Any) -> bool:
    return type(v).__module__.startswith("PIL.") and hasattr(v, "getbands")


def _name(sample: Any, j: int) -> str:
    """Sample ``j`` of the batch, by its key where it has one."""
    if isinstance(sample, Mapping):
        if "__key__" in sample:
            return f"{sample['__key__']!r}"
        if "__index__" in sample:
            return f"at index {sample['__index__']}"
        if "path" in sample:
            return f"{sample['path']!r}"
    return f"#{j} of the batch"


def _source(samples: Sequence[Any], *js: int) -> str:
    """`` (from shard.tar)`` when the samples name where they come from."""
    urls = []
    for j in js:
        s = samples[j]
        if isinstance(s, Mapping):
            url = s.get("__url__") or s.get("path")
            if url and url not in urls:
                urls.append(str(url))
    return f" (from {', '.join(urls)})" if urls else ""


def _find(samples: Sequence[Any], path: tuple[Any, ...]) -> tuple[str, tuple[Any, ...], int] | None:
    """The first leaf, by key path, that does not batch: ``("shape", path, j)`` (sample ``j``'s shape
    differs from the first's) or ``("pil", path, 0)``; None when every leaf would."""
    first = samples[0]
    if isinstance(first, Mapping):
        for key in first:
            values = [s.get(key) if isinstance(s, Mapping) else None for s in samples]
            found = _find(values, (*path, key))
            if found is not None:
                return found
        return None
    if isinstance(first, (list, tuple)) and not isinstance(first, (str, bytes)):
        if not all(isinstance(s, (list, tuple)) and len(s) == len(first) for s in samples):
            return None
        for i in range(len(first)):
            found = _find([s[i] for s in samples], (*path, i))
            if found is not None:
                return found
        return None
    if _is_array(first):
        for j, v in enumerate(samples):
            if _is_array(v) and tuple(v.shape) != tuple(first.shape):
                return "shape", path, j
        return None
    if _is_pil(first):
        return "pil", path, 0
    return None


def _members_differ(samples: Sequence[Any]) -> CannotBatch | None:
    """Samples (dicts) that do not all have the same members: the shards store some images as ``.jpg``
    and others as ``.png``, say. torch's collate stops with a bare ``KeyError: 'jpg'``."""
    if not all(isinstance(s, Mapping) for s in samples):
        return None
    first = {k for k in samples[0] if not str(k).startswith("__")}
    for j, s in enumerate(samples):
        other = {k for k in s if not str(k).startswith("__")}
        if other != first:
            only = sorted(map(str, first - other))
            extra = sorted(map(str, other - first))
            alts = ";".join(dict.fromkeys(only + extra)) or "jpg;png"
            return CannotBatch(
                f"cannot batch the samples: sample {_name(samples[0], 0)} has members {sorted(map(str, first))} and "
                f"sample {_name(samples[j], j)} {sorted(map(str, other))}{_source(samples, 0, j)}; samples with "
                "different members do not collate into one batch. Pick each field from its alternatives "
                f"with the dataset's fields= option (fields={{'image': '{alts}', ...}}, as webdataset's "
                "'jpg;png'), leave the odd samples out in transform=, or batch them your own way with "
                "collate_fn= (collate_fn=list keeps each batch a list of samples)"
            )
    return None


def _where(path: tuple[Any, ...]) -> str:
    """``key 'jpg'``, or ``sample['a'][0]`` for a value deeper in the sample."""
    if not path:
        return "the samples"
    if len(path) == 1:
        return f"key {path[0]!r}"
    return "sample" + "".join(f"[{p!r}]" for p in path)


def explain(samples: Sequence[Any]) -> CannotBatch | None:
    """Why ``samples`` do not collate, as a :class:`CannotBatch` naming the key, the samples and the fixes,
    or None when it is nothing this module recognises (the caller then re-raises the original error)."""
    if not samples:
        return None
    members = _members_differ(samples)
    if members is not None:
        return members
    try:
        found = _find(samples, ())
    except Exception:  # noqa: BLE001 - explaining must never hide the original error
        return None
    if found is None:
        return None
    kind, path, j = found
    where = _where(path)
    if kind == "pil":
        return CannotBatch(
            f"cannot batch {where}: it holds PIL images{_source(samples, 0)}, which torch's default_collate does "
            "not batch. Decode to tensors or arrays (decode='torch' or 'numpy'; for images of different sizes "
            "decode=fastdata.Decoder('torch', size=(224, 224))), convert them in transform=, or batch them your "
            "own way with collate_fn= (collate_fn=list keeps each batch a list of samples)"
        )

    def leaf(s: Any) -> Any:
        for p in path:
            s = s[p]
        return s

    a, b = leaf(samples[0]), leaf(samples[j])
    clips = path == ("clip",) and isinstance(samples[0], Mapping) and {"frames", "fps"} <= samples[0].keys()
    # an HDF5Dataset's sample ("__index__", no "__key__") whose field holds rows of different lengths
    rows = isinstance(samples[0], Mapping) and "__index__" in samples[0] and "__key__" not in samples[0]
    if rows and len(path) == 1 and a.ndim <= 1 and b.ndim <= 1:
        return CannotBatch(
            f"cannot batch {where}: sample {_name(samples[0], 0)} has {len(a)} values and sample "
            f"{_name(samples[j], j)} {len(b)} (a variable-length field); rows of different lengths do not stack "
            f"into one tensor. Pass collate_fn=ds.collate to the DataLoader (it gives such a field as the list of "
            f"its rows; fastdata.Loader(ds) uses it), pad or cut the rows in transform=, or leave {path[0]!r} out of "
            "fields="
        )
    return CannotBatch(
        f"cannot batch {where}: sample {_name(samples[0], 0)} has shape {list(a.shape)} and sample "
        f"{_name(samples[j], j)} {list(b.shape)}{_source(samples, 0, j)}; "
        + (f"videos of different sizes do not stack into one tensor. To batch them, {VIDEO_FIXES}" if clips else "")
        + ("" if clips else f"images of different sizes do not stack into one tensor. To batch them, {FIXES}")
    )


__all__ = ["FIXES", "VIDEO_FIXES", "Unequal", "as_tensors", "check_shapes", "explain"]
