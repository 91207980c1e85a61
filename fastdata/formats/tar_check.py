"""Checking a sidecar index (``SHARD.tar.idx``) against its shard before it is trusted.

A sidecar says where every member lies; a wrong one (copied from another shard of the same size, left
from an older version of the shard, listing fewer samples than the shard holds, damaged) would make
the reader slice wrong bytes or drop samples without a word. So an index read from a sidecar is
checked against the shard's own headers once, when it is loaded (never per read):

- its arrays agree with themselves: every sample has members, consecutive samples differ in key,
  members lie in file order inside the shard, each right after a 512-byte header boundary;
- the 512 bytes before each member are a valid header (checksum and numeric fields, as
  :func:`~fastdata.formats.tar_headers.first_bad_header` checks them) of a regular file with that
  member's name and size, once the extended headers (PAX, GNU long names) before it are applied;
- nothing lies between the members, or after the last one, that a scan would have made part of a
  sample: only extended headers, folders, webdataset metadata and members without an extension,
  then the end-of-archive marker or the end of the file.

A local shard (a memory map) is checked whole, in numpy for members that follow one another directly
(the layout of fastdata's writer); that costs a fraction of a scan. A remote shard would need a
request per header, so there the first and last members, evenly spaced ones between (16 in all) and
the end of the archive are checked, in one batch of ranged reads.
"""

from __future__ import annotations

import numpy as np

from fastdata.formats.tar import ShardIndex, split_key
from fastdata.formats.tar_headers import (
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

SAMPLED = 16  # members checked in a remote shard
TAIL_WINDOW = 64 << 10  # bytes read after the last member of a remote shard
MAX_GAP = 1 << 20  # the most bytes read between two members of a remote shard
_REGULAR_CODES = (48, 0, 55)  # typeflags '0', NUL, '7'


class _Mismatch(Exception):
    """The index does not describe the shard; the message says where."""


Flat = list[tuple[int, str, int, int]]  # (sample, ext, data offset, size) of every member, in order


def check_index(index: ShardIndex, reader: Reader) -> str | None:
    """Why ``index`` (read from a sidecar) does not describe the shard ``reader`` reads, or None.

    On a local shard it also counts the members that belong to no sample (:attr:`ShardIndex.ignored`).
    """
    size = reader.size
    if index.size != size:
        return f"is for a shard of {index.size} bytes, the shard has {size}"
    if size == 0:
        return "is for an empty file"
    flat = [(i, ext, off, n) for i, ms in enumerate(index.members) for ext, off, n in ms]
    try:
        _check_layout(index, flat, size)
        offs = np.array([m[2] for m in flat], dtype=np.int64)
        sizes = np.array([m[3] for m in flat], dtype=np.int64)
        ends = offs + sizes + (-sizes % BLOCK)  # where each member's padded data ends
        starts = np.concatenate(([0], ends[:-1])).astype(np.int64)  # where the headers before each begin
        tail = int(ends[-1]) if len(flat) else 0
        buf = reader.buffer() if hasattr(reader, "buffer") else None
        if buf is not None:
            index.ignored = _check_local(index, flat, buf, size, offs, sizes, starts, tail)
        else:
            _check_sampled(index, flat, reader, size, offs, starts, tail)
    except _Mismatch as e:
        return str(e)
    return None


def _check_layout(index: ShardIndex, flat: Flat, size: int) -> None:
    keys = index.keys
    for i, ms in enumerate(index.members):
        key = keys[i]
        if not ms:
            raise _Mismatch(f"lists sample {i} ({key!r}) without members")
        if i and key == keys[i - 1]:
            raise _Mismatch(f"lists samples {i - 1} and {i} under one key {key!r}")
        exts = [m[0] for m in ms]
        if len(set(exts)) != len(exts):
            raise _Mismatch(f"lists two members of sample {key!r} with one extension")
        for ext in exts:
            if split_key(f"{key}.{ext}") != (key, ext):
                raise _Mismatch(f"lists a member {key}.{ext!r} that is not a KEY.EXT name")
    prev_end = 0
    for _, _, off, n in flat:
        if off % BLOCK or off < prev_end + BLOCK or n < 0 or off + n > size:
            raise _Mismatch(f"lists a member at byte {off} ({n} bytes) out of order, off a header or past the end")
        prev_end = off + n + (-n % BLOCK)


def _check_local(
    index: ShardIndex,
    flat: Flat,
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
    index: ShardIndex, flat: Flat, reader: Reader, size: int, offs: np.ndarray, starts: np.ndarray, tail: int
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


def _check_names(index: ShardIndex, flat: Flat, direct: np.ndarray, blocks: np.ndarray) -> None:
    """Each direct member's header names it: compared in numpy where the name fits the name field as
    written (the usual case), through the full ustar rules (prefix, extension case) otherwise."""
    keys = index.keys
    names = [f"{keys[flat[j][0]]}.{flat[j][1]}".encode("utf-8", "surrogateescape") for j in direct.tolist()]
    short = np.array([len(n) <= 100 for n in names], dtype=bool)
    expected = np.frombuffer(b"".join(n.ljust(100, b"\0")[:100] for n in names), dtype=np.uint8).reshape(-1, 100)
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


__all__ = ["check_index"]
