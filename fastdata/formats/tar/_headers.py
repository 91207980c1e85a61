"""Reading the fields of tar headers and PAX records (the writer's side is
:mod:`fastdata.formats.tar`), read as Python's ``tarfile`` (and so webdataset) reads
them, and checked so that no field is trusted further than it goes.

Every number is checked before it moves the parser: a negative size (GNU base-256 with the sign bit,
or an octal ``-...``), a PAX record whose length does not advance, a field that is not a number: each
is damage (:class:`Malformed`), reported by the scanner as a
:class:`~fastdata.core.errors.CorruptShard` naming the shard and the offset, never a loop, a jump
backwards, or bytes read from outside the member.
"""

from __future__ import annotations

import struct

import numpy as np

BLOCK = 512
# name, size, chksum, typeflag, magic, prefix (see POSIX ustar)
HEADER = struct.Struct("100s24x12s12x8sc100x6s82x155s12x")
CHKSUM_AT = 148
REGULAR = (b"0", b"\0", b"7")
EXTENDED = b"xXgLK"  # PAX (per member, Solaris, global) and GNU long name / long link headers
# links, devices, folders and FIFOs: POSIX stores no data after their header, whatever the size field
# says, and tarfile reads the next header right after theirs
NO_DATA = b"123456"
# the other numeric fields tarfile parses (mode, uid, gid, mtime, devmajor, devminor): a header whose
# field is not a number is one tarfile refuses, so it is damage here too
_NUMERIC = ((100, 8), (108, 8), (116, 8), (136, 12), (329, 8), (337, 8))
_MAX_PAX_LENGTH_DIGITS = 20


class Malformed(ValueError):
    """A header field or PAX record that is not what the format says; the message says which."""


def octal(field: bytes) -> int:
    """A numeric header field as ``tarfile`` reads it: octal digits up to the first NUL (spaces
    around them allowed), or GNU base-256 (first byte 0x80, or 0xFF for a negative two's complement).

    Raises:
        ValueError: the field is not a number.
    """
    try:
        return int(field.rstrip(b" \0"), 8)  # the common case: octal digits, then NUL or space
    except ValueError:
        pass
    if field[:1] in (b"\x80", b"\xff"):
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[0] == 0xFF else n
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def text(field: bytes) -> str:
    """A name field up to its first NUL (as ``tarfile`` cuts it), undecodable bytes kept."""
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def pax_records(data: bytes) -> dict[str, str]:
    """The records ``"LEN keyword=value\\n"`` of a PAX extended header's data.

    Every record must have a decimal length that covers it exactly, ends at its newline and lies
    inside ``data``: each step advances by at least one whole record, so the loop always ends.
    NUL bytes after the last record are padding (``tarfile`` stops there too).

    Raises:
        Malformed: a record that breaks these rules (``tarfile`` would stop reading the header there,
            or loop on a zero length in old versions).
    """
    out: dict[str, str] = {}
    at, end = 0, len(data)
    while at < end:
        if data[at] == 0:
            break
        space = data.find(b" ", at, min(end, at + _MAX_PAX_LENGTH_DIGITS + 1))
        digits = data[at:space] if space > at else b""
        if not digits.isdigit():
            found = data[at : at + 12]
            raise Malformed(f"PAX record at byte {at} of its header does not start with a length ({found!r})")
        length = int(digits)
        if length < len(digits) + 4 or at + length > end:
            raise Malformed(
                f"PAX record at byte {at} of its header claims {length} bytes, "
                f"{'fewer than a record holds' if length < len(digits) + 4 else f'only {end - at} are left'}"
            )
        if data[at + length - 1] != 0x0A:
            raise Malformed(f"PAX record at byte {at} of its header does not end where its length says")
        key, eq, value = data[space + 1 : at + length - 1].partition(b"=")
        if not eq or not key:
            raise Malformed(f"PAX record at byte {at} of its header has no 'keyword='")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        at += length
    return out


def pax_size(value: str) -> int:
    """A PAX ``size`` record's value, checked like a header's size field.

    Raises:
        Malformed: not a decimal number, or negative.
    """
    if value.isascii() and value.isdigit():
        return int(value)
    if value[:1] == "-" and value[1:].isdigit():
        raise Malformed(f"PAX size record is negative ({value})")
    raise Malformed(f"PAX size record {value!r} is not a number")


class Chain:
    """The extended headers (PAX, GNU long name) read since the last member, and the global PAX records.

    As in ``tarfile``, the first extended header of a chain that sets a field wins (``tarfile`` applies
    them from the innermost out), a PAX header's records include the global ones, and a global ``path``
    also names members that have no extended header of their own.
    """

    __slots__ = ("glob", "name", "size", "sparse", "start")

    def __init__(self) -> None:
        self.start = -1  # where the pending chain began; -1 when none is pending
        self.name: str | None = None
        self.size: int | None = None
        self.sparse = False
        self.glob: dict[str, str] = {}  # the global records that matter here (path, GNU.sparse.*)

    def add(self, typeflag: bytes, data: bytes, at: int) -> None:
        """Take in extended header ``typeflag`` at byte ``at`` holding ``data``.

        Raises:
            Malformed: a PAX record or value that breaks the format.
        """
        if self.start < 0:
            self.start = at
        if typeflag == b"L":
            if self.name is None:
                self.name = text(data)
            return
        if typeflag == b"K" or not (
            b"path=" in data or b"size=" in data or b"GNU.sparse." in data or (self.glob and typeflag != b"g")
        ):
            return  # webdataset writes a PAX header before every member, usually an mtime alone
        records = pax_records(data)
        if typeflag == b"g":
            if "size" in records:
                raise Malformed("a global PAX header sets the size of every member")
            self.glob.update((k, v) for k, v in records.items() if k == "path" or k[:11] == "GNU.sparse.")
            return
        found = {**self.glob, **records} if self.glob else records
        if self.name is None:
            for key, value in found.items():  # the last of them wins, as tarfile applies them in order
                if key == "path":
                    self.name = value.rstrip("/")
                elif key == "GNU.sparse.name":  # a PAX sparse file's real name
                    self.name = value
        if self.size is None and "size" in found:
            self.size = pax_size(found["size"])
        self.sparse = self.sparse or any(k[:11] == "GNU.sparse." for k in found)

    def take(self) -> tuple[str | None, int | None, bool]:
        """``(name, size, sparse)`` that the chain (and the global records) give the member that ends it:
        None where the member's own header decides. Starts a new chain."""
        glob = self.glob
        name = self.name if self.name is not None else glob["path"].rstrip("/") if "path" in glob else None
        out = (name, self.size, self.sparse or any(k[:11] == "GNU.sparse." for k in glob))
        self.start, self.name, self.size, self.sparse = -1, None, None, False
        return out


def ustar_name(name_f: bytes, prefix_f: bytes, typeflag: bytes) -> str:
    """A member's name from its own header: the ustar prefix (not in GNU's own types), a ``/``, the name."""
    name = name_f.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    if prefix_f[0] and typeflag not in b"LKS":
        name = prefix_f.split(b"\0", 1)[0].decode("utf-8", "surrogateescape") + "/" + name
    return name


def is_folder(name_f: bytes, typeflag: bytes) -> bool:
    """A folder: type 5, or an old-style regular entry whose name ends in ``/`` (as ``tarfile`` says)."""
    return typeflag == b"5" or (typeflag == b"\0" and name_f.split(b"\0", 1)[0].endswith(b"/"))


def is_meta(name: str) -> bool:
    """webdataset's metadata members (``__key__`` style names at the top level): part of no sample."""
    return name.startswith("__") and name.endswith("__") and "/" not in name


def header_problem(block: bytes) -> str | None:
    """Why one 512-byte header is not one ``tarfile`` would accept (bad checksum, a numeric field
    that is not a number), or None. The slow, exact check of :func:`first_bad_header`."""
    try:
        stored = octal(block[CHKSUM_AT : CHKSUM_AT + 8])
    except ValueError:
        return "bad checksum (the checksum field is not a number)"
    unsigned = sum(block) - sum(block[CHKSUM_AT : CHKSUM_AT + 8]) + 8 * 32
    # old writers summed signed bytes
    if stored != unsigned and stored != unsigned - 256 * sum(
        b > 127 for b in block[:CHKSUM_AT] + block[CHKSUM_AT + 8 :]
    ):
        return "bad checksum"
    for at, n in ((124, 12), *_NUMERIC):
        try:
            octal(block[at : at + n])
        except ValueError:
            return f"a numeric field at byte {at} of the header is not a number ({block[at : at + n]!r})"
    return None


# byte classes for numeric fields: octal digit 1, terminator (NUL, space) 2, anything else 8
_CLASS = np.full(256, 8, dtype=np.int8)
_CLASS[48:56] = 1
_CLASS[[0, 32]] = 2


def _plain(classes: np.ndarray) -> np.ndarray:
    """Rows (byte classes of one field each) in the common form: octal digits, then only NULs and
    spaces. (A terminator followed later by a digit always shows as a terminator next to a digit.)"""
    return (classes.max(axis=1) < 8) & ~((classes[:, :-1] - classes[:, 1:]) == 1).any(axis=1)  # type: ignore[no-any-return]


def octal_fields(fields: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values of numeric fields (rows of bytes, up to 12 wide) in the common form, and which rows
    are in it; a row in another form (base-256, leading spaces, a sign) needs :func:`octal`."""
    classes = _CLASS[fields]
    digits = classes == 1
    weights = 8 ** np.arange(fields.shape[1] - 1, -1, -1, dtype=np.int64)
    values = ((fields.astype(np.int64) - 48) * digits) @ weights >> (3 * (fields.shape[1] - digits.sum(axis=1)))
    return values, _plain(classes)


def _plain_fields(blocks: np.ndarray) -> np.ndarray:
    """Which headers have every numeric field but size and checksum in the common form. Those fields
    rarely change within a shard: only the rows that differ from the first are classified."""
    ok = np.ones(len(blocks), dtype=bool)
    for start, stop, width in ((100, 124, 8), (136, 148, 12), (329, 345, 8)):
        fields = blocks[:, start:stop]
        differ = np.flatnonzero((fields != fields[0]).any(axis=1))
        if not _plain(_CLASS[fields[0]].reshape(-1, width)).all():
            differ = np.arange(len(blocks))
        if len(differ):
            ok[differ] &= _plain(_CLASS[fields[differ]].reshape(-1, width)).reshape(len(differ), -1).all(axis=1)
    return ok


def first_bad_header(blocks: np.ndarray) -> tuple[int, str] | None:
    """The first of ``blocks`` (rows of 512 bytes) that is not a valid header, and why; or None.

    A few numpy passes: the checksum (the byte sum with its own field read as eight spaces) and every
    numeric field in its common form; a row in another form (base-256, leading spaces, a sign, an old
    writer's signed-byte checksum) is checked exactly, one by one, by :func:`header_problem`.
    """
    if len(blocks) == 0:
        return None
    field = blocks[:, CHKSUM_AT : CHKSUM_AT + 8]
    unsigned = blocks.sum(axis=1, dtype=np.uint32).astype(np.int64) - field.sum(axis=1, dtype=np.int64) + 8 * 32
    stored, plain = octal_fields(field)
    suspect = ~plain | (stored != unsigned) | ~_plain_fields(blocks)
    for row in np.flatnonzero(suspect).tolist():
        problem = header_problem(blocks[row].tobytes())
        if problem is not None:
            return row, problem
    return None


__all__ = [
    "BLOCK",
    "CHKSUM_AT",
    "EXTENDED",
    "HEADER",
    "NO_DATA",
    "REGULAR",
    "Chain",
    "Malformed",
    "first_bad_header",
    "header_problem",
    "is_folder",
    "is_meta",
    "octal",
    "octal_fields",
    "pax_records",
    "pax_size",
    "text",
    "ustar_name",
]
