"""Print the table of fastdata inside the frameworks: every scenario ``tests/test_frameworks.py`` runs
(Lightning, Accelerate and Hugging Face ``Trainer`` x tar, HDF5 and ``fd.Mix`` x setting), with the samples
read per epoch against those expected, the steps of each rank, and the mid-epoch resumes on 1 process.

    python tools/framework_matrix.py [--keep DIR]

One torchrun launch of 2 CPU ranks over gloo (``tests/frameworks_worker.py``, small seeded data: 33
samples a dataset, batches of 4), then the resume in one process; a minute or so on 2 cores. Not a test:
the tests assert the same figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.dist_backends import BACKENDS, BATCH  # noqa: E402
from tests.frameworks_worker import STOP  # noqa: E402

WORLD = 2
NAMES = ("tar_shards", "hdf5", "mix")


def launch(root: Path) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, int]]:
    sizes = {}
    for name in NAMES:
        (root / name).mkdir(parents=True, exist_ok=True)
        sizes[name] = len(BACKENDS[name].prepare(root / name))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    worker = str(ROOT / "tests" / "frameworks_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}"]
    run = {"env": env, "cwd": ROOT, "check": True, "stdout": sys.stderr}  # the table alone on stdout
    subprocess.run([*cmd, "--max-restarts=0", worker, "--root", str(root)], **run)  # type: ignore[call-overload]
    subprocess.run([sys.executable, worker, "--root", str(root), "--resume"], **run)  # type: ignore[call-overload]
    ranks = [json.loads((root / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return ranks, json.loads((root / "resume.json").read_text()), sizes


def dataset_of(scenario: str) -> str:
    part = scenario.split("/")[1]
    return "tar_shards" if part == "tar" else part


def row(scenario: str, runs: list[dict[str, Any]], size: int) -> list[str]:
    expected = size - size % WORLD
    errors = [r.get("error") for r in runs]
    if all(errors):
        e = str(errors[0])
        kind = e.split(":")[0]
        setting = "rank=0, world_size=1" if "rank=0, world_size=1" in e else "?"
        wrapper = next((w for w in ("BatchSamplerShard", "DataLoaderDispatcher", "DataLoaderShard") if w in e), "")
        return [scenario, "-", "-", f"refused on every rank at the first batch: {kind} ({wrapper}; names {setting})"]
    if any(errors):
        return [scenario, "-", "-", f"ERROR on some ranks: {errors}"]
    reads, steps, ok = [], [], True
    for epoch in range(len(runs[0]["epochs"])):
        read = Counter(k for r in runs for k in r["epochs"][epoch])
        n, once = sum(read.values()), max(read.values(), default=0) == 1
        ok = ok and once and n == expected and len({r["steps"][epoch] for r in runs}) == 1
        reads.append(f"{n}/{expected}" + ("" if once else f" ({n - len(read)} twice)"))
        steps.append("=".join(str(r["steps"][epoch]) for r in runs))
    new_order = all(r["epochs"][0] != r["epochs"][1] for r in runs)
    verdict = ("exactly once, equal steps" if ok else "NOT exact") + (", new order in epoch 1" if new_order else "")
    return [scenario, "; ".join(reads), "; ".join(steps), verdict]


def resume_row(framework: str, ranks: list[dict[str, Any]], resumed: dict[str, Any], size: int) -> list[str]:
    saved = [r[f"{framework}/tar_shards/save"] for r in ranks]
    got = resumed[f"{framework}/tar_shards/resume"]
    name = f"{framework}/tar_shards: 2-rank checkpoint at epoch 1 batch {STOP} -> 1 process"
    if "error" in got:
        return [name, "-", "-", f"ERROR: {got['error']}"]
    head = [k for r in saved for k in r["epochs"][1][: STOP * BATCH]]
    rest, later = got["epochs"]
    read = Counter(head + rest)
    expected = size - size % WORLD
    once = max(read.values()) == 1 and sum(read.values()) == expected
    whole = len(later) == len(set(later)) == size
    return [
        name,
        f"{len(head)} before + {len(rest)} after = {sum(read.values())}/{expected}; epoch 2: {len(later)}/{size}",
        f"{STOP}={STOP} + {got['steps'][0]}; {got['steps'][1]}",
        ("epoch 1 exactly once" if once else "epoch 1 NOT exact") + ("; epoch 2 whole" if whole else "; epoch 2 cut"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="make the data and results in DIR and keep them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        ranks, resumed, sizes = launch(root)
        rows = [["scenario (2 ranks)", "samples read / expected, epoch 0; 1", "steps, rank 0=1", "result"]]
        for scenario in sorted(k for k in ranks[0] if k != "built"):
            rows.append(row(scenario, [r[scenario] for r in ranks], sizes[dataset_of(scenario)]))
        for framework in ("lightning", "accelerate"):
            rows.append(resume_row(framework, ranks, resumed, sizes["tar_shards"]))
        built = [r["built"] for r in ranks]
        print("| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]))
        for r in rows[1:]:
            print("| " + " | ".join(r) + " |")
        print(f"\nbuilt before the ranks, (rank, world) recorded then: {[b['before the ranks'] for b in built]}; ")
        print(f"built in a Lightning ddp child without RANK: {[b['without RANK'] for b in built]}")
        print(f"datasets: {sizes} samples, batches of {BATCH}; 'drop' leaves {sizes['hdf5'] % WORLD} out per epoch")


if __name__ == "__main__":
    main()
