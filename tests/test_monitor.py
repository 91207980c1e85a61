"""The monitor inside a training loop: ``fd.Loader(monitor=...)`` and ``fd.monitor(dataloader)`` report what
the loop, the workers and the machine did (the stall, stage times, every process's CPU, switches, threads,
memory and files, the diagnosis), to a function, a log line or a JSON-lines file, and ``stats()`` returns
the latest; real worker processes under fork and spawn."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastdata as fd
from fastdata.core import stages
from fastdata.core.errors import ConfigError
from fastdata.loading import observe
from fastdata.loading.observe import Monitor
from fastdata.loading.observe.diagnose import LABELS, Context
from fastdata.loading.observe.measure import StartSplit
from fastdata.loading.observe.report import Stats
from tests.bench_points import window_of
from tests.datagen import make_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("jpeg"), shards=2, per_shard=40, jpeg=True)


def tar_loader(shards: list[str], **options: Any) -> fd.Loader:
    ds = fd.TarShardDataset(shards, decode="torch", batch_size=4, shuffle=True, shuffle_window=16)
    return fd.Loader(ds, **options)


def run(loader: Any, epochs: int = 2) -> int:
    n = 0
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        for _ in loader:
            n += 1
    return n


def test_the_loader_reports_every_n_batches_to_a_function(shards: list[str]) -> None:
    reports: list[Stats] = []
    loader = tar_loader(shards, num_workers=2, monitor=Monitor(to=reports.append, seconds=None, every=5))
    batches = run(loader)
    pids = set()
    try:
        assert len(reports) == batches // 5
        for r in reports:
            assert r.batches == 5 and r.samples == 20 and r.workers == 2 and not r.auto
            assert 0 <= r.stall <= 1 and r.samples_per_s > 0 and r.wait_ms >= 0
            main, *workers = r.processes
            assert main.role == "main" and main.pid == os.getpid() and main.threads >= 1
            # the running workers (those of a pass that ran out may have exited before the report)
            assert {w.role for w in workers} <= {"worker 0", "worker 1"}
            pids |= {w.pid for w in workers}
            for p in r.processes:
                assert p.pss > 0 and p.uss > 0 and p.fds > 0 and p.threads >= 1
                assert p.voluntary >= 0 and p.involuntary >= 0 and p.cores >= 0
            assert r.stages["decode"]["ms_per_sample"] is not None and r.stages["decode"]["ms_per_sample"] > 0
            assert r.label in LABELS and r.evidence
            assert r.usable_cores >= 1 and r.others_cores >= 0 and r.memory_available > 0
            json.dumps(r.to_dict())
            assert "samples/s" in r.line() and r.label in r.line()
        # the workers wrote their own CPU: over the run they used some (they decoded every JPEG)
        assert sum(w.cores for r in reports for w in r.processes[1:]) > 0
        # workers do not persist: each epoch's are new processes
        assert len(pids) >= 3 and os.getpid() not in pids
        assert max(len(r.processes) for r in reports) == 3
        assert loader.stats() is reports[-1]
        # what fork copied the page tables of, for the fork verdict ("the 0.0 GiB parent" before it was read)
        session = loader._session
        assert session is not None and session.context().parent_rss > 50e6  # torch alone is more
    finally:
        loader.close()


def test_reports_go_to_a_json_lines_file_and_to_the_log(
    shards: list[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "logs" / "loader.jsonl"
    loader = tar_loader(shards, num_workers=1, monitor=Monitor(to=path, seconds=None, every=4))
    batches = run(loader, 1)
    loader.close()
    lines = path.read_text().splitlines()
    assert len(lines) == batches // 4
    first = json.loads(lines[0])
    assert first["batches"] == 4 and first["workers"] == 1 and len(first["processes"]) == 2
    assert {"stall", "stages", "label", "evidence", "others_cores", "changes"} <= set(first)
    with caplog.at_level(logging.INFO, logger="fastdata.monitor"):
        loader = tar_loader(shards, num_workers=0, monitor=Monitor(seconds=None, every=4))
        run(loader, 1)
        loader.close()
    logged = [r.getMessage() for r in caplog.records if r.name == "fastdata.monitor"]
    assert len(logged) == batches // 4
    assert all("samples/s" in m and "no workers" in m for m in logged)


class Timed(Dataset[torch.Tensor]):
    """Each item waits 2 ms (a read) and records it as its fetch stage."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        t = stages.clock()
        time.sleep(0.002)  # the workload, not a synchronisation
        stages.lap("fetch", t)
        return torch.full((4,), i)


class MarkInit:
    """A user's worker_init_fn: leaves a file per worker (so the test sees it ran, under spawn too)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, worker_id: int) -> None:
        (self.folder / f"worker-{worker_id}").write_text(str(os.getpid()))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_plain_dataloader_is_monitored_with_its_own_worker_init_fn(tmp_path: Path, context: str) -> None:
    reports: list[Stats] = []
    dl = DataLoader(
        Timed(), batch_size=8, num_workers=2, worker_init_fn=MarkInit(tmp_path), multiprocessing_context=context
    )
    plain = [b.tolist() for b in DataLoader(Timed(), batch_size=8)]
    with fd.monitor(dl, reports.append, seconds=None, every=4) as monitored:
        got = [b.tolist() for b in monitored]
        assert len(monitored) == 8
        whole = monitored.stats(since="start")
    assert got == plain  # the batches, unchanged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-0", "worker-1"]
    assert len(reports) == 2
    last = reports[-1]
    assert last.workers == 2 and len(last.processes) == 3
    # the workers' stage table over the run (a window may only hand out batches made before it): the
    # dataset's fetch (2 ms an item, slept) and the collate the monitor timed
    assert whole is not None and whole.batches == 8
    fetch = whole.stages["fetch"]["ms_per_sample"]
    assert fetch is not None and 1.5 <= fetch <= 50
    assert whole.stages["collate"]["ms_per_sample"] is not None
    assert sum(w.voluntary for w in whole.window.workers) > 0  # sleeping workers give their cores up (exited since)


def test_the_stall_is_the_share_of_the_loop_spent_waiting(tmp_path: Path) -> None:
    """No workers: each batch takes 8 x 2 ms to make; the step sleeps 16 ms: the loop waits about half the
    time (sleeps are lower bounds: a loaded machine makes both longer)."""
    reports: list[Stats] = []
    monitored = fd.monitor(DataLoader(Timed(), batch_size=8), reports.append, seconds=None, every=8)
    for _ in monitored:
        time.sleep(0.016)  # the training step
    monitored.close()
    (r,) = reports
    assert r.wait_ms >= 16 and r.step_ms >= 16
    assert 0.2 <= r.stall <= 0.8


def test_stats_before_a_report_is_due_covers_what_was_seen(shards: list[str]) -> None:
    loader = tar_loader(shards, num_workers=0, monitor=True)  # a report every 10 s: none in this short run
    assert loader.stats() is None
    batches = run(loader, 1)
    s = loader.stats()
    loader.close()
    assert s is not None and s.batches == batches and s.workers == 0
    assert tar_loader(shards).stats() is None  # no monitor


def test_changes_of_auto_are_logged_with_their_reason_and_reported(
    shards: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    from tests.test_autotune_loader import FAST_WINDOWS, Scripted

    reports: list[Stats] = []
    loader = tar_loader(
        shards, num_workers="auto", autotune=FAST_WINDOWS, monitor=Monitor(to=reports.append, seconds=None, every=2)
    )
    assert loader._session is not None
    loader._session.tuner = Scripted([0, 1])
    with caplog.at_level(logging.INFO, logger="fastdata.autotune"):
        run(loader, 1)
    loader.close()
    logged = [r.getMessage() for r in caplog.records if r.name == "fastdata.autotune"]
    assert len(logged) == 2 and all("scripted" in m for m in logged)
    reported = [c for r in reports for c in r.changes]
    assert [(c["to"]["workers"], c["reason"]) for c in reported] == [(0, "scripted"), (1, "scripted")]
    # where the training was, not a clock alone: each change names its epoch and batch, and so does its report
    assert all(c["epoch"] == 0 and c["batch"] > 0 for c in reported)
    assert all(r.epoch == 0 and r.position > 0 for r in reports)
    assert any("num_workers='auto' moved" in a for r in reports for a in r.advice)  # the report says it
    assert all(r.auto for r in reports)
    assert "auto" in repr(loader)


def test_options_are_checked(shards: list[str]) -> None:
    with pytest.raises(ConfigError, match="seconds= or every="):
        Monitor(seconds=None)
    with pytest.raises(ConfigError, match="monitor=42"):
        tar_loader(shards, monitor=42)
    with pytest.raises(ConfigError, match="num_workers='many'"):
        tar_loader(shards, num_workers="many")
    with pytest.raises(ConfigError, match="needs workers"):
        tar_loader(shards, num_workers=0, prefetch_factor="auto")
    with pytest.raises(ConfigError, match=r"prefetch_factor='lots': pass a count \(1, 2 ...\) or 'auto'"):
        tar_loader(shards, num_workers=2, prefetch_factor="lots")
    with pytest.raises(ConfigError, match="autotune="):
        tar_loader(shards, num_workers=2, autotune=fd.AutoTune())
    dl = DataLoader(Timed(), num_workers=1, persistent_workers=True)
    iter(dl)
    with pytest.raises(ConfigError, match="before its first epoch"):
        fd.monitor(dl)


def test_loader_threads_are_monitored_and_not_auto_tuned(shards: list[str]) -> None:
    reference = tar_loader(shards, num_workers=2, workers="threads")
    reference.set_epoch(1)
    expected = [k for b in reference for k in b["__key__"]]
    reference.close()
    reports: list[Stats] = []
    loader = tar_loader(shards, num_workers=2, workers="threads", monitor=Monitor(to=reports.append, every=5))
    loader.set_epoch(1)
    got = [k for b in loader for k in b["__key__"]]
    latest = loader.stats()
    loader.close()
    assert got == expected  # the monitor hands the threads' batches out unchanged
    assert len(reports) == len(got) // 4 // 5
    for r in reports:
        assert r.loader_threads == 2 and r.workers == 0 and r.samples == 20 and r.samples_per_s > 0
        assert r.processes[0].role == "main" and r.processes[0].threads >= 3  # the loop and the two readers
    assert latest is not None and "2 loader threads" in latest.line()
    for options in ({"num_workers": "auto"}, {"num_workers": 2, "prefetch_factor": "auto"}):
        with pytest.raises(ConfigError, match='workers="processes"'):
            tar_loader(shards, workers="threads", **options)


def test_under_the_monitor_the_slots_still_stack_batches_straight_into_the_slot(shards: list[str]) -> None:
    """The monitor wraps the slots' collate function (not the other way round, which made workers stack each
    batch privately and copy it into the slot: a quarter more worker CPU on decoded images), and still counts
    every sample a worker collates."""
    from fastdata.loading.observe._session import MonitoredCollate
    from fastdata.loading.transport._collate import SlotCollate, batch_as_is

    loader = tar_loader(shards, num_workers=2, monitor=Monitor(to=lambda s: None, every=1000))
    collate = loader.dataloader.collate_fn
    assert isinstance(collate, MonitoredCollate) and isinstance(collate.collate_fn, SlotCollate)
    assert collate.collate_fn.collate_fn is batch_as_is  # the dataset's batches go into slots unchanged
    plain = [b["__key__"] for b in tar_loader(shards, num_workers=2)]
    got = [b["__key__"] for b in loader]
    assert got == plain  # the same batches
    # the workers counted every sample they collated (from the second batch on they hold Stacks)
    assert loader._session is not None
    assert loader._session.probe.table.totals()["collate"][1] == 80
    loader.close()


def test_a_report_file_that_cannot_be_written_is_refused_or_warned_and_training_goes_on(
    shards: list[str], tmp_path: Path
) -> None:
    from fastdata.loading.observe.report import MonitorWriteWarning

    # a folder, or a path under a file: refused when the loader is made, not at the first report
    with pytest.raises(ConfigError, match="is a folder"):
        tar_loader(shards, monitor=tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        tar_loader(shards, monitor=blocker / "loader.jsonl")
    # a file whose writes fail (a full disk): one warning, the epoch is read to its end
    loader = tar_loader(shards, num_workers=0, monitor=Monitor(to="/dev/full", seconds=None, every=2))
    with pytest.warns(MonitorWriteWarning, match="/dev/full") as caught:
        batches = run(loader, 1)
    loader.close()
    assert batches == 20
    assert len([w for w in caught if issubclass(w.category, MonitorWriteWarning)]) == 1


class _Items(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), i)


@pytest.mark.parametrize("persistent", [False, True])
def test_each_pass_end_is_counted_as_a_wait_of_the_loop(persistent: bool) -> None:
    # issue 35: the next() that finds a pass over shuts workers that do not persist down (0.06-0.18 s over 4
    # epochs by hand); the monitor counted it nowhere, so persistent_workers=True's saving missed it
    loader = fd.Loader(
        _Items(), batch_size=8, num_workers=2, persistent_workers=persistent, monitor=Monitor(to=None, seconds=3600)
    )
    try:
        for _ in range(3):
            for _batch in loader:
                pass
        stats = loader.stats(since="start")
    finally:
        loader.close()
    assert stats is not None
    w = stats.window
    assert w.ends == 3 and w.starts == 3, (w.ends, w.starts)
    assert w.end_wait_s > 0 and w.wait_s >= w.first_wait_s + w.end_wait_s


@pytest.mark.parametrize("persistent", [False, True])
def test_restarts_that_are_most_of_the_wait_name_persistent_workers_with_their_saving(persistent: bool) -> None:
    # issue 35's DDP loop: a 22% stall, three quarters of it epochs' first batches (below the third of the time
    # the start-up rule needed), read as "unknown"; the saving claimed is launch + set-up, not the first batch
    w = dataclasses.replace(window_of(2, 300, stall=0.22, first_wait=0.17, worker_busy=[0.05, 0.05]), starts=4)
    split = StartSplit(total=0.25, launch=0.05, init=0.15, produce=0.03, deliver=0.02)
    ctx = Context(cores=2, start=split, where="training", persistent=persistent)
    v = observe.classify(observe.evidence(w, ctx))
    if persistent:  # workers that already persist: nothing to save, nothing advised
        assert not any("persistent_workers=True would save" in a for a in v.advice), v
        return
    assert v.label == "worker-init", v
    assert "of the loop's wait for data" in v.evidence[0], v.evidence
    saving = next(a for a in v.advice if "persistent_workers=True would save" in a)
    assert "0.20 s an epoch after the first (launch 0.05 s + set-up 0.15 s" in saving, saving
    assert "not the first batch's own reading and delivery (0.05 s)" in saving, saving
