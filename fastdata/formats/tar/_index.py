"""The index of one tar shard (:class:`ShardIndex`: where each sample's members lie) and its sidecar
file ``SHARD.tar.idx``, an ``.npz`` of plain arrays written by ``fastdata convert`` and
``fastdata inspect --write-manifest``. A sidecar is only a claim about its shard: readers check it with
:func:`fastdata.formats.tar.check_index` before they use it (a remote shard's members as they are
read: :attr:`ShardIndex.pending`)."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from fastdata.core.errors import BadSample, CorruptShard, FastdataError
from fastdata.storage import Reader

Member = tuple[str, int, int]  # (ext, data offset, size)


class SidecarMismatch(FastdataError, ValueError):
    """A sidecar index trusted until its members were read does not describe its shard; nothing it
    pointed at was returned. Readers (``TarSource``) scan the shard
    instead and read again."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(
            f"{url}.idx: {problem}; scan the shard instead (rewrite the sidecar with "
            "'fastdata inspect --write-manifest', or delete it)"
        )
        self.url, self.problem = url, problem


class PendingCheck(Protocol):
    """What a sidecar claims of a shard and no read has checked yet (see
    :mod:`fastdata.formats.tar`): reading through it checks each member first."""

    @property
    def done(self) -> bool:
        """Every claim checked."""
        ...

    def read(self, reader: Reader, which: Sequence[int]) -> list[bytes]:
        """The bytes of every member of samples ``which``, in order, each checked before it is returned.

        Raises:
            SidecarMismatch: a member (or the end of the archive) is not what the sidecar says.
        """
        ...


@dataclass
class ShardIndex:
    """Where each sample of one shard lies.

    A scan that meets damage (a cut, a bad header) keeps the samples before it and ends the index with
    one bad sample that stands for what was lost after it (its error is :attr:`tail_error`), so a reader
    always meets the damage: once per damaged shard, or once per lost sample where a manifest says how
    many the shard held.

    Attributes:
        url (str): the shard.
        keys (list[str]): each sample's key.
        members (list[tuple[Member, ...]]): each sample's members as (ext, offset, size).
        spans (list[tuple[int, int]]): each sample's byte range, headers included.
        bad (dict[int, BadSample]): samples found bad while scanning, by sample number.
        complete (bool): False when the scan stopped early (truncated or damaged shard).
        tail_error (BadSample | None): why it stopped.
        size (int): bytes in the shard when indexed, to notice a stale sidecar index.
        ignored (int): members that belong to no sample (no extension, like a ``README``), left out.
        identity (tuple[int, int, int] | None): ``(size, mtime_ns, inode)`` of the local file indexed, to
            notice that it was replaced; None for remote shards. Not stored in the sidecar.
        pending (PendingCheck | None): for an index read from the sidecar of a remote shard, the claims
            not yet checked against the shard: :func:`~fastdata.formats.tar.read_samples` reads through
            it, so every member is checked before its bytes are returned. None once all are checked, and
            for scanned or fully checked indexes.
        split (int): keys whose members were not next to each other in the shard (``tar cf`` of a folder
            stores directory order): the scan gathered each into one sample; other readers split them.
        split_examples (list[str]): the first few such keys, to name in messages.
    """

    url: str
    keys: list[str] = field(default_factory=list)
    members: list[tuple[Member, ...]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    bad: dict[int, BadSample] = field(default_factory=dict)
    complete: bool = True
    tail_error: BadSample | None = None
    size: int = -1
    ignored: int = 0
    identity: tuple[int, ...] | None = None
    pending: PendingCheck | None = None
    split: int = 0
    split_examples: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.keys)

    def error_at(self, i: int) -> BadSample | None:
        """The problem with sample ``i``, or None if it is readable."""
        if i >= len(self.keys):
            return self.tail_error or CorruptShard(
                f"{self.url}: has {len(self.keys)} samples, sample {i} was expected (the shard changed "
                "since its manifest was written?); rebuild the manifest with 'fastdata inspect --write-manifest'",
                self.url,
            )
        return self.bad.get(i)

    # -- the sidecar index file (KEY.tar.idx), written by `fastdata convert` -----------------------
    def to_bytes(self) -> bytes:
        counts = [len(m) for m in self.members]
        flat = [m for ms in self.members for m in ms]
        buf = io.BytesIO()
        np.savez(
            buf,
            keys=np.array(self.keys, dtype=str),
            counts=np.array(counts, dtype=np.int32),
            exts=np.array([m[0] for m in flat], dtype=str),
            offsets=np.array([m[1] for m in flat], dtype=np.int64),
            sizes=np.array([m[2] for m in flat], dtype=np.int64),
            spans=np.array(self.spans, dtype=np.int64).reshape(-1, 2),
            size=np.array(self.size, dtype=np.int64),
            ignored=np.array(self.ignored, dtype=np.int64),
        )
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, url: str, data: bytes) -> ShardIndex:
        """The index a sidecar holds, as it claims (check it against the shard with
        :func:`fastdata.formats.tar.check_index` before trusting it).

        Raises:
            ValueError: the bytes are not a sidecar index (damaged, or arrays of the wrong kind or shape).
        """
        z = _load_sidecar(data)
        keys, exts = z["keys"].tolist(), z["exts"].tolist()
        counts, offsets, sizes = z["counts"].tolist(), z["offsets"].tolist(), z["sizes"].tolist()
        spans = [tuple(s) for s in z["spans"].tolist()]
        if len(counts) != len(keys) or len(spans) != len(keys) or sum(counts) != len(exts):
            raise ValueError("arrays of different lengths")
        if len(offsets) != len(exts) or len(sizes) != len(exts) or min(counts, default=0) < 0:
            raise ValueError("arrays of different lengths")
        members: list[tuple[Member, ...]] = []
        at = 0
        for c in counts:
            members.append(tuple(zip(exts[at : at + c], offsets[at : at + c], sizes[at : at + c])))
            at += c
        ignored = int(z["ignored"]) if "ignored" in z else 0
        return cls(url, keys, members, spans, size=int(z["size"]), ignored=ignored)  # type: ignore[arg-type]


# what each array of a sidecar must be: (dtype kind, dimensions)
_SIDECAR = {
    "keys": ("U", 1),
    "exts": ("U", 1),
    "counts": ("i", 1),
    "offsets": ("i", 1),
    "sizes": ("i", 1),
    "spans": ("i", 2),
    "size": ("i", 0),
    "ignored": ("i", 0),
}


def _load_sidecar(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of a sidecar, each checked for kind and shape, none bigger than the file holds."""
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            name = info.filename.removesuffix(".npy")
            if name not in _SIDECAR:
                continue
            with z.open(info) as f:
                fmt = np.lib.format
                version = fmt.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = fmt.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, _, dtype = fmt.read_array_header_2_0(f)
                else:
                    raise ValueError(f"array {name!r} has .npy version {version}")
                kind, dims = _SIDECAR[name]
                if dtype.kind != kind or len(shape) != dims or (dims == 2 and shape[1] != 2):
                    raise ValueError(f"array {name!r} is {dtype} of shape {shape}")
                if int(np.prod(shape)) * dtype.itemsize > info.file_size:
                    raise ValueError(f"array {name!r} claims more bytes than it holds")
            with z.open(info) as f:
                out[name] = fmt.read_array(f, allow_pickle=False)
    missing = set(_SIDECAR) - set(out) - {"ignored"}
    if missing:
        raise ValueError(f"no {', '.join(sorted(missing))} array")
    return out
