"""The main process keeps freed heap for the next batches (fastdata.core.system._heap): raw bytes batches from
workers land on reused memory, not on fresh pages faulted in one by one; FASTDATA_KEEP_FREED_HEAP=0
leaves malloc as it was."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

# a fresh interpreter (its malloc thresholds as glibc starts them): the main process's minor page faults
# over the third to sixth epochs of raw ~30 KB members in batches of 64 (2 MB) through 1 worker
SCRIPT = """
import json, resource, sys
import fastdata as fd
ds = fd.TarShardDataset(sys.argv[1:], batch_size=64)
loader = fd.Loader(ds, num_workers=1, transport="slots", persistent_workers=True, multiprocessing_context="fork")
for _ in range(2):
    for batch in loader:
        pass
before, batches = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, 0
for _ in range(4):
    for batch in loader:
        batches += 1
        del batch
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
loader.close()
print(json.dumps({"faults_per_batch": faults / batches, "batches": batches}))
"""


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("heap")
    rng = np.random.default_rng(5)
    paths = []
    for s in range(4):
        path = folder / f"part-{s}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(64):
                data = rng.bytes(30_000)
                info = tarfile.TarInfo(f"s{s}_{i:03d}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def faults(shards: list[str], keep: str) -> dict[str, float]:
    env = {**os.environ, "FASTDATA_KEEP_FREED_HEAP": keep, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", SCRIPT, *shards], capture_output=True, text=True, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_batches_of_bytes_reuse_the_heap_in_the_main_process(shards: list[str]) -> None:
    got = faults(shards, "1")
    assert got["batches"] == 16
    # a batch is 1.9 MB of bytes: 469 pages, were they fresh (~100 faults a batch without the setting)
    assert got["faults_per_batch"] < 10, got


@pytest.mark.parametrize(
    ("keep", "expect"),
    [("0", "False"), ("false", "False"), ("Off", "False"), ("no", "False"), ("1", "True"), ("TRUE", "True"),
     ("on", "True"), ("yes", "True"), ("", "True")],
)  # fmt: skip
def test_the_setting_takes_the_usual_true_and_false_words(keep: str, expect: str) -> None:
    # before: anything but "0" turned it on, "false" included
    script = "from fastdata.core.system import _heap; print(_heap.keep_freed_heap())"
    env = {**os.environ, "FASTDATA_KEEP_FREED_HEAP": keep}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT)
    assert run.stdout.strip() == expect, run.stderr


def test_another_value_of_the_setting_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastdata.core.errors import ConfigError
    from fastdata.core.system import _heap

    monkeypatch.setenv("FASTDATA_KEEP_FREED_HEAP", "maybe")
    with pytest.raises(ConfigError, match=r"HEAP='maybe': give one of 1, true, yes, on .* 0, false"):
        _heap.wanted()
