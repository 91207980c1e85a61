"""One rank of the elastic-resume test; ``tests/test_distributed_elastic.py`` launches it with torchrun.

    torchrun --standalone --nproc-per-node=N tests/dist_elastic_worker.py PHASE --root DIR --workers W

* ``save`` (4 ranks): for each backend, epoch 1 through ``fd.Loader(num_workers=W)``, stopped after ``STOP``
  batches (an ``all_reduce`` after each step); rank 0 saves the Loader's state; every rank writes the keys it
  consumed.
* ``resume`` (2 or 3 ranks, another ``num_workers``): loads that state, finishes epoch 1 (an ``all_reduce``
  after each step: a rank with fewer batches would leave the others waiting, and the gloo timeout fails it),
  then reads epoch 2 as a run of this size.

Each rank writes what it saw to ``DIR/<PHASE>-<world>-rank<R>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script by torchrun

import fastdata as fd
from tests.dist_backends import BACKENDS, BATCH, SEED, make_loader, make_mix_sources

GLOO_TIMEOUT_S = 60
STOP = 1  # batches of epoch 1 read before the state is saved (of 2 per rank at 4 ranks)
NAMES = ("tar_shards", "hdf5", "mix")
MIX_EPOCH = 60  # divisible by 4, 3 and 2 ranks: nothing left out, so the shares are exact
MIX_WEIGHTS = {"tar": 2.0, "h5": 1.0}


def loader_for(
    name: str, folder: Path, num_workers: int, rank: int | None = None, world_size: int | None = None
) -> fd.Loader:
    """Backend ``name``'s Loader (the mix: 2 parts tar to 1 part HDF5, 60 samples an epoch)."""
    if name != "mix":
        return make_loader(name, folder, num_workers=num_workers, rank=rank, world_size=world_size)
    mix = fd.Mix(
        make_mix_sources(folder), MIX_WEIGHTS, seed=SEED, epoch_size=MIX_EPOCH, rank=rank, world_size=world_size
    )
    return fd.Loader(mix, batch_size=BATCH, num_workers=num_workers)


def step(n: int) -> list[float]:
    """One training step's collective: every rank must reach it, the same number of times."""
    t = torch.tensor([1.0, float(n)], dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def save(name: str, folder: Path, states: Path, workers: int) -> dict[str, Any]:
    loader = loader_for(name, folder, workers)
    loader.set_epoch(1)
    batches = iter(loader)
    keys = []
    for _ in range(STOP):
        k = BACKENDS[name].keys_of(next(batches))
        keys.append(k)
        step(len(k))
    state = loader.state_dict()
    if dist.get_rank() == 0:
        (states / f"{name}.json").write_text(json.dumps(state))
    del batches
    loader.close()
    return {"batches": keys, "state": state}


def resume(name: str, folder: Path, states: Path, workers: int) -> dict[str, Any]:
    loader = loader_for(name, folder, workers)
    loader.load_state_dict(json.loads((states / f"{name}.json").read_text()))
    # what is left of the epoch: len() counts the saved position too, as after any resume (Lightning's loop)
    out: dict[str, Any] = {"len": len(loader) - loader.consumed, "batches": [], "reduced": []}
    for batch in loader:
        k = BACKENDS[name].keys_of(batch)
        out["batches"].append(k)
        out["reduced"].append(step(len(k)))
    out["state"] = loader.state_dict()
    loader.set_epoch(2)
    out["next"] = [BACKENDS[name].keys_of(b) for b in loader]
    loader.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["save", "resume"])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--workers", type=int, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        states = args.root / "state"
        states.mkdir(exist_ok=True)
        phase = save if args.phase == "save" else resume
        result = {name: phase(name, args.root / name, states, args.workers) for name in NAMES}
        step(0)  # every rank got here: nobody is left behind in a collective
        (args.root / f"{args.phase}-{world}-rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
