"""``num_workers="auto"`` on real DataLoaders: every sample exactly once, in the fixed setting's order, across
the automatic changes (worker processes stopped and started mid-epoch, fork and spawn); changes bounded in
a real run; the reaction to a busy-loop program started beside the loader.

The changes come from the real session and restart path; in the exactly-once tests a scripted tuner
decides them (at chosen batches, so that the test does not depend on timing), in the others the real one.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

import fastdata as fd
from fastdata.core import stages
from fastdata.loading.observe.tune import AutoTune, Change, Observation, Setting, Tuner
from tests.dist_backends import BACKENDS, make_loader

FAST_WINDOWS = AutoTune(max_workers=3, window=1e-3, min_batches=1, interval=1e-3)


class Scripted(Tuner):
    """Changes the setting to the next of ``plan`` every ``every`` windows (whatever was measured)."""

    def __init__(self, plan: list[int], every: int = 1) -> None:
        super().__init__(FAST_WINDOWS, cores=3)
        self.plan, self.every, self.seen = list(plan), every, 0
        self.current = Setting(2, 2)
        self.left: list[int | None] = []  # batches left in the epoch at each change

    def observe(self, obs: Observation) -> Change | None:
        if obs.early or not obs.batches_left or obs.batches_left < 2:
            return None  # (a change at an epoch's last batch is exact too, but not what this test is about)
        self.seen += 1
        if self.seen % self.every or not self.plan:
            return None
        w = self.plan.pop(0)
        change = Change(obs.t, obs.setting, Setting(w, 2 if w else None), "scripted", "now", obs.epoch, obs.batch)
        self.changes.append(change)
        self.left.append(obs.batches_left)
        self.current = change.after
        return change


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in ("tar_shards", "indexed_tar"):
        folder = tmp_path_factory.mktemp(name)
        BACKENDS[name].prepare(folder)
        out[name] = folder
    return out


def epochs_of(loader: fd.Loader, name: str, epochs: tuple[int, ...] = (1, 2)) -> list[list[str]]:
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out.append([k for batch in loader for k in BACKENDS[name].keys_of(batch)])
    return out


@pytest.mark.parametrize(
    ("name", "context", "plan"),
    [
        ("tar_shards", "fork", [0, 3, 1, 2]),
        ("indexed_tar", "fork", [3, 0, 2, 1]),
        ("tar_shards", "spawn", [1, 0]),  # the resume position travels to spawned workers pickled
    ],
)
def test_automatic_changes_read_every_sample_once_in_the_fixed_order(
    data: dict[str, Path], name: str, context: str, plan: list[int]
) -> None:
    reference = make_loader(name, data[name], num_workers=0)
    expected = epochs_of(reference, name)
    reference.close()
    loader = make_loader(name, data[name], num_workers="auto", autotune=FAST_WINDOWS, multiprocessing_context=context)
    assert loader._session is not None
    loader._session.tuner = scripted = Scripted(plan)
    got = epochs_of(loader, name)
    changes = loader.changes
    loader.close()
    assert got == expected  # the same samples in the same order: none lost, none twice
    for epoch in got:
        assert len(epoch) == len(set(epoch)) == 33
    assert [c.after.workers for c in changes] == plan  # every planned change happened ...
    assert all(left for left in scripted.left)  # ... mid-epoch


def test_the_real_tuner_keeps_every_sample_once_whatever_it_decides(data: dict[str, Path]) -> None:
    name = "indexed_tar"
    reference = make_loader(name, data[name], num_workers=0)
    expected = epochs_of(reference, name, (1, 2, 3))
    reference.close()
    options = AutoTune(window=0.02, min_batches=1, interval=0.02)
    loader = make_loader(name, data[name], num_workers="auto", prefetch_factor="auto", autotune=options)
    got = epochs_of(loader, name, (1, 2, 3))
    seen = loader._session.observations if loader._session is not None else []
    loader.close()
    assert got == expected
    assert seen  # it measured (and may have changed the setting)


class Jittery(Dataset[int]):
    """Items whose cost flips between cheap and dear from one moment to the next (a noisy signal)."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> int:
        t = stages.clock()
        time.sleep(0.004 if (i // 16) % 3 == 0 else 0.0005)  # the workload, not a synchronisation
        stages.lap("fetch", t)
        return i


def _session(options: AutoTune, dataset: Dataset[int]) -> tuple[Any, Tuner, Any]:
    """A real session and tuner over a plain DataLoader of ``dataset`` (batches of 8), and the function that
    restarts it with a setting (the order does not matter here: each restart reads from the start)."""
    from fastdata.loading._builder import build_dataloader
    from fastdata.loading._plan import ReadPlan
    from fastdata.loading.observe._session import Session

    tuner = Tuner(options, cores=2)
    setting = tuner.initial()
    session = Session(None, tuner, setting, rows=1 + tuner.most_workers)

    def open_at(epoch: int, done: int, s: Setting) -> Any:
        kwargs: dict[str, Any] = {"num_workers": s.workers}
        if s.workers:
            kwargs["prefetch_factor"] = s.prefetch
        return iter(build_dataloader(dataset, ReadPlan(batch_size=8, shuffle=False), **kwargs, **session.hooks()))

    session.pass_starts()
    return session, tuner, session.run(open_at(0, 0, setting), 0, 0, None, open_at)


def test_a_noisy_loader_does_not_start_a_restart_storm() -> None:
    """Rates that jump from window to window: at most one change per interval (but for a climb up the ladder,
    each step measured clearly faster than the last), and few in all."""
    options = AutoTune(window=0.1, min_batches=2, interval=0.5)
    session, tuner, batches = _session(options, Jittery())
    start = time.perf_counter()
    try:
        for _ in batches:
            if time.perf_counter() - start > 4.0:
                break
    finally:
        session.close()
    elapsed = time.perf_counter() - start
    changes = tuner.changes
    times = [c.t for c in changes]
    assert len(session.observations) >= 10  # it measured all along
    for a, b in itertools.pairwise(changes):
        # sooner than the interval only to climb on after a step up (which measured clearly faster)
        up = a.after.workers > a.before.workers and b.after.workers > b.before.workers
        assert b.t - a.t >= options.interval or up, [(c.t, str(c.before), str(c.after)) for c in changes]
    climbs = len(tuner._steps(tuner.most_workers))  # a climb is at most the ladder long
    assert len(times) <= elapsed / options.interval + 1 + climbs
    assert len(times) <= (1 + tuner.regime) * (climbs + 2)


def _spin(iterations: int) -> int:
    x = 0
    for i in range(iterations):
        x += i * i % 7
    return x


class Compute(Dataset[int]):
    """Items that cost ~1 ms of pure-Python CPU each."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> int:
        t = stages.clock()
        _spin(8000)
        stages.lap("decode", t)
        return i


# one program that keeps both cores of a 2-core machine busy: two processes, each ending with the program
# (it is killed at the test's end) or after 60 s
BUSY = (
    "import multiprocessing as mp, os, time\n"
    "def spin(parent):\n"
    "    end = time.time() + 60\n"
    "    while time.time() < end and os.getppid() == parent:\n"
    "        pass\n"
    "if __name__ == '__main__':\n"
    "    ps = [mp.Process(target=spin, args=(os.getpid(),)) for _ in range(2)]\n"
    "    [p.start() for p in ps]\n"
    "    [p.join() for p in ps]\n"
)


@pytest.mark.slow
def test_the_tuner_reacts_when_another_program_takes_a_core() -> None:
    """A busy loop started beside a loader settled at 2 workers on CPU-bound items: within 15 s the tuner sees
    that the machine changed (other programs took cores, or the loop became slower) and tries fewer workers
    (keeping them, or going back as measured). Tolerant of a machine that other programs load meanwhile:
    any change it names after the start counts, and the busy loop only needs to make itself seen."""
    # more sensitive than the defaults (the program may take only part of a machine other programs load too)
    options = AutoTune(
        start=2,
        min_workers=1,
        max_workers=2,
        window=1.0,
        min_batches=4,
        interval=1.0,
        others_change=0.4,
        rate_change=0.25,
    )
    session, tuner, batches = _session(options, Compute())
    hog: subprocess.Popen[bytes] | None = None
    started: float | None = None
    reacted: Change | None = None
    try:
        begin = time.perf_counter()
        for _ in batches:
            now = time.perf_counter()
            if hog is None:
                quiet = now - (tuner.changes[-1].t if tuner.changes else begin)
                at_two = tuner.current.workers == 2
                if (len(session.observations) >= 5 and quiet > 3.0 and at_two) or now - begin > 20:
                    hog = subprocess.Popen([sys.executable, "-c", BUSY])
                    started, seen_before = now, len(tuner.changes)
            else:
                fewer = [c for c in tuner.changes[seen_before:] if c.after.workers < c.before.workers]
                if fewer:
                    reacted = fewer[0]
                    break
                if now - started > 15:
                    break
    finally:
        if hog is not None:
            hog.kill()  # its two processes see their parent gone and end
            hog.wait()
        session.close()
    seen = [
        (round(o.t - (started or 0), 1), o.setting.workers, round(o.w.samples_per_s), round(o.w.others_cores, 2))
        for o in session.observations
    ]
    assert started is not None and reacted is not None, f"no change within 15 s of the busy loop's start: {seen}"
    assert "other programs" in reacted.reason, ([c.reason for c in tuner.changes], seen)
    assert reacted.t - started <= 15


def test_a_restart_lets_go_of_the_old_workers_slots(data: dict[str, Path]) -> None:
    from fastdata.loading.transport import _registry as slot_registry

    name = "tar_shards"
    loader = make_loader(name, data[name], num_workers="auto", autotune=FAST_WINDOWS, transport="slots")
    assert loader._session is not None
    loader._session.tuner = Scripted([0])  # from 2 workers to none: no new worker would prune the old rings
    loader.set_epoch(1)
    slot_registry.release()  # the rings of earlier tests' exited workers
    rings_before, rings_after = [], []
    changed = False  # the change is decided at a batch and applied as the next one is asked for
    for batch in loader:
        (rings_after if changed else rings_before).append(len(slot_registry._rings))
        changed = bool(loader.changes)
        del batch  # a batch still held keeps its slot's memory, not its ring's entry
    loader.close()
    assert [c.after.workers for c in loader.changes] == [0]
    assert max(rings_before) >= 1  # the two workers' batches came through slots ...
    assert rings_after and max(rings_after) == 0  # ... and their rings went with them at the restart


def test_restarts_count_each_bad_sample_once(tmp_path: Path) -> None:
    """Bad samples under on_error="skip", and auto restarting the workers mid-epoch: the old workers had read
    ahead (and skipped) samples of batches they never handed out, which the new workers read again; the skipped
    count is of the epoch's bad samples, each once (it said 18 for 16)."""
    import warnings

    import numpy as np

    from tests.datagen import jpeg_bytes, write_tar

    rng = np.random.default_rng(5)
    shards = []
    for s in range(4):
        samples = []
        for i in range(32):
            image = jpeg_bytes(rng)
            if i % 8 == 3:  # 4 bad images a shard: 16 in all
                image = image[:40] + b"\x00garbage" * 10
            samples.append({"__key__": f"s{s:02d}{i:04d}", "cls": b"1", "jpg": image})
        shards.append(str(tmp_path / f"bad-{s:06d}.tar"))
        write_tar(shards[-1], samples)
    ds = fd.TarShardDataset(shards, decode="numpy", on_error="skip", batch_size=4, shuffle=False)
    loader = fd.Loader(ds, num_workers="auto", autotune=FAST_WINDOWS)
    assert loader._session is not None
    loader._session.tuner = Scripted([1, 3, 2], every=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        keys = [k for batch in loader for k in batch["__key__"]]
    changes = loader.changes
    loader.close()
    assert len(changes) == 3  # three restarts mid-epoch, each after read-ahead
    assert len(keys) == len(set(keys)) == 4 * 32 - 16
    assert ds.skipped == 16


class SlowFirstWorker(Dataset[int]):
    """Items of 1 ms; the last worker's first item takes 0.5 s more (its first connection, a SYN retried)."""

    def __init__(self) -> None:
        self.started = False

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> int:
        info = torch.utils.data.get_worker_info()
        slow = info is not None and info.id == info.num_workers - 1 and not self.started
        self.started = True
        time.sleep(0.5 if slow else 0.001)  # the workload, not a synchronisation
        return i


def test_a_setting_is_measured_once_every_worker_has_handed_its_first_batch() -> None:
    """A worker's slow start is a start-up, paid once: the tuner's windows begin after each worker's first
    batch (the DataLoader takes them in turn), not at the pass's first (16 HTTP workers, one of them held 1 s
    by a SYN retry, measured 0.11x of 8 and were sent back)."""
    options = AutoTune(window=0.05, min_batches=1, interval=1e3)  # no change: the first setting is measured
    session, tuner, batches = _session(options, SlowFirstWorker())
    workers = tuner.initial().workers
    assert workers >= 2
    begun: list[int] = []
    started = session.tuning.started
    session.tuning.started = lambda reading: (begun.append(session.counter.batches), started(reading))[1]
    try:
        for _ in batches:
            if session.observations:
                break
    finally:
        session.close()
    assert begun == [workers]  # from the slow worker's first batch, the last of the first round
