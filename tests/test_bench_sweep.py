"""The harness on synthetic datasets whose best settings are known (fastdata.bench._synthetic).

Real DataLoaders with real worker processes, measured on a machine other programs are loading too: the
assertions compare points of one sweep with each other (which is best, which is the knee, what the
probes say), never a time or a rate against a fixed number. The sleeps inside the datasets are their
workload (an I/O wait), not synchronisation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import fastdata as fd
from fastdata.bench._synthetic import CheapDataset, CPUDataset, IOWaitDataset
from fastdata.core.system._machine import usable_cores

# short measurements: a few windows per point; rounds=2 interleaves the grid so that a burst of load
# from another program is shared by every point instead of landing on one
QUICK = {"seconds": 1.5, "window": 0.3, "warmup": 0.3}


def by_workers(result: fd.bench.SweepResult) -> dict[int, fd.bench.Point]:
    return {p.config.num_workers: p for p in result.points}


@pytest.mark.slow
def test_io_wait_scales_with_workers_so_the_largest_count_wins() -> None:
    result = fd.bench.sweep(IOWaitDataset(delay=0.004), workers=[0, 1, 2, 4], batch_size=8, **QUICK)
    points = by_workers(result)
    assert all(p.ok for p in points.values()), [p.error for p in points.values()]
    # waiting items overlap across workers: each doubling of workers nearly doubles throughput (1.3x
    # leaves room for a crowded machine's late wake-ups; CPU-bound work could not gain past 2 cores)
    assert points[4].samples_per_s > 1.3 * points[2].samples_per_s > 1.3 * 1.3 * points[1].samples_per_s
    rec = fd.bench.recommend(result)
    assert rec.config is not None and rec.config.num_workers == 4
    assert rec.bottleneck == "sleep"  # the items sleep (the looks see clock_nanosleep), as IOWaitDataset's do
    assert any("try more" in s for s in rec.diagnosis)  # the best is the largest tested


@pytest.fixture
def at_most_two_cores() -> Iterator[None]:
    """Confine this process (and the workers it starts) to two CPUs, so the knee is at 2 on any machine."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:2])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.slow
def test_cpu_bound_saturates_at_the_usable_cores(at_most_two_cores: None) -> None:
    cores = usable_cores()
    assert cores <= 2  # the affinity is respected
    workers = sorted({1, cores, cores + 1})
    result = fd.bench.sweep(CPUDataset(iterations=15_000), workers=workers, batch_size=4, rounds=2, **QUICK)
    rec = fd.bench.recommend(result)
    assert rec.config is not None, rec.diagnosis
    assert abs(rec.config.num_workers - cores) <= 1, rec.text()
    assert rec.bottleneck == "cpu", rec.text()
    knee = by_workers(result)[cores]
    # the workers compute all the time (running, or runnable while another program holds the core)
    assert min(knee.window.worker_busy) > 0.5


@pytest.mark.slow
def test_trivially_cheap_items_are_best_loaded_without_workers() -> None:
    result = fd.bench.sweep(CheapDataset(), workers=[0, 1, 2], batch_size=64, **QUICK)
    points = by_workers(result)
    assert points[0].samples_per_s > 2 * max(points[1].samples_per_s, points[2].samples_per_s)
    rec = fd.bench.recommend(result)
    assert rec.kwargs["num_workers"] == 0 and "prefetch_factor" not in rec.kwargs
    assert rec.bottleneck == "ipc"


@pytest.mark.slow
def test_with_a_step_time_the_smallest_loader_that_keeps_up_wins() -> None:
    # one worker makes a batch of 8 in 160 ms, six in 27 ms (up to 3.7 times that when other programs
    # delay the wake-ups); the step takes 100 ms: one worker stalls, six keep up, twelve need not. Int
    # items: a tensor's hand-over would make each arrival wait for its worker to get a core, which on a
    # crowded machine alone can exceed the 5% stall target
    ds = IOWaitDataset(delay=0.02, tensor=False)
    result = fd.bench.sweep(ds, workers=[1, 6, 12], batch_size=8, collate_fn=list, step_time=0.1, **QUICK)
    points = by_workers(result)
    assert all(p.stall is not None for p in points.values())
    assert points[1].stall > 0.2 > points[6].stall  # type: ignore[operator]
    # a 10% target: on a crowded machine the main process alone can lose 5 ms a step waiting for a core
    rec = fd.bench.recommend(result, stall_target=0.1)
    assert rec.config is not None and rec.config.num_workers == 6, rec.text()
    assert rec.bottleneck == "step"


def test_a_sweep_moves_a_fastdata_dataset_to_a_new_epoch_at_every_pass(tmp_path) -> None:
    # short epochs restart many times within one point: each restart is a new epoch, as in training,
    # so a shuffled dataset is never read twice in the same order (and never warns that it was)
    import warnings

    from fastdata.core.epoch._seeding import RepeatedEpochWarning
    from tests.datagen import make_shards

    ds = fd.TarShardDataset(make_shards(tmp_path, shards=2, per_shard=8), shuffle=True, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RepeatedEpochWarning)
        result = fd.bench.sweep(ds, workers=[0], batch_size=4, **QUICK)
    assert result.points[0].error is None, result.points[0].error
    assert ds.epoch > 1
