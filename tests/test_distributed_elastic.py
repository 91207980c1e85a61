"""An epoch saved under torchrun at 4 ranks x 2 workers, resumed at 2 ranks x 3 workers and at 3 ranks x 1
worker (gloo, CPU; ``tests/dist_elastic_worker.py``): over the two runs every sample of the epoch is read
exactly once, every resumed rank takes the same number of steps (an ``all_reduce`` after each; a rank left
waiting fails on the gloo timeout), the mix's shares are exact over the epoch, and the next epoch is the new
size's own. Three launches in all, over ``tar_shards``, ``hdf5`` and ``mix`` (the in-process suite,
``test_elastic_resume.py``, covers more layouts).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.dist_backends import BACKENDS, batch_keys
from tests.dist_elastic_worker import NAMES, STOP, loader_for

SAVED = (4, 2)  # ranks, workers per rank
RESUMED = ((2, 3), (3, 1))
LAUNCH_TIMEOUT_S = 240
ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * LAUNCH_TIMEOUT_S + 60)]


def torchrun(phase: str, root: Path, world: int, workers: int) -> list[dict[str, Any]]:
    """Run ``dist_elastic_worker.py PHASE`` on ``world`` ranks; each rank's result, by rank."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={world}",
        "--max-restarts=0",
        str(ROOT / "tests" / "dist_elastic_worker.py"),
        phase,
        "--root",
        str(root),
        "--workers",
        str(workers),
    ]
    # a session of its own, so that on timeout the whole tree (agent, ranks, their workers) is killed
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun {phase} at {world} ranks did not finish in {LAUNCH_TIMEOUT_S} s:\n{output[-6000:]}")
    assert proc.returncode == 0, f"torchrun {phase} at {world} ranks failed ({proc.returncode}):\n{output[-6000:]}"
    return [json.loads((root / f"{phase}-{world}-rank{r}.json").read_text()) for r in range(world)]


def epoch_of(name: str, folder: Path, world: int, epoch: int) -> list[list[list[str]]]:
    """What each of ``world`` ranks reads of ``epoch`` in an uninterrupted run (in this process)."""
    out = []
    for rank in range(world):
        loader = loader_for(name, folder, 0, rank=rank, world_size=world)
        loader.set_epoch(epoch)
        out.append(batch_keys(name, loader))
        loader.close()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("elastic")
    for name in NAMES:
        (root / name).mkdir()
        BACKENDS[name].prepare(root / name)
    saved = torchrun("save", root, *SAVED)
    resumed = {world: torchrun("resume", root, world, workers) for world, workers in RESUMED}
    return {"root": root, "saved": saved, "resumed": resumed}


def keys(ranks: list[dict[str, Any]], name: str) -> list[str]:
    return [k for r in ranks for batch in r[name]["batches"] for k in batch]


@pytest.mark.parametrize("world", [w for w, _ in RESUMED])
@pytest.mark.parametrize("name", NAMES)
def test_every_sample_of_the_epoch_once_over_the_two_runs(runs: dict[str, Any], name: str, world: int) -> None:
    whole = [k for rank in epoch_of(name, runs["root"] / name, SAVED[0], 1) for b in rank for k in b]
    saved, resumed = runs["saved"], runs["resumed"][world]
    assert all(len(r[name]["batches"]) == STOP for r in saved)
    assert Counter(keys(saved, name) + keys(resumed, name)) == Counter(whole)
    if name == "mix":  # 2 parts tar to 1 of HDF5 of 60 samples: exactly 40 and 20 over the epoch
        assert Counter(k[0] for k in keys(saved, name) + keys(resumed, name)) == {"t": 40, "h": 20}


@pytest.mark.parametrize("world", [w for w, _ in RESUMED])
@pytest.mark.parametrize("name", NAMES)
def test_every_resumed_rank_takes_the_same_steps(runs: dict[str, Any], name: str, world: int) -> None:
    ranks = [r[name] for r in runs["resumed"][world]]
    counts = [len(r["batches"]) for r in ranks]
    assert counts == [r["len"] for r in ranks] and len(set(counts)) == 1 and counts[0] > 0
    for r in ranks:  # every step's all_reduce had every rank in it
        assert [count for count, _ in r["reduced"]] == [float(world)] * counts[0]
    state = ranks[0]["state"]
    assert state["plan"]["world_size"] == world and state["history"][0]["world_size"] == SAVED[0]


@pytest.mark.parametrize("world", [w for w, _ in RESUMED])
@pytest.mark.parametrize("name", NAMES)
def test_the_next_epoch_is_the_new_sizes_own(runs: dict[str, Any], name: str, world: int) -> None:
    got = [r[name]["next"] for r in runs["resumed"][world]]
    assert got == epoch_of(name, runs["root"] / name, world, 2)
