"""The one measurement record (``Window``): readings subtract into windows, windows pool, and a sweep's
point and a monitor's report built on the same window carry the same figures and the same label."""

from __future__ import annotations

from pathlib import Path

import pytest

import fastdata as fd
from fastdata.bench._diagnose import context, verdict
from fastdata.bench._result import Config, Point, SweepResult
from fastdata.loading.observe import Context, Monitor, Process, Stats, Window, classify, evidence
from tests.datagen import make_shards


def test_two_readings_subtract_into_the_window_between_them() -> None:
    a = Window(seconds=1.0, loop_s=1.0, batches=10, samples=40, wait_s=0.5, main=Process(cpu_s=0.4, pid=7, pss=5.0))
    a.workers = [Process(cpu_s=1.0, runq_s=0.1, voluntary=3, pid=8, threads=2)]
    a.stages = {"decode": (0.8, 40.0)}
    b = Window(seconds=3.0, loop_s=2.5, batches=30, samples=120, wait_s=1.0, main=Process(cpu_s=1.0, pid=7, pss=6.0))
    b.workers = [Process(cpu_s=2.5, runq_s=0.1, voluntary=9, pid=8, threads=3), Process(cpu_s=0.5, pid=9)]
    b.stages = {"decode": (2.4, 120.0), "fetch": (0.2, 80.0)}
    w = b.since(a)
    assert (w.seconds, w.loop_s, w.batches, w.samples, w.wait_s) == (2.0, 1.5, 20, 80, 0.5)
    assert w.main.cpu_s == pytest.approx(0.6) and w.main.pss == 6.0  # an amount subtracts, a state is the end's
    assert w.workers[0].cpu_s == pytest.approx(1.5) and w.workers[0].voluntary == 6 and w.workers[0].threads == 3
    assert w.workers[1].cpu_s == 0.5  # a worker slot new since the first reading counts from zero
    assert w.stages["decode"] == pytest.approx((1.6, 80.0)) and w.stages["fetch"] == (0.2, 80.0)
    assert w.samples_per_s == pytest.approx(80 / 1.5) and w.stall == pytest.approx(0.5 / 1.5)
    assert w.stage_ms()["decode"] == pytest.approx(20.0) and w.stage_ms()["transform"] is None


def test_windows_pool_into_one_and_round_trip_through_dicts() -> None:
    one = Window(seconds=1.0, loop_s=1.0, samples=100, batches=4, recv_s=0.2, workers=[Process(cpu_s=0.5, pss=3.0)])
    two = Window(seconds=2.0, loop_s=2.0, samples=100, batches=4, recv_s=None, workers=[Process(cpu_s=1.0, pss=2.0)])
    pooled = Window.pooled([one, two])
    assert pooled.samples_per_s == pytest.approx(200 / 3) and pooled.recv_s == pytest.approx(0.2)
    assert pooled.workers[0].cpu_s == pytest.approx(1.5) and pooled.workers[0].pss == 3.0  # the largest state
    assert Window.from_dict(pooled.to_dict()) == pooled


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("win"), shards=2, per_shard=64, jpeg=True, seed=3)


def test_a_report_and_a_sweep_point_on_the_same_window_say_the_same(shards: list[str]) -> None:
    reports: list[Stats] = []
    ds = fd.TarShardDataset(shards, batch_size=4, decode="numpy")
    loader = fd.Loader(ds, num_workers=2, monitor=Monitor(to=reports.append, seconds=None, every=8))
    for _ in loader:
        pass
    loader.close()
    assert reports
    report = reports[-1]
    window = report.window
    point = Point(Config(2, 2, batch_size=None), windows=[window], usable_cores=report.usable_cores)
    result = SweepResult([point], {}, {"usable_cores": report.usable_cores, "usable_memory": 8 * 2**30})
    # the figures are the window's own, wherever it was measured
    assert point.samples_per_s == report.samples_per_s and point.window.stall == report.stall
    assert point.stage_ms == {s: v["ms_per_sample"] for s, v in report.stages.items()}
    assert point.window.worker_busy == window.worker_busy and point.window.pss == report.pss
    # one evidence builder and one set of rules: the same label from the same window and context
    ctx = context(point, result)
    live = Context(cores=ctx.cores, memory=ctx.memory, start=ctx.start, start_method=ctx.start_method)
    assert classify(evidence(window, live)).label == verdict(point, result).label == report.label


def test_stats_covers_what_was_seen_up_to_the_call(tmp_path: Path) -> None:
    # asked after each epoch, the report is that epoch's (it stayed epoch 0's until a timed report fell due)
    shards = make_shards(tmp_path, shards=2, per_shard=16, seed=1)
    ds = fd.TarShardDataset(shards, batch_size=4)
    loader = fd.Loader(ds, num_workers=0, monitor=Monitor(to=lambda s: None, seconds=3600))
    seen = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
        report = loader.stats(since="epoch")
        assert report is not None
        seen.append((report.epoch, report.position, report.batches))
        assert loader.stats() is not None and loader.stats().batches == 8 * (epoch + 1)  # type: ignore[union-attr]
    loader.close()
    assert seen == [(0, 8, 8), (1, 8, 8), (2, 8, 8)]
    whole = loader.stats(since="start")
    assert whole is not None and whole.batches == 24


def test_the_simulated_step_is_not_the_main_process_being_busy() -> None:
    """A 25 ms step per batch and a loader that keeps up: next() returns at once, mostly computing (receiving
    the batch). The main process used 0.04 cores for the loader: it is 'busy' 4% of the time, not 90%, and the
    step, not the main process or the CPU, is the limit (issue 22)."""
    batches = 100
    w = Window(seconds=2.8, loop_s=2.8, batches=batches, samples=batches * 8, wait_s=0.15, wait_cpu_s=0.11)
    w.step_s = 2.65  # 25 ms after each batch, slept
    w.loop_cpu_s = 0.12
    w.main = Process(cpu_s=0.13, pid=1, threads=2)
    w.workers = [Process(cpu_s=0.2, pid=2, looks={"idle/poll": 60, "computing/": 20})] * 2
    assert w.main_busy == pytest.approx(0.11 / 2.8, rel=0.05) and w.main_busy < 0.05
    verdict = classify(evidence(w, Context(cores=2)))
    assert verdict.label == "step", verdict
    assert "waits for data" in verdict.evidence[0] and "rebuilding the batches it receives" in verdict.evidence[0]


def test_core_counts_are_never_more_than_the_machine_has_in_thread_mode() -> None:
    """Eight loader threads on 2 cores: 1.84 cores of CPU, and 9.4 thread-seconds a second of run-queue wait
    summed over the threads. The report says cores used (at most 2), never '11.29 cores busy' (issue 22)."""
    w = Window(seconds=1.0, loop_s=1.0, batches=50, samples=400, wait_s=0.9, wait_cpu_s=0.05, loop_cpu_s=0.05)
    w.main = Process(cpu_s=1.84, runq_s=9.4, pid=1, threads=10, by_thread={"fastdata-loader-0": 0.23})
    w.main.looks = {"computing/": 30, "lock/futex": 50}
    ev = evidence(w, Context(cores=2, threads=8))
    assert ev.main_process_busy <= 2 and ev.demand <= 2
    verdict = classify(ev)
    text = " ".join(verdict.evidence)
    assert verdict.label == "cpu" and "uses 1.84 of the 2 cores" in text, text
    import re

    assert all(float(x) <= 2 for x in re.findall(r"(\d+\.\d+) cores", text)), text
    report = Stats(0.0, 0, 50, w, 0, None, False, loader_threads=8, usable_cores=2)
    assert all(p.cores <= 2 and p.busy <= 2 for p in report.processes)
