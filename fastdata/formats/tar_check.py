"""Checking a sidecar index (``SHARD.tar.idx``) against its shard before it is trusted.

A sidecar says where every member lies; a wrong one (copied from another shard of the same size, left
from an older version of the shard, listing fewer samples than the shard holds, damaged) would make
the reader slice wrong bytes or drop samples without a word. So an index read from a sidecar is
checked against the shard's own headers once, when it is loaded (never per read):

- its arrays agree with themselves: every sample has members, consecutive samples differ in key,
  members lie in file order inside the shard, each right after a 512-byte header boundary;
- the 512 bytes before each member are a valid header (checksum and numeric fields, as
  :func:`~fastdata.formats.tar_fields.first_bad_header` checks them) of a regular file with that
  member's name and size, once the extended headers (PAX, GNU long names) before it are applied;
- nothing lies between the members, or after the last one, that a scan would have made part of a
  sample: only extended headers, folders, webdataset metadata and members without an extension,
  then the end-of-archive marker or the end of the file.

A local shard (a memory map) is checked whole, in numpy for members that follow one another directly
(the layout of fastdata's writer): about 0.4 of a scan's time for such shards. A remote shard would
need a request per header, so there only the first member (in the bytes fetched when the reader
opened), the last one with the end of the archive (one request) and two between are checked, in one
batch of ranged reads: a few requests, against the tens a shard's samples take. A sidecar copied from
another shard fails at the first member, one for an older version of the shard or listing fewer
samples at the end. :func:`check_once` does it
once per process for each version of a local shard and its sidecar (an index dropped from a reader's
cache and loaded again is not checked again).
"""

from __future__ import annotations

import hashlib

import numpy as np

from fastdata.formats.tar import ShardIndex, split_key
from fastdata.formats.tar_fields import (
    BLOCK,
    EXTENDED,
    HEADER,
    NO_DATA,
    Chain,
    Malformed,
    first_bad_header,
    header_problem,
    is_folder,
    is_meta,
    octal,
    octal_fields,
    ustar_name,
)
from fastdata.storage import Reader

SAMPLED = 4  # members checked in a remote shard: first, last, two between
TAIL_WINDOW = 64 << 10  # bytes read after the last member of a remote shard
MAX_GAP = 1 << 20  # the most bytes read between two members of a remote shard
_REGULAR_CODES = (48, 0, 55)  # typeflags '0', NUL, '7'


# (url, shard identity, digest of the sidecar's bytes) -> members without an extension, for every local
# sidecar this process found to match its shard; plain data, so a forked worker may use its parent's
_MATCHED: dict[tuple[object, ...], int] = {}
_MATCHED_MAX = 1 << 16


class _Mismatch(Exception):
    """The index does not describe the shard; the message says where."""


def check_index(index: ShardIndex, reader: Reader) -> str | None:
    """Why ``index`` (read from a sidecar) does not describe the shard ``reader`` reads, or None.

    On a local shard it also counts the members that belong to no sample (:attr:`ShardIndex.ignored`).
    """
    size = reader.size
    if index.size != size:
        return f"is for a shard of {index.size} bytes, the shard has {size}"
    if size == 0:
        return "is for an empty file"
    members = index.members
    counts = np.fromiter(map(len, members), dtype=np.int64, count=len(members))
    m = int(counts.sum())
    owner = np.repeat(np.arange(len(members)), counts)  # the sample of each member
    ext_t, off_t, size_t = zip(*[member for ms in members for member in ms]) if m else ((), (), ())
    offs, sizes = np.array(off_t, dtype=np.int64), np.array(size_t, dtype=np.int64)
    flat = _Flat(owner, list(ext_t), offs, sizes)
    try:
        ends = _check_layout(index, flat, counts, size)
        starts = np.concatenate(([0], ends[:-1])).astype(np.int64)  # where the headers before each member begin
        tail = int(ends[-1]) if m else 0
        buf = reader.buffer() if hasattr(reader, "buffer") else None
        if buf is not None:
            index.ignored = _check_local(index, flat, buf, size, offs, sizes, starts, tail)
        else:
            _check_sampled(index, flat, reader, size, offs, starts, tail)
    except _Mismatch as e:
        return str(e)
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
        raise _Mismatch(f"lists sample {i} ({keys[i]!r}) without members")
    for i in range(1, len(keys)):
        if keys[i] == keys[i - 1]:
            raise _Mismatch(f"lists samples {i - 1} and {i} under one key {keys[i]!r}")
    for key in keys:  # KEY.EXT splits back into KEY and EXT (what split_key gives for a scanned name)
        if not key or key[-1] == "/" or "." in key[key.rfind("/") + 1 :]:
            raise _Mismatch(f"lists a sample key {key!r} that a scan cannot give")
    kinds = {e: n for n, e in enumerate(set(flat.exts))}
    for ext in kinds:
        if not ext or "/" in ext or ext != ext.lower():
            raise _Mismatch(f"lists a member extension {ext!r} that a scan cannot give")
    if len(flat):
        pairs = flat.owner * len(kinds) + np.fromiter(map(kinds.__getitem__, flat.exts), np.int64, len(flat))
        if (np.diff(np.sort(pairs)) == 0).any():
            raise _Mismatch("lists two members of one sample with one extension")
    offs, sizes = flat.offs, flat.sizes
    ends = offs + sizes + (-sizes % BLOCK)
    prev = np.concatenate(([0], ends[:-1]))
    wrong = np.flatnonzero((offs % BLOCK != 0) | (offs < prev + BLOCK) | (sizes < 0) | (offs + sizes > size))
    if len(wrong):
        _, _, off, n = flat[int(wrong[0])]
        raise _Mismatch(f"lists a member at byte {off} ({n} bytes) out of order, off a header or past the end")
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
            raise _Mismatch(f"points at byte {int(offs[direct[found[0]]])}, which follows no valid header")
        regular = np.isin(blocks[:, 156], _REGULAR_CODES)
        if not regular.all():
            raise _Mismatch(
                f"points at byte {int(offs[direct[np.argmin(regular)]])}, which is not a regular file's data"
            )
        wrong = np.flatnonzero(_size_fields(blocks[:, 124:136]) != sizes[direct])
        if len(wrong):
            off, n = flat[int(direct[wrong[0]])][2:]
            raise _Mismatch(f"says the member at byte {off} has {n} bytes, its header says otherwise")
        _check_names(index, flat, direct, blocks)
    ignored = 0
    heads: list[int] = []  # every header walked, checked in one pass at the end
    chain = Chain()
    for j in np.flatnonzero(offs - BLOCK != starts).tolist():
        i, ext, off, n = flat[j]
        start = int(starts[j])
        got, skipped = _walk(bytes(buf[start:off]), start, chain, heads, member=True)
        ignored += skipped
        _compare(got, index.keys[i], ext, n, off)
    _, skipped = _walk(bytes(buf[tail:size]), tail, chain, heads, member=False)
    found = first_bad_header(rows[np.asarray(heads, dtype=np.int64) // BLOCK]) if heads else None
    if found is not None:
        raise _Mismatch(f"does not match the shard: {found[1]} in the header at byte {heads[found[0]]}")
    return ignored + skipped


def _check_sampled(
    index: ShardIndex, flat: _Flat, reader: Reader, size: int, offs: np.ndarray, starts: np.ndarray, tail: int
) -> None:
    """Check a few members of a remote shard, and its end, in one batch of ranged reads."""
    m = len(flat)
    picks = sorted(set(np.linspace(0, m - 1, min(m, SAMPLED)).round().astype(int).tolist())) if m else []
    ranges = [(int(starts[j]), int(offs[j] - starts[j])) for j in picks]
    if any(n > MAX_GAP for _, n in ranges):
        raise _Mismatch("has members far apart (more than 1 MiB between them): cannot be checked cheaply")
    window = min(TAIL_WINDOW, size - tail)
    data = reader.read_ranges([*ranges, (tail, window)] if window else ranges)
    heads: list[tuple[int, bytes]] = []
    for j, region in zip(picks, data):
        i, ext, off, n = flat[j]
        walked: list[int] = []
        got, _ = _walk(bytes(region), int(starts[j]), Chain(), walked, member=True)
        heads += [(a, bytes(region[a - int(starts[j]) : a - int(starts[j]) + BLOCK])) for a in walked]
        _compare(got, index.keys[i], ext, n, off)
    walked = []
    end = bytes(data[-1]) if window else b""
    _walk(end, tail, Chain(), walked, member=False, cut=tail + window < size)
    heads += [(a, end[a - tail : a - tail + BLOCK]) for a in walked]
    for at, block in heads:
        problem = header_problem(block)
        if problem is not None:
            raise _Mismatch(f"does not match the shard: {problem} in the header at byte {at}")


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
            raise _Mismatch(f"says the member at byte {off} is {keys[i]}.{ext}, its header names {name!r}")


def _compare(got: tuple[str, int, bytes, bool], key: str, ext: str, n: int, off: int) -> None:
    name, size, typeflag, sparse = got
    if typeflag not in (b"0", b"\0", b"7") or sparse:
        raise _Mismatch(f"points at byte {off}, which is not a regular file's data")
    if split_key(name) != (key, ext):
        raise _Mismatch(f"says the member at byte {off} is {key}.{ext}, its header names {name!r}")
    if size != n:
        raise _Mismatch(f"says the member at byte {off} has {n} bytes, its header says {size}")


def _walk(
    data: bytes, base: int, chain: Chain, heads: list[int], *, member: bool, cut: bool = False
) -> tuple[tuple[str, int, bytes, bool], int]:
    """Walk the headers in ``data`` (the shard's bytes from byte ``base``), allowing only what a scan
    leaves out of every sample; each header's offset goes to ``heads`` (the caller checks them).

    With ``member``, ``data`` ends with the header of a listed member: return its ``(name, size,
    typeflag, sparse)``. Without, it must reach the end-of-archive marker or the end of the file (not
    the end of a ``cut`` window). Also returns how many members without an extension it passed.
    """
    at, ignored, none = 0, 0, ("", 0, b"", False)
    while True:
        if at + BLOCK > len(data):
            if member or at < len(data) or cut:
                raise _Mismatch(f"does not match the shard's headers near byte {base + at}")
            return none, ignored  # the end of the file
        block = data[at : at + BLOCK]
        if not any(block):
            if member:
                raise _Mismatch(f"lists a member after the end-of-archive marker at byte {base + at}")
            return none, ignored
        heads.append(base + at)
        name_f, size_f, _, typeflag, _, prefix_f = HEADER.unpack_from(block)
        try:
            n = octal(size_f)
        except ValueError:
            n = -1
        data_at = at + BLOCK
        if n < 0:
            raise _Mismatch(f"does not match the shard: a damaged header at byte {base + at}")
        if typeflag in EXTENDED:
            if data_at + n > len(data):
                raise _Mismatch(f"does not match the shard's extended header at byte {base + at}")
            try:
                chain.add(typeflag, data[data_at : data_at + n], base + at)
            except Malformed as e:
                raise _Mismatch(f"does not match the shard: {e} at byte {base + at}") from None
            at = data_at + n + (-n % BLOCK)
            continue
        name, pax_size, sparse = chain.take()
        name = name if name is not None else ustar_name(name_f, prefix_f, typeflag)
        n = pax_size if pax_size is not None else n
        if member and data_at == len(data):
            return (name, n, typeflag, sparse or typeflag == b"S"), ignored
        folder = is_folder(name_f, typeflag)
        if typeflag == b"S" or not (folder or is_meta(name) or not split_key(name)[1]):
            raise _Mismatch(f"leaves out the member {name!r} at byte {base + at}")
        ignored += not (folder or is_meta(name))
        n = 0 if folder or typeflag in NO_DATA else n
        at = data_at + n + (-n % BLOCK)


__all__ = ["check_index", "check_once"]
