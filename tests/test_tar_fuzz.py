"""Fuzzing the tar reader: valid shards (written by webdataset, by fastdata's writer, and by ``tarfile``
as ustar, GNU and PAX) and their sidecar indexes are mutated byte by byte, field by field and by
truncation, and every mutant must hold the reader's promise:

- the scan ends within a time limit (a loop that does not advance fails the test, it does not hang it);
- every sample it yields equals what Python's ``tarfile`` reads for the same members (same data offset,
  same name, same size, same bytes);
- everything else is a :class:`~fastdata.core.errors.FastdataError` naming the shard;
- a mutated sidecar is either refused (the shard is scanned instead) or, if accepted, describes exactly
  the members a scan finds.

Hypothesis runs with a fixed seed (``derandomize``) and a bounded number of examples, so the test is
the same on every run and takes a few seconds.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fastdata.core.errors import FastdataError
from fastdata.datasets.tar._source import load_index, sidecar_index
from fastdata.formats.tar._index import ShardIndex, SidecarMismatch
from fastdata.formats.tar._reader import read_samples, scan, split_key
from fastdata.formats.tar._writer import TarShardWriter
from fastdata.storage._local import LocalReader
from tests.tar_datagen import fix_checksum, tar_bytes, within

LIMIT_S = 5.0  # far more than any scan of these few-KB shards takes
FUZZ = settings(
    derandomize=True, deadline=None, max_examples=1000, suppress_health_check=[HealthCheck.too_slow], database=None
)


# -- the valid shards the mutants come from -----------------------------------------------------------
def _members() -> list[tuple[str, bytes]]:
    long_dir = "d" * 90 + "/" + "e" * 60  # fits ustar only with the prefix field
    return [
        ("k0.jpg", b"J" * 700),
        ("k0.cls", b"0"),
        (f"{long_dir}/k1.jpg", b"long" * 40),
        (f"{long_dir}/k1.cls", b"1"),
        ("x" * 120 + "/ünï.txt", b"non-ascii"),
        ("z" * 110 + ".bin", b"pax path"),  # no ustar split: a PAX path or a GNU long name
        ("k3.json", b'{"a": 1}'),
    ]


def _webdataset() -> bytes:
    buf = io.BytesIO()
    with wds.TarWriter(buf, mtime=1_700_000_000.25) as sink:  # a PAX header (float mtime) before every member
        for i in range(3):
            sink.write({"__key__": f"w{i}", "jpg": b"w" * (100 * i + 5), "cls": b"%d" % i})
    return buf.getvalue()


def _fastdata(path: Path) -> bytes:
    with TarShardWriter(path, fsync=False, write_index=False) as w:
        for name, data in _members():
            key, ext = split_key(name)
            w.add_bytes(key, ext, data)
    return path.read_bytes()


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fastdata-fuzz-") as d:
        yield Path(d)


class Quiet(dict):  # type: ignore[type-arg]
    """A fixture's dict that Hypothesis prints in one word when an example fails."""

    def __repr__(self) -> str:
        return f"<{len(self)} shards>"


@pytest.fixture(scope="module")
def seeds(workdir: Path) -> dict[str, bytes]:
    return Quiet(
        {
            "webdataset": _webdataset(),
            "fastdata": _fastdata(workdir / "seed.tar"),
            "ustar": tar_bytes(_members()[:4], fmt=tarfile.USTAR_FORMAT),
            "gnu": tar_bytes(_members(), fmt=tarfile.GNU_FORMAT),
            "pax": tar_bytes(_members(), fmt=tarfile.PAX_FORMAT),
        }
    )


# -- mutations -----------------------------------------------------------------------------------------
FIELDS = {
    "name": (0, 100),
    "mode": (100, 8),
    "size": (124, 12),
    "chksum": (148, 8),
    "type": (156, 1),
    "prefix": (345, 155),
}
NASTY = [b"\xff" * 12, b"\x80" + bytes(10) + b"\x01", b"-0000001000\0", b"77777777777\0", b"0\0", b"", b" 12 34\0"]


@st.composite
def mutants(draw: st.DrawFn, seeds: dict[str, bytes]) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(seeds)))
    data = bytearray(seeds[name])
    kind = draw(st.sampled_from(["bytes", "field", "pax", "cut"]))
    event(f"mutation: {kind}")
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tf:
        heads = [m.offset for m in tf] + [m.offset_data - 512 for m in tf]
        pax = [(m.offset, m.offset_data - 512) for m in tf if m.offset != m.offset_data - 512]
    # positions near a header (where the parser looks) as often as anywhere in the file
    near = st.builds(lambda at, k: min(at + k, len(data) - 1), st.sampled_from(sorted(set(heads))), st.integers(0, 600))
    where = st.one_of(near, st.integers(0, len(data) - 1))
    if kind == "bytes":  # a few bytes: headers, PAX data, member data, the end
        for _ in range(draw(st.integers(1, 4))):
            data[draw(where)] = draw(st.integers(0, 255))
    elif kind == "field":  # one header field, checksum fixed up or not
        at = draw(st.sampled_from(heads))
        start, width = FIELDS[draw(st.sampled_from(sorted(FIELDS)))]
        value = draw(st.one_of(st.sampled_from(NASTY), st.binary(min_size=1, max_size=width)))[:width]
        data[at + start : at + start + len(value)] = value
        if draw(st.booleans()):
            fix_checksum(data, at)
    elif kind == "pax" and pax:  # the records of an extended header (its data is not checksummed)
        first, last = draw(st.sampled_from(pax))
        for _ in range(draw(st.integers(1, 3))):
            data[draw(st.integers(first + 512, max(first + 512, last - 1)))] = draw(
                st.sampled_from(b"0123456789 =\n\0-xpathsize")
            )
    else:
        del data[draw(where) :]
    return name, bytes(data)


# -- the reference: what tarfile reads -------------------------------------------------------------------
def tarfile_members(data: bytes) -> dict[int, tuple[str, int, bytes | None]]:
    """Every member tarfile finds, by data offset: (name, size, bytes or None when it cannot read them).
    tarfile stops at the first header it rejects (silently, mid-archive): what it found until then
    counts. Python 3.11's tarfile loops forever on a negative size (it goes back to a header it read):
    it stops there too."""
    out: dict[int, tuple[str, int, bytes | None]] = {}
    try:
        tf = tarfile.open(fileobj=io.BytesIO(data))  # noqa: SIM115 - closed below, once it opened
    except Exception:  # noqa: BLE001 - not a tar to tarfile: it finds nothing
        return out
    found: list[tarfile.TarInfo] = []
    with tf:
        with contextlib.suppress(Exception), within(LIMIT_S):
            while (m := tf.next()) is not None and all(m.offset > f.offset for f in found[-1:]):
                found.append(m)
        for m in found:
            got: bytes | None = None
            if m.isreg():
                try:
                    got = tf.extractfile(m).read()  # type: ignore[union-attr]
                except Exception:  # noqa: BLE001 - a cut member
                    got = None
            out[m.offset_data] = (m.name, m.size, got)
    return out


def check_against_tarfile(index: ShardIndex, reader: LocalReader, data: bytes) -> None:
    reference = tarfile_members(data)
    for i in range(len(index)):
        problem = index.error_at(i)
        if problem is not None:
            assert isinstance(problem, FastdataError) and reader.url in str(problem)
            continue
        (sample,) = read_samples(reader, index, [i])
        for ext, off, size in index.members[i]:
            assert off in reference, f"member {index.keys[i]}.{ext} at byte {off}: tarfile finds no member there"
            name, their_size, their_bytes = reference[off]
            assert split_key(name) == (index.keys[i], ext) and their_size == size
            assert their_bytes is not None and bytes(sample[ext]) == their_bytes


@given(data=st.data())
@FUZZ
def test_mutated_shards_are_read_as_tarfile_reads_them_or_refused(
    data: st.DataObject, seeds: dict[str, bytes], workdir: Path
) -> None:
    _, mutant = data.draw(mutants(seeds))
    path = workdir / "mutant.tar"
    path.write_bytes(mutant)
    with LocalReader(str(path)) as reader:
        with within(LIMIT_S):
            index = scan(reader)
        check_against_tarfile(index, reader, mutant)
    if index.tail_error is not None:
        assert str(path) in str(index.tail_error) and not index.complete
    good = sum(1 for i in range(len(index)) if index.error_at(i) is None)
    event("scan: whole" if index.complete and not index.bad else f"scan: damaged, {min(good, 3)}+ samples read")


def test_the_seeds_themselves_read_whole(seeds: dict[str, bytes], workdir: Path) -> None:
    # the property above would hold vacuously for a reader that refused everything
    for name, data in seeds.items():
        path = workdir / f"{name}.tar"
        path.write_bytes(data)
        with LocalReader(str(path)) as reader:
            index = scan(reader)
            assert index.complete and not index.bad and index.ignored == 0, name
            check_against_tarfile(index, reader, data)
            assert sum(len(m) for m in index.members) == len([m for m in tarfile_members(data).values() if m[2]])


# -- sidecars ----------------------------------------------------------------------------------------------
ARRAYS = ["keys", "counts", "exts", "offsets", "sizes", "spans"]


def _arrays(blob: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob)) as z:
        return {k: z[k] for k in z.files}


@st.composite
def sidecar_mutants(draw: st.DrawFn, sidecar: bytes) -> bytes:
    kind = draw(st.sampled_from(["bytes", "array", "array", "drop"]))
    if kind == "bytes":
        blob = bytearray(sidecar)
        for _ in range(draw(st.integers(1, 3))):
            blob[draw(st.integers(0, len(blob) - 1))] = draw(st.integers(0, 255))
        return bytes(blob)
    arrays = _arrays(sidecar)
    if kind == "drop":  # fewer samples (or members) than the shard holds
        n = draw(st.integers(0, len(arrays["keys"]) - 1))
        kept = int(arrays["counts"][:n].sum())
        arrays.update(
            keys=arrays["keys"][:n], counts=arrays["counts"][:n], spans=arrays["spans"][:n],
            exts=arrays["exts"][:kept], offsets=arrays["offsets"][:kept], sizes=arrays["sizes"][:kept],
        )  # fmt: skip
    else:
        name = draw(st.sampled_from(ARRAYS))
        a = arrays[name].astype(np.int64) if arrays[name].dtype.kind == "i" else arrays[name].copy()
        if a.size:
            i = draw(st.integers(0, a.size - 1))
            flat = a.reshape(-1)
            if a.dtype.kind == "U":
                flat[i] = draw(st.sampled_from(["", "k0", "w1", "k1", "jpg", "cls", "x/y", flat[(i + 1) % a.size]]))
            else:
                flat[i] += draw(st.sampled_from([1, -1, 512, -512, 1024, 1 << 40, -int(flat[i]) - 1]))
        arrays[name] = a
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


@pytest.fixture(scope="module")
def sidecar_shards(seeds: dict[str, bytes], workdir: Path) -> dict[str, tuple[str, bytes, ShardIndex]]:
    out = Quiet()
    for name in ("fastdata", "webdataset", "gnu"):
        path = workdir / f"side-{name}.tar"
        path.write_bytes(seeds[name])
        with LocalReader(str(path)) as reader:
            index = scan(reader)
        out[name] = (str(path), index.to_bytes(), index)
    return out


@given(data=st.data())
@settings(FUZZ, max_examples=400)
def test_mutated_sidecars_are_refused_or_describe_the_shard_exactly(
    data: st.DataObject, sidecar_shards: dict[str, tuple[str, bytes, ShardIndex]]
) -> None:
    url, sidecar, truth = sidecar_shards[data.draw(st.sampled_from(sorted(sidecar_shards)))]
    Path(url + ".idx").write_bytes(data.draw(sidecar_mutants(sidecar)))
    with LocalReader(url) as reader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with within(LIMIT_S):
                index = load_index(url, reader)
        event("sidecar: refused" if caught else "sidecar: accepted")
        assert index.keys == truth.keys
        assert [dict((e, (o, n)) for e, o, n in ms) for ms in index.members] == [
            dict((e, (o, n)) for e, o, n in ms) for ms in truth.members
        ]
        got = read_samples(reader, index, range(len(index)))
        expected = read_samples(reader, truth, range(len(truth)))
        assert [{k: bytes(v) if isinstance(v, bytes) else v for k, v in s.items()} for s in got] == expected


class _Unmapped:
    """A local shard read without its memory map, as an S3 shard is read: a sidecar is then checked as its
    members are read (:mod:`fastdata.formats.tar._checked_reads`), not whole when it is loaded."""

    def __init__(self, reader: LocalReader) -> None:
        self.url, self.size, self._reader = reader.url, reader.size, reader

    def read(self, offset: int, length: int) -> bytes:
        return self._reader.read(offset, length)

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [bytes(b) for b in self._reader.read_ranges(ranges)]

    def close(self) -> None:
        self._reader.close()


@given(data=st.data())
@settings(FUZZ, max_examples=400)
def test_mutated_sidecars_of_remote_shards_never_return_a_wrong_byte(
    data: st.DataObject, sidecar_shards: dict[str, tuple[str, bytes, ShardIndex]]
) -> None:
    url, sidecar, truth = sidecar_shards[data.draw(st.sampled_from(sorted(sidecar_shards)))]
    Path(url + ".idx").write_bytes(data.draw(sidecar_mutants(sidecar)))
    expected = {s["__key__"]: s for s in read_samples(LocalReader(url), truth, range(len(truth)))}
    with LocalReader(url) as local:
        reader = _Unmapped(local)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with within(LIMIT_S):
                index = sidecar_index(url, reader, end=True)  # as a dataset counts its samples: the end now
        if index is None:
            event("remote sidecar: refused when loaded")
            return
        order = data.draw(st.permutations(range(len(index))))
        try:
            with within(LIMIT_S):
                for i in order:  # one sample per read, in any order: each is checked before it is returned
                    (got,) = read_samples(reader, index, [i])
                    assert got["__key__"] in expected, f"sample {got['__key__']!r} is not in the shard"
                    assert {k: bytes(v) if isinstance(v, bytes) else v for k, v in got.items()} == expected[
                        got["__key__"]
                    ]
        except SidecarMismatch as e:
            assert url in str(e)
            event("remote sidecar: refused on a read")
            return
        event("remote sidecar: accepted")
        assert index.pending is None, f"every member was read, so every claim is checked ({len(index)} samples)"
        assert index.keys == truth.keys
        assert [dict((e, (o, n)) for e, o, n in ms) for ms in index.members] == [
            dict((e, (o, n)) for e, o, n in ms) for ms in truth.members
        ]
