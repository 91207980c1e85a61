"""TarShardWriter: valid tar for tarfile and GNU tar, the index it builds, atomic publishing, undo of a
member whose file fails."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fastdata.core.errors import SourceNotFound, SourceUnreadable
from fastdata.formats.tar._index import ShardIndex
from fastdata.formats.tar._reader import scan
from fastdata.formats.tar._writer import TarShardWriter
from fastdata.storage._local import LocalReader

LONG_PREFIXED = "d" * 90 + "/" + "e" * 60  # over 100 bytes, splits into ustar's prefix + name
LONG_PAX = "p" * 150  # no split fits: a PAX path record


def members_by_tarfile(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers()}  # type: ignore[union-attr]


def write_example(path: Path, src: Path, buffer_size: int = 4 << 20) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    big = rng.bytes(70_000)
    src.write_bytes(big)
    expected = {
        "s1.txt": b"hello",
        "s1.cls": b"3",
        "s2.bin": big,
        f"{LONG_PREFIXED}.txt": b"long",
        f"{LONG_PAX}.json": b"{}",
        "s3.npy": rng.bytes(511),
        "s4.seg.png": rng.bytes(512),
    }
    with TarShardWriter(path, buffer_size=buffer_size, fsync=False) as w:
        w.add_bytes("s1", "txt", b"hello")
        w.add_bytes("s1", "cls", b"3")
        assert w.add_file("s2", "bin", str(src)) == 70_000
        w.add_bytes(LONG_PREFIXED, "txt", b"long")
        w.write_sample({"__key__": LONG_PAX, "json": "{}"})
        w.add_bytes("s3", "npy", expected["s3.npy"])
        w.add_bytes("s4", "seg.png", expected["s4.seg.png"])
    return expected


@pytest.mark.parametrize("buffer_size", [2048, 4 << 20])
def test_tarfile_reads_every_member_and_the_index_equals_a_scan(tmp_path: Path, buffer_size: int) -> None:
    path = tmp_path / "a.tar"
    expected = write_example(path, tmp_path / "src.bin", buffer_size)
    assert members_by_tarfile(path) == expected
    assert path.stat().st_size % 10240 == 0  # whole records, as tar writes them
    side = ShardIndex.from_bytes(str(path), (tmp_path / "a.tar.idx").read_bytes())
    fresh = scan(LocalReader(str(path)))
    assert fresh.complete and not fresh.bad
    assert (side.keys, side.members, side.spans, side.size) == (fresh.keys, fresh.members, fresh.spans, fresh.size)
    assert fresh.keys == ["s1", "s2", LONG_PREFIXED, LONG_PAX, "s3", "s4"]


def test_gnu_tar_lists_it_without_complaint(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    expected = write_example(path, tmp_path / "src.bin")
    run = subprocess.run(["tar", "tf", str(path)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stderr == ""
    assert run.stdout.splitlines() == list(expected)


def test_same_samples_give_the_same_bytes(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    write_example(a / "x.tar", tmp_path / "src.bin")
    write_example(b / "x.tar", tmp_path / "src.bin")
    digest = [hashlib.sha256((d / "x.tar").read_bytes()).hexdigest() for d in (a, b)]
    assert digest[0] == digest[1]


def test_nothing_at_the_final_name_until_closed_and_an_error_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    w = TarShardWriter(path, fsync=False)
    w.add_bytes("k", "txt", b"x")
    assert not path.exists() and Path(w.tmp_path).exists()
    result = w.close()
    assert path.exists() and not Path(w.tmp_path).exists()
    assert result.samples == 1 and result.bytes == path.stat().st_size
    assert result.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(RuntimeError), TarShardWriter(tmp_path / "b.tar", fsync=False) as w2:
        w2.add_bytes("k", "txt", b"x")
        raise RuntimeError("stop")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar", "a.tar.idx"]


def test_keys_and_extensions_are_checked(tmp_path: Path) -> None:
    with TarShardWriter(tmp_path / "a.tar", fsync=False) as w:
        w.add_bytes("a", "txt", b"1")
        with pytest.raises(ValueError, match=r"already has a '\.txt' member"):
            w.add_bytes("a", "txt", b"2")
        w.add_bytes("b", "txt", b"1")
        with pytest.raises(ValueError, match="used by an earlier sample"):
            w.add_bytes("a", "cls", b"2")
        for bad_key in ("a.v2", "../up", "/abs", ""):
            with pytest.raises(ValueError, match="not usable"):
                w.add_bytes(bad_key, "txt", b"")
        with pytest.raises(ValueError, match="extension"):
            w.add_bytes("c", "", b"")
    assert scan(LocalReader(str(tmp_path / "a.tar"))).keys == ["a", "b"]


@pytest.mark.parametrize("buffer_size", [2048, 4 << 20])
def test_a_file_that_fails_is_left_out_whole(tmp_path: Path, buffer_size: int) -> None:
    good = tmp_path / "good.bin"
    good.write_bytes(b"g" * 3000)
    folder = tmp_path / "folder"  # opens, then fails to read (EISDIR)
    folder.mkdir()
    path = tmp_path / "a.tar"
    with TarShardWriter(path, buffer_size=buffer_size, fsync=False) as w:
        w.add_file("one", "bin", str(good))
        with pytest.raises(SourceNotFound, match=r"gone\.bin"):
            w.add_file("two", "bin", str(tmp_path / "gone.bin"))
        with pytest.raises(SourceUnreadable, match="folder"):
            w.add_file("two", "bin", str(folder))
        w.add_bytes("one", "cls", b"1")  # the failed sample 'two' never began: 'one' goes on
        w.add_file("three", "bin", str(good))
    assert members_by_tarfile(path) == {"one.bin": b"g" * 3000, "one.cls": b"1", "three.bin": b"g" * 3000}
    index = scan(LocalReader(str(path)))
    assert index.keys == ["one", "three"] and index.complete
    assert ShardIndex.from_bytes(str(path), (tmp_path / "a.tar.idx").read_bytes()).spans == index.spans
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# -- add_files: a batch of planned files -----------------------------------------------------------------
def _planned(tmp_path: Path) -> list[tuple[str, str, Path, bytes]]:
    """(key, ext, path, bytes) of files that cover the header paths: short names, the ustar prefix field,
    a PAX path record, an empty file, one bigger than a small buffer."""
    rng = np.random.default_rng(7)
    specs = [
        ("a", "jpg", rng.bytes(3000)),
        ("empty", "bin", b""),
        (LONG_PREFIXED, "jpg", rng.bytes(700)),
        (LONG_PAX, "png", rng.bytes(1)),
        ("big", "bin", rng.bytes(9000)),
        ("z/last", "jpg", rng.bytes(512)),
    ]
    out = []
    for n, (key, ext, data) in enumerate(specs):
        path = tmp_path / f"src{n}.{ext}"
        path.write_bytes(data)
        os.utime(path, (1_600_000_000 + n, 1_600_000_000 + n))
        out.append((key, ext, path, data))
    return out


@pytest.mark.parametrize("buffer_size", [2048, 4 << 20])
def test_add_files_writes_what_add_file_writes_and_the_index_a_scan_finds(tmp_path: Path, buffer_size: int) -> None:
    from fastdata.formats.tar._writer import FileMember

    files = _planned(tmp_path)
    one, batch = tmp_path / "one.tar", tmp_path / "batch.tar"
    with TarShardWriter(one, buffer_size=buffer_size, fsync=False) as w:
        for key, ext, path, _ in files:
            w.add_file(key, ext, str(path))
            w.add_bytes(key, "cls", b"7")
    members = [FileMember(k, e, str(p), len(d), 1_600_000_000 + n) for n, (k, e, p, d) in enumerate(files)]
    with TarShardWriter(batch, buffer_size=buffer_size, fsync=False) as w:
        assert w.add_files(members[:2], extras=[(("cls", b"7"),)] * 2) == 3000
        w.add_files(members[2:], extras=[(("cls", b"7"),)] * 4)
    assert batch.read_bytes() == one.read_bytes()  # byte for byte, mtimes and PAX records included
    side = ShardIndex.from_bytes(str(batch), (tmp_path / "batch.tar.idx").read_bytes())
    fresh = scan(LocalReader(str(batch)))
    assert (side.keys, side.members, side.spans, side.size) == (fresh.keys, fresh.members, fresh.spans, fresh.size)
    expected = {f"{k}.{e}": d for k, e, _, d in files} | {f"{k}.cls": b"7" for k, *_ in files}
    assert members_by_tarfile(batch) == expected


@pytest.mark.parametrize("buffer_size", [2048, 4 << 20])
def test_add_files_leaves_out_a_file_gone_grown_or_shrunk_whole_or_names_it(tmp_path: Path, buffer_size: int) -> None:
    from fastdata.formats.tar._writer import FileMember

    files = _planned(tmp_path)
    members = [FileMember(k, e, str(p), len(d), 0) for k, e, p, d in files]
    members[0] = members[0]._replace(size=2999)  # the file grew since it was listed
    members[4] = members[4]._replace(size=9001)  # ... shrank (the big one: the path with undo)
    members[5] = members[5]._replace(path=str(tmp_path / "gone.jpg"))
    skipped: list[tuple[int, str]] = []
    path = tmp_path / "a.tar"
    with TarShardWriter(path, buffer_size=buffer_size, fsync=False) as w:
        w.add_files(members, skip=lambda i, e: skipped.append((i, str(e))))
    assert [i for i, _ in skipped] == [0, 4, 5]
    assert "changed since the corpus was listed (2999 bytes then, holds more now)" in skipped[0][1]
    assert "9001 bytes then, holds only 9000 now" in skipped[1][1] and "gone.jpg: no such file" in skipped[2][1]
    kept = {f"{k}.{e}": d for n, (k, e, _, d) in enumerate(files) if n in (1, 2, 3)}
    assert members_by_tarfile(path) == kept and scan(LocalReader(str(path))).keys == [files[n][0] for n in (1, 2, 3)]
    with pytest.raises(SourceUnreadable, match=r"src0\.jpg: changed since"), TarShardWriter(tmp_path / "b.tar") as w:
        w.add_files(members)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".tar", ".tmp")) == ["a.tar"]


def test_close_later_publishes_on_the_executor_and_a_failure_there_leaves_nothing(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def refuse(tmp: str, final: str) -> None:
        raise OSError(28, "No space left on device")

    with ThreadPoolExecutor(1) as pool:
        w = TarShardWriter(tmp_path / "a.tar", fsync=True)
        w.add_bytes("k", "txt", b"x")
        result = w.close_later(pool).result()
        assert result.bytes == (tmp_path / "a.tar").stat().st_size and (tmp_path / "a.tar.idx").exists()
        w = TarShardWriter(tmp_path / "b.tar", fsync=True, publish=refuse)
        w.add_bytes("k", "txt", b"x")
        with pytest.raises(OSError, match="No space"):
            w.close_later(pool).result()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp") or p == "b.tar"]
