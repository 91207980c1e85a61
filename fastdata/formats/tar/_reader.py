"""Tar shards in the WebDataset layout: members ``KEY.EXT`` grouped into samples by ``KEY``.

Reading a tar is deciding where its members are. Python's ``tarfile`` parses ~17k headers/s here and
``webdataset`` yields ~7k samples/s, while the bytes come off the page cache at ~5 GB/s. So we parse
the 512-byte headers by hand (one ``struct.unpack_from`` each, checksums and numeric fields verified in
one numpy pass at the end) into a :class:`ShardIndex`: for every sample its key and the offset and size
of each member. With the index, reading a sample is slicing its members out of the file, and any sample
can be read in any order (shuffling, resuming, splitting a shard between workers) without reading the
others.

Headers are read as ``tarfile`` (and so webdataset) reads them: ustar prefixes, GNU long names, PAX
``path``/``size`` records (the first extended header before a member wins, as in ``tarfile``), global
PAX headers, and no data after links, devices and folders. Nothing is ever extracted to disk. Names with
``..`` or an absolute path, links, devices and GNU sparse files are reported as
:class:`~fastdata.core.errors.UnsafeMember`; a truncated or damaged shard as
:class:`~fastdata.core.errors.CorruptShard`. Both are bad samples, subject to the dataset's ``on_error``.
A member without an extension (a ``README``) belongs to no sample: it is left out and counted in
:attr:`ShardIndex.ignored`. A key whose members are not next to each other (``tar cf`` of a folder) is
still one sample: the scan gathers its members (``_group``) and counts such keys in :attr:`ShardIndex.split`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fastdata.core.errors import BadSample, CorruptShard, UnsafeMember
from fastdata.formats.tar._compressed import MAGIC
from fastdata.formats.tar._group import group_keys, has_split_keys
from fastdata.formats.tar._headers import (
    BLOCK,
    EXTENDED,
    HEADER,
    NO_DATA,
    REGULAR,
    Chain,
    Malformed,
    first_bad_header,
    header_problem,
    octal,
    text,
    ustar_name,
)
from fastdata.formats.tar._index import Member, ShardIndex
from fastdata.storage import Reader

GZIP_MAGIC = b"\x1f\x8b"


def split_key(name: str) -> tuple[str, str]:
    """``("dir/key", "ext")`` for ``"dir/key.ext"`` (extension lower-cased; ``""`` without one): webdataset's
    rule, the key ends at the first dot of the last path component (a leading dot starts no extension)."""
    dot = name.find(".", name.rfind("/") + 1)
    return (name[:dot], name[dot + 1 :].lower()) if dot > 0 and name[dot - 1] != "/" else (name, "")


def is_safe_name(name: str) -> bool:
    """False for absolute names and names with a ``..`` component."""
    return not (name.startswith("/") or ".." in name.replace("\\", "/").split("/"))


class _Damage(Exception):
    """Damage met while scanning: where, what was found, and the name of the member it hit if known."""

    def __init__(self, message: str, at: int, block: bytes | None = None, name: str | None = None) -> None:
        super().__init__(message)
        self.message, self.at, self.block, self.name = message, at, block, name


def scan(reader: Reader) -> ShardIndex:
    """Index a tar shard by parsing its headers (data is skipped, never read).

    Bad members become bad samples in the index; a damaged or truncated shard stops the scan, keeps the
    samples before the damage and ends with one bad sample for the loss (see :class:`ShardIndex`).
    Never raises for bad data, and always ends: every step moves forward by at least one block.
    """
    url, size = reader.url, reader.size
    index = ShardIndex(url, size=size, identity=getattr(reader, "identity", None))
    buf = reader.buffer() if hasattr(reader, "buffer") else None
    read = reader.read
    keys, members, spans, bad = index.keys, index.members, index.spans, index.bad
    header_at: list[int] = []
    ignored: list[int] = []
    unpack = HEADER.unpack_from
    cur_key: str | None = None
    cur: list[Member] = []
    cur_start = 0
    chain = Chain()
    ended = False  # met the end-of-archive marker
    last_name = ""  # the last member's name, for a cut in the padding after it
    damage: _Damage | None = None
    at = 0
    try:
        if size == 0:
            raise _Damage("is empty (0 bytes), not a tar archive", 0)
        while True:
            if at + BLOCK > size:
                if at > size and chain.start >= 0:
                    raise _Damage("truncated: the shard ends in the padding of an extended header", chain.start)
                if at > size:
                    # the last member's data is whole but the zero padding after it is cut: the shard was cut
                    # (tarfile raises here too), and whatever followed the member is lost
                    raise _Damage(
                        f"truncated: the shard ends {at - size} bytes short of the end of the zero padding "
                        f"after member {last_name!r}",
                        size,
                    )
                if at < size:
                    partial = bytes(buf[at:size]) if buf is not None else read(at, size - at)
                    cut_name = chain.name or (text(partial[:100]) if len(partial) >= 100 else None)
                    raise _Damage(
                        f"truncated: the shard ends {size - at} bytes into a 512-byte header", at, None, cut_name
                    )
                if chain.start >= 0:
                    raise _Damage("truncated: the shard ends after an extended header, before its member", chain.start)
                break  # a shard may also end right after its last member
            block = buf[at : at + BLOCK] if buf is not None else read(at, BLOCK)
            name_f, size_f, _, typeflag, _, prefix_f = unpack(block)
            if name_f[0] == 0 and not any(block):
                if chain.start >= 0:
                    raise _Damage("an extended header is followed by the end-of-archive marker", chain.start)
                ended = True
                break
            try:
                member_size = octal(size_f)
            except ValueError:
                raise _Damage(
                    f"damaged header: its size field {bytes(size_f)!r} is not a number", at, block, chain.name
                ) from None
            if member_size < 0:
                raise _Damage(f"damaged header: negative size ({member_size})", at, block, chain.name)
            header_at.append(at)
            data_at = at + BLOCK
            if typeflag in EXTENDED:
                end = data_at + member_size
                if end > size:
                    raise _Damage(
                        f"truncated: an extended header needs {member_size} bytes, the shard ends after "
                        f"{size - data_at}",
                        at,
                        block,
                    )
                try:
                    chain.add(typeflag, bytes(buf[data_at:end]) if buf is not None else read(data_at, member_size), at)
                except Malformed as e:
                    raise _Damage(f"damaged PAX header: {e}", at, block) from None
                at = end + (-member_size % BLOCK)
                continue
            hdr_at = at
            if typeflag == b"S":  # old GNU sparse: blocks of its sparse map come before the data
                more = block[482]
                while more:
                    if data_at + BLOCK > size:
                        raise _Damage("truncated inside a GNU sparse member's map", hdr_at, block)
                    more = (buf[data_at + 504] if buf is not None else read(data_at + 504, 1)[0]) != 0
                    data_at += BLOCK
            name: str | None = None
            sparse = typeflag == b"S"
            if chain.start >= 0 or chain.glob:
                name, pax_size, pax_sparse = chain.take()
                if pax_size is not None:
                    member_size = pax_size
                sparse = sparse or pax_sparse
            if name is None:
                name = name_f.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                if prefix_f[0] and typeflag != b"S":
                    name = prefix_f.split(b"\0", 1)[0].decode("utf-8", "surrogateescape") + "/" + name
            folder = typeflag == b"5" or (typeflag == b"\0" and name_f.split(b"\0", 1)[0].endswith(b"/"))
            data_len = 0 if folder or typeflag in NO_DATA else member_size
            end = data_at + data_len
            if end > size:
                raise _Damage(
                    f"truncated: member {name!r} needs {data_len} bytes, the shard ends after {size - data_at}",
                    hdr_at,
                    None,
                    name,
                )
            at = end + (-data_len % BLOCK)
            last_name = name
            if folder or (name.startswith("__") and name.endswith("__") and "/" not in name):
                continue  # folders, and webdataset's metadata members, carry no sample data
            key, ext = split_key(name)
            if not ext:
                ignored.append(hdr_at)  # a README or a stray file: no KEY.EXT, so part of no sample
                continue
            if key != cur_key:
                if cur_key is not None:
                    keys.append(cur_key)
                    members.append(tuple(cur))
                    spans.append((cur_start, hdr_at))
                cur_key, cur, cur_start = key, [], hdr_at
            if (
                typeflag in REGULAR
                and not sparse
                and name[0] != "/"
                and ".." not in name
                and all(m[0] != ext for m in cur)
            ):
                cur.append((ext, data_at, member_size))
            else:
                bad.setdefault(len(keys), _member_problem(url, name, typeflag, key, ext, sparse))
    except _Damage as d:
        damage = d
    stream_damage = getattr(reader, "damage", None)  # a compressed shard whose stream broke
    if stream_damage and not ended:
        if damage is None:
            damage = _Damage(f"truncated: {stream_damage}", size)
        else:
            damage.message += f" ({stream_damage})"
    if damage is not None:
        _end_at_damage(index, damage, cur_key, cur, cur_start)
    elif cur_key is not None:
        keys.append(cur_key)
        members.append(tuple(cur))
        spans.append((cur_start, at))
    cut = _verify_headers(index, buf, reader, header_at, damage)
    index.ignored = len(ignored) if cut is None else sum(1 for a in ignored if a < cut)
    if has_split_keys(keys):  # members of one key scattered over the shard (tar of a folder): gather them
        group_keys(index)
    return index


def _error(index: ShardIndex, message: str, at: int | None) -> CorruptShard:
    where = f" at byte {at}" if at is not None else ""
    return CorruptShard(f"{index.url}: {message}{where}; re-create or re-download this shard", index.url)


def _not_a_header(problem: str, found: bytes, at: int) -> str:
    """What was found where a header should be, for the message."""
    found = found.rstrip(b"\0")
    if at:
        return f"damaged header ({problem}; found {found!r})"
    packed = next((name for magic, name in MAGIC.items() if found.startswith(magic)), None)
    hint = f"; {packed}-compressed? TarShardDataset reads those" if packed else ""
    return f"not a tar archive: the first 512 bytes are not a tar header ({problem}; found {found!r}{hint})"


def _end_at_damage(index: ShardIndex, damage: _Damage, cur_key: str | None, cur: list[Member], cur_start: int) -> None:
    """End the index at ``damage``: the samples before it stay; the sample it hit (or, if it came
    between samples, a placeholder) becomes the bad sample that stands for the loss."""
    message, name = damage.message, damage.name
    if damage.block is not None:
        block = bytes(damage.block)
        problem = header_problem(block)
        if problem is not None:
            message = _not_a_header(problem, block[:16], damage.at)
        name_f, _, _, typeflag, _, prefix_f = HEADER.unpack_from(block)
        if problem is not None and problem.startswith("bad checksum"):
            name = None  # not a header at all: none of its fields can be trusted
        elif typeflag in EXTENDED:
            name = None  # which member an extended header was for is unknown: maybe the current sample's
        elif name is None:
            name = ustar_name(name_f, prefix_f, typeflag)
    error = _error(index, message, damage.at if index.size else None)
    index.complete, index.tail_error = False, error
    keys, members, spans = index.keys, index.members, index.spans
    cut_key = split_key(name)[0] if name else None
    if cur_key is not None and cut_key is not None and cut_key != cur_key:
        # the damage hit a new sample: the one before it is whole and stays readable
        keys.append(cur_key)
        members.append(tuple(cur))
        spans.append((cur_start, damage.at))
        cur_key = None
    index.bad[len(keys)] = error
    if cur_key is not None:
        keys.append(cur_key)
        members.append(tuple(cur))
        spans.append((cur_start, damage.at))
    else:
        keys.append(cut_key or "")
        members.append(())
        spans.append((damage.at, damage.at))


def _member_problem(url: str, name: str, typeflag: bytes, key: str, ext: str, sparse: bool) -> BadSample:
    """Why a member cannot be part of a sample (the slow path of :func:`scan`)."""
    if not is_safe_name(name):
        return UnsafeMember(
            f"{url}: member {name!r} has an absolute path or '..'; fastdata never "
            "extracts it; rebuild the shard with relative names",
            url,
        )
    if sparse:
        return UnsafeMember(
            f"{url}: member {name!r} is a GNU sparse file (holes recorded in a map, not stored), not a plain "
            "regular file; rebuild the shard without 'tar --sparse'",
            url,
        )
    if typeflag not in REGULAR:
        return UnsafeMember(
            f"{url}: member {name!r} is a link or device (type {typeflag!r}), not a "
            "regular file; rebuild the shard without it",
            url,
        )
    if ".." in name:  # a harmless '..' inside a file name, like 'a..b.jpg'
        return BadSample(f"{url}: member {name!r} has '..' in its name; rename it", url)
    return CorruptShard(f"{url}: sample {key!r} has two '.{ext}' members", url)


def _verify_headers(
    index: ShardIndex, buf: object, reader: Reader, header_at: list[int], damage: _Damage | None
) -> int | None:
    """Check every header parsed (checksum, numeric fields) in one numpy pass; cut the index at the
    first that is not a valid header: it, and everything the scan read after trusting it, is damage.
    Returns where the index was cut, if it was."""
    if not header_at:
        return None
    at = np.asarray(header_at, dtype=np.int64)
    if buf is not None:
        # headers start on 512-byte boundaries: view the file as rows of 512 and gather rows
        whole = len(buf) // BLOCK * BLOCK  # type: ignore[arg-type]
        rows = np.frombuffer(buf, dtype=np.uint8, count=whole).reshape(-1, BLOCK)  # type: ignore[call-overload]
        blocks = rows[at // BLOCK]
    else:
        blocks = np.frombuffer(b"".join(reader.read(int(a), BLOCK) for a in at), np.uint8).reshape(-1, BLOCK)
    found = first_bad_header(blocks)
    if found is None:
        return None
    row, problem = found
    first = int(at[row])
    if damage is not None and damage.at < first:
        return None  # the scan stopped at earlier damage already
    message = _not_a_header(problem, blocks[row, :16].tobytes(), first)
    keys, spans = index.keys, index.spans
    keep = sum(1 for start, _ in spans if start < first)
    # the sample whose range holds the damaged header may have had members in it: it cannot be trusted
    if keep and spans[keep - 1][1] >= first:
        keep -= 1
    lost_key = keys[keep] if keep < len(keys) else ""
    del keys[keep:], index.members[keep:], spans[keep:]
    for i in [i for i in index.bad if i >= keep]:
        del index.bad[i]
    error = _error(index, message, first)
    index.complete, index.tail_error = False, error
    index.bad[keep] = error
    keys.append(lost_key)
    index.members.append(())
    spans.append((first, first))
    return first


def read_samples(
    reader: Reader, index: ShardIndex, which: Sequence[int], *, views: bool = False
) -> list[dict[str, object]]:
    """The samples ``which`` of a shard as dicts ``{"__key__", "__url__", EXT: bytes, ...}``.

    With ``views`` a reader that can (a local file's) gives each member as a read-only ``memoryview`` of
    the file instead of ``bytes``: for a caller that copies them on at once (a worker's slot).

    The caller checks :meth:`ShardIndex.error_at` first; this reads only good samples. An index whose
    claims are not all checked yet (:attr:`ShardIndex.pending`: a remote shard's sidecar) checks each
    member before its bytes are returned.

    Raises:
        SidecarMismatch: (only through :attr:`ShardIndex.pending`) the sidecar does not describe the
            shard: scan it and read again.
    """
    pending = index.pending
    if pending is not None:
        data = pending.read(reader, which)
        if pending.done:
            index.pending = None  # every claim checked: the index is trusted whole from now on
    else:
        ranges = [(off, n) for i in which for _, off, n in index.members[i]]
        read_views = getattr(reader, "read_views", None) if views else None
        data = read_views(ranges) if read_views is not None else reader.read_ranges(ranges)
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
