"""The node-local cache on a hostile node, on the real moto server through the counting proxy: a byte
flipped in a cached entry (found by the block checksums, fetched again once, the local copy blamed), a
read-only pre-warmed cache, a home that cannot be written (no cache asked for), a full cache disk, and a
download under way in the main process when the DataLoader forks its workers.

The read-only and full-disk cases run the loader in a child process in a mount namespace of its own
(``unshare -m``, as root: the tests run as root here and in CI, as tests/test_transport_shm.py does), over a
read-only bind mount or a 3 MB tmpfs: real ``EROFS`` and ``ENOSPC``, no mocks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.convert import convert
from fastdata.inspection._cache import inspect_cache
from fastdata.storage import open_remote
from fastdata.storage.cache import CacheError, NodeCache
from tests.cache_datagen import SAMPLES, make_corpus, upload, via

ROOT = Path(__file__).resolve().parent.parent

# Reads one epoch with two forked workers and prints what it read (a digest of every key and payload), the
# error if one ends it, and the cache's warnings; argv: cache_dir ("" for none) storage_options urls...
CHILD = textwrap.dedent(
    """
    import gc, hashlib, json, os, sys, warnings
    sys.path.insert(0, sys.argv[1])
    import fastdata as fd
    from torch.utils.data import DataLoader

    cache_dir = sys.argv[2] or None
    options = json.loads(sys.argv[3])
    out = {"keys": 0, "digest": "", "error": None, "warnings": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ds = fd.TarShardDataset(sys.argv[4:], storage_options=options, cache_dir=cache_dir)
            loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork",
                                collate_fn=fd.as_is, timeout=120)
            got = {s["__key__"]: bytes(s["bin"]) for s in loader}
            out["keys"] = len(got)
            out["digest"] = hashlib.sha256(b"".join(k.encode() + got[k] for k in sorted(got))).hexdigest()
        except Exception as e:
            out["error"] = [type(e).__name__, str(e)]
            # the error's traceback holds the loader's iterator in a reference cycle: left to the garbage
            # collector, torch's queues were closed before its workers were told to stop, and each worker was
            # killed after torch's 5 s wait (10 s a run); let go of here, the workers stop at once
            e.__traceback__ = None
    gc.collect()  # anything else in a reference cycle: the workers stop before the folder is listed
    from fastdata.storage.cache import CacheWarning
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    if cache_dir and os.path.isdir(cache_dir):
        out["files"] = sorted(os.listdir(os.path.join(cache_dir, "objects")))
    print("RESULT " + json.dumps(out))
    """
)


def digest(expected: dict[str, bytes]) -> str:
    return hashlib.sha256(b"".join(k.encode() + expected[k] for k in sorted(expected))).hexdigest()


def run_child(
    tmp_path: Path,
    mount: str,
    cache_dir: str,
    options: dict[str, Any],
    urls: list[str],
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The child's result, run in a mount namespace of its own after ``mount`` (a shell command)."""
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    inner = " ".join(
        [sys.executable, str(child), str(ROOT), repr(cache_dir), repr(json.dumps(options)), *map(repr, urls)]
    )
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", f"{mount} && exec {inner}"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.split(" ", 1)[1])  # type: ignore[no-any-return]


@pytest.fixture
def corpus(s3_server: Any, s3_bucket: str, tmp_path: Path) -> dict[str, Any]:
    """Four shards without sidecars or manifest, two written by webdataset and two by GNU tar."""
    return make_corpus(s3_server, s3_bucket, tmp_path)


def _entry_file(cache: Path, url: str) -> Path:
    (name,) = [e["name"] for e in inspect_cache(str(cache))["entries"] if e["url"] == url]
    return cache / "objects" / name


def test_a_byte_flipped_in_a_cached_shard_is_fetched_again_once_and_read_right(
    corpus: dict[str, Any], fault_proxy: Any, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    ds = fd.TarShardDataset(corpus["urls"], storage_options=via(fault_proxy), cache_dir=cache)
    damaged_url = corpus["urls"][2]
    entry = _entry_file(cache, damaged_url)
    original = entry.read_bytes()
    # a bit flipped in the middle of the shard: inside a sample's payload (no tar header notices it)
    with open(entry, "r+b") as f:
        f.seek(len(original) // 2)
        byte = f.read(1)
        f.seek(len(original) // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    fault_proxy.reset()
    # the workers check each block before they serve it: the damaged one is fetched again, once for the node
    for epoch in range(2):
        got = _epoch(ds, epoch)
        assert got == corpus["expected"]
    assert fault_proxy.stats()["bytes"] == len(corpus["shards"]["train/shard-000002.tar"])
    assert entry.read_bytes() == original  # the copy in the cache is whole again
    assert ds.counters()["cache_refetches"] == 1  # (the worker's warning is shown in the next test)


def test_a_byte_flipped_in_a_cached_object_is_fetched_again_and_the_local_copy_is_blamed(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    data = os.urandom(3 << 20)
    (url,) = upload(s3_server, s3_bucket, {"obj.bin": data})
    cache = NodeCache(tmp_path / "cache")
    remote = open_remote(url, **via(fault_proxy))
    cache.open(url, remote).close()  # type: ignore[union-attr]
    entry = _entry_file(tmp_path / "cache", url)
    with open(entry, "r+b") as f:  # the last block, a byte of it
        f.seek(len(data) - 5)
        f.write(bytes([data[-5] ^ 1]))
    fault_proxy.reset()
    fresh = NodeCache(tmp_path / "cache")  # another run: a process that did not check it yet
    reader = fresh.open(url, remote)
    assert reader is not None
    blamed = f"the cached copy of {url} at {entry} was damaged; fetched again"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert reader.read(0, len(data)) == data
    reader.close()
    assert [str(w.message) for w in caught] == [f"fastdata: {blamed}"]
    assert fault_proxy.stats()["bytes"] == len(data)


def _epoch(ds: Any, epoch: int) -> dict[str, bytes]:
    ds.set_epoch(epoch)
    loader = DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="fork", collate_fn=fd.as_is, timeout=120
    )
    got: dict[str, bytes] = {}
    for s in loader:
        assert s["__key__"] not in got
        got[s["__key__"]] = bytes(s["bin"])
    return got


def test_a_read_only_pre_warmed_cache_is_read_and_what_it_lacks_comes_from_the_store(
    corpus: dict[str, Any], fault_proxy: Any, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    # another user (or an earlier job) filled the cache with three shards of four
    fd.TarShardDataset(corpus["urls"][:3], storage_options=via(fault_proxy), cache_dir=cache)
    fault_proxy.reset()
    got = run_child(tmp_path, f"mount --bind -o ro {cache} {cache}", str(cache), via(fault_proxy), corpus["urls"])
    assert got["error"] is None
    assert got["keys"] == 4 * SAMPLES and got["digest"] == digest(corpus["expected"])
    # the three cached shards came from the cache; the fourth from the store (scanned, then read)
    fetched = fault_proxy.stats()["bytes"]
    fourth = len(corpus["shards"]["train/shard-000003.tar"])
    assert fourth <= fetched <= 3 * fourth
    assert len([w for w in got["warnings"] if "is read-only here" in w]) == 1, got["warnings"]
    assert all("cache_dir=False" in w for w in got["warnings"])


def test_a_home_that_cannot_be_written_reads_shards_without_sidecars_from_the_store(
    corpus: dict[str, Any], fault_proxy: Any, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("FASTDATA_CACHE_DIR", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)  # a container under an arbitrary uid: a home it cannot write
    got = run_child(tmp_path, f"mount --bind -o ro {home} {home}", "", via(fault_proxy), corpus["urls"], env)
    assert got["error"] is None, got["error"]
    assert got["keys"] == 4 * SAMPLES and got["digest"] == digest(corpus["expected"])
    (warned,) = got["warnings"]  # one warning, naming the folder, the reason and the ways out
    assert f"{home}/.cache/fastdata/remote cannot be written (Read-only file system" in warned
    assert "cache_dir=" in warned and "cache_dir=False" in warned
    assert not (home / ".cache").exists()


def test_an_unusable_cache_dir_is_a_cache_error_naming_it_and_the_ways_out(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(CacheError, match=r"cache_dir='.*a-file/cache' cannot be used as a cache") as caught:
        fd.TarShardDataset("s3://bucket/a.tar", cache_dir=blocker / "cache")
    assert "cache_dir=False" in str(caught.value) and "FASTDATA_CACHE_DIR" not in str(caught.value)


def _converted(s3_server: Any, bucket: str, tmp_path: Path) -> tuple[list[str], dict[str, bytes]]:
    """Six ~1 MB shards with .idx sidecars and a manifest, written by fastdata convert, in the store; and
    each sample's payload by key."""
    src = tmp_path / "src"
    src.mkdir()
    expected = {}
    for i in range(60):
        expected[f"{i:04d}"] = hashlib.sha256(b"%d" % i).digest() * 3125  # 100 KB each
        (src / f"{i:04d}.bin").write_bytes(expected[f"{i:04d}"])
    convert(src, tmp_path / "out", shard_count=6, progress=False, fsync=False)
    files = {f"conv/{p.name}": p.read_bytes() for p in sorted((tmp_path / "out").iterdir()) if p.is_file()}
    upload(s3_server, bucket, files)
    return [f"s3://{bucket}/{k}" for k in files if k.endswith(".tar")], expected


def test_a_full_cache_disk_is_a_cache_error_every_time_and_leaves_nothing_behind(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    urls, _ = _converted(s3_server, s3_bucket, tmp_path)
    for run in range(3):  # the hang was intermittent: each run is bounded (the child's timeouts), none may hang
        disk = tmp_path / f"disk{run}"
        disk.mkdir()
        got = run_child(
            tmp_path, f"mount -t tmpfs -o size=3m tmpfs {disk}", str(disk / "cache"), via(fault_proxy), urls
        )
        assert got["error"] is not None and got["error"][0] == "CacheError", got
        assert "no space left in cache_dir=" in got["error"][1] and "cache_dir=False" in got["error"][1]
        leftovers = [f for f in got["files"] if f.endswith((".part", ".tmp"))]
        assert not leftovers, got["files"]


# A full cache disk, and a fork while a thread's download is under way: the thread's download fails (no
# space left) after the fork; the child then frees space and downloads the object itself.
# argv: root disk url storage_options
FORKED = textwrap.dedent(
    """
    import json, multiprocessing, os, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from fastdata.storage import open_remote
    from fastdata.storage.cache import NodeCache

    disk, url, options = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    filler = os.path.join(disk, "filler")
    cache = NodeCache(os.path.join(disk, "cache"))
    errors = []

    def download():
        try:
            cache.open(url, open_remote(url, **options)).close()
        except Exception as e:
            errors.append(type(e).__name__)

    def child(failed):
        failed.wait(60)  # the parent's download failed and let go of the entry
        os.unlink(filler)
        reader = NodeCache(os.path.join(disk, "cache")).open(url, open_remote(url, **options))
        assert reader is not None and reader.size == 3 << 19
        reader.close()

    thread = threading.Thread(target=download)
    thread.start()
    objects = os.path.join(disk, "cache", "objects")
    while not (os.path.isdir(objects) and any(n.endswith(".part") for n in os.listdir(objects))):  # under way
        time.sleep(0.01)
    # the download has its 1.5 MB of the 3 MB (allocated at its start): fill the rest, so that it fails at
    # its end (its record cannot be written: no space left) while the child forked below holds its lock too
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(64 << 10))
        except OSError:
            pass
    ctx = multiprocessing.get_context("fork")
    failed = ctx.Event()
    forked = ctx.Process(target=child, args=(failed,))
    forked.start()
    thread.join()
    failed.set()
    forked.join(60)
    waited = forked.is_alive()
    if waited:
        forked.kill()
    print("RESULT " + json.dumps({"parent": errors, "child_waited": waited, "child_exit": forked.exitcode}))
    """
)


def test_a_download_failing_on_a_full_disk_in_a_thread_while_the_process_forks_never_blocks_the_child(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    """A flock belongs to the open file: a child forked (a DataLoader worker) while a thread of its parent
    held an entry's lock exclusively (a read-ahead download) holds that lock too; when the parent's download
    failed (a full disk) and it let go, the child kept it, for ever: the child, and every process of the
    node wanting that entry, waited for ever (the intermittent hang of a full cache disk). The download's
    space is allocated at its start, so here the disk fills while it runs and its record is what cannot be
    written."""
    (url,) = upload(s3_server, s3_bucket, {"big.bin": os.urandom(3 << 19)})
    # the body is held back a moment: the parent's download is under way when it forks
    fault_proxy.configure(stall=1.0, stall_s=2, stall_at="body")
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    disk = tmp_path / "disk"
    disk.mkdir()
    inner = " ".join([sys.executable, str(script), str(ROOT), str(disk), url, repr(json.dumps(via(fault_proxy)))])
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", f"mount -t tmpfs -o size=3m tmpfs {disk} && {inner}"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert got["parent"] == ["CacheError"]  # no space left: the documented error
    assert not got["child_waited"], "the forked child waited for a lock its parent had let go"
    assert got["child_exit"] == 0, done.stderr[-3000:]


# argv: root folder; a 64 KB tmpfs is mounted at folder
SHORT_WRITE = textwrap.dedent(
    """
    import errno, json, os, sys
    sys.path.insert(0, sys.argv[1])
    from fastdata.storage.cache._fetch import reserve
    from fastdata.storage.s3._download import write_at

    out = {}
    for name, call in [("write_at", lambda fd: write_at(fd, b"x" * 100_000, 0)),
                       ("reserve", lambda fd: reserve(fd, 100_000))]:
        fd = os.open(os.path.join(sys.argv[2], name), os.O_RDWR | os.O_CREAT)
        try:
            call(fd)
            out[name] = "returned"
        except OSError as e:
            out[name] = errno.errorcode[e.errno]
        os.close(fd)
        os.unlink(os.path.join(sys.argv[2], name))
    fd = os.open(os.path.join(sys.argv[2], "plain"), os.O_RDWR | os.O_CREAT)
    out["pwrite"] = os.pwrite(fd, b"x" * 100_000, 0)  # what a plain pwrite does there: writes what fits, no error
    print("RESULT " + json.dumps(out))
    """
)


def test_a_disk_that_fills_midway_is_an_error_never_a_hole_of_zeros(tmp_path: Path) -> None:
    # a download's parts are written with pwrite, which on a disk that fills midway writes what fits and says
    # so only in its return value: ignored, the copy kept a hole of zeros at the right size (a shard that
    # "ends" early, read later without a word); a real 64 KB tmpfs, no mocks
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "short.py"
    script.write_text(SHORT_WRITE)
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size=64k tmpfs {disk} && exec {sys.executable} {script} {ROOT} {disk}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT ")).split(" ", 1)[1])
    assert got["pwrite"] < 100_000  # the premise: the disk fills midway and pwrite does not raise
    assert got["write_at"] == "ENOSPC" and got["reserve"] == "ENOSPC", got
