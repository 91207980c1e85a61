"""Walking the headers between the members a sidecar index lists, to check what it claims about them
(shared by the check of a whole shard, :mod:`fastdata.formats.tar`, and the check of each member
of a remote shard as it is read, :mod:`fastdata.formats.tar`).

Between two members that belong to samples a shard may hold only what a scan leaves out of every
sample: extended headers (PAX, GNU long names), folders, webdataset metadata and members without an
extension. :func:`walk` follows the headers of such a stretch as the scanner does and says which member
ends it; :func:`compare` holds that member against the sidecar's claim.
"""

from __future__ import annotations

from fastdata.formats.tar._headers import (
    BLOCK,
    EXTENDED,
    HEADER,
    NO_DATA,
    Chain,
    Malformed,
    is_folder,
    is_meta,
    octal,
    ustar_name,
)
from fastdata.formats.tar._reader import split_key

Found = tuple[str, int, bytes, bool]  # a member's (name, size, typeflag, sparse)


class Mismatch(Exception):
    """The index does not describe the shard; the message says where."""


class Cut(Mismatch):
    """The bytes given end before the walk could: more of the shard is needed to decide."""


def compare(got: Found, key: str, ext: str, n: int, off: int) -> None:
    """The member :func:`walk` found is the regular file ``KEY.EXT`` of ``n`` bytes at byte ``off``.

    Raises:
        Mismatch: it is not.
    """
    name, size, typeflag, sparse = got
    if typeflag not in (b"0", b"\0", b"7") or sparse:
        raise Mismatch(f"points at byte {off}, which is not a regular file's data")
    if split_key(name) != (key, ext):
        raise Mismatch(f"says the member at byte {off} is {key}.{ext}, its header names {name!r}")
    if size != n:
        raise Mismatch(f"says the member at byte {off} has {n} bytes, its header says {size}")


def walk(
    data: bytes, base: int, chain: Chain, heads: list[int], *, member: bool, cut: bool = False
) -> tuple[Found, int]:
    """Walk the headers in ``data`` (the shard's bytes from byte ``base``), allowing only what a scan
    leaves out of every sample; each header's offset goes to ``heads`` (the caller checks them).

    With ``member``, ``data`` ends with the header of a listed member: return its ``(name, size,
    typeflag, sparse)``. Without, it must reach the end-of-archive marker or the end of the file; with
    ``cut``, ``data`` is only the start of the rest of the file (:class:`Cut` when that is not enough).
    Also returns how many members without an extension it passed.

    Raises:
        Mismatch: the headers are not what the index claims.
    """
    at, ignored, none = 0, 0, ("", 0, b"", False)
    while True:
        if at + BLOCK > len(data):
            if cut and not member:
                raise Cut(f"needs more than the bytes read after byte {base} to reach the end of the archive")
            if member or at < len(data):
                raise Mismatch(f"does not match the shard's headers near byte {base + at}")
            return none, ignored  # the end of the file
        block = data[at : at + BLOCK]
        if not any(block):
            if member:
                raise Mismatch(f"lists a member after the end-of-archive marker at byte {base + at}")
            return none, ignored
        heads.append(base + at)
        name_f, size_f, _, typeflag, _, prefix_f = HEADER.unpack_from(block)
        try:
            n = octal(size_f)
        except ValueError:
            n = -1
        data_at = at + BLOCK
        if n < 0:
            raise Mismatch(f"does not match the shard: a damaged header at byte {base + at}")
        if typeflag in EXTENDED:
            if data_at + n > len(data):
                if cut and not member:
                    raise Cut(f"needs more than the bytes read for the extended header at byte {base + at}")
                raise Mismatch(f"does not match the shard's extended header at byte {base + at}")
            try:
                chain.add(typeflag, data[data_at : data_at + n], base + at)
            except Malformed as e:
                raise Mismatch(f"does not match the shard: {e} at byte {base + at}") from None
            at = data_at + n + (-n % BLOCK)
            continue
        name, pax_size, sparse = chain.take()
        name = name if name is not None else ustar_name(name_f, prefix_f, typeflag)
        n = pax_size if pax_size is not None else n
        if member and data_at == len(data):
            return (name, n, typeflag, sparse or typeflag == b"S"), ignored
        folder = is_folder(name_f, typeflag)
        if typeflag == b"S" or not (folder or is_meta(name) or not split_key(name)[1]):
            raise Mismatch(f"leaves out the member {name!r} at byte {base + at}")
        ignored += not (folder or is_meta(name))
        n = 0 if folder or typeflag in NO_DATA else n
        at = data_at + n + (-n % BLOCK)


__all__ = ["Cut", "Found", "Mismatch", "compare", "walk"]
