"""Thread mode (``fd.Loader(workers="threads")``: loading/threads.py, thread_loader.py), the hybrid
(``threads_per_worker``: loading/hybrid.py) and the slot transport wired into ``fd.Loader``: the batches
of worker processes in their order, exact resume with any thread count, errors with their messages,
early exit that stops the threads, a dataset copy per thread, and refusals of what does not apply."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import fastdata as fd
from fastdata.bench._probes import Probed, ProbedCollate
from fastdata.core.errors import BadSample, ConfigError
from fastdata.loading import transport as slots
from fastdata.loading._builder import build_dataloader
from fastdata.loading._plan import ReadPlan
from fastdata.loading.observe.measure._probe import _queued
from fastdata.loading.threads._gang import ThreadGang, thread_copies
from tests.datagen import make_shards
from tests.hdf5_datagen import make_files

BAD = "s000017"


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("shards"), shards=3, per_shard=11, seed=1)


@pytest.fixture(scope="module")
def h5(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    paths, _ = make_files(tmp_path_factory.mktemp("h5"), (11, 13, 9))
    return paths


def make(kind: str, shards: list[str], h5: list[str], **kw: Any) -> tuple[Any, dict[str, Any]]:
    """A dataset of ``kind`` and the Loader arguments it is read with."""
    if kind == "tar":
        return fd.TarShardDataset(shards, batch_size=4, shuffle=True, shuffle_window=8, seed=3, **kw), {}
    if kind == "indexed":
        return fd.IndexedTarDataset(shards, seed=3, **kw), {"batch_size": 4}
    return fd.HDF5Dataset(h5, ("image", "key"), seed=3), {"batch_size": 4}


def batches(loader: Any) -> list[list[Any]]:
    out = []
    for b in loader:
        key = b["__key__"] if "__key__" in b else b["key"].tolist()
        out.append(list(key))
    return out


@pytest.mark.parametrize("kind", ["tar", "indexed", "hdf5"])
def test_threads_give_the_batches_of_worker_processes_in_their_order(
    kind: str, shards: list[str], h5: list[str]
) -> None:
    ds, kw = make(kind, shards, h5)
    want = batches(fd.Loader(ds, num_workers=2, multiprocessing_context="fork", **kw))
    for n in (1, 2, 4):  # 4 threads: more than the 3 shards
        with fd.Loader(ds, num_workers=n, workers="threads", **kw) as loader:
            assert batches(loader) == want, f"{n} threads"
            ds.set_epoch(1)
            assert batches(loader) != want  # a new epoch, a new order, through the same threads
            ds.set_epoch(0)


@pytest.mark.parametrize("kind", ["tar", "indexed"])
def test_thread_mode_resumes_exactly_with_any_thread_count(kind: str, shards: list[str], h5: list[str]) -> None:
    ds, kw = make(kind, shards, h5)
    want = batches(fd.Loader(ds, **kw))
    loader = fd.Loader(ds, num_workers=2, workers="threads", **kw)
    it = iter(loader)
    head = [list(next(it)["__key__"]) for _ in range(3)]
    state = loader.state_dict()
    del it
    loader.close()
    for resumed in (
        fd.Loader(ds, num_workers=3, workers="threads", **kw),
        fd.Loader(ds, num_workers=2, multiprocessing_context="fork", **kw),  # a thread-mode state, in processes
    ):
        resumed.load_state_dict(state)
        assert head + batches(resumed) == want
        resumed.close()


def failing(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["__key__"] == BAD:
        raise ValueError(f"cannot use {sample['__key__']}")
    return sample


@pytest.mark.parametrize("kind", ["tar", "indexed"])
def test_an_error_in_a_thread_reaches_the_caller_with_its_message(kind: str, shards: list[str], h5: list[str]) -> None:
    ds, kw = make(kind, shards, h5, transform=failing)
    with pytest.raises(Exception) as in_process:
        batches(fd.Loader(ds, **kw))
    with pytest.raises(Exception) as in_threads:
        batches(fd.Loader(ds, num_workers=3, workers="threads", **kw))
    assert type(in_threads.value) is type(in_process.value)
    assert str(in_threads.value) == str(in_process.value) and BAD in str(in_threads.value)
    assert any("loader thread" in note for note in in_threads.value.__notes__)


@pytest.mark.parametrize("kind", ["tar", "indexed"])
def test_breaking_out_stops_the_threads(kind: str, shards: list[str], h5: list[str]) -> None:
    started: list[str] = []

    def count(sample: dict[str, Any]) -> dict[str, Any]:
        started.append(sample["__key__"])
        return sample

    ds, kw = make(kind, shards, h5, transform=count)
    loader = fd.Loader(ds, num_workers=2, workers="threads", prefetch_factor=1, **kw)
    for k, _ in enumerate(loader):
        if k == 1:
            break
    after_break = len(started)
    # 2 batches taken, at most two more per thread (one queued, one being handed over), and nothing
    # after the loop ended
    assert after_break <= (2 + 2 * 2) * 4
    gang = loader.thread_loader.threads()
    assert gang.alive() == 2
    loader.close()
    assert len(started) == after_break
    assert gang.alive() == 0


def test_each_thread_reads_its_own_copy_sharing_epoch_and_counters(shards: list[str]) -> None:
    def skip_some(sample: dict[str, Any]) -> dict[str, Any]:
        if int(sample["__key__"][1:]) % 5 == 0:
            raise BadSample(f"{sample['__key__']}: damaged", sample["__key__"])
        return sample

    ds = fd.IndexedTarDataset(shards, decode=skip_some, on_error="skip")
    loader = fd.Loader(ds, batch_size=4, num_workers=3, workers="threads", shuffle=False)
    opened_here = ds.source._readers.opened  # while counting the samples, at construction
    with pytest.warns(UserWarning):
        keys = [k for b in loader for k in b["__key__"]]
    assert keys == [f"s{i:06d}" for i in range(33) if i % 5]
    assert ds.skipped == 7  # counted in each thread's own slot, summed in the dataset
    copies = loader.thread_loader.threads().copies
    assert len({id(c) for c in copies} | {id(ds)}) == 4
    assert len({id(c.source._readers) for c in copies} | {id(ds.source._readers)}) == 4
    assert all(c.source._readers.opened for c in copies) and ds.source._readers.opened == opened_here
    ds.set_epoch(5)
    assert [c.epoch for c in copies] == [5, 5, 5]  # the epoch lives in shared memory, shared by reference
    loader.close()


def test_thread_mode_refuses_what_does_not_apply(shards: list[str]) -> None:
    ds = fd.TarShardDataset(shards, batch_size=4)
    for kwargs in (
        {"workers": "thread"},
        {"workers": "threads"},  # num_workers=0
        {"workers": "threads", "num_workers": 2, "worker_init_fn": print},
        {"workers": "threads", "num_workers": 2, "transport": "slots"},
        {"workers": "threads", "num_workers": 2, "threads_per_worker": 2},
        {"transport": "shm"},
        {"threads_per_worker": 0},
    ):
        with pytest.raises(ConfigError):
            fd.Loader(ds, **kwargs)
    with pytest.raises(ConfigError, match="multiprocessing_context"):
        len(fd.Loader(ds, num_workers=2, workers="threads", multiprocessing_context="fork").thread_loader)
    with pytest.raises(ConfigError, match="take no generator"):
        len(fd.Loader(ds, num_workers=2, workers="threads", generator=None).thread_loader)
    with pytest.raises(ConfigError, match="num_workers >= 1"):
        build_dataloader(ds, threads_per_worker=2)


class Locked(fd.IndexedTarDataset):
    def __init__(self, urls: list[str]) -> None:
        super().__init__(urls)
        self.lock = threading.Lock()


def test_a_dataset_that_cannot_be_copied_is_refused_naming_why(shards: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"cannot be pickled.*lock"):
        thread_copies(Locked(shards), 2)


@pytest.mark.parametrize(
    ("kind", "context"), [("tar", "fork"), pytest.param("tar", "spawn", marks=pytest.mark.slow), ("hdf5", "fork")]
)
def test_hybrid_gives_the_same_batches_and_resumes(kind: str, context: str, shards: list[str], h5: list[str]) -> None:
    ds, kw = make(kind, shards, h5)
    want = batches(fd.Loader(ds, **kw))
    hybrid = {"num_workers": 2, "threads_per_worker": 2, "multiprocessing_context": context}
    loader = fd.Loader(ds, **hybrid, **kw)
    assert batches(loader) == want
    loader.set_epoch(0)  # a pass read to its end moves the next to epoch 1: read epoch 0 again
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it, head
    loader.close()
    resumed = fd.Loader(ds, **hybrid, **kw)
    resumed.load_state_dict(state)
    assert batches(resumed) == want[3:]


def test_loader_slots_carry_the_batches_and_close_lets_them_go(h5: list[str]) -> None:
    ds = fd.HDF5Dataset(h5, ("image", "key"))
    slots.release(everything=True)
    slots.reset_counts()
    loader = fd.Loader(ds, batch_size=4, num_workers=2, transport="slots", multiprocessing_context="fork")
    assert batches(loader) == batches(fd.Loader(ds, batch_size=4))
    assert slots.stats()["slots"] >= len(loader) - 1 and slots.stats()["rings"] == 2
    loader.close()  # the workers have exited with the epoch: their slots go now
    assert slots.stats()["rings"] == 0


@pytest.mark.parametrize("kind", ["tar", "hdf5"])
def test_probes_wrap_the_collate_inside_the_slots(kind: str, shards: list[str], h5: list[str]) -> None:
    ds, kw = make(kind, shards, h5)
    slots.reset_counts()
    got = list(
        build_dataloader(
            ds, ReadPlan(kw.get("batch_size")), num_workers=2, transport="slots", wrap_collate=ProbedCollate
        )
    )
    assert all(isinstance(p, Probed) for p in got)
    assert sum(p.n for p in got) == 33 and got[0].n == 4 and got[0].nbytes > 0
    assert batches(p.batch for p in got) == batches(fd.Loader(ds, **kw))
    assert slots.stats()["slots"] > 0  # the probed batches came through slots, not the pipe


def test_each_pass_of_loader_threads_is_a_new_pass(shards: list[str]) -> None:
    # the threads of a pass share one pass token, the next pass's differ: a second pass over the same epoch
    # is seen as such (warned, as with worker processes), not taken for the first one again
    from fastdata.core.epoch._seeding import RepeatedEpochWarning
    from fastdata.loading.threads._loader import ThreadLoader

    ds = fd.TarShardDataset(shards, batch_size=4, shuffle=True)
    loader = ThreadLoader(ds, num_threads=2)
    first = batches(loader)
    with pytest.warns(RepeatedEpochWarning):
        assert batches(loader) == first
    loader.close()


def test_the_probe_reads_an_idle_loader_thread_as_waiting_on_its_queue() -> None:
    """A loader thread waiting for its next job (blocked in ``SimpleQueue.get``, a C call, so its innermost
    Python frame is the gang's own) is waiting for work, not on a lock: the probe tells it by the marker the
    threads' module carries, whatever the file's path."""
    gang = ThreadGang([object()], [(0, 1)])
    try:
        gang.submit(0, lambda copy: None).result()  # the thread has run a job and goes back to its queue
        tid = gang._threads[0].native_id
        assert tid is not None
        deadline = time.monotonic() + 10
        while not _queued(tid) and time.monotonic() < deadline:  # until it is back in get(): a state, polled
            time.sleep(0.01)
        assert _queued(tid)
        assert not _queued(threading.get_native_id())  # this thread runs: no queue
    finally:
        gang.close()
