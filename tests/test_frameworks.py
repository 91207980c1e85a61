"""fastdata inside the frameworks users train with, under the real frameworks: one ``torchrun`` launch of
2 CPU ranks over gloo (``tests/frameworks_worker.py``) runs Accelerate's ``prepare`` and Lightning's
``Trainer.fit`` over tar, HDF5 and Mix, and each scenario is checked here: every sample of each epoch
read exactly once across the ranks (the ``drop`` remainder leaves 1 of 33 out), the same steps on each
rank, a new order in epoch 1, or a clear error on every rank naming the setting to change. A checkpoint
Lightning saved mid-epoch on the 2 ranks is then resumed by Lightning on 1 device.

The same launch checks the monitor on several ranks, every rank given the same report paths: each report
names the rank that made it (``rank``/``world_size`` in the JSON, "rank R/2" in the log line), and no two
ranks append to one file (rank 0 writes the path given, rank 1 ``loader.rank1.jsonl`` beside it, and a
path with ``{rank}`` is each rank's own).
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

from fastdata.loading.observe import Window
from fastdata.loading.observe.report import Stats
from tests.dist_backends import BACKENDS, BATCH
from tests.frameworks_worker import STOP

WORLD = 2
LAUNCH_TIMEOUT_S = 240
ROOT = Path(__file__).resolve().parent.parent
NAMES = ("tar_shards", "hdf5", "mix")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(LAUNCH_TIMEOUT_S + 60)]


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("frameworks")


@pytest.fixture(scope="module")
def ranks(launched: Path) -> tuple[list[dict[str, Any]], dict[str, int]]:
    root = launched
    sizes = {}
    for name in NAMES:
        (root / name).mkdir()
        sizes[name] = len(BACKENDS[name].prepare(root / name))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}"]
    cmd += ["--max-restarts=0", str(ROOT / "tests" / "frameworks_worker.py"), "--root", str(root)]
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {LAUNCH_TIMEOUT_S} s:\n{output[-6000:]}")
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{output[-6000:]}"
    # the checkpoint saved mid-epoch on 2 ranks, resumed by Lightning on 1 device, in one process
    one = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    cmd = [sys.executable, str(ROOT / "tests" / "frameworks_worker.py"), "--root", str(root), "--resume"]
    done = subprocess.run(cmd, env=one, cwd=ROOT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sizes["resume"] = json.loads((root / "resume.json").read_text())
    return [json.loads((root / f"rank{r}.json").read_text()) for r in range(WORLD)], sizes


EXACT = [
    "accelerate/{}/fd.Loader",
    "accelerate/hdf5/DataLoader(rank=0, world_size=1)",
    "lightning/hdf5/DataLoader(sampler=ds.sampler())",
    "lightning/mix/DataLoader(sampler=ds.sampler())",
    "lightning/{}/fd.Loader",
    "lightning/tar_shards/fd.Loader(built before the ranks)",
    "lightning/tar_shards/fd.Loader(built without RANK)",
    "trainer/{}/fd.Loader",
    "trainer/hdf5/Trainer(rank=0, world_size=1)",
]
SCENARIOS = sorted({s.format(n) for s in EXACT for n in NAMES})


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_sample_once_per_epoch_with_equal_steps_and_a_new_order(ranks: Any, scenario: str) -> None:
    results, sizes = ranks
    runs = [r[scenario] for r in results]
    assert not any("error" in r for r in runs), [r.get("error") for r in runs]
    size = sizes[scenario.split("/")[1]]
    for epoch in range(2):
        read = Counter(k for r in runs for k in r["epochs"][epoch])
        assert max(read.values()) == 1 and sum(read.values()) == size - size % WORLD, f"epoch {epoch}: {read}"
        assert runs[0]["steps"][epoch] == runs[1]["steps"][epoch]
    assert all(r["epochs"][0] != r["epochs"][1] for r in runs), "epoch 1 repeated epoch 0's order"


@pytest.mark.parametrize(
    ("scenario", "wrapper"),
    [
        ("accelerate/hdf5/DataLoader(sampler=ds.sampler())", "BatchSamplerShard"),
        ("accelerate/tar/DataLoader(batch_size=None)", "DataLoaderDispatcher"),
        ("trainer/hdf5/Trainer", "DataLoaderShard"),
    ],
)
def test_a_second_split_by_accelerate_is_refused_on_every_rank_naming_the_fix(
    ranks: Any, scenario: str, wrapper: str
) -> None:
    for r in ranks[0]:
        error = r[scenario]["error"]
        assert error.startswith("ConfigError") and wrapper in error and "fastdata.Loader" in error, error
        assert "rank=0, world_size=1" in error
        # the fix named is the one this user can make: a Trainer user never calls prepare() themselves
        trainer = scenario.startswith("trainer/")
        assert ("get_train_dataloader()" in error) == trainer and ("to prepare()" in error) != trainer, error


def test_a_dataset_built_before_the_ranks_records_what_the_environment_says(ranks: Any) -> None:
    built = [r["built"] for r in ranks[0]]
    assert [b["before the ranks"] for b in built] == [[0, 1], [0, 1]]  # learned later, where it reads
    assert [b["without RANK"] for b in built] == [[0, 2], [1, 2]]  # LOCAL_RANK and WORLD_SIZE, as Lightning's


@pytest.mark.parametrize("framework", ["lightning", "accelerate"])
def test_a_2_rank_checkpoint_resumes_on_1_process_reading_the_rest_once_and_later_epochs_whole(
    ranks: Any, framework: str
) -> None:
    """Lightning's checkpoint (the loader's state rides in it by itself), and Accelerate's ``save_state`` of
    a loader registered with ``register_for_checkpointing``, as docs/frameworks.md says."""
    results, sizes = ranks
    saved = [r[f"{framework}/tar_shards/save"] for r in results]
    resumed = sizes["resume"][f"{framework}/tar_shards/resume"]
    assert "error" not in resumed and resumed["first_epoch"] == 1
    head = [k for r in saved for k in r["epochs"][1][: STOP * BATCH]]  # read before the checkpoint
    rest, later = resumed["epochs"]
    read = Counter(head + rest)
    size = sizes["tar_shards"]
    assert max(read.values()) == 1 and sum(read.values()) == size - size % WORLD, "epoch 1 not read exactly once"
    assert sorted(later) == sorted(set(later)) and len(later) == size, "epoch 2 on 1 device not whole"


def _reports(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_rank_writes_its_own_monitor_file_and_every_report_names_its_rank(ranks: Any, launched: Path) -> None:
    folder = launched / "reports"
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jsonl"))
    assert files == ["0/loader.jsonl", "1/loader.jsonl", "loader.jsonl", "loader.rank1.jsonl"]
    # 33 samples, 16 a rank ("drop"), batches of 4: 4 batches, a report every 2
    for rank, names in enumerate([("loader.jsonl", "0/loader.jsonl"), ("loader.rank1.jsonl", "1/loader.jsonl")]):
        for name in names:
            got = _reports(folder / name)
            assert len(got) == 2 and all((r["rank"], r["world_size"]) == (rank, WORLD) for r in got), (name, got)
            assert len({r["processes"][0]["pid"] for r in got}) == 1  # one process wrote each file


def test_the_monitor_log_line_says_which_rank_made_it(ranks: Any, launched: Path) -> None:
    for rank in range(WORLD):
        lines = (launched / f"log{rank}.txt").read_text().splitlines()
        assert len(lines) == 2 and all(line.startswith(f"rank {rank}/{WORLD} epoch 0 batch ") for line in lines), lines


def test_a_single_process_report_names_no_rank() -> None:
    line = Stats(0.0, 0, 5, Window(), 0, None, False).line()
    assert line.startswith("epoch 0 batch 5: ") and "rank" not in line
