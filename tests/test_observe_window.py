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
    assert point.window.worker_busy == window.worker_busy and point.pss_total == report.pss
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
