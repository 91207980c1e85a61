"""Seeding (fastdata.core.epoch._seeding) through real workers: persistent workers see new epochs (shared
state) and reseed, worker_init_fn composes with the user's, seeds differ by every part, stagger is seeded."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastdata as fd
from fastdata.core import compose_worker_init
from fastdata.core.epoch._seeding import derive_seed, stagger
from fastdata.core.epoch._world import World
from fastdata.core.process._shared import SharedState


class EpochProbe(Dataset):
    """Returns, from inside the worker, the epoch it sees and random draws of each library."""

    def __init__(self) -> None:
        self.shared = SharedState(("seen",))
        self.seed, self.rank, self.world_size = 5, 0, 1

    def worker_world(self) -> World:
        info = torch.utils.data.get_worker_info()
        return World(0, 1, info.id if info else 0, info.num_workers if info else 1, self.seed, self.shared.epoch)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple[int, int, float, float, float]:
        from fastdata.core.epoch._seeding import on_epoch

        on_epoch(self.worker_world())
        self.shared.add("seen")
        info = torch.utils.data.get_worker_info()
        return (
            self.shared.epoch,
            info.id if info else -1,
            random.random(),
            float(np.random.rand()),
            float(torch.rand(1)),
        )


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_see_new_epochs_and_reseed(context: str) -> None:
    ds = EpochProbe()
    loader = DataLoader(
        ds,
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=fd.worker_init_fn,
        multiprocessing_context=context,
    )
    runs = []
    for epoch in range(2):
        ds.shared.epoch = epoch
        runs.append(list(loader))
    assert {r[0] for r in runs[0]} == {0} and {r[0] for r in runs[1]} == {1}
    assert ds.shared.total("seen") == 8, "counters written in workers are visible in the main process"
    draws = [tuple(r[2:]) for run in runs for r in run]
    assert len(set(draws)) == len(draws), "workers and epochs never share a random stream"
    # the same seed and epoch give the same streams in a fresh loader
    again = DataLoader(
        ds, batch_size=None, num_workers=2, worker_init_fn=fd.worker_init_fn, multiprocessing_context=context
    )
    assert [r[2:] for r in again] == [r[2:] for r in runs[1]]


def _user_init(worker_id: int) -> None:
    os.environ["FASTDATA_TEST_USER_INIT"] = str(worker_id)


class EnvProbe(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> str:
        return os.environ.get("FASTDATA_TEST_USER_INIT", "")


def test_worker_init_composes_with_the_users_function() -> None:
    loader = DataLoader(
        EnvProbe(),
        batch_size=None,
        num_workers=2,
        worker_init_fn=compose_worker_init(_user_init),
        multiprocessing_context="spawn",
    )
    assert sorted(loader) == ["0", "1"]


def test_seeds_differ_by_every_part_and_stagger_is_seeded() -> None:
    seeds = {derive_seed(s, e, r, w) for s in range(2) for e in range(2) for r in range(2) for w in range(2)}
    assert len(seeds) == 16
    world = World(worker=1, num_workers=2, seed=3)
    assert stagger(world, 0.0, 0.002) == stagger(world, 0.0, 0.002)
    assert stagger(world, 0.0, 0.002) != stagger(World(worker=0, num_workers=2, seed=3), 0.0, 0.002)
    assert stagger(world, 0.0, 0.0) == 0.0
