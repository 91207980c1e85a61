"""Writing tar shards in the WebDataset layout, fast, with their index.

webdataset's ``ShardWriter`` goes through ``tarfile`` (a ``TarInfo``, a PAX header for the float mtime
and a ``BytesIO`` per member) and writes ~0.4 of ``tar cf``'s MB/s here. This writer keeps Python out of
the per-byte work and most of the per-member work:

* :meth:`TarShardWriter.add_files` takes a batch of planned files (key, extension, path, size, mtime):
  their headers are built together (``heads``), so a member costs an
  ``open``, one ``readv`` straight into the output buffer, a ``close`` and a few slice copies;
* each filled buffer (1 MiB) is hashed (SHA-256, or a faster digest) and written, on a thread of its own
  that overlaps the reading of the next files when a core is free for it, else at once while it is still in cache
  (``HashedOutput`` says why);
* a labelled sample's ``.cls`` member (header and block) is built with the batch's headers, in one array;
* :meth:`TarShardWriter.close_later` hands the finished shard's ``fsync``, sidecar index and rename to
  an executor, so the next shard is written while the disk flushes the last one.

Kernel-side copies (``os.copy_file_range``, ``os.sendfile``) were measured and left out: on ext4 with the
files in the page cache they copied 4 MB files at 0.57-1.05x the speed of ``readv`` + ``write``, and the
digest then needs the bytes read back (``benchmarks/bench_convert.py --parts copy`` measures it on
another filesystem).

The shard is written under a temporary name beside its final one and renamed only when complete, so
a reader or a resumed conversion never sees half a shard; an error at any point (a full disk included)
removes the temporary file. The :class:`~fastdata.formats.tar.ShardIndex` is built while writing (the
same index :func:`~fastdata.formats.tar.scan` would build from the file) and saved as ``NAME.tar.idx``.

Output is POSIX ustar (names over 100 bytes go in the prefix field, or in a PAX ``path`` record when
no split fits), readable by Python's ``tarfile``, GNU tar and ``webdataset.WebDataset``.
"""

from __future__ import annotations

import builtins
import contextlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from fastdata.core import DigestName
from fastdata.core.errors import ConfigError, FastdataError, SourceNotFound, SourceUnreadable
from fastdata.formats._hashed_output import HashedOutput
from fastdata.formats._source_files import (
    changed,
    open_error,
    open_source,
    read_error,
    read_planned_rest,
    readv,
    write_atomic,
)
from fastdata.formats.tar._headers import BLOCK
from fastdata.formats.tar._index import Member, ShardIndex
from fastdata.formats.tar._reader import index_url, is_safe_name
from fastdata.formats.tar._ustar import heads, member_head, ustar_headers

RECORD = 20 * BLOCK  # tar and tarfile pad archives to 10 KiB records; so do we
_ZEROS = bytes(RECORD + 2 * BLOCK)
_PADS = [bytes(n) for n in range(BLOCK)]
_CHECKED_EXTS: set[str] = set()  # extensions already found valid (a handful per corpus)
_OPEN = os.O_RDONLY | os.O_CLOEXEC


class FileMember(NamedTuple):
    """A planned file for :meth:`TarShardWriter.add_files`: member ``key.ext`` holding ``size`` bytes of
    ``path`` (the size the file had when listed; a file that changed since is an error), with ``mtime``
    (seconds) in its header."""

    key: str
    ext: str
    path: str
    size: int
    mtime: int


@dataclass
class ShardResult:
    """A finished shard.

    Attributes:
        path (str): its final path.
        samples (int): samples written.
        bytes (int): size of the file.
        digest (str): hex digest of the file, of the kind ``digest_name``.
        index (ShardIndex): where each sample lies.
        index_bytes (bytes): the sidecar's bytes as written (empty when ``write_index=False``).
    """

    path: str
    samples: int
    bytes: int
    digest: str
    index: ShardIndex
    index_bytes: builtins.bytes = b""  # the field above shadows the name in this class
    digest_name: DigestName = "sha256"

    @property
    def sha256(self) -> str:
        """The SHA-256 (empty when the writer computed another digest)."""
        return self.digest if self.digest_name == "sha256" else ""


class TarShardWriter:
    """Writes one tar shard: members grouped into samples by key, then ``close()`` publishes it.

    Members of one sample must be added one after another (that is what makes them one sample).
    Use as a context manager: leaving the block normally closes and publishes the shard; leaving it
    with an exception removes the temporary file.

    Args:
        path (str): the shard's final path (``.../name.tar``).
        mtime (int | None): modification time stored for members given as bytes, in seconds.
            Defaults to 0, so the same samples give the same bytes (and SHA-256) every time.
        write_index (bool): also write the sidecar index ``path + ".idx"``. Defaults to True.
        fsync (bool): flush the shard to disk before renaming it, so a finished shard survives a power
            loss, not just a killed process. Defaults to True.
        buffer_size (int): bytes gathered before each write, in bytes. Defaults to 1 MiB (4 MiB cost a
            quarter more CPU here: the buffer no longer fits in the cache between its filling, hashing
            and writing).
        publish (Callable[[str, str], None] | None): moves the finished temporary file to its final
            place, called as ``publish(tmp_path, path)``. Defaults to :func:`os.replace`.
        hash_thread (bool): hash and write the filled buffers on a thread of their own, overlapping the
            reading of the next files: worth it only with a core to spare (see
            :mod:`fastdata.formats`). Defaults to False.
        digest ("sha256" | "xxh3_128"): the digest of the file in :attr:`ShardResult.digest`: SHA-256 where
            a store or a user checks it, else the faster one. Defaults to "sha256".
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        mtime: int | None = None,
        write_index: bool = True,
        fsync: bool = True,
        buffer_size: int = 1 << 20,
        publish: Callable[[str, str], None] | None = None,
        hash_thread: bool = False,
        digest: DigestName = "sha256",
    ) -> None:
        if buffer_size < 4 * BLOCK:
            raise ConfigError(f"buffer_size={buffer_size} must be at least {4 * BLOCK} bytes")
        self.path = os.fspath(path)
        folder, name = os.path.split(self.path)
        self.tmp_path = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
        self.mtime = 0 if mtime is None else int(mtime)
        self.write_index, self.fsync = write_index, fsync
        self._publish = publish or os.replace
        self._digest = digest
        self._size = buffer_size
        self._fd: int | None = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self._out = HashedOutput(self._fd, buffer_size, background=hash_thread, digest=digest)
        self._mv = self._out.buffer()
        self._probe = memoryview(bytearray(1))  # one byte past a planned size: did the file grow?
        self._pos = 0  # bytes waiting in the buffer
        self.index = ShardIndex(self.path)
        self._key: str | None = None
        self._exts: list[Member] = []
        self._start = 0
        self._keys_seen: set[str] = set()

    # -- public ------------------------------------------------------------------------------------
    @property
    def offset(self) -> int:
        """Bytes written so far (where the next header goes)."""
        return self._out.flushed + self._pos

    @property
    def samples(self) -> int:
        """Samples begun so far."""
        return len(self.index.keys) + (self._key is not None)

    def add_bytes(self, key: str, ext: str, data: bytes | bytearray | memoryview, *, mtime: int | None = None) -> None:
        """Add member ``key.ext`` holding ``data``."""
        size = len(data)
        data_at = self._member_header(key, ext, size, self.mtime if mtime is None else mtime)
        self._put(data)
        self._pad(size)
        self._exts.append((ext, data_at, size))

    def add_file(self, key: str, ext: str, path: str, *, mtime: int | None = None) -> int:
        """Add member ``key.ext`` holding the bytes of file ``path``; return its size in bytes.

        The member's mtime is the file's own unless ``mtime`` is given.

        Raises:
            SourceNotFound, SourceUnreadable: the file is gone, cannot be read, or changed size
                while being read. The shard is unchanged then: the member is added whole or not at all.
        """
        fd = open_source(path)
        try:
            st = os.fstat(fd)
            size = st.st_size
            self._check_sample(key, ext)
            name = f"{key}.{ext}".encode("utf-8", "surrogateescape")
            head = member_head(name, size, int(st.st_mtime) if mtime is None else mtime)
            self._add_read(fd, path, key, ext, head, size, planned=False)
            return size
        finally:
            os.close(fd)

    def add_files(
        self,
        files: Sequence[FileMember],
        *,
        extras: Sequence[Sequence[tuple[str, bytes]]] | None = None,
        skip: Callable[[int, FastdataError], None] | None = None,
    ) -> int:
        """Add one sample per file: member ``key.ext`` with the file's bytes, then the sample's extra
        members ``extras[i]`` (``(ext, bytes)`` pairs, like ``("cls", b"3")``, stored with this writer's
        ``mtime``). Return the bytes of the files added.

        Args:
            files: the files, each a new sample (keys unique in the shard).
            extras: per file, the members that follow it in its sample. Defaults to none.
            skip: called as ``skip(i, error)`` for a file that is gone, unreadable or changed size; the
                sample is left out whole and the others go on. Defaults to None: such an error is raised
                (the samples before it are kept).

        Raises:
            SourceNotFound, SourceUnreadable: a file cannot be read (without ``skip``).
            ValueError: a key or extension that readers would misread.
        """
        if self._fd is None:
            raise ValueError(f"{self.path}: writer already closed")
        self._end_sample()
        keys_seen, n = self._keys_seen, len(files)
        for f in files:
            if f.key in keys_seen:
                raise self._key_reused(f.key)
            _check_key(f.key)
            keys_seen.add(f.key)
            if f.ext not in _CHECKED_EXTS:
                self._check_ext(f.key, f.ext)
        keys_seen.difference_update(f.key for f in files)  # taken again below, as each sample is added
        blob, at = heads([f"{f.key}.{f.ext}".encode("utf-8", "surrogateescape") for f in files], *_sizes(files))
        tails, tail_members = self._tails(files, extras)
        blob_mv, probe, index, pads = memoryview(blob), self._probe, self.index, _PADS
        added = 0
        mv, pos, room = self._mv, self._pos, self._size
        for i in range(n):
            key, ext, path, size, _ = files[i]
            head_len, tail = at[i + 1] - at[i], tails[i]
            pad = -size % BLOCK
            data_at = pos + head_len
            end = data_at + size + pad + len(tail)
            if end > room:
                self._pos = pos
                self._flush()
                mv, pos = self._mv, 0
                data_at, end = head_len, head_len + size + pad + len(tail)
                if end > room:  # bigger than a buffer: the general path, with its undo
                    try:
                        self._add_read(open_source(path), path, key, ext, blob[at[i] : at[i + 1]], size, True, tail)
                    except (SourceNotFound, SourceUnreadable) as e:
                        if skip is None:
                            raise
                        skip(i, e)
                        mv, pos = self._mv, self._pos  # the undo may have moved to another buffer
                        continue
                    self._exts.extend(tail_members[i])  # offsets relative to the tail: fixed below
                    self._fix_tail_offsets(len(tail_members[i]), len(tail))
                    self._end_sample()
                    added += size
                    mv, pos = self._mv, self._pos
                    continue
            try:
                fd = os.open(path, _OPEN)
            except OSError as e:
                if skip is None:
                    raise open_error(path, e) from None
                skip(i, open_error(path, e))
                continue
            try:
                got = os.readv(fd, [mv[data_at : data_at + size], probe])
                if got != size:
                    read_planned_rest(fd, mv[data_at : data_at + size], got, size, path)
            except (SourceNotFound, SourceUnreadable) as e:
                if skip is None:
                    raise
                skip(i, e)
                continue
            except OSError as e:
                if skip is None:
                    raise read_error(path, e) from None
                skip(i, read_error(path, e))
                continue
            finally:
                os.close(fd)
            mv[pos:data_at] = blob_mv[at[i] : at[i + 1]]
            tail_at = data_at + size + pad
            mv[data_at + size : tail_at] = pads[pad]
            mv[tail_at:end] = tail
            base = self._out.flushed
            members: list[Member] = [(ext, base + data_at, size)]
            members.extend((x, base + tail_at + off, length) for x, off, length in tail_members[i])
            start = base + data_at - BLOCK
            if head_len > BLOCK and index.spans and index.spans[-1][1] < start:
                index.spans[-1] = (index.spans[-1][0], start)  # as in _begin
            index.keys.append(key)
            index.members.append(tuple(members))
            index.spans.append((start, base + end))
            keys_seen.add(key)
            pos = end
            added += size
        self._pos = pos
        return added

    def write_sample(self, sample: dict[str, Any]) -> None:
        """Add a WebDataset-style sample ``{"__key__": key, ext: bytes | str, ...}`` (exts sorted)."""
        key = sample["__key__"]
        for ext in sorted(k for k in sample if not k.startswith("_")):
            value = sample[ext]
            self.add_bytes(key, ext, value.encode() if isinstance(value, str) else value)

    def close(self) -> ShardResult:
        """Finish the shard: end-of-archive blocks, flush, (fsync), sidecar index, rename into place."""
        return self._finish(*self._end_writing())

    def close_later(self, executor: Executor) -> Future[ShardResult]:
        """Like :meth:`close`, but the ``fsync``, the sidecar and the rename run on ``executor`` (a thread
        pool of one keeps shards finishing in order), so the caller can begin the next shard while the
        disk flushes this one. Everything is written (to the page cache) when this returns."""
        return executor.submit(self._finish, *self._end_writing())

    def abort(self) -> None:
        """Drop the shard: close and remove the temporary file. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                self._out.drain()  # the write that failed may be why we are dropping the shard
            os.close(fd)
            self._out.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp_path)

    def __enter__(self) -> TarShardWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None and self._fd is not None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:  # a fallback only; close() or the context manager is the way
        if getattr(self, "_fd", None) is not None:
            self.abort()

    # -- one member at a time --------------------------------------------------------------------------
    def _check_sample(self, key: str, ext: str) -> None:
        if self._fd is None:
            raise ValueError(f"{self.path}: writer already closed")
        if key != self._key:
            if key in self._keys_seen:
                raise self._key_reused(key)
            _check_key(key)
        elif any(m[0] == ext for m in self._exts):
            raise ValueError(f"{self.path}: sample {key!r} already has a '.{ext}' member")
        if ext not in _CHECKED_EXTS:
            self._check_ext(key, ext)

    def _check_ext(self, key: str, ext: str) -> None:
        if not ext or "/" in ext or ext.startswith("."):
            raise ValueError(
                f"{self.path}: extension {ext!r} of sample {key!r} must be non-empty, without '/' or a leading '.'"
            )
        _CHECKED_EXTS.add(ext)

    def _key_reused(self, key: str) -> ValueError:
        return ValueError(
            f"{self.path}: key {key!r} was used by an earlier sample; keys must be "
            "unique, or readers merge or confuse the samples"
        )

    def _member_header(self, key: str, ext: str, size: int, mtime: int) -> int:
        """Start sample ``key`` if new, write the member's header(s); return where its data goes."""
        self._check_sample(key, ext)
        self._put(member_head(f"{key}.{ext}".encode("utf-8", "surrogateescape"), size, mtime))
        self._begin(key)
        return self.offset

    def _begin(self, key: str) -> None:
        """Start sample ``key`` (if new) at the regular header just put in the buffer."""
        if key != self._key:
            # a sample's span runs from its first regular header to the next sample's, as scan() sees
            # it: a PAX header before the next sample's first member ends this one's span
            start = self.offset - BLOCK
            self._end_sample(start)
            spans = self.index.spans
            if spans and spans[-1][1] < start:
                spans[-1] = (spans[-1][0], start)
            self._key, self._start = key, start
            self._keys_seen.add(key)

    def _add_read(
        self, fd: int, path: str, key: str, ext: str, head: bytes, size: int, planned: bool, tail: bytes = b""
    ) -> None:
        """Add a member read from ``fd`` (closed here when ``planned``): whole, or not at all."""
        try:
            need = len(head) + size + (-size % BLOCK) + len(tail)
            if self._pos + need > self._size:
                self._flush()
            mark = self._mark(big=need > self._size)
            try:
                self._put(head)
                self._begin(key)
                data_at = self.offset
                self._read_into_buffer(fd, size, path, planned)
                self._pad(size)
                self._exts.append((ext, data_at, size))
                self._put(tail)
            except BaseException:
                self._restore(mark)
                raise
        finally:
            if planned:
                os.close(fd)

    def _fix_tail_offsets(self, count: int, tail_len: int) -> None:
        """The extras of a big member were appended with offsets relative to its tail: make them absolute."""
        tail_at = self.offset - tail_len
        for k in range(len(self._exts) - count, len(self._exts)):
            x, off, length = self._exts[k]
            self._exts[k] = (x, tail_at + off, length)

    def _tails(
        self, files: Sequence[FileMember], extras: Sequence[Sequence[tuple[str, bytes]]] | None
    ) -> tuple[list[bytes], list[tuple[Member, ...]]]:
        """Per file, the bytes of its extra members (headers, data, padding) and where their data lies in them."""
        if not extras:
            return [b""] * len(files), [()] * len(files)
        if len(extras) != len(files):
            raise ValueError(f"{self.path}: {len(files)} files but {len(extras)} lists of extra members")
        small = self._small_tails(files, extras)
        if small is not None:
            return small
        names, sizes = [], []
        for f, more in zip(files, extras):
            exts = [f.ext]
            for x, data in more:
                if x in exts:
                    raise ValueError(f"{self.path}: sample {f.key!r} already has a '.{x}' member")
                if x not in _CHECKED_EXTS:
                    self._check_ext(f.key, x)
                exts.append(x)
                names.append(f"{f.key}.{x}".encode("utf-8", "surrogateescape"))
                sizes.append(len(data))
        blob, at = heads(names, sizes, [self.mtime] * len(names))
        tails, members, k = [], [], 0
        for more in extras:
            parts: list[bytes] = []
            where: list[Member] = []
            length = 0
            for x, data in more:
                head = blob[at[k] : at[k + 1]]
                where.append((x, length + len(head), len(data)))
                parts += (head, bytes(data), _PADS[-len(data) % BLOCK])
                length += len(head) + len(data) + (-len(data) % BLOCK)
                k += 1
            tails.append(b"".join(parts))
            members.append(tuple(where))
        return tails, members

    def _small_tails(
        self, files: Sequence[FileMember], extras: Sequence[Sequence[tuple[str, bytes]]]
    ) -> tuple[list[bytes], list[tuple[Member, ...]]] | None:
        """:meth:`_tails` for the common case, one extra member of under 512 bytes per file (a label):
        every tail is one header and one block, built for the whole batch in one array; None otherwise."""
        ext = extras[0][0][0] if extras[0] else None
        names = []
        for f, more in zip(files, extras):
            if len(more) != 1 or more[0][0] != ext or len(more[0][1]) >= BLOCK or ext == f.ext:
                return None
            names.append(f"{f.key}.{ext}".encode("utf-8", "surrogateescape"))
        assert ext is not None
        if ext not in _CHECKED_EXTS:
            self._check_ext(files[0].key, ext)
        data = [more[0][1] for more in extras]
        sizes = [len(d) for d in data]
        if max(map(len, names)) > 100:
            return None
        rows = np.zeros((len(files), 2 * BLOCK), np.uint8)
        rows[:, :BLOCK] = ustar_headers(names, sizes, [self.mtime] * len(names))
        rows[:, BLOCK : BLOCK + max(sizes)] = (
            np.array(data, dtype=f"S{max(sizes)}").view(np.uint8).reshape(len(files), -1)
        )
        blob = rows.tobytes()
        tails = [blob[k : k + 2 * BLOCK] for k in range(0, len(blob), 2 * BLOCK)]
        return tails, [((ext, BLOCK, n),) for n in sizes]

    def _read_into_buffer(self, fd: int, size: int, path: str, planned: bool) -> None:
        left = size
        while left:
            if self._pos == self._size:
                self._flush()
            room = min(left, self._size - self._pos)
            n = readv(fd, self._mv[self._pos : self._pos + room], path)
            if n == 0:
                raise changed(path, size, size - left, planned)
            self._pos += n
            left -= n
        # bytes appended after the fstat are not read, as with tar; a planned size must be the file's
        if planned and readv(fd, self._probe, path):
            raise changed(path, size, size + 1, planned)

    def _mark(self, big: bool) -> tuple[Any, ...]:
        hash_copy = None
        if big:  # a member that will be flushed half-way: keep the digest to go back to
            self._out.drain()
            hash_copy = self._out.hash.copy()
        return (
            self._pos,
            self._out.flushed,
            len(self.index.keys),
            self._key,
            tuple(self._exts),
            self._start,
            hash_copy,
        )

    def _restore(self, mark: tuple[Any, ...]) -> None:
        """Undo a member that failed half-way (see :meth:`add_file`)."""
        pos, flushed, n_samples, key, exts, start, hash_copy = mark
        if flushed != self._out.flushed:
            # a member too big for the buffer already reached the file: cut it back off
            assert hash_copy is not None
            self._out.truncate(flushed, hash_copy)
        self._pos = pos
        if self._key != key:
            self._keys_seen.discard(self._key)  # type: ignore[arg-type]
        del self.index.keys[n_samples:], self.index.members[n_samples:], self.index.spans[n_samples:]
        self._key, self._exts, self._start = key, list(exts), start

    def _end_sample(self, end: int | None = None) -> None:
        if self._key is not None:
            self.index.keys.append(self._key)
            self.index.members.append(tuple(self._exts))
            self.index.spans.append((self._start, self.offset if end is None else end))
            self._key, self._exts = None, []

    # -- buffers and threads ---------------------------------------------------------------------------
    def _put(self, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        if self._pos + n > self._size:
            self._flush()
            if n > self._size:  # too big to gather: write it through
                self._out.write_through(memoryview(data))
                return
        self._mv[self._pos : self._pos + n] = data
        self._pos += n

    def _pad(self, size: int) -> None:
        pad = -size % BLOCK
        if pad:
            self._put(_PADS[pad])

    def _flush(self) -> None:
        """Hand the filled buffer over to be hashed and written, and go on with another."""
        if self._pos:
            self._mv = self._out.hand_off(self._mv, self._pos)
            self._pos = 0

    # -- finishing -------------------------------------------------------------------------------------
    def _end_writing(self) -> tuple[int, int]:
        """Everything but the fsync and the rename; on an error the temporary file is removed."""
        if self._fd is None:
            raise ValueError(f"{self.path}: writer already closed")
        try:
            self._end_sample()
            end = self.offset
            # two zero blocks end the archive, then pad to a whole record as tar does
            total = end + 2 * BLOCK
            total += -total % RECORD
            self._put(_ZEROS[: total - end])
            self._flush()
            self._out.drain()
        except BaseException:
            self.abort()
            raise
        fd, self._fd = self._fd, None
        self._out.close()
        self._mv = memoryview(b"")
        self.index.size = total
        return fd, total

    def _finish(self, fd: int, total: int) -> ShardResult:
        try:
            try:
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            sidecar = self.index.to_bytes() if self.write_index else b""
            if self.write_index:
                write_atomic(index_url(self.path), sidecar, fsync=self.fsync)
            self._publish(self.tmp_path, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp_path)
            raise
        return ShardResult(
            self.path, len(self.index), total, self._out.hash.hexdigest(), self.index, sidecar, self._digest
        )


def _sizes(files: Sequence[FileMember]) -> tuple[list[int], list[int]]:
    return [f.size for f in files], [f.mtime for f in files]


def _check_key(key: str) -> None:
    if (
        not key
        or "." in key[key.rfind("/") + 1 :]
        or key[0] == "/"
        or key[-1] == "/"
        or (".." in key and not is_safe_name(key))
    ):
        raise ValueError(
            f"sample key {key!r} is not usable: it must be a relative name without '..' and "
            "without a dot in its last part (the WebDataset key ends at the first dot)"
        )


__all__ = ["RECORD", "FileMember", "ShardResult", "TarShardWriter"]
