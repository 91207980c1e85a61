"""Mid-epoch resume, in one process, of every resumable object: ``fd.Loader`` (any ``num_workers``) over
every backend in ``tests/dist_backends.py`` and over HDF5's chunk sampler, ``EpochSampler``,
``ChunkBatchSampler``, ``TarShardDataset``, and torchdata's ``StatefulDataLoader`` (same ``num_workers``).

Every one goes through the one check, :func:`tests.resume_check.check_resume`: saved at the start, the
middle and the end of an epoch, resumed in an object built anew (a new dataset too) from a state that went
through JSON, as after a restart; ``test_distributed.py`` does the same across real process restarts under
torchrun. The rest checks the one state schema (:mod:`fastdata.core.epoch._resume`): what it reports, the states
older versions saved, and the states that do not fit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import SequentialSampler

import fastdata as fd
from fastdata.core.epoch._seeding import WorkerInit
from fastdata.core.errors import ConfigError
from fastdata.loading import EpochSampler
from fastdata.loading._chunk_sampler import ChunkBatchSampler
from tests.dist_backends import BACKENDS, BATCH, SEED, batch_keys, make_dataset, make_loader, make_stateful
from tests.resume_check import Subject, check_resume, through_json

STOP_EPOCH = 1


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, s3_env: dict[str, str]) -> dict[str, Path]:
    out = {}
    for name in BACKENDS:
        folder = tmp_path_factory.mktemp(name)
        BACKENDS[name].prepare(folder)
        out[name] = folder
    return out


def every_batch(n: int) -> range:
    return range(n + 1)


def positions(name: str) -> Any:
    """Where to stop: at every batch (0 .. n: after the last batch too) on a fast backend; on a slow one
    the start, the middle and the end (the plan is the same code)."""
    return None if BACKENDS[name].slow else every_batch


def loader_subject(name: str, folder: Path, workers: Any = ((0, 0),), **options: Any) -> Subject:
    return Subject(
        make=lambda num_workers: make_loader(name, folder, num_workers=num_workers, **options),
        keys=BACKENDS[name].keys_of,
        workers=workers,
    )


@pytest.mark.parametrize(("remainder", "rank", "world_size"), [("drop", 0, 1), ("pad", 1, 2), ("uneven", 2, 3)])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_loader_resumes_exactly_at_every_batch(
    data: dict, name: str, remainder: str, rank: int, world_size: int
) -> None:
    subject = loader_subject(name, data[name], remainder=remainder, rank=rank, world_size=world_size)
    at = positions(name)
    states = check_resume(subject, epoch=STOP_EPOCH, at=at)
    # the states count the batches handed out (the last: after the pass ran out), in the one schema, with
    # the plan they were read under
    n = len(subject.make(0))
    assert [s["position"] for s in states] == [*(at(n) if at else (0, n // 2, n)), n]
    assert {(s["version"], s["epoch"], s["unit"]) for s in states} == {(2, STOP_EPOCH, "batches")}
    plan = dict(states[0]["plan"])
    # the data's identity, as digests: a Mix's sources, shares and orders; shards; HDF5 files
    mixed = {plan.pop(k, None) is None for k in ("mix", "mix_counts", "mix_orders")}
    assert mixed == {name != "mix"}, "a Mix's plan names its mix"
    identity = {"tar_shards": "shards", "indexed_tar": "shards", "hdf5": "files"}.get(name)
    assert (plan.pop(identity, None) is not None) if identity else not {"shards", "files"} & set(plan)
    own = {"window": 8} if name == "tar_shards" else {"unit": 1}  # the tar dataset's shuffle window; a sampler's unit
    assert plan == {
        "batch_size": BATCH,
        "world_size": world_size,
        "size": 66 if name == "mix" else 33,
        "seed": SEED,
        "shuffle": 0 if name == "mix" else 1,  # a Mix's sequence is its own (its sources shuffle: in mix_orders)
        "remainder": ["drop", "pad", "uneven"].index(remainder),  # how the epoch is split: an elastic resume replays it
        "drop_last": 0,
        **own,
    }


@pytest.mark.parametrize("name", list(BACKENDS))
def test_loader_resumes_with_another_num_workers(data: dict, name: str) -> None:
    check_resume(loader_subject(name, data[name], workers=((0, 3), (3, 2), (2, 0), (2, 1))), epoch=STOP_EPOCH)


def hdf5_chunk_loader(folder: Path, num_workers: int, **options: Any) -> fd.Loader:
    ds = make_dataset("hdf5", folder, rank=options.get("rank"), world_size=options.get("world_size"))
    sampler = ds.chunk_sampler(
        BATCH, drop_last=options.get("drop_last", False), remainder=options.get("remainder", "drop")
    )
    return fd.Loader(ds, batch_sampler=sampler, num_workers=num_workers)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"remainder": "pad", "rank": 1, "world_size": 2, "drop_last": True},
        {"remainder": "uneven", "rank": 2, "world_size": 3},
    ],
)
def test_loader_resumes_through_the_hdf5_chunk_sampler(data: dict, options: dict) -> None:
    subject = Subject(
        make=lambda num_workers: hdf5_chunk_loader(data["hdf5"], num_workers, **options),
        keys=BACKENDS["hdf5"].keys_of,
        workers=((0, 2), (2, 0), (0, 0)),
    )
    check_resume(subject, epoch=STOP_EPOCH, at=every_batch)


@pytest.mark.parametrize(("remainder", "rank", "world_size"), [("drop", 0, 1), ("pad", 1, 2), ("uneven", 2, 3)])
def test_epoch_sampler_resumes_exactly_at_every_index(remainder: str, rank: int, world_size: int) -> None:
    subject = Subject(
        make=lambda _: EpochSampler(33, seed=4, remainder=remainder, rank=rank, world_size=world_size),
        keys=lambda index: index,
    )
    states = check_resume(subject, at=every_batch)
    assert states[3] == {
        "version": 2,
        "epoch": 1,
        "unit": "samples",
        "position": 3,
        "plan": {
            "size": 33,
            "world_size": world_size,
            "seed": 4,
            "shuffle": 1,
            "remainder": ["drop", "pad", "uneven"].index(remainder),
            "unit": 1,
        },
    }


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("remainder", "rank", "world_size"), [("drop", 0, 1), ("uneven", 1, 2)])
def test_chunk_batch_sampler_resumes_exactly_at_every_batch(
    drop_last: bool, remainder: str, rank: int, world_size: int
) -> None:
    # 33 indices in blocks of 5 (the last of 3): batches of 4 leave a short last batch, or drop it
    subject = Subject(
        make=lambda _: ChunkBatchSampler(
            list(range(0, 33, 5)),
            33,
            4,
            seed=5,
            drop_last=drop_last,
            remainder=remainder,
            rank=rank,
            world_size=world_size,
        ),
        keys=tuple,
    )
    states = check_resume(subject, at=every_batch)
    # it reports what it has handed out, in samples (whole batches; the whole epoch at its end)
    n = len(subject.make(0))
    length = subject.make(0).samples
    assert [s["position"] for s in states[: n + 1]] == [min(4 * k, length) for k in range(n + 1)]
    assert states[-1]["position"] == min(4 * n, length)


@pytest.mark.parametrize("remainder", ["drop", "uneven"])
def test_tar_shard_dataset_resumes_exactly_at_every_batch(data: dict, remainder: str) -> None:
    subject = Subject(
        make=lambda _: make_dataset("tar_shards", data["tar_shards"], remainder=remainder, rank=1, world_size=2),
        keys=BACKENDS["tar_shards"].keys_of,
    )
    check_resume(subject, at=every_batch)


def stateful_subject(make_ds: Any, num_workers: int, keys: Any, sampler: Any = None, name: str = "") -> Subject:
    """torchdata's StatefulDataLoader over a fresh dataset (through fastdata's builder), same num_workers."""

    def make(workers: int) -> Any:
        ds = make_ds()
        if sampler is not None:
            return make_stateful(name, ds, num_workers=workers, batch_sampler=sampler(ds))
        return make_stateful(name, ds, num_workers=workers)

    return Subject(
        make=make,
        keys=keys,
        workers=((num_workers, num_workers),),
        set_epoch=lambda sdl, epoch: sdl.dataset.set_epoch(epoch),
        epoch_of=None,  # the training script keeps the epoch in its own checkpoint, as with any DataLoader
        resumes_after_a_pass=False,  # a state saved after the pass ran out starts a new pass
    )


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_stateful_dataloader_resumes_exactly(data: dict, name: str, num_workers: int) -> None:
    subject = stateful_subject(lambda: make_dataset(name, data[name]), num_workers, BACKENDS[name].keys_of, name=name)
    check_resume(subject, at=lambda n: (0, 1, n // 2, n) if not BACKENDS[name].slow else (0, n // 2, n))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_through_the_hdf5_chunk_sampler(data: dict, num_workers: int) -> None:
    # the fastest HDF5 path: before the fix, ChunkBatchSampler reported consumed=0 and this restarted the epoch
    subject = stateful_subject(
        lambda: make_dataset("hdf5", data["hdf5"]),
        num_workers,
        BACKENDS["hdf5"].keys_of,
        sampler=lambda ds: ds.chunk_sampler(BATCH),
        name="hdf5",
    )
    check_resume(subject, at=every_batch if num_workers == 0 else None)


def epoch_keys(name: str, folder: Path, epoch: int, **options: Any) -> list[list[str]]:
    loader = make_loader(name, folder, num_workers=0, **options)
    loader.set_epoch(epoch)
    return batch_keys(name, loader)


def saved_after(name: str, folder: Path, k: int, **options: Any) -> dict[str, Any]:
    """The state of a Loader stopped after ``k`` batches of epoch ``STOP_EPOCH``, through JSON."""
    loader = make_loader(name, folder, num_workers=0, **options)
    loader.set_epoch(STOP_EPOCH)
    batch_keys(name, loader, k)
    return through_json(loader.state_dict())


@pytest.mark.parametrize("name", list(BACKENDS))
def test_persistent_workers_take_a_state_loaded_later(data: dict, name: str) -> None:
    full = [epoch_keys(name, data[name], e) for e in (0, 1)]
    loader = make_loader(name, data[name], num_workers=2, persistent_workers=True)
    for epoch in (0, 1):  # the same batches as without persistent workers
        loader.set_epoch(epoch)
        assert batch_keys(name, loader) == full[epoch]
    state = {**loader.state_dict(), "epoch": 1, "position": 2}
    loader.load_state_dict(state)
    assert batch_keys(name, loader) == full[1][2:]
    loader.set_epoch(1)  # and the pass after that is a whole epoch again
    assert batch_keys(name, loader) == full[1]
    loader.close()


def test_worker_state_in_another_worker_layout_is_refused(data: dict) -> None:
    ds = make_dataset("tar_shards", data["tar_shards"])
    state = {**ds.state_dict(), "position": 3, "worker": 1, "num_workers": 2}
    ds.load_state_dict(state)
    with pytest.raises(ConfigError, match="saved by worker 1 of 2"):
        next(iter(ds))


@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_state_from_another_setup_is_refused(data: dict, name: str) -> None:
    # (another batch size or world size is resumed elastically: tests/test_elastic_resume.py)
    state = saved_after(name, data[name], 2)
    for options, field in (({"seed": 99}, "seed"), ({"remainder": "pad"}, "remainder")):
        with pytest.raises(ConfigError, match=field):
            make_loader(name, data[name], num_workers=0, **options).load_state_dict(state)
    loader = make_loader(name, data[name], num_workers=0)
    with pytest.raises(ConfigError, match="outside"):
        loader.load_state_dict({**state, "position": len(loader) + 1})


def test_a_state_without_the_schema_is_refused_naming_what_to_pass(data: dict) -> None:
    # no compatibility with unversioned states: fastdata was never released with them
    loader = make_loader("tar_shards", data["tar_shards"], num_workers=0)
    for old in ({"epoch": 1, "batches": 2, "batch_size": BATCH}, {"epoch": 2, "consumed": 5}):
        with pytest.raises(ConfigError, match=r"not a resume state.*'version'"):
            loader.load_state_dict(old)
        with pytest.raises(ConfigError, match="not a resume state"):
            EpochSampler(33, seed=4, rank=0, world_size=1).load_state_dict(old)


def test_a_state_that_does_not_fit_is_refused_naming_why(data: dict) -> None:
    sampler = EpochSampler(33, seed=4, rank=0, world_size=1)
    state = sampler.state_dict(consumed=4)
    with pytest.raises(ConfigError, match=r"size \(samples\): saved 33, now 34"):
        EpochSampler(34, seed=4, rank=0, world_size=1).load_state_dict(state)
    chunks = ChunkBatchSampler(list(range(0, 33, 5)), 33, 4, seed=5, rank=0, world_size=1)
    with pytest.raises(ConfigError, match="batch_size: saved 4, now 8"):
        ChunkBatchSampler(list(range(0, 33, 5)), 33, 8, seed=5, rank=0, world_size=1).load_state_dict(
            chunks.state_dict(consumed=8)
        )
    loader = make_loader("indexed_tar", data["indexed_tar"], num_workers=0)
    with pytest.raises(ConfigError, match=r"counts samples .* Loader counts batches"):
        loader.load_state_dict(state)
    with pytest.raises(ConfigError, match="worker 0 of 2; EpochSampler resumes a whole rank"):
        sampler.load_state_dict({**state, "worker": 0, "num_workers": 2})
    with pytest.raises(ConfigError, match="newer fastdata"):
        sampler.load_state_dict({**state, "version": 3})
    with pytest.raises(ConfigError, match="not a resume state"):
        sampler.load_state_dict({"consumed": 4})


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
    with pytest.raises(ConfigError, match=r"use fastdata\.loading\.EpochSampler"):
        fd.Loader(ds, batch_size=BATCH, sampler=SequentialSampler(ds))
    with pytest.raises(ConfigError, match="sampler you built"):
        fd.Loader(ds, batch_size=BATCH, sampler=ds.sampler(), shuffle=False)
    h5 = make_dataset("hdf5", data["hdf5"])
    with pytest.raises(ConfigError, match="yields whole batches: pass it as batch_sampler="):
        fd.Loader(h5, batch_size=BATCH, sampler=h5.chunk_sampler(BATCH))
    for kwargs, word in (
        ({"batch_size": BATCH + 1}, "differs from the batch sampler's 4"),
        ({"shuffle": False}, "to the batch sampler you built"),
        ({"sampler": h5.sampler()}, "not both"),
    ):
        with pytest.raises(ConfigError, match=word):
            fd.Loader(h5, batch_sampler=h5.chunk_sampler(BATCH), **kwargs)


def test_loader_runs_the_users_worker_init_after_fastdatas(data: dict) -> None:
    def mine(worker_id: int) -> None:
        pass

    loader = make_loader("indexed_tar", data["indexed_tar"], num_workers=0, worker_init_fn=mine)
    init = loader.dataloader.worker_init_fn
    assert isinstance(init, WorkerInit) and init.then == (mine,)


def test_epoch_sampler_state_follows_its_iteration() -> None:
    sampler = EpochSampler(10, seed=4, rank=0, world_size=1)
    sampler.set_epoch(2)
    it = iter(sampler)
    head = [next(it) for _ in range(3)]
    state = sampler.state_dict()
    plan = {"size": 10, "world_size": 1, "seed": 4, "shuffle": 1, "remainder": 0, "unit": 1}
    assert state == {"version": 2, "epoch": 2, "unit": "samples", "position": 3, "plan": plan}
    assert sampler.state_dict(consumed=1)["position"] == 1
    other = EpochSampler(10, seed=4, rank=0, world_size=1)
    other.load_state_dict(state)
    assert other.state_dict() == state  # before it is iterated, it reports what it will resume from
    assert head + list(other) == list(sampler)


def test_chunk_batch_sampler_state_follows_its_iteration() -> None:
    # the bug: state_dict() always said consumed=0, so a StatefulDataLoader restarted the epoch
    sampler = ChunkBatchSampler(list(range(0, 10, 3)), 10, 4, seed=4, rank=0, world_size=1)
    it = iter(sampler)
    assert sampler.state_dict()["position"] == 0
    next(it)
    assert sampler.state_dict()["position"] == 4
    list(it)
    assert sampler.state_dict()["position"] == 10  # two whole batches and the short last one
    other = ChunkBatchSampler(list(range(0, 10, 3)), 10, 4, seed=4, rank=0, world_size=1)
    other.load_state_dict({**sampler.state_dict(), "position": 4})
    assert other.state_dict()["position"] == 4  # before it is iterated, it reports what it will resume from
