"""2 ranks x 2 DataLoader workers under torchrun on one node, sharing one cache folder: every shard is
downloaded once for the node (the bytes counted at the proxy in front of the moto server), and every
sample read once per epoch across the ranks. The rank script is tests/cache_rank.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cache_datagen import make_corpus, via

ROOT = Path(__file__).resolve().parent.parent
WORLD = 2
LAUNCH_TIMEOUT_S = 240

pytestmark = [pytest.mark.slow, pytest.mark.timeout(LAUNCH_TIMEOUT_S + 60)]


def test_two_ranks_of_two_workers_download_each_shard_once_per_node(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    corpus = make_corpus(s3_server, s3_bucket, tmp_path / "src")  # four shards without sidecars
    spec = {
        "urls": corpus["urls"],
        "options": via(fault_proxy),
        "cache_dir": str(tmp_path / "cache"),
        "batch_size": 8,  # every worker of every rank reads batches of every shard
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={WORLD}",
        "--max-restarts=0",
        str(ROOT / "tests" / "cache_rank.py"),
        str(tmp_path / "spec.json"),
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {LAUNCH_TIMEOUT_S} s:\n{output[-6000:]}")
    assert proc.returncode == 0, output[-6000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    want = {k: len(v) for k, v in corpus["expected"].items()}
    for epoch in range(2):
        seen = [r["epochs"][epoch] for r in ranks]
        assert not set(seen[0]) & set(seen[1]), "a sample read by both ranks"
        assert {**seen[0], **seen[1]} == want
    # two ranks x two workers x two epochs, and the node fetched each shard's bytes once
    assert fault_proxy.stats()["bytes"] == corpus["bytes"]
    assert sum(r["counters"]["cache_misses"] for r in ranks) == len(corpus["urls"])
    assert sum(r["counters"]["cache_remote_bytes"] for r in ranks) == corpus["bytes"]
