"""Checking a sidecar index (``SHARD.tar.idx``) against its shard before it is trusted.

A sidecar says where every member lies; a wrong one (copied from another shard of the same size, left
from an older version of the shard, listing fewer samples than the shard holds, damaged) would make
the reader slice wrong bytes or drop samples without a word. So an index read from a sidecar is
checked against the shard's own headers:

- its arrays agree with themselves: every sample has members, no two samples share a key,
  members lie in file order inside the shard, each right after a 512-byte header boundary;
- the 512 bytes before each member are a valid header (checksum and numeric fields, as
  ``first_bad_header`` checks them) of a regular file with that
  member's name and size, once the extended headers (PAX, GNU long names) before it are applied;
- nothing lies between the members, or after the last one, that a scan would have made part of a
  sample: only extended headers, folders, webdataset metadata and members without an extension,
  then the end-of-archive marker or the end of the file.

A local shard (a memory map) is checked whole when the sidecar is loaded (:func:`check_index`), in
numpy for members that follow one another directly (the layout of fastdata's writer): about 0.4 of a
scan's time for such shards; :func:`check_once` does it once per process for each version of a local
shard and its sidecar (an index dropped from a reader's cache and loaded again is not checked again).
A remote shard's headers would cost requests (for a small shard, the whole shard, in every worker), so
:func:`check_on_read` checks the layout when the sidecar is loaded and leaves each member to the
first read of it, which fetches its headers with its data (see :mod:`fastdata.formats.tar`).
"""

from __future__ import annotations

import hashlib

import numpy as np

from fastdata.formats.tar._checked_reads import Unchecked
from fastdata.formats.tar._headers import (
    BLOCK,
    HEADER,
    Chain,
    first_bad_header,
    octal,
    octal_fields,
    ustar_name,
)
from fastdata.formats.tar._index import ShardIndex
from fastdata.formats.tar._reader import split_key
from fastdata.formats.tar._walk import Mismatch, compare, walk
from fastdata.storage import Reader

_REGULAR_CODES = (48, 0, 55)  # typeflags '0', NUL, '7'


# (url, shard identity, digest of the sidecar's bytes) -> members without an extension, for every local
# sidecar this process found to match its shard; plain data, so a forked worker may use its parent's
_MATCHED: dict[tuple[object, ...], int] = {}
_MATCHED_MAX = 1 << 16


def check_index(index: ShardIndex, reader: Reader) -> str | None:
    """Why ``index`` (read from a sidecar) does not describe the shard ``reader`` reads, or None: every
    member and the end checked now (a remote shard's headers read ``CHUNK`` bytes of shard at a time).

    On a local shard it also counts the members that belong to no sample (:attr:`ShardIndex.ignored`).
    """
    try:
        flat, counts, starts, tail = _layout(index, reader.size)
        buf = reader.buffer() if hasattr(reader, "buffer") else None
        if buf is not None:
            index.ignored = _check_local(index, flat, buf, reader.size, flat.offs, flat.sizes, starts, tail)
        else:
            _unchecked(index, flat, counts, starts, tail).check_all(reader)
    except Mismatch as e:
        return str(e)
    return None


def check_on_read(index: ShardIndex, reader: Reader, *, end: bool = False) -> str | None:
    """Why ``index`` (read from the sidecar of a remote shard) does not describe the shard, as far as its
    layout shows (no byte of the shard read), or None: then the members are left to be checked as they
    are read (:attr:`ShardIndex.pending`, see :mod:`fastdata.formats.tar`).

    Args:
        end (bool): check the end of the archive now too (a few KiB after the last member, one request
            at most), for an index whose sample count plans an epoch. Defaults to False (when the last
            member is read).
    """
    try:
        flat, counts, starts, tail = _layout(index, reader.size)
        pending = _unchecked(index, flat, counts, starts, tail)
        if end:
            pending.check_end(reader)
    except Mismatch as e:
        return str(e)
    index.pending = pending if not pending.done else None
    return None


def check_once(index: ShardIndex, reader: Reader, sidecar: bytes) -> str | None:
    """:func:`check_index`, skipped when this process already found this sidecar (its bytes) to match
    this local shard (its size, mtime and inode), unchanged since."""
    shard_identity = getattr(reader, "identity", None)
    key = (index.url, shard_identity, hashlib.blake2b(sidecar, digest_size=16).digest()) if shard_identity else None
    if key is not None and key in _MATCHED:
        index.ignored = _MATCHED[key]
        return None
    problem = check_index(index, reader)
    if problem is None and key is not None:
        if len(_MATCHED) >= _MATCHED_MAX:
            _MATCHED.clear()
        _MATCHED[key] = index.ignored
    return problem


def _layout(index: ShardIndex, size: int) -> tuple[_Flat, np.ndarray, np.ndarray, int]:
    """The members of ``index`` in file order, the members per sample, where the headers before each
    member begin and where the last one ends, once the index is found to agree with itself.

    Raises:
        Mismatch: it does not (or it is for a shard of another size).
    """
    if index.size != size:
        raise Mismatch(f"is for a shard of {index.size} bytes, the shard has {size}")
    if size == 0:
        raise Mismatch("is for an empty file")
    members = index.members
    counts = np.fromiter(map(len, members), dtype=np.int64, count=len(members))
    m = int(counts.sum())
    owner = np.repeat(np.arange(len(members)), counts)  # the sample of each member
    ext_t, off_t, size_t = zip(*[member for ms in members for member in ms]) if m else ((), (), ())
    flat = _Flat(owner, list(ext_t), np.array(off_t, dtype=np.int64), np.array(size_t, dtype=np.int64))
    ends = _check_layout(index, flat, counts, size)
    starts = np.concatenate(([0], ends[:-1])).astype(np.int64)  # where the headers before each member begin
    return flat, counts, starts, int(ends[-1]) if m else 0


def _unchecked(index: ShardIndex, flat: _Flat, counts: np.ndarray, starts: np.ndarray, tail: int) -> Unchecked:
    return Unchecked(index.url, index.size, index.keys, counts, flat.exts, flat.offs, flat.sizes, starts, tail)


class _Flat:
    """Every member of an index in file order: ``flat[j]`` is ``(sample, ext, offset, size)``."""

    def __init__(self, owner: np.ndarray, exts: list[str], offs: np.ndarray, sizes: np.ndarray) -> None:
        self.owner, self.exts, self.offs, self.sizes = owner, exts, offs, sizes

    def __len__(self) -> int:
        return len(self.exts)

    def __getitem__(self, j: int) -> tuple[int, str, int, int]:
        return int(self.owner[j]), self.exts[j], int(self.offs[j]), int(self.sizes[j])


def _check_layout(index: ShardIndex, flat: _Flat, counts: np.ndarray, size: int) -> np.ndarray:
    """The index agrees with itself; returns where each member's padded data ends."""
    keys = index.keys
    if len(counts) and not counts.all():
        i = int(np.argmin(counts))
        raise Mismatch(f"lists sample {i} ({keys[i]!r}) without members")
    if len(set(keys)) != len(keys):
        # a scan makes one sample of every key; a sidecar written before it did lists a split key twice
        seen: dict[str, int] = {}
        for i, key in enumerate(keys):
            if seen.setdefault(key, i) != i:
                raise Mismatch(f"lists samples {seen[key]} and {i} under one key {key!r}")
    for key in keys:  # KEY.EXT splits back into KEY and EXT (what split_key gives for a scanned name)
        if not key or key[-1] == "/" or "." in key[key.rfind("/") + 1 :]:
            raise Mismatch(f"lists a sample key {key!r} that a scan cannot give")
    kinds = {e: n for n, e in enumerate(set(flat.exts))}
    for ext in kinds:
        if not ext or "/" in ext or ext != ext.lower():
            raise Mismatch(f"lists a member extension {ext!r} that a scan cannot give")
    if len(flat):
        pairs = flat.owner * len(kinds) + np.fromiter(map(kinds.__getitem__, flat.exts), np.int64, len(flat))
        if (np.diff(np.sort(pairs)) == 0).any():
            raise Mismatch("lists two members of one sample with one extension")
    offs, sizes = flat.offs, flat.sizes
    ends = offs + sizes + (-sizes % BLOCK)
    prev = np.concatenate(([0], ends[:-1]))
    wrong = np.flatnonzero((offs % BLOCK != 0) | (offs < prev + BLOCK) | (sizes < 0) | (offs + sizes > size))
    if len(wrong):
        _, _, off, n = flat[int(wrong[0])]
        raise Mismatch(f"lists a member at byte {off} ({n} bytes) out of order, off a header or past the end")
    return ends


def _check_local(
    index: ShardIndex,
    flat: _Flat,
    buf: memoryview | bytes,
    size: int,
    offs: np.ndarray,
    sizes: np.ndarray,
    starts: np.ndarray,
    tail: int,
) -> int:
    """Check every member of a memory-mapped shard; return how many members belong to no sample."""
    rows = np.frombuffer(buf, dtype=np.uint8, count=size // BLOCK * BLOCK).reshape(-1, BLOCK)  # type: ignore[call-overload]
    direct = np.flatnonzero(offs - BLOCK == starts)  # members right after the one before: no header between
    if len(direct):
        blocks = rows[(offs[direct] - BLOCK) // BLOCK]
        found = first_bad_header(blocks)
        if found is not None:
            raise Mismatch(f"points at byte {int(offs[direct[found[0]]])}, which follows no valid header")
        regular = np.isin(blocks[:, 156], _REGULAR_CODES)
        if not regular.all():
            raise Mismatch(
                f"points at byte {int(offs[direct[np.argmin(regular)]])}, which is not a regular file's data"
            )
        wrong = np.flatnonzero(_size_fields(blocks[:, 124:136]) != sizes[direct])
        if len(wrong):
            off, n = flat[int(direct[wrong[0]])][2:]
            raise Mismatch(f"says the member at byte {off} has {n} bytes, its header says otherwise")
        _check_names(index, flat, direct, blocks)
    ignored = 0
    heads: list[int] = []  # every header walked, checked in one pass at the end
    chain = Chain()
    for j in np.flatnonzero(offs - BLOCK != starts).tolist():
        i, ext, off, n = flat[j]
        start = int(starts[j])
        got, skipped = walk(bytes(buf[start:off]), start, chain, heads, member=True)
        ignored += skipped
        compare(got, index.keys[i], ext, n, off)
    _, skipped = walk(bytes(buf[tail:size]), tail, chain, heads, member=False)
    found = first_bad_header(rows[np.asarray(heads, dtype=np.int64) // BLOCK]) if heads else None
    if found is not None:
        raise Mismatch(f"does not match the shard: {found[1]} in the header at byte {heads[found[0]]}")
    return ignored + skipped


def _size_fields(fields: np.ndarray) -> np.ndarray:
    """The sizes in 12-byte size fields: in numpy for the common form, exactly for the others (GNU
    base-256 for 8 GiB and more); -1 for a field that is not a number."""
    values, plain = octal_fields(fields)
    for row in np.flatnonzero(~plain).tolist():
        try:
            values[row] = octal(fields[row].tobytes())
        except ValueError:
            values[row] = -1
    return values


def _check_names(index: ShardIndex, flat: _Flat, direct: np.ndarray, blocks: np.ndarray) -> None:
    """Each direct member's header names it: compared in numpy where the name fits the name field as
    written (the usual case), through the full ustar rules (prefix, extension case) otherwise."""
    keys = index.keys
    owner, exts = flat.owner[direct].tolist(), [flat.exts[j] for j in direct.tolist()]
    # one encode for all names (NUL cannot be in a name: it ends the field)
    names = "\0".join([f"{keys[i]}.{e}" for i, e in zip(owner, exts)]).encode("utf-8", "surrogateescape").split(b"\0")
    short = np.fromiter(map(len, names), dtype=np.int64, count=len(names)) <= 100
    expected = np.array(names, dtype="S100").view(np.uint8).reshape(-1, 100)
    same = short & (blocks[:, 345] == 0) & (blocks[:, :100] == expected).all(axis=1)
    for row in np.flatnonzero(~same).tolist():
        i, ext, off, _ = flat[int(direct[row])]
        name_f, _, _, typeflag, _, prefix_f = HEADER.unpack_from(blocks[row].tobytes())
        name = ustar_name(name_f, prefix_f, typeflag)
        if split_key(name) != (keys[i], ext):
            raise Mismatch(f"says the member at byte {off} is {keys[i]}.{ext}, its header names {name!r}")


__all__ = ["check_index", "check_on_read", "check_once"]
