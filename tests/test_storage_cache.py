"""The cache folder itself (:class:`fastdata.storage.cache.NodeCache`), against the real moto server through
the counting proxy: processes that want one object at once download it once; a download that does not
match the SHA-256 the store keeps is refused; an object larger than the limit is not cached; the
environment's default folder; what ``fastdata inspect`` finds under ``$FASTDATA_CACHE_DIR``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fastdata as fd
from fastdata.inspection._cache import cache_folder
from fastdata.storage import open_remote
from fastdata.storage.cache import CacheWarning, NodeCache, cache_from
from tests.cache_datagen import upload, via

ROOT = Path(__file__).resolve().parent.parent


def test_processes_that_want_one_object_at_once_download_it_once(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    data = os.urandom(3 << 20)
    (url,) = upload(s3_server, s3_bucket, {"big.bin": data})
    # every GET is held back a moment in its body, so that all four processes are waiting on the one download
    fault_proxy.configure(stall=1.0, stall_s=0.5, stall_at="body")
    script = (
        "import hashlib, sys\n"
        "from fastdata.storage import open_remote\n"
        "from fastdata.storage.cache import NodeCache\n"
        f"cache = NodeCache({str(tmp_path / 'cache')!r})\n"
        f"with cache.open({url!r}, open_remote({url!r}, part_size=1 << 20, **{via(fault_proxy)!r})) as f:\n"
        "    print(hashlib.sha256(f.read(0, f.size)).hexdigest(), f.hit)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env) for _ in range(4)
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert {o[0] for o in outs} == {hashlib.sha256(data).hexdigest()}
    assert sorted(o[1] for o in outs) == ["False", "True", "True", "True"]  # one downloaded, three waited
    stats = fault_proxy.stats()
    assert stats["bytes"] == len(data) and stats["stall"] == 3  # three 1 MiB parts, fetched once


def test_a_download_that_does_not_match_the_stores_sha256_is_refused(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    s3_server.client().put_object(
        Bucket=s3_bucket, Key="x.bin", Body=b"the bytes", Metadata={"sha256": hashlib.sha256(b"other").hexdigest()}
    )
    url = f"s3://{s3_bucket}/x.bin"
    cache = NodeCache(tmp_path / "cache")
    with pytest.raises(fd.SourceUnreadable, match=r"x\.bin: the bytes downloaded do not have the SHA-256"):
        cache.open(url, open_remote(url, **via(fault_proxy)))
    assert not [p for p in (tmp_path / "cache" / "objects").iterdir() if p.suffix in ("", ".json", ".part")]
    good = b"checked"
    s3_server.client().put_object(
        Bucket=s3_bucket, Key="y.bin", Body=good, Metadata={"sha256": hashlib.sha256(good).hexdigest()}
    )
    with cache.open(f"s3://{s3_bucket}/y.bin", open_remote(url, **via(fault_proxy))) as f:
        assert f.read(0, f.size) == good and f.version.sha256 == hashlib.sha256(good).hexdigest()


def test_an_object_larger_than_the_limit_is_read_from_the_store(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    (url,) = upload(s3_server, s3_bucket, {"big.bin": os.urandom(50_000)})
    cache = NodeCache(tmp_path / "cache", limit=10_000)
    with pytest.warns(CacheWarning, match=r"big\.bin: 50000 bytes, more than cache_limit=10000: read from the store"):
        assert cache.open(url, open_remote(url, **via(fault_proxy))) is None
    assert fault_proxy.stats().get("bytes", 0) == 0


def test_the_environment_names_the_default_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "fd"))
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", "2GB")
    cache = cache_from(None, None)
    assert cache is not None and cache.root == str(tmp_path / "fd" / "remote") and cache.limit == 2 * 10**9
    assert cache_from(False, None) is None
    assert cache_from(tmp_path / "mine", "1.5GiB").limit == int(1.5 * 2**30)  # type: ignore[union-attr]
    monkeypatch.delenv("FASTDATA_CACHE_DIR")
    assert cache_from(None, None) is None
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", "plenty")
    with pytest.raises(fd.ConfigError, match="FASTDATA_CACHE_LIMIT='plenty' is not a size"):
        cache_from(tmp_path, None)


def test_inspect_finds_the_cache_under_fastdata_cache_dir(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (url,) = upload(s3_server, s3_bucket, {"a.bin": b"abc"})
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path))
    cache = cache_from(None, None)
    assert cache is not None
    cache.open(url, open_remote(url, **via(fault_proxy))).close()  # type: ignore[union-attr]
    assert cache_folder(str(tmp_path)) == str(tmp_path / "remote")
    out = subprocess.run(
        [sys.executable, "-m", "fastdata", "inspect", str(tmp_path), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert [e["url"] for e in json.loads(out.stdout)["entries"]] == [url]
