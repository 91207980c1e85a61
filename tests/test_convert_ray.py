"""``fastdata convert SRC OUT --engine ray``: on a real local Ray cluster (started once for the module, every
server on 127.0.0.1), against the local S3 server too.

Shards byte-identical to a local conversion (local folders, and s3:// in and out); a killed driver
resumed by a rerun; a task whose worker is killed mid-shard retried by Ray, nothing duplicated.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastdata.convert import convert
from fastdata.convert._corpus import Item, scan_corpus
from fastdata.convert._plan import plan_shards
from fastdata.convert._remote import staging_folder
from fastdata.convert._resume import STATE_DIR
from tests.convert_driver import convert_listed, kill, start_paused
from tests.datagen import make_image_folder
from tests.s3_server import MotoServer

ROOT = Path(__file__).resolve().parents[1]
# Ray binds every server to the machine's address unless it runs as a single-machine "cluster", which
# keeps them on 127.0.0.1 (the same switch Ray uses on macOS and Windows)
LOCAL_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A 2-CPU Ray cluster for the whole module (its start-up takes seconds): the GCS address."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in LOCAL_ONLY.items():
            mp.setenv(name, value)
        import ray

        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            logging_level="WARNING",
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), **LOCAL_ONLY}},
        )
        try:
            address = ray.get_runtime_context().gcs_address
            assert address.startswith("127.0.0.1:"), address
            yield address
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    make_image_folder(root, classes=4, per_class=30, seed=9)
    return root


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != "manifest.json"}


def test_ray_shards_are_byte_identical_to_a_local_conversion(ray_address: str, corpus: Path, tmp_path) -> None:
    options: dict[str, Any] = dict(shard_count=6, shuffle=True, seed=3, progress=False, fsync=False)
    local = convert(corpus, tmp_path / "local", workers=2, **options)
    remote = convert(corpus, tmp_path / "ray", engine="ray", **options)
    assert remote["shards"] == local["shards"] and remote["samples"] == 120
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "local")  # shards and sidecars, byte for byte
    assert sorted(os.listdir(tmp_path / "ray")) == sorted(os.listdir(tmp_path / "local"))  # nothing left over


def test_ray_reads_from_and_writes_to_s3_with_the_same_bytes(
    ray_address: str, corpus: Path, s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], tmp_path
) -> None:
    s3 = s3_server.client()
    s3.put_bucket_versioning(Bucket=s3_bucket, VersioningConfiguration={"Status": "Enabled"})
    for path in sorted(corpus.rglob("*.jpg")):
        s3.put_object(Bucket=s3_bucket, Key=f"src/{path.relative_to(corpus).as_posix()}", Body=path.read_bytes())
    options: dict[str, Any] = dict(shard_count=5, progress=False, fsync=False, staging=tmp_path / "stage")
    src = f"s3://{s3_bucket}/src/"
    remote = convert(src, f"s3://{s3_bucket}/ray", engine="ray", storage_options=s3_options, **options)
    local = convert(src, f"s3://{s3_bucket}/local", storage_options=s3_options, **options)
    assert remote["shards"] == local["shards"] and remote["samples"] == 120
    listing = s3.list_object_versions(Bucket=s3_bucket, Prefix="ray/")["Versions"]
    names = [s["name"] for s in remote["shards"]]
    assert Counter(v["Key"][4:] for v in listing) == Counter([*names, *(n + ".idx" for n in names), "manifest.json"])
    stored = json.loads(s3.get_object(Bucket=s3_bucket, Key="ray/manifest.json")["Body"].read())
    assert stored == remote and not Path(staging_folder(f"s3://{s3_bucket}/ray", tmp_path / "stage")).exists()


def _job_dead() -> bool:
    import ray
    from ray._private import state  # no public call tells a dead job without the dashboard

    ours = ray.get_runtime_context().get_job_id()
    return all(j["IsDead"] for j in state.jobs() if j["JobID"] != ours)


def _tmp_pids(folder: Path) -> list[int]:
    return [int(p.name.rsplit(".", 2)[-2]) for p in folder.glob(".*.tmp")]


@pytest.mark.slow
def test_a_killed_driver_leaves_its_finished_shards_and_a_rerun_completes(
    ray_address: str, corpus: Path, tmp_path
) -> None:
    out = tmp_path / "out"
    options = {"shard_count": 24, "engine": "ray", "address": ray_address, "fsync": False}
    # paused in its on_shard hook once 2 shards are finished: no more tasks are submitted
    driver = start_paused(str(corpus), str(out), 2, options, env=LOCAL_ONLY)
    kill(driver)
    deadline = time.monotonic() + 60
    # Ray stops a dead driver's tasks: wait until the job is dead and no task of it is still writing
    while not _job_dead() or any(Path(f"/proc/{p}").exists() for p in _tmp_pids(out)):
        assert time.monotonic() < deadline, "the killed driver's tasks went on running"
        time.sleep(0.01)
    assert not (out / "manifest.json").exists()
    recorded = [p.name[: -len(".json")] for p in (out / STATE_DIR / "done").glob("*.json")]
    assert 2 <= len(recorded) < 24
    before = {n: (out / n).stat().st_mtime_ns for n in recorded}
    manifest = convert(corpus, out, shard_count=24, engine="ray", fsync=False, progress=False)
    assert {n: (out / n).stat().st_mtime_ns for n in recorded} == before, "finished shards were written again"
    clean = convert(corpus, tmp_path / "clean", shard_count=24, fsync=False, progress=False)
    assert manifest["shards"] == clean["shards"]
    assert files_of(out) == files_of(tmp_path / "clean") and not _tmp_pids(out)


@pytest.mark.slow
def test_a_task_whose_worker_is_killed_mid_shard_is_retried_and_nothing_is_duplicated(
    ray_address: str, corpus: Path, tmp_path
) -> None:
    blob = (corpus / "class_1" / "img_0000.jpg").read_bytes()
    # one 'file' of the corpus is a named pipe: the task that reads it blocks in open() until the test
    # writes the bytes, so it is mid-shard (its temporary file open) when its worker is killed
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    listed = scan_corpus(corpus)
    listed.items = sorted(
        [*listed.items, Item(str(fifo), "class_1/zz_pipe.jpg", 1, len(blob), 0)], key=lambda i: i.relpath
    )
    plan = plan_shards(listed, shard_size=None, shard_count=8, shuffle=False, seed=0, prefix="shard")
    blocked = next(n for n, s in zip(plan.names, plan.shards) if any(e.path == str(fifo) for e in s))
    out = tmp_path / "out"
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["manifest"] = convert_listed(
                listed, str(out), shard_count=8, engine="ray", fsync=False, progress=False
            )
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread, which asserts on it
            result["error"] = e

    driver = threading.Thread(target=run)
    driver.start()
    try:
        first = _wait_for_tmp(out, blocked, exclude=set())
        os.kill(first, signal.SIGKILL)  # the worker, blocked mid-shard
        second = _wait_for_tmp(out, blocked, exclude={first})  # Ray runs the task again, in another worker
    finally:
        _feed(fifo, blob)  # let the (retried) task read the file
        driver.join(timeout=120)
    assert "error" not in result, result.get("error")
    assert second != first
    twin = tmp_path / "twin"  # the same corpus with a plain file in the pipe's place
    twin.mkdir()
    (twin / "pipe.jpg").write_bytes(blob)
    listed.items = [i._replace(path=str(twin / "pipe.jpg")) if i.path == str(fifo) else i for i in listed.items]
    clean = convert_listed(listed, str(tmp_path / "clean"), shard_count=8, fsync=False, progress=False)
    assert result["manifest"]["shards"] == clean["shards"] and result["manifest"]["samples"] == 121
    assert files_of(out) == files_of(tmp_path / "clean") and not _tmp_pids(out)


def _wait_for_tmp(out: Path, shard: str, exclude: set[int]) -> int:
    """The pid of the live worker writing ``shard`` (from its temporary file's name), other than ``exclude``."""
    deadline = time.monotonic() + 60
    while True:
        for path in out.glob(f".{shard}.*.tmp") if out.is_dir() else []:
            pid = int(path.name.rsplit(".", 2)[-2])
            if pid not in exclude and Path(f"/proc/{pid}").exists():
                return pid
        assert time.monotonic() < deadline, f"no task began {shard}"
        time.sleep(0.005)


def _feed(fifo: Path, blob: bytes) -> None:
    """Write ``blob`` into the pipe once a reader has it open (bounded: a failed test must not hang)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            if e.errno != errno.ENXIO or time.monotonic() > deadline:
                return
            time.sleep(0.005)  # no reader yet
    try:
        os.set_blocking(fd, True)
        os.write(fd, blob)
    finally:
        os.close(fd)


def test_an_unreachable_cluster_is_a_clear_error_before_any_work(corpus: Path, tmp_path) -> None:
    import socket

    from fastdata.core.errors import ConfigError

    with socket.socket() as s:  # a port on which nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match=rf"--address 127\.0\.0\.1:{port}: no Ray cluster answers there"):
        convert(corpus, tmp_path / "out", engine="ray", address=f"127.0.0.1:{port}", progress=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="address applies to engine='ray' only"):
        convert(corpus, tmp_path / "out", address="127.0.0.1:6379", progress=False)
