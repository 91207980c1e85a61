"""How a collated batch lies in a shared-memory slot: planned and written in the worker, rebuilt as views
in the main process.

A batch is a tree of dicts, lists and tuples (named tuples too) whose leaves are tensors, numpy arrays,
``bytes``, lists of ``bytes`` and small values (numbers, strings). :func:`plan` walks it once and gives

* a *skeleton*: the same tree with every payload leaf replaced by a small reference (where it lies in
  the slot, its dtype and shape); the skeleton is what gets pickled, so only it crosses the pipe;
* the writes that put the payloads at those places, and the bytes they need.

:func:`write` does the writes into a slot (tensors with ``copy_``, stacked samples with
``torch.stack(out=...)``, bytes with a memory copy); :func:`rebuild` turns a skeleton back into the batch,
every tensor and array a view of the slot's memory (or a private copy, with ``copy=True``). Payload
offsets are aligned to 64 bytes so that every dtype can be viewed in place.

Small values (strings, numbers, ``bytes`` under :data:`INLINE_BELOW`) stay in the skeleton: pickling
them costs less than a reference does.
"""

from __future__ import annotations

import copy as _copy
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import numpy as np
import torch

ALIGN = 64
INLINE_BELOW = 1024
"""``bytes`` values shorter than this travel pickled in the skeleton, in bytes."""

BytesAs = Literal["bytes", "packed"]
_ATOMS = (str, bytes, int, float, bool, type(None))  # bytes: short ones (long ones are packed first)


class PlainDict(dict):  # type: ignore[type-arg]
    """A dict subclass that a slot carries as a plain ``dict`` (its skeleton and its rebuilt batch are
    plain dicts): ``SlotSample``, which pickles itself into a slot
    and must not do so again from inside one."""

    __slots__ = ()


class Stack:
    """Sample tensors that the batch will hold stacked: written straight into the slot by
    ``torch.stack(out=...)`` instead of being stacked into fresh memory first (see
    ``slot_default_collate``)."""

    __slots__ = ("tensors",)

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors

    def materialise(self) -> torch.Tensor:
        return torch.stack(self.tensors, 0)


class Rebuilt:
    """An object of the batch that pickles as a call (its class defines ``__reduce__`` returning
    ``(fn, args)``, like the harness's probed batch wrapper) and whose ``args`` hold payloads: the args are
    laid out like any batch, and the main process calls ``fn(*args)`` on the rebuilt args, as unpickling
    would."""

    __slots__ = ("args", "fn")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (Rebuilt, (self.fn, self.args))


def _strong(ref: weakref.ref[Any]) -> Callable[[Any], Any]:
    fn = ref()
    assert fn is not None  # the caller is that very function
    return fn  # type: ignore[no-any-return]


def _as_call(leaf: Any) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
    """``(fn, args)`` when ``leaf`` pickles as ``fn(*args)`` by a ``__reduce__`` of its own class."""
    if (
        isinstance(leaf, (type, np.generic))
        or getattr(type(leaf), "__reduce__", object.__reduce__) is object.__reduce__
    ):
        return None
    try:
        r = leaf.__reduce__()
    except Exception:  # noqa: BLE001 - then it is pickled as it is
        return None
    if isinstance(r, tuple) and len(r) == 2 and callable(r[0]) and isinstance(r[1], tuple):
        return r
    return None


class ArrayRef:
    """A tensor or numpy array of ``shape`` and ``dtype`` at ``offset`` of the slot."""

    __slots__ = ("dtype", "numpy", "offset", "shape")

    def __init__(self, offset: int, dtype: Any, shape: tuple[int, ...], numpy: bool) -> None:
        self.offset, self.dtype, self.shape, self.numpy = offset, dtype, shape, numpy

    def __reduce__(self) -> tuple[Any, ...]:
        return (ArrayRef, (self.offset, self.dtype, self.shape, self.numpy))


class BytesRef:
    """One ``bytes`` value of ``length`` bytes at ``offset``."""

    __slots__ = ("length", "offset")

    def __init__(self, offset: int, length: int) -> None:
        self.offset, self.length = offset, length

    def __reduce__(self) -> tuple[Any, ...]:
        return (BytesRef, (self.offset, self.length))


class BytesListRef:
    """A list of ``count`` bytes values packed end to end at ``offset``; their ``count + 1`` boundaries
    (int64, relative to ``offset``) lie at ``bounds``."""

    __slots__ = ("bounds", "count", "offset")

    def __init__(self, offset: int, count: int, bounds: int) -> None:
        self.offset, self.count, self.bounds = offset, count, bounds

    def __reduce__(self) -> tuple[Any, ...]:
        return (BytesListRef, (self.offset, self.count, self.bounds))


class PackedBytes(Sequence[memoryview]):
    """A batch's list of ``bytes`` values, left where they lie in the slot (``bytes_as="packed"``).

    ``packed[i]`` is a read-only ``memoryview`` of value ``i`` (no copy: ``np.frombuffer(packed[i],
    np.uint8)``, ``PIL.Image.open(io.BytesIO(packed[i]))``); :meth:`tolist` copies them out as ``bytes``.
    ``data`` holds all values end to end as a ``uint8`` tensor, value ``i`` being
    ``data[offsets[i]:offsets[i + 1]]``. Equal to a list of the same bytes.

    Attributes:
        data (torch.Tensor): uint8, every value end to end.
        offsets (torch.Tensor): int64, ``len(self) + 1`` boundaries into ``data``.
    """

    __slots__ = ("_bounds", "_view", "data", "offsets")

    def __init__(self, data: np.ndarray, bounds: np.ndarray) -> None:
        self._view = data.data.toreadonly()
        self._bounds = bounds.tolist()
        self.data = torch.from_numpy(data)
        self.offsets = torch.from_numpy(bounds)

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"PackedBytes index {i} out of range for {len(self)} values")
        return self._view[self._bounds[i] : self._bounds[i + 1]]

    def __iter__(self) -> Iterator[memoryview]:
        b, view = self._bounds, self._view
        return (view[b[i] : b[i + 1]] for i in range(len(b) - 1))

    def tolist(self) -> list[bytes]:
        """The values as ``bytes`` (copies, independent of the slot)."""
        return [bytes(v) for v in self]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)) or len(other) != len(self):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def pin_memory(self, device: Any = None) -> PackedBytes:
        """What the DataLoader's pin-memory thread calls: left as it is (a pinned slot is pinned already)."""
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # a copy: a pickled batch must not depend on this process's slot
        return (PackedBytes, (self.data.numpy().copy(), np.array(self._bounds, dtype=np.int64)))

    def __repr__(self) -> str:
        return f"PackedBytes({len(self)} values, {int(self._bounds[-1])} bytes)"


def _walk(value: Any, take: Callable[[Any], Any]) -> Any:
    """``value`` rebuilt with ``take`` applied to every node that is not a container; ``take`` sees lists
    first and may return them replaced (``_DESCEND`` to look inside). Container types are kept: dict and
    list subclasses are copied and updated, as ``torch``'s ``collate`` does, named tuples rebuilt."""
    if isinstance(value, dict):
        items = {k: _walk(v, take) for k, v in value.items()}
        if type(value) is dict or isinstance(value, PlainDict):
            return items
        clone = _copy.copy(value)
        clone.update(items)
        return clone
    if isinstance(value, list):
        out = take(value)
        if out is not _DESCEND:
            return out
        items_l = [_walk(v, take) for v in value]
        if type(value) is list:
            return items_l
        clone_l = _copy.copy(value)
        clone_l[:] = items_l
        return clone_l
    if isinstance(value, tuple):
        parts = [_walk(v, take) for v in value]
        return type(value)(*parts) if hasattr(value, "_fields") else type(value)(parts)
    return take(value)


_DESCEND = object()


def _byte_string(v: Any) -> bool:
    """``bytes``, or a flat ``memoryview`` of bytes (a member read as a view of its mapped shard, see
    ``LocalReader.read_views``): copied into the slot alike."""
    return type(v) is bytes or (type(v) is memoryview and v.ndim == 1 and v.format == "B")


def _byte_strings(values: list[Any]) -> bool:
    return all(type(v) is bytes for v in values) or all(_byte_string(v) for v in values)


def _atoms(values: list[Any]) -> bool:
    return all(isinstance(v, _ATOMS) for v in values)


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _slot_tensor(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and t.device.type == "cpu" and not t.is_quantized and not t.requires_grad


class Plan:
    """The result of :func:`plan`: the skeleton, the writes, and how many bytes of slot they need."""

    __slots__ = ("nbytes", "skeleton", "writes")

    def __init__(self) -> None:
        self.nbytes = 0
        self.skeleton: Any = None
        self.writes: list[tuple[int, Any]] = []

    def place(self, nbytes: int, source: Any) -> int:
        at = self.nbytes
        self.writes.append((at, source))
        self.nbytes = aligned(at + nbytes)
        return at


def _address(leaf: np.ndarray | torch.Tensor) -> int | None:
    """Where a C-contiguous array's or tensor's bytes start in memory; None if they are not contiguous."""
    if isinstance(leaf, torch.Tensor):
        return leaf.data_ptr() if leaf.is_contiguous() else None
    return int(leaf.__array_interface__["data"][0]) if leaf.flags.c_contiguous else None


def plan(batch: Any, arena: tuple[int, int, int] | None = None) -> Plan:
    """Where each payload of ``batch`` will lie in a slot (see the module doc).

    Args:
        batch: the collated batch.
        arena ((int, int, int) | None): ``(address, size, used)`` of the slot that arrays of this batch
            were allocated in already (``SlotPool``): a contiguous array or
            tensor lying inside it is referenced where it is, not copied; the other payloads go after
            its first ``used`` bytes.
    """
    p = Plan()
    lo = hi = 0
    if arena is not None:
        lo, size, p.nbytes = arena
        hi = lo + size

    def in_place(leaf: np.ndarray | torch.Tensor, n: int) -> int | None:
        at = _address(leaf) if hi else None
        return at - lo if at is not None and lo <= at and at + n <= hi and n else None

    def take(leaf: Any) -> Any:
        if isinstance(leaf, list):
            if leaf and _byte_strings(leaf):
                total = sum(map(len, leaf))
                if total < INLINE_BELOW:
                    return leaf if all(type(v) is bytes for v in leaf) else [bytes(v) for v in leaf]
                bounds = np.zeros(len(leaf) + 1, dtype=np.int64)
                np.cumsum([len(v) for v in leaf], out=bounds[1:])
                at = p.place(total, leaf)
                return BytesListRef(at, len(leaf), p.place(bounds.nbytes, bounds))
            if _atoms(leaf):
                return leaf  # keys, urls, labels as Python values: cheap to pickle
            return _DESCEND
        if isinstance(leaf, Stack):
            first = leaf.tensors[0]
            if not _slot_tensor(first) or any(
                t.shape != first.shape or t.dtype != first.dtype or not _slot_tensor(t) for t in leaf.tensors
            ):
                leaf = leaf.materialise()  # raises as default_collate does, or promotes dtypes
            else:
                shape = (len(leaf.tensors), *first.shape)
                n = first.numel() * first.element_size() * len(leaf.tensors)
                return ArrayRef(p.place(n, (leaf, shape)), first.dtype, shape, False)
        if isinstance(leaf, torch.Tensor):
            if not _slot_tensor(leaf):
                return leaf
            n = leaf.numel() * leaf.element_size()
            here = in_place(leaf, n)
            return ArrayRef(p.place(n, leaf) if here is None else here, leaf.dtype, tuple(leaf.shape), False)
        if isinstance(leaf, np.ndarray):
            if leaf.dtype.hasobject:
                return leaf
            here = in_place(leaf, leaf.nbytes)
            return ArrayRef(p.place(leaf.nbytes, leaf) if here is None else here, leaf.dtype, leaf.shape, True)
        if isinstance(leaf, (bytes, bytearray)) and len(leaf) >= INLINE_BELOW:
            return BytesRef(p.place(len(leaf), leaf), len(leaf))
        if type(leaf) is memoryview and _byte_string(leaf):
            return BytesRef(p.place(len(leaf), leaf), len(leaf)) if len(leaf) >= INLINE_BELOW else bytes(leaf)
        call = _as_call(leaf)
        if call is not None:
            writes = len(p.writes)
            args = _walk(call[1], _strong(me))
            if len(p.writes) > writes:  # payloads inside: they go into the slot, the call is rebuilt there
                return Rebuilt(call[0], args)
        return leaf

    me = weakref.ref(take)  # take refers to itself weakly: a cycle would keep the batch alive until gc
    p.skeleton = _walk(batch, take)
    return p


def packed_lists(batch: Any) -> Any:
    """``batch`` with each list of ``bytes`` that :func:`plan` would pack made a :class:`PackedBytes`
    (copied): what ``bytes_as="packed"`` gives for a batch that did not come through a slot."""

    def take(leaf: Any) -> Any:
        if isinstance(leaf, list):
            if leaf and all(type(v) is bytes for v in leaf) and sum(map(len, leaf)) >= INLINE_BELOW:
                bounds = np.zeros(len(leaf) + 1, dtype=np.int64)
                np.cumsum([len(v) for v in leaf], out=bounds[1:])
                return PackedBytes(np.frombuffer(b"".join(leaf), np.uint8).copy(), bounds)
            return leaf if _atoms(leaf) else _DESCEND
        return leaf

    return _walk(batch, take)


def materialise(batch: Any) -> Any:
    """``batch`` with every :class:`Stack` stacked in fresh memory and every view of a shard made ``bytes``
    (for a batch that takes the pipe)."""

    def take(leaf: Any) -> Any:
        if isinstance(leaf, Stack):
            return leaf.materialise()
        if type(leaf) is memoryview and _byte_string(leaf):
            return bytes(leaf)  # a view of a mapped shard: the pipe needs the bytes themselves
        return _DESCEND if isinstance(leaf, list) and not _atoms(leaf) else leaf

    return _walk(batch, take)


def write(p: Plan, slot: torch.Tensor, array: np.ndarray, view: memoryview) -> None:
    """Write the payloads of ``p`` into ``slot`` (a uint8 tensor; ``array`` and ``view`` of the same memory)."""
    for at, source in p.writes:
        if isinstance(source, torch.Tensor):
            n = source.numel() * source.element_size()
            if n:
                slot[at : at + n].view(source.dtype).view(source.shape).copy_(source)
        elif isinstance(source, tuple):  # (Stack, shape)
            stack, shape = source
            first = stack.tensors[0]
            n = first.numel() * first.element_size() * shape[0]
            if n:
                torch.stack(stack.tensors, 0, out=slot[at : at + n].view(first.dtype).view(shape))
        elif isinstance(source, np.ndarray):
            if source.nbytes:
                np.copyto(array[at : at + source.nbytes].view(source.dtype).reshape(source.shape), source)
        elif isinstance(source, list):  # bytes values end to end
            pos = at
            for v in source:
                end = pos + len(v)
                view[pos:end] = v
                pos = end
        else:  # one bytes value
            view[at : at + len(source)] = source


def rebuild(skeleton: Any, flat: np.ndarray, bytes_as: BytesAs, copy: bool) -> Any:
    """The batch of ``skeleton``, its payloads read from ``flat`` (the slot's used bytes, uint8): views of
    it, or private copies with ``copy``. ``bytes`` values are always copies."""

    def take(leaf: Any) -> Any:
        if isinstance(leaf, ArrayRef):
            n = int(np.prod(leaf.shape, dtype=np.int64)) * leaf.dtype.itemsize
            if n == 0:  # nothing to view (and numpy gives an empty array strides torch cannot view)
                return np.empty(leaf.shape, leaf.dtype) if leaf.numpy else torch.empty(leaf.shape, dtype=leaf.dtype)
            part = flat[leaf.offset : leaf.offset + n]
            if copy:
                part = part.copy()
            if leaf.numpy:
                return part.view(leaf.dtype).reshape(leaf.shape)
            return torch.from_numpy(part).view(leaf.dtype).view(leaf.shape)
        if isinstance(leaf, BytesListRef):
            bounds = flat[leaf.bounds : leaf.bounds + 8 * (leaf.count + 1)].view(np.int64)
            data = flat[leaf.offset : leaf.offset + int(bounds[-1])]
            if bytes_as == "packed":
                return PackedBytes(data.copy() if copy else data, bounds.copy())
            b = bounds.tolist()
            view = data.data
            return [bytes(view[b[i] : b[i + 1]]) for i in range(leaf.count)]
        if isinstance(leaf, BytesRef):
            return flat[leaf.offset : leaf.offset + leaf.length].tobytes()
        if isinstance(leaf, Rebuilt):
            return leaf.fn(*_walk(leaf.args, _strong(me)))
        if isinstance(leaf, list):
            return leaf if _atoms(leaf) else _DESCEND
        return leaf

    me = weakref.ref(take)  # take refers to itself weakly: a cycle would keep the slot's views alive until gc
    return _walk(skeleton, take)
