"""The worker-safety core: per-process handles, the bounded LRU, shared state, seeding."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import resource

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastdata as fd
from fastdata.core.errors import ConfigError
from fastdata.core.handles import HandleCache, ProcessLocal, default_max_open
from fastdata.core.seeding import derive_seed, stagger
from fastdata.core.shared import SharedState
from fastdata.core.world import World


class Handle:
    """A fake handle that records who opened it and whether it was closed."""

    def __init__(self, key: str) -> None:
        self.key, self.pid, self.closed = key, os.getpid(), False

    def close(self) -> None:
        self.closed = True


def test_handles_open_lazily_and_lru_bound_closes_the_oldest() -> None:
    cache: HandleCache[str, Handle] = HandleCache(Handle, max_open=2)
    assert len(cache) == 0 and cache.opened == 0
    a = cache.get("a")
    assert cache.get("a") is a and cache.opened == 1
    b = cache.get("b")
    cache.get("a")  # a is now the most recent
    c = cache.get("c")  # evicts b
    assert b.closed and not a.closed and not c.closed and len(cache) == 2
    cache.close()
    assert a.closed and c.closed and len(cache) == 0
    cache.close()  # idempotent


def test_max_open_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        HandleCache(Handle, max_open=0)


def test_pickling_drops_handles() -> None:
    cache: HandleCache[str, Handle] = HandleCache(Handle, max_open=4)
    cache.get("a")
    clone = pickle.loads(pickle.dumps(cache))
    assert len(clone) == 0 and clone.opened == 0
    assert clone.get("a") is not cache.get("a")


def _child_view(cache: HandleCache[str, Handle], parent_handle: Handle, queue: multiprocessing.Queue) -> None:
    mine = cache.get("a")
    queue.put((mine.pid, mine is parent_handle, parent_handle.closed))


@pytest.mark.parametrize("close_inherited", [True, False])
def test_a_forked_child_never_uses_its_parents_handle(close_inherited: bool) -> None:
    ctx = multiprocessing.get_context("fork")
    cache: HandleCache[str, Handle] = HandleCache(Handle, max_open=4, close_inherited=close_inherited)
    parent_handle = cache.get("a")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_view, args=(cache, parent_handle, queue))
    proc.start()
    child_pid, same, closed_in_child = queue.get(timeout=60)
    proc.join(60)
    assert child_pid == proc.pid and not same
    assert closed_in_child is close_inherited  # closed, or abandoned untouched (decord must not be destroyed)
    assert not parent_handle.closed and cache.get("a") is parent_handle  # the parent's copy is unaffected


def test_process_local_builds_once_per_process_and_is_picklable() -> None:
    local = ProcessLocal(lambda: Handle("client"))
    first = local.get()
    assert local.get() is first
    clone = pickle.loads(pickle.dumps(ProcessLocal(_make_client)))
    assert clone.get().key == "client"
    local.close()
    assert first.closed


def _make_client() -> Handle:
    return Handle("client")


def test_default_max_open_follows_ulimit_and_workers() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert default_max_open(7) == 1024 // 4 // 8
        assert default_max_open(0) == 256
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        assert default_max_open(8) == 4, "never below 4"
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


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
        from fastdata.core.seeding import on_epoch

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
        worker_init_fn=fd.compose_worker_init(_user_init),
        multiprocessing_context="spawn",
    )
    assert sorted(loader) == ["0", "1"]


def test_shared_state_pickles_by_value_outside_spawning() -> None:
    state = SharedState(("skipped",))
    state.epoch = 3
    state.add("skipped", 2)
    clone = pickle.loads(pickle.dumps(state))
    clone.epoch = 9
    assert state.epoch == 3 and clone.total("skipped") == 2


def test_seeds_differ_by_every_part_and_stagger_is_seeded() -> None:
    seeds = {derive_seed(s, e, r, w) for s in range(2) for e in range(2) for r in range(2) for w in range(2)}
    assert len(seeds) == 16
    world = World(worker=1, num_workers=2, seed=3)
    assert stagger(world, 0.0, 0.002) == stagger(world, 0.0, 0.002)
    assert stagger(world, 0.0, 0.002) != stagger(World(worker=0, num_workers=2, seed=3), 0.0, 0.002)
    assert stagger(world, 0.0, 0.0) == 0.0


def test_world_detects_rank_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    world = World.detect(seed=1)
    assert (world.rank, world.world_size, world.worker, world.num_workers) == (2, 4, 0, 1)
    assert world.global_worker == 2 and world.total_workers == 4
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ConfigError, match="rank=4"):
        World.detect()
