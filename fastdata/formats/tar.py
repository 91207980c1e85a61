"""Tar shards in the WebDataset layout: members ``KEY.EXT`` grouped into samples by ``KEY``.

Reading a tar is deciding where its members are. Python's ``tarfile`` parses ~17k headers/s here and
``webdataset`` yields ~7k samples/s, while the bytes come off the page cache at ~5 GB/s. So we parse
the 512-byte headers by hand (one ``struct.unpack_from`` each, checksums verified in one numpy pass at
the end) into a :class:`ShardIndex`: for every sample its key and the offset and size of each member.
With the index, reading a sample is slicing its members out of the file, and any sample can be read
in any order (shuffling, resuming, splitting a shard between workers) without reading the others.

Nothing is ever extracted to disk. Names with ``..`` or an absolute path, links and devices are
reported as :class:`~fastdata.core.errors.UnsafeMember`; a truncated or damaged shard as
:class:`~fastdata.core.errors.CorruptShard`. Both are bad samples, subject to the dataset's ``on_error``.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fastdata.core.errors import BadSample, CorruptShard, UnsafeMember
from fastdata.storage import Reader

BLOCK = 512
# name, size, chksum, typeflag, magic, prefix (see POSIX ustar)
_HEADER = struct.Struct("100s24x12s12x8sc100x6s82x155s12x")
_CHKSUM_AT = 148
_REGULAR = (b"0", b"\0", b"7")


def split_key(name: str) -> tuple[str, str]:
    """``("dir/key", "ext")`` for ``"dir/key.ext"`` (extension lower-cased; ``""`` without one): webdataset's
    rule, the key ends at the first dot of the last path component (a leading dot starts no extension)."""
    dot = name.find(".", name.rfind("/") + 1)
    return (name[:dot], name[dot + 1 :].lower()) if dot > 0 and name[dot - 1] != "/" else (name, "")


def is_safe_name(name: str) -> bool:
    """False for absolute names and names with a ``..`` component."""
    return not (name.startswith("/") or ".." in name.replace("\\", "/").split("/"))


Member = tuple[str, int, int]  # (ext, data offset, size)


@dataclass
class ShardIndex:
    """Where each sample of one shard lies.

    Attributes:
        url (str): the shard.
        keys (list[str]): each sample's key.
        members (list[tuple[Member, ...]]): each sample's members as (ext, offset, size).
        spans (list[tuple[int, int]]): each sample's byte range, headers included.
        bad (dict[int, BadSample]): samples found bad while scanning, by sample number.
        complete (bool): False when the scan stopped early (truncated or damaged shard).
    """

    url: str
    keys: list[str] = field(default_factory=list)
    members: list[tuple[Member, ...]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    bad: dict[int, BadSample] = field(default_factory=dict)
    complete: bool = True
    tail_error: BadSample | None = None
    size: int = -1  # bytes in the shard when indexed, to notice a stale sidecar index

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
        )
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, url: str, data: bytes) -> ShardIndex:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            keys = z["keys"].tolist()
            counts = z["counts"].tolist()
            exts, offsets, sizes = z["exts"].tolist(), z["offsets"].tolist(), z["sizes"].tolist()
            spans = [tuple(s) for s in z["spans"].tolist()]
            size = int(z["size"])
        members: list[tuple[Member, ...]] = []
        at = 0
        for c in counts:
            members.append(tuple(zip(exts[at : at + c], offsets[at : at + c], sizes[at : at + c])))
            at += c
        return cls(url, keys, members, spans, size=size)  # type: ignore[arg-type]


def _octal(field: bytes) -> int:
    try:
        return int(field.rstrip(b" \0"), 8)  # the common case: octal digits, then NUL or space
    except ValueError:
        pass
    if field[:1] in (b"\x80", b"\xff"):  # GNU base-256 for sizes of 8 GiB and more
        n = int.from_bytes(field[1:], "big")
        return -n if field[:1] == b"\xff" else n
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def _pax_records(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    at = 0
    while at < len(data):
        space = data.index(b" ", at)
        length = int(data[at:space])
        key, _, value = data[space + 1 : at + length - 1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        at += length
    return out


def scan(reader: Reader) -> ShardIndex:
    """Index a tar shard by parsing its headers (data is skipped, never read).

    Bad members become bad samples in the index; a damaged or truncated shard stops the scan and is
    recorded in ``tail_error`` (every sample after it is unreadable). Never raises for bad data.
    """
    url, size = reader.url, reader.size
    buf = reader.buffer() if hasattr(reader, "buffer") else None
    index = ShardIndex(url, size=size)
    keys, members, spans, bad = index.keys, index.members, index.spans, index.bad
    header_at: list[int] = []
    header_sum: list[int] = []
    unpack = _HEADER.unpack_from
    octal = _octal
    cur_key: str | None = None
    cur: list[Member] = []
    cur_start = 0
    long_name: str | None = None
    pax: dict[str, str] = {}
    at = 0
    while True:
        if at + BLOCK > size:
            if at < size:
                _fail(index, f"truncated: {size - at} stray bytes where a 512-byte header should start", at)
            break  # a shard may also end right after its last member
        block = buf[at : at + BLOCK] if buf is not None else reader.read(at, BLOCK)
        name_f, size_f, sum_f, typeflag, _magic, prefix_f = unpack(block)
        if name_f[0] == 0 and not any(block):
            break  # end-of-archive marker
        try:
            member_size = octal(size_f)
            header_sum.append(octal(sum_f))
        except ValueError:
            _fail(index, "damaged header (size or checksum is not a number)", at)
            break
        header_at.append(at)
        data_at = at + BLOCK
        if data_at + member_size > size:
            cut = (
                pax.get("path")
                or long_name
                or "/".join(f.split(b"\0", 1)[0].decode("utf-8", "surrogateescape") for f in (prefix_f, name_f) if f[0])
            )
            _fail(
                index, f"truncated: member {cut!r} needs {member_size} bytes, the shard ends after {size - data_at}", at
            )
            cut_key = split_key(cut)[0]
            if cur_key is not None and cut_key != cur_key:
                # the cut member starts a new sample: the one before it is whole and stays readable
                keys.append(cur_key)
                members.append(tuple(cur))
                spans.append((cur_start, at))
                cur_key = None
            bad[len(keys)] = index.tail_error  # type: ignore[assignment]
            keys.append(cur_key if cur_key is not None else cut_key)
            members.append(tuple(cur) if cur_key is not None else ())
            spans.append((cur_start if cur_key is not None else at, at))
            cur_key = None
            break
        at = data_at + member_size + (-member_size % BLOCK)
        if typeflag in b"xgLK":
            ext_data = (
                bytes(buf[data_at : data_at + member_size]) if buf is not None else reader.read(data_at, member_size)
            )
            if typeflag == b"L":
                long_name = ext_data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            elif typeflag == b"x" and (b" path=" in ext_data or b" size=" in ext_data):
                pax = _pax_records(ext_data)  # webdataset writes one per member, usually just an mtime
            continue
        if long_name is not None:
            name, long_name = long_name, None
        else:
            name = name_f.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if prefix_f[0]:
                name = prefix_f.split(b"\0", 1)[0].decode("utf-8", "surrogateescape") + "/" + name
        if pax:
            name = pax.get("path", name)
            if "size" in pax:
                member_size = int(pax["size"])
                at = data_at + member_size + (-member_size % BLOCK)
            pax = {}
        if typeflag == b"5" or (name.startswith("__") and name.endswith("__") and "/" not in name):
            continue  # folders, and webdataset's metadata members, carry no sample data
        key, ext = split_key(name)
        if key != cur_key:
            if cur_key is not None:
                keys.append(cur_key)
                members.append(tuple(cur))
                spans.append((cur_start, data_at - BLOCK))
            cur_key, cur, cur_start = key, [], data_at - BLOCK
        if (
            typeflag in _REGULAR
            and ext
            and "/" not in ext
            and name[0] != "/"
            and ".." not in name
            and all(m[0] != ext for m in cur)
        ):
            cur.append((ext, data_at, member_size))
        else:
            bad.setdefault(len(keys), _member_problem(url, name, typeflag, key, ext))
    if cur_key is not None:
        keys.append(cur_key)
        members.append(tuple(cur))
        spans.append((cur_start, at))
    _verify_checksums(index, buf, reader, header_at, header_sum)
    return index


def _fail(index: ShardIndex, message: str, at_byte: int) -> None:
    index.complete = False
    index.tail_error = CorruptShard(
        f"{index.url}: {message} at byte {at_byte}; re-create or re-download this shard", index.url
    )


def _member_problem(url: str, name: str, typeflag: bytes, key: str, ext: str) -> BadSample:
    """Why a member cannot be part of a sample (the slow path of :func:`scan`)."""
    if not is_safe_name(name):
        return UnsafeMember(
            f"{url}: member {name!r} has an absolute path or '..'; fastdata never "
            "extracts it; rebuild the shard with relative names",
            url,
        )
    if typeflag not in _REGULAR:
        return UnsafeMember(
            f"{url}: member {name!r} is a link or device (type {typeflag!r}), not a "
            "regular file; rebuild the shard without it",
            url,
        )
    if not ext or "/" in ext:
        return BadSample(
            f"{url}: member {name!r} has no extension, so it belongs to no sample (WebDataset names are KEY.EXT)", url
        )
    if ".." in name:  # a harmless '..' inside a file name, like 'a..b.jpg'
        return BadSample(f"{url}: member {name!r} has '..' in its name; rename it", url)
    return CorruptShard(f"{url}: sample {key!r} has two '.{ext}' members", url)


def _verify_checksums(
    index: ShardIndex, buf: object, reader: Reader, header_at: list[int], header_sum: list[int]
) -> None:
    """Check every header's checksum in one numpy pass; cut the index at the first damaged one."""
    if not header_at:
        return
    at = np.asarray(header_at, dtype=np.int64)
    if buf is not None:
        # headers start on 512-byte boundaries: view the file as rows of 512 and gather rows
        whole = len(buf) // BLOCK * BLOCK  # type: ignore[arg-type]
        rows = np.frombuffer(buf, dtype=np.uint8, count=whole).reshape(-1, BLOCK)  # type: ignore[call-overload]
        blocks = rows[at // BLOCK]
    else:
        blocks = np.frombuffer(b"".join(reader.read(int(a), BLOCK) for a in at), np.uint8).reshape(-1, BLOCK)
    # the checksum is the byte sum of the header with its own field read as eight spaces
    field = blocks[:, _CHKSUM_AT : _CHKSUM_AT + 8]
    unsigned = blocks.sum(axis=1, dtype=np.int64) - field.sum(axis=1, dtype=np.int64) + 8 * ord(" ")
    high = (blocks > 127).sum(axis=1, dtype=np.int64) - (field > 127).sum(axis=1, dtype=np.int64)
    signed = unsigned - 256 * high  # old writers summed signed chars
    stored = np.asarray(header_sum, dtype=np.int64)
    wrong = np.nonzero((unsigned != stored) & (signed != stored))[0]
    if len(wrong) == 0:
        return
    first = int(at[wrong[0]])
    keep = sum(1 for start, _ in index.spans if start < first)
    # the sample holding the damaged header, and all after it, cannot be trusted
    keep = max(0, keep - 1) if keep and index.spans[keep - 1][1] > first else keep
    del index.keys[keep:], index.members[keep:], index.spans[keep:]
    for i in [i for i in index.bad if i >= keep]:
        del index.bad[i]
    index.complete = False
    index.tail_error = CorruptShard(
        f"{index.url}: damaged header (bad checksum) at byte {first}; re-create or re-download this shard", index.url
    )


def read_samples(reader: Reader, index: ShardIndex, which: Sequence[int]) -> list[dict[str, object]]:
    """The samples ``which`` of a shard as dicts ``{"__key__", "__url__", EXT: bytes, ...}``.

    The caller checks :meth:`ShardIndex.error_at` first; this reads only good samples.
    """
    ranges = [(off, n) for i in which for _, off, n in index.members[i]]
    data = reader.read_ranges(ranges)
    out: list[dict[str, object]] = []
    at = 0
    url, keys, members = index.url, index.keys, index.members
    for i in which:
        sample: dict[str, object] = {"__key__": keys[i], "__url__": url}
        for ext, _, _ in members[i]:
            sample[ext] = data[at]
            at += 1
        out.append(sample)
    return out


def index_url(url: str) -> str:
    """Where the sidecar index of shard ``url`` lives: ``url + ".idx"``."""
    return url + ".idx"
