"""Real multi-rank training: ``torchrun --nproc-per-node=2`` (gloo, CPU) x ``num_workers=2`` per backend.

Two torchrun launches serve every test here (starting torchrun costs seconds): ``plan`` reads epochs
under each remainder policy and saves a mid-epoch state; ``resume``, in new processes, finishes that
epoch from the state. See ``tests/dist_worker.py``; backends come from ``tests/dist_backends.py``.
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

from tests.dist_backends import BACKENDS, BATCH
from tests.dist_worker import EPOCHS, STOP

WORLD = 2
# The gloo timeout inside the ranks (60 s) fails a rank left waiting in a collective; this one stops a
# launch that hangs anyway (say, in a DataLoader worker), so that CI fails instead of blocking.
LAUNCH_TIMEOUT_S = 240
ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * LAUNCH_TIMEOUT_S + 60)]


def torchrun(phase: str, root: Path) -> list[dict[str, Any]]:
    """Run ``dist_worker.py PHASE`` on ``WORLD`` ranks; each rank's result, by rank."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "TORCHELASTIC_ERROR_FILE": str(root / f"{phase}-error.json"),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={WORLD}",
        "--max-restarts=0",
        str(ROOT / "tests" / "dist_worker.py"),
        phase,
        "--root",
        str(root),
        "--backends",
        ",".join(BACKENDS),
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
        pytest.fail(f"torchrun {phase} did not finish in {LAUNCH_TIMEOUT_S} s:\n{output[-6000:]}")
    assert proc.returncode == 0, f"torchrun {phase} failed ({proc.returncode}):\n{output[-6000:]}"
    return [json.loads((root / f"{phase}-rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, s3_env: dict[str, str]) -> dict[str, Any]:
    # s3_env: the S3 backends' server, found by the ranks (and their workers) through the environment
    root = tmp_path_factory.mktemp("dist")
    expected = {}
    for name, backend in BACKENDS.items():
        (root / name).mkdir()
        expected[name] = backend.prepare(root / name)
    plan = torchrun("plan", root)
    resume = torchrun("resume", root)
    return {"expected": expected, "plan": plan, "resume": resume}


def per_rank(runs: dict[str, Any], phase: str, name: str, key: str) -> list[dict[str, Any]]:
    return [rank["backends"][name][key] for rank in runs[phase]]


def flat(batches: list[list[str]]) -> list[str]:
    return [k for batch in batches for k in batch]


@pytest.mark.parametrize("epoch", EPOCHS)
@pytest.mark.parametrize("remainder", ["drop", "pad", "uneven"])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_ranks_together_read_the_dataset(runs: dict[str, Any], name: str, remainder: str, epoch: int) -> None:
    expected = runs["expected"][name]
    n = len(expected)
    ranks = per_rank(runs, "plan", name, f"{remainder}/{epoch}")
    seen = Counter(k for r in ranks for k in flat(r["batches"]))
    assert set(seen) <= set(expected), "samples that are not in the dataset"
    if remainder == "drop":
        assert max(seen.values()) == 1, "a sample read twice"
        assert len(seen) == WORLD * (n // WORLD), "not exactly n % world_size samples left out"
    elif remainder == "pad":
        assert set(seen) == set(expected), "samples missing"
        pads = WORLD * -(-n // WORLD) - n
        assert sum(seen.values()) - n == pads and max(seen.values()) <= 2, "not exactly the documented pads"
    else:
        assert sorted(seen.elements()) == sorted(expected), "not every sample exactly once"


@pytest.mark.parametrize("remainder", ["drop", "pad"])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_equal_batches_per_rank_and_every_step_synchronises(runs: dict[str, Any], name: str, remainder: str) -> None:
    for epoch in EPOCHS:
        ranks = per_rank(runs, "plan", name, f"{remainder}/{epoch}")
        counts = [len(r["batches"]) for r in ranks]
        assert counts == [r["len"] for r in ranks], "len(loader) is not the number of batches read"
        assert len(set(counts)) == 1, f"ranks read different numbers of batches: {counts}"
        for r in ranks:  # every rank took part in every all_reduce, with the same batch
            sizes = [len(b) for b in r["batches"]]
            assert [s for s, _ in r["reduced"]] == [float(WORLD)] * len(sizes)
            assert all(total == WORLD * size for (_, total), size in zip(r["reduced"], sizes))


@pytest.mark.parametrize("name", list(BACKENDS))
def test_uneven_ranks_finish_under_join(runs: dict[str, Any], name: str) -> None:
    n = len(runs["expected"][name])
    for epoch in EPOCHS:
        ranks = per_rank(runs, "plan", name, f"uneven/{epoch}")
        counts = [len(r["batches"]) for r in ranks]
        assert counts == [r["len"] for r in ranks], "len(loader) is not the number of batches read"
        assert [len(flat(r["batches"])) for r in ranks] == [n // WORLD + (r < n % WORLD) for r in range(WORLD)]
        # every step's all_reduce completed; past the shorter rank's end, the others see it has joined
        for r in ranks:
            assert r["reduced"] == [float(sum(c > i for c in counts)) for i in range(len(r["batches"]))]


@pytest.mark.parametrize("name", list(BACKENDS))
def test_each_rank_order_changes_with_the_epoch(runs: dict[str, Any], name: str) -> None:
    # that every rank drew the same permutation without communicating is what the union test shows
    for a, b in zip(per_rank(runs, "plan", name, "drop/0"), per_rank(runs, "plan", name, "drop/1")):
        assert flat(a["batches"]) != flat(b["batches"])


@pytest.mark.parametrize("resumed", ["loader_1_forkserver", "loader_0", "sdl_2"])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_resume_in_new_process_continues_exactly(runs: dict[str, Any], name: str, resumed: str) -> None:
    full = per_rank(runs, "plan", name, "drop/1")
    stop = per_rank(runs, "plan", name, "sdl_stop" if resumed.startswith("sdl") else "loader_stop")
    rest = per_rank(runs, "resume", name, resumed)
    for rank in range(WORLD):
        assert len(stop[rank]["batches"]) == STOP
        assert stop[rank]["batches"] + rest[rank]["batches"] == full[rank]["batches"], f"rank {rank}"
        assert all(count == float(WORLD) for count, _ in rest[rank]["reduced"])
    if resumed.startswith("loader"):
        assert [r["epochs"] for r in rest] == [[1], [1]]
        states = [s["state"] for s in stop]
        assert states[0] == states[1], "the saved state differs between ranks"
        assert (states[0]["epoch"], states[0]["unit"], states[0]["position"]) == (1, "batches", STOP)
        assert states[0]["plan"]["batch_size"] == BATCH
