"""Mid-epoch resume, in one process: ``fd.Loader`` (any ``num_workers``) and torchdata's
``StatefulDataLoader`` (same ``num_workers``), for every backend in ``tests/dist_backends.py``.

A resumed loader is always built anew, from a new dataset, with a state that went through JSON, as
after a restart; ``test_distributed.py`` does the same across real process restarts under torchrun.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import SequentialSampler

import fastdata as fd
from fastdata.core.errors import ConfigError
from fastdata.core.seeding import WorkerInit
from tests.dist_backends import BACKENDS, BATCH, batch_keys, make_dataset, make_loader, make_stateful

STOP_EPOCH = 1


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, s3_env: dict[str, str]) -> dict[str, Path]:
    out = {}
    for name in BACKENDS:
        folder = tmp_path_factory.mktemp(name)
        BACKENDS[name].prepare(folder)
        out[name] = folder
    return out


def positions(name: str, batches: int) -> list[int]:
    """Where to stop, in an epoch of ``batches``: everywhere (0 .. batches: after the last batch too) on
    a fast backend; on a slow one the start, the ends and a middle (the plan is the same code)."""
    if not BACKENDS[name].slow:
        return list(range(batches + 1))
    return sorted({0, 1, batches // 2, batches - 1, batches})


def uninterrupted(name: str, folder: Path, epochs: range, **options: Any) -> list[list[str]]:
    loader = make_loader(name, folder, num_workers=0, **options)
    out: list[list[str]] = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out += batch_keys(name, loader)
    return out


def stop_after(name: str, folder: Path, k: int, *, num_workers: int = 0, **options: Any) -> tuple[list, dict]:
    """Read ``k`` batches of epoch ``STOP_EPOCH``; those batches and the saved state (through JSON)."""
    loader = make_loader(name, folder, num_workers=num_workers, **options)
    loader.set_epoch(STOP_EPOCH)
    head = batch_keys(name, loader, k)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return head, state


def resume(
    name: str, folder: Path, state: dict, last_epoch: int, *, num_workers: int = 0, **options: Any
) -> list[list[str]]:
    """A new Loader from ``state``, run the way a training script does, to the end of ``last_epoch``."""
    loader = make_loader(name, folder, num_workers=num_workers, **options)
    loader.load_state_dict(state)
    out: list[list[str]] = []
    for epoch in range(loader.epoch, last_epoch + 1):
        loader.set_epoch(epoch)
        out += batch_keys(name, loader)
    loader.close()
    return out


@pytest.mark.parametrize(("remainder", "rank", "world_size"), [("drop", 0, 1), ("pad", 1, 2), ("uneven", 2, 3)])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_resume_at_every_batch_continues_exactly(
    data: dict, name: str, remainder: str, rank: int, world_size: int
) -> None:
    options = {"remainder": remainder, "rank": rank, "world_size": world_size}
    epoch_1 = uninterrupted(name, data[name], range(1, 2), **options)
    epoch_2 = uninterrupted(name, data[name], range(2, 3), **options)
    assert epoch_1 != epoch_2
    for k in positions(name, len(epoch_1)):  # k == len: saved after the last batch of the epoch
        head, state = stop_after(name, data[name], k, **options)
        assert state["epoch"] == STOP_EPOCH and state["batches"] == k
        rest = resume(name, data[name], state, last_epoch=2, **options)
        assert head + rest == epoch_1 + epoch_2, f"resumed after {k} batches"


@pytest.mark.parametrize(("before", "after", "k"), [(0, 3, 3), (3, 2, 1)])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_resume_with_another_num_workers(data: dict, name: str, before: int, after: int, k: int) -> None:
    full = uninterrupted(name, data[name], range(STOP_EPOCH, STOP_EPOCH + 1))
    head, state = stop_after(name, data[name], k, num_workers=before)
    rest = resume(name, data[name], state, last_epoch=STOP_EPOCH, num_workers=after)
    assert head == full[:k] and head + rest == full


@pytest.mark.parametrize("name", list(BACKENDS))
def test_persistent_workers_take_a_state_loaded_later(data: dict, name: str) -> None:
    full = [uninterrupted(name, data[name], range(e, e + 1)) for e in (0, 1)]
    loader = make_loader(name, data[name], num_workers=2, persistent_workers=True)
    for epoch in (0, 1):  # the same batches as without persistent workers
        loader.set_epoch(epoch)
        assert batch_keys(name, loader) == full[epoch]
    state = {**loader.state_dict(), "epoch": 1, "batches": 2}
    loader.load_state_dict(state)
    assert batch_keys(name, loader) == full[1][2:]
    loader.set_epoch(1)  # and the pass after that is a whole epoch again
    assert batch_keys(name, loader) == full[1]
    loader.close()


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_stateful_dataloader_resumes_exactly(data: dict, name: str, num_workers: int) -> None:
    pytest.importorskip("torchdata.stateful_dataloader")
    import torch

    def run(k: int | None, state: Any = None) -> tuple[list, Any]:
        ds = make_dataset(name, data[name])
        ds.set_epoch(STOP_EPOCH)
        sdl = make_stateful(name, ds, num_workers=num_workers)
        if state is not None:
            sdl.load_state_dict(state)
        got = batch_keys(name, sdl, k)
        return got, sdl.state_dict()

    full, _ = run(None)
    for k in (1, 2, len(full)) if not BACKENDS[name].slow or num_workers == 0 else (1, len(full)):
        head, state = run(k)
        buf = Path(data[name]) / f"sdl-{num_workers}-{k}.pt"
        torch.save(state, buf)  # the way a checkpoint stores it
        rest, _ = run(None, torch.load(buf, weights_only=True))
        assert head + rest == full, f"resumed after {k} batches"


def test_worker_state_in_another_worker_layout_is_refused(data: dict) -> None:
    ds = make_dataset("tar_shards", data["tar_shards"])
    ds.load_state_dict({"epoch": 0, "batches": 3, "worker": 1, "num_workers": 2})
    with pytest.raises(ConfigError, match="saved by worker 1 of 2"):
        next(iter(ds))


@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_state_from_another_setup_is_refused(data: dict, name: str) -> None:
    _, state = stop_after(name, data[name], 2)
    for options, field in (
        ({"batch_size": BATCH + 1}, "batch_size"),
        ({"seed": 99}, "seed"),
        ({"rank": 0, "world_size": 2}, "world_size"),
    ):
        with pytest.raises(ConfigError, match=field):
            make_loader(name, data[name], num_workers=0, **options).load_state_dict(state)
    loader = make_loader(name, data[name], num_workers=0)
    with pytest.raises(ConfigError, match="outside"):
        loader.load_state_dict({**state, "batches": len(loader) + 1})


@pytest.mark.parametrize("name", list(BACKENDS))
def test_loader_refuses_options_that_break_resume(data: dict, name: str) -> None:
    ds = make_dataset(name, data[name])
    with pytest.raises(ConfigError, match="in_order"):
        fd.Loader(ds, batch_size=BATCH, num_workers=2, in_order=False)
    with pytest.raises(ConfigError, match="batch_sampler"):
        fd.Loader(ds, batch_size=BATCH, batch_sampler=[[0]])


def test_loader_checks_an_iterable_dataset_plans_what_it_is_asked(data: dict) -> None:
    ds = make_dataset("tar_shards", data["tar_shards"], shuffle=True, remainder="drop")
    for kwargs, word in (
        ({"batch_size": BATCH + 1}, "batch_size"),
        ({"shuffle": False}, "shuffle"),
        ({"remainder": "pad"}, "remainder"),
        ({"drop_last": True}, "drop_last"),
        ({"sampler": SequentialSampler(range(3))}, "sampler"),
        ({"collate_fn": list}, "collate_fn"),
    ):
        with pytest.raises(ConfigError, match=word):
            fd.Loader(ds, **kwargs)
    unbatched = fd.TarShardDataset(ds.urls)
    with pytest.raises(ConfigError, match=r"batch_size=\.\.\."):
        fd.Loader(unbatched)


def test_loader_checks_a_map_style_setup(data: dict) -> None:
    ds = make_dataset("indexed_tar", data["indexed_tar"])
    with pytest.raises(ConfigError, match="batch_size"):
        fd.Loader(ds)
    with pytest.raises(ConfigError, match=r"use fastdata\.EpochSampler"):
        fd.Loader(ds, batch_size=BATCH, sampler=SequentialSampler(ds))
    with pytest.raises(ConfigError, match="sampler you built"):
        fd.Loader(ds, batch_size=BATCH, sampler=ds.sampler(), shuffle=False)


def test_loader_runs_the_users_worker_init_after_fastdatas(data: dict) -> None:
    def mine(worker_id: int) -> None:
        pass

    loader = make_loader("indexed_tar", data["indexed_tar"], num_workers=0, worker_init_fn=mine)
    init = loader.dataloader.worker_init_fn
    assert isinstance(init, WorkerInit) and init.then == (mine,)


def test_epoch_sampler_state_follows_its_iteration() -> None:
    sampler = fd.EpochSampler(10, seed=4, rank=0, world_size=1)
    sampler.set_epoch(2)
    it = iter(sampler)
    head = [next(it) for _ in range(3)]
    state = sampler.state_dict()
    assert state == {"epoch": 2, "consumed": 3}
    assert sampler.state_dict(consumed=1) == {"epoch": 2, "consumed": 1}
    other = fd.EpochSampler(10, seed=4, rank=0, world_size=1)
    other.load_state_dict(state)
    assert other.state_dict() == state  # before it is iterated, it reports what it will resume from
    assert head + list(other) == list(sampler)
