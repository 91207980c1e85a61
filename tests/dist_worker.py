"""One rank of the distributed tests; ``tests/test_distributed.py`` launches it with torchrun.

    torchrun --standalone --nproc-per-node=2 tests/dist_worker.py PHASE --root DIR [--backends a,b]

``DIR/<backend>/`` holds each backend's data (written by the test beforehand). Each rank writes what it
saw to ``DIR/<PHASE>-rank<R>.json``; the test then checks it. Phases:

* ``plan``: for each remainder policy, epochs 0 and 1 through ``fd.Loader(num_workers=2,
  persistent_workers=True)``, an ``all_reduce`` after every step (``drop``, ``pad``), or under ``Join``
  (``uneven``); then a run of epoch 1 stopped after ``STOP`` batches, its state saved
  (``fd.Loader`` and torchdata's ``StatefulDataLoader``) under ``DIR/state/``.
* ``resume``: a new process loads those states and finishes epoch 1: ``fd.Loader`` with 1 worker
  (forkserver) and with none (other worker counts than the saved run), and ``StatefulDataLoader``
  with the saved run's 2 workers.

Every collective runs under a gloo timeout, so a rank left waiting fails instead of hanging.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script by torchrun

from tests.dist_backends import BACKENDS, batch_keys, make_dataset, make_loader, make_stateful

GLOO_TIMEOUT_S = 60
EPOCHS = (0, 1)
STOP = 3  # batches of epoch 1 read before the saved state (odd: the 2 workers are mid-cycle)
WORKERS = 2


def step(keys: list[str]) -> list[float]:
    """The collective of one training step: every rank must reach it, the same number of times."""
    t = torch.tensor([1.0, float(len(keys))], dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def run_steps(batches: Any, name: str) -> dict[str, Any]:
    keys, reduced = [], []
    for batch in batches:
        k = BACKENDS[name].keys_of(batch)
        keys.append(k)
        reduced.append(step(k))
    return {"batches": keys, "reduced": reduced}


class StepSync(Joinable):
    """One ``all_reduce`` per training step, as DDP's gradient sync does; under ``Join``, a rank that has
    run out of batches shadows it with zeros, so the ranks still training see how many are left.

    (DDP itself would do, but building one imports ``torch._dynamo``: seconds per rank.)
    """

    def __init__(self) -> None:
        super().__init__()
        self.reduced: list[float] = []

    def step(self) -> None:
        Join.notify_join_context(self)
        t = torch.ones(1)
        dist.all_reduce(t)
        self.reduced.append(t.item())

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _ShadowStep()

    @property
    def join_device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def join_process_group(self) -> Any:
        return dist.group.WORLD


class _ShadowStep(JoinHook):
    def main_hook(self) -> None:
        dist.all_reduce(torch.zeros(1))


def run_joined(loader: Any, name: str) -> dict[str, Any]:
    """Train under ``Join``: what ``remainder="uneven"`` is documented to need."""
    sync = StepSync()
    keys = []
    with Join([sync]):
        for batch in loader:
            keys.append(BACKENDS[name].keys_of(batch))
            sync.step()
    return {"batches": keys, "reduced": sync.reduced}


def plan_phase(name: str, data: Path, states: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for remainder in ("drop", "pad", "uneven"):
        loader = make_loader(name, data, num_workers=WORKERS, remainder=remainder, persistent_workers=True)
        for epoch in EPOCHS:
            loader.set_epoch(epoch)
            got = run_joined(loader, name) if remainder == "uneven" else run_steps(loader, name)
            out[f"{remainder}/{epoch}"] = {"len": len(loader), **got}
        loader.close()

    loader = make_loader(name, data, num_workers=WORKERS)
    loader.set_epoch(1)
    batches = iter(loader)
    head = [BACKENDS[name].keys_of(next(batches)) for _ in range(STOP)]
    for k in head:
        step(k)
    state = loader.state_dict()
    out["loader_stop"] = {"batches": head, "state": state}
    if dist.get_rank() == 0:  # the state is the same on every rank: rank 0's is enough
        (states / f"{name}-loader.json").write_text(json.dumps(state))
    del batches
    loader.close()

    ds = make_dataset(name, data)
    ds.set_epoch(1)
    sdl = make_stateful(name, ds, num_workers=WORKERS)
    head = batch_keys(name, sdl, STOP)
    for k in head:
        step(k)
    torch.save(sdl.state_dict(), states / f"{name}-sdl-rank{dist.get_rank()}.pt")
    out["sdl_stop"] = {"batches": head}
    return out


def resume_phase(name: str, data: Path, states: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    saved = json.loads((states / f"{name}-loader.json").read_text())
    for label, workers, context in (("loader_1_forkserver", 1, "forkserver"), ("loader_0", 0, None)):
        kwargs = {"multiprocessing_context": context} if context else {}
        loader = make_loader(name, data, num_workers=workers, **kwargs)
        loader.load_state_dict(saved)
        got: dict[str, Any] = {"batches": [], "reduced": [], "epochs": []}
        for epoch in range(loader.epoch, EPOCHS[-1] + 1):
            loader.set_epoch(epoch)
            part = run_steps(loader, name)
            got["batches"] += part["batches"]
            got["reduced"] += part["reduced"]
            got["epochs"].append(epoch)
        out[label] = got
        loader.close()

    ds = make_dataset(name, data)
    ds.set_epoch(1)  # the training script keeps the epoch in its own checkpoint, as with any DataLoader
    sdl = make_stateful(name, ds, num_workers=WORKERS)
    sdl.load_state_dict(torch.load(states / f"{name}-sdl-rank{dist.get_rank()}.pt", weights_only=True))
    out["sdl_2"] = run_steps(sdl, name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["plan", "resume"])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    try:
        rank = dist.get_rank()
        states = args.root / "state"
        states.mkdir(exist_ok=True)
        phase = plan_phase if args.phase == "plan" else resume_phase
        result = {"rank": rank, "world_size": dist.get_world_size(), "pid": os.getpid(), "backends": {}, "seconds": {}}
        for name in args.backends.split(","):
            start = time.perf_counter()
            result["backends"][name] = phase(name, args.root / name, states)
            result["seconds"][name] = round(time.perf_counter() - start, 2)  # what each backend costs the suite
        step([])  # every rank got here: nobody is left behind in a collective
        (args.root / f"{args.phase}-rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
