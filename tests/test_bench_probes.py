"""The stage hook and the probes: counts that must come out exactly, through real worker processes."""

from __future__ import annotations

import contextlib
import os
import pickle
import time
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import fastdata as fd
from fastdata.bench._loop import Timing, make_loader, measure
from fastdata.bench._probes import Probed, ProbedCollate, payload_bytes
from fastdata.bench._result import Config
from fastdata.core import stages
from fastdata.loading.observe.measure import StageTable, batch_samples
from tests.datagen import make_shards


class Staged(Dataset[dict[str, Any]]):
    """Reports fetch and decode for every item (``n`` items, each fetched as one)."""

    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        t = stages.clock()
        raw = bytes(100)
        t = stages.lap("fetch", t)
        with stages.timed("decode"):
            value = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        return {"i": i, "x": value}


class Plain(Dataset[int]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        return i


@pytest.fixture(autouse=True)
def probing_off() -> Any:
    yield
    stages.disable()


def test_off_the_hook_does_nothing() -> None:
    assert not stages.enabled()
    assert stages.clock() == 0.0
    assert stages.lap("fetch", stages.clock()) == 0.0
    with stages.timed("decode"):
        pass
    assert stages.totals()["decode"] == (0.0, 0.0)


def test_on_the_hook_adds_time_and_items_per_stage() -> None:
    sink = np.zeros(2 * len(stages.STAGES))
    stages.enable(sink)
    t = stages.clock()
    time.sleep(0.001)  # the workload being timed
    t = stages.lap("fetch", t, n=5)
    with stages.timed("transform", n=2):
        pass
    totals = stages.totals()
    assert totals["fetch"][0] > 0 and totals["fetch"][1] == 5
    assert totals["transform"][1] == 2
    assert totals["decode"] == (0.0, 0.0)
    assert sink.sum() == 0  # nothing reaches shared memory before a flush
    stages.flush()
    assert sink[1] == 5 and sink[5] == 2


def read_all(loader: Any) -> list[Probed]:
    return list(loader)


@pytest.mark.parametrize(("workers", "context"), [(0, None), (2, "fork"), (1, "spawn")])
def test_stage_totals_reach_the_main_process_exactly(workers: int, context: str | None) -> None:
    table = StageTable(workers + 1)
    if not workers:
        table.attach(0)
    config = Config(workers, 2 if workers else None, False, False, 4)
    loader = make_loader(Staged(40), config, shuffle=False, multiprocessing_context=context, table=table)
    batches = read_all(loader)
    stages.disable()
    assert [b.n for b in batches] == [4] * 10
    totals = table.totals()
    assert totals["fetch"][1] == 40 and totals["decode"][1] == 40
    assert totals["collate"][1] == 40  # timed by the harness around the collate_fn
    assert totals["transform"] == (0.0, 0.0)  # never reported: unknown
    assert all(b.nbytes == 4 * (100 + 8) for b in batches)  # 4 tensors of 100 bytes and 4 int64 indices
    if workers:
        assert all(b.unpickle_s > 0 for b in batches)  # received from another process


def test_a_new_epochs_workers_count_on_from_the_last_ones() -> None:
    table = StageTable(3)
    loader = make_loader(Staged(20), Config(2, 2, False, False, 5), shuffle=False, table=table)
    read_all(loader)
    read_all(loader)  # new workers (not persistent) take over the same rows
    assert table.totals()["fetch"][1] == 40


def test_tar_datasets_report_fetch_decode_and_transform(tmp_path: Any) -> None:
    shards = make_shards(tmp_path, shards=2, per_shard=10, jpeg=True)
    ds = fd.TarShardDataset(shards, decode="numpy", transform=lambda s: s["cls"])
    table = StageTable(3)
    loader = make_loader(ds, Config(2, 2, False, False, 5), table=table)
    assert sum(b.n for b in read_all(loader)) == 20
    totals = table.totals()
    assert totals["fetch"][1] == 20 and totals["decode"][1] == 20 and totals["transform"][1] == 20
    assert totals["decode"][0] > 0

    raw = fd.IndexedTarDataset(shards)  # no decoder, no transform: only fetch
    table = StageTable(1)
    table.attach(0)
    read_all(make_loader(raw, Config(0, batch_size=5), table=table))
    totals = table.totals()
    assert totals["fetch"][1] == 20 and totals["decode"] == (0.0, 0.0) and totals["transform"] == (0.0, 0.0)


def test_a_dataset_without_the_hook_still_benchmarks_with_stages_unknown() -> None:
    point = measure(
        Plain(),
        Config(1, 2, False, False, 8),
        timing=Timing(seconds=0.4, window=0.1, warmup=0.1, min_windows=2),
        cores=2,
    )
    assert point.ok, point.error
    assert point.stage_ms["fetch"] is None and point.stage_ms["decode"] is None
    assert point.stage_ms["collate"] is not None
    assert point.window.worker_busy and point.pss_workers and point.window.main.pss > 0 and point.fds > 0


def test_a_failing_dataset_gives_a_failed_point_not_an_exception() -> None:
    class Broken(Plain):
        def __getitem__(self, i: int) -> int:
            raise OSError("disk on fire")

    point = measure(Broken(), Config(0, batch_size=4), timing=Timing(seconds=0.2, window=0.1, warmup=0.0))
    assert not point.ok and point.error is not None and "disk on fire" in point.error


def test_an_iterable_dataset_that_batches_itself_is_counted_by_its_batches(tmp_path: Any) -> None:
    shards = make_shards(tmp_path, shards=2, per_shard=12)
    ds = fd.TarShardDataset(shards, batch_size=6)
    table = StageTable(2)
    loader = make_loader(ds, Config(1, 2, False, False, None), table=table)
    assert [b.n for b in read_all(loader)] == [6, 6, 6, 6]


def test_probed_batches_time_their_own_unpickling() -> None:
    probed = ProbedCollate(list, batched=True)([[1.0] * 1000, [2.0] * 1000])
    again = pickle.loads(pickle.dumps(probed))
    assert again.n == 2 and again.batch == probed.batch
    assert again.unpickle_s > 0 and again.unpickle_cpu >= 0
    counted = ProbedCollate(list, batched=True, measure=False)([1, 2, 3])
    assert counted.n == 3 and counted.nbytes == 0


def test_batch_samples_and_payload_bytes() -> None:
    assert batch_samples(torch.zeros(7, 3)) == 7
    assert batch_samples({"x": torch.zeros(5, 2), "y": [1] * 5}) == 5
    assert batch_samples([torch.zeros(4, 2), torch.zeros(4)]) == 4  # an (inputs, targets) pair
    assert batch_samples([1, 2, 3]) == 3
    assert payload_bytes(torch.zeros(10, dtype=torch.float32)) == 40
    assert payload_bytes({"a": b"xyz", "b": np.zeros(4, dtype=np.uint8), "c": "hi"}) == 9
    # long lists are estimated from a sample of their items, exactly when the items are alike
    assert payload_bytes([b"1234"] * 100_000) == 400_000


def test_every_thread_of_a_process_is_counted_a_helper_thread_included() -> None:
    import threading

    from fastdata.bench._synthetic import spin
    from fastdata.core.system._procfs import ProcessProbe, python_thread_names

    probe = ProcessProbe(os.getpid(), names=python_thread_names)
    before = probe.read()
    worked, release = threading.Event(), threading.Event()

    def decode() -> None:
        spin(3_000_000)
        worked.set()
        release.wait()

    helper = threading.Thread(target=decode, name="decoder-helper")
    helper.start()
    worked.wait()
    mid = probe.read()  # seen alive, by its Python name
    release.set()
    helper.join()  # the helper has exited: its last reading still counts
    after = probe.read()
    seen = {k: v.name for k, v in probe._seen.items()}
    assert mid.by_thread.get("decoder-helper", 0.0) - before.by_thread.get("decoder-helper", 0.0) > 0.05, seen
    assert after.by_thread["decoder-helper"] >= mid.by_thread["decoder-helper"], seen
    assert after.cpu >= mid.cpu >= before.cpu
    after = after.minus(before)
    assert after.voluntary + after.involuntary > 0 and after.threads >= 1


def test_voluntary_and_involuntary_switches_are_told_apart() -> None:
    from fastdata.core.system._procfs import read_thread

    tid = threading_id()
    before = read_thread(os.getpid(), tid)
    for _ in range(50):
        time.sleep(0.001)  # each sleep gives the core up: a voluntary switch (the workload measured)
    after = read_thread(os.getpid(), tid)
    assert before is not None and after is not None
    assert after.voluntary - before.voluntary >= 40


def threading_id() -> int:
    import threading

    return threading.get_native_id()


def test_the_first_batch_wait_splits_into_set_up_and_shuffle_fill() -> None:
    from fastdata.bench._synthetic import ShuffleBufferDataset
    from fastdata.loading.observe.measure import start_split

    def slow_init(worker_id: int) -> None:
        time.sleep(0.2)  # the workers' set-up this test measures

    ds = ShuffleBufferDataset(n=128, window=120, delay=0.002)
    table = StageTable(2)
    loader = make_loader(ds, Config(1, 2, False, False, 8), table=table, worker_init_fn=slow_init)
    table.new_epoch()
    asked = time.perf_counter()
    it = iter(loader)
    started = time.perf_counter()
    first = next(it)
    split = start_split(table, 1, asked, started, time.perf_counter(), restarted=True)
    del it
    assert first.n == 8
    assert split.init >= 0.2  # the worker_init_fn
    # the whole buffer before the first item, then a read per item for the other 7 of the batch
    assert split.read == 120 + 7 and split.batch == 8
    assert split.fill > 10 * split.produce


# programs that each wait on one thing, as a producer would: what the looks must call them
# (each says "ready" when it begins, so that the looks start after the interpreter's start-up)
WAITERS = {
    "network": "import socket\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "c = socket.create_connection(s.getsockname()); c.settimeout(60); print('ready', flush=True); c.recv(10)",
    "sleep": "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.005)",
    "lock": "import threading, time\nlock = threading.Lock()\n"
    "def hold():\n    while True:\n        with lock: time.sleep(0.05)\n"
    "threading.Thread(target=hold, daemon=True).start()\nprint('ready', flush=True)\nwhile True:\n"
    "    with lock: pass",
    "idle": "import multiprocessing as mp\nq = mp.Queue()\nprint('ready', flush=True)\nq.get(timeout=60)",
    "computing": "print('ready', flush=True)\nwhile True: pass",
}


def _sampled(codes: dict[Any, str], looks: int = 40) -> tuple[dict[Any, dict[str, int]], Any]:
    """Start one Python process per code (each prints 'ready' once waiting), look at them with a real
    ThreadSampler until each was looked at ``looks`` times (bounded), and kill them: each one's looks by
    ``kind/call``, and the (stopped) sampler."""
    import subprocess
    import sys

    from fastdata.core.system._procfs import ThreadSampler

    procs = {k: subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for k, code in codes.items()}
    sampler = ThreadSampler(interval=0.01)
    try:
        for p in procs.values():
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        sampler.watch([p.pid for p in procs.values()])
        sampler.start()
        deadline = time.perf_counter() + 30
        while time.perf_counter() < deadline:
            time.sleep(0.05)  # waiting for the sampler's looks, bounded
            if all(sum(sampler.looked(p.pid).values()) >= looks for p in procs.values()):
                break
        sampler.stop()
        return {k: sampler.looked(p.pid) for k, p in procs.items()}, sampler
    finally:
        sampler.stop()
        for p in procs.values():
            p.kill()
            p.wait()


def _by_kind(looks: dict[str, int]) -> dict[str, int]:
    from fastdata.core.system._waits import split

    counted: dict[str, int] = {}
    for key, n in looks.items():
        counted[split(key)[0]] = counted.get(split(key)[0], 0) + n
    return counted


def test_the_thread_sampler_tells_what_each_process_waits_on() -> None:
    """Real processes, each waiting on one thing: a socket (Python's timeout polls before it receives), sleeps,
    a lock another thread holds while it sleeps, a pipe (a DataLoader worker waiting for work: not the
    network, though it polls too), and a busy loop. The looks name each one's kind."""
    looked, sampler = _sampled(WAITERS)
    for kind, looks in looked.items():
        # a look may find the sleeper between two sleeps: most, not all, must be the kind
        counted = _by_kind(looks)
        assert counted.get(kind, 0) >= 0.6 * sum(counted.values()), (kind, looks)
    assert any(k.startswith("network/") and k.split("/")[1] in ("poll", "recvfrom") for k in looked["network"])
    looks, blocked = sampler.counts()
    assert looks >= 40 and 0 <= blocked <= looks


def test_workers_of_short_epochs_are_counted_though_they_exit_between_readings() -> None:
    from fastdata.bench._synthetic import CPUDataset, spin

    costs = []
    for _ in range(20):
        started = time.thread_time()
        spin(30_000)
        costs.append(time.thread_time() - started)
    # CPU-seconds one item costs here at the least (a core shared with other programs' hyperthreads or
    # caches makes the same item cost more CPU-seconds at some times than at others)
    per_item = min(costs)
    # epochs of 4 batches per worker (tens of ms): each worker exits long before a window's reading
    point = measure(
        CPUDataset(n=32, iterations=30_000),
        Config(2, 2, False, False, 4),
        timing=Timing(seconds=1.0, window=0.5, warmup=0.2, min_windows=2),
        cores=2,
    )
    assert point.ok, point.error
    assert point.restart_s is not None  # epochs did end while measuring
    # what the workers computed is counted (each wrote its own CPU into the stage table): most of
    # the CPU the items they made cost (without it, most of it was lost: a third here)
    made = point.samples_per_s * point.window.seconds
    assert sum(point.window.worker_cores) * point.window.seconds > 0.7 * made * per_item
    assert sum(point.window.switches) > 0


def test_the_thread_sampler_closes_what_it_opened_for_workers_gone() -> None:
    """Workers that do not persist are new processes each epoch: the memory files opened to read their polls
    are closed when they leave, so a long run does not run out of descriptors."""
    import subprocess
    import sys

    from fastdata.core.system._procfs import ThreadSampler

    code = "import socket\ns, peer = socket.socketpair()\ns.settimeout(60)\nprint('ready', flush=True)\ns.recv(1)"

    def opened_for(pids: list[int]) -> list[str]:
        """This process's descriptors open on a file under /proc/PID/ of one of ``pids`` (counted by what they
        point at, so that files other threads of the test process open meanwhile do not count)."""
        out = []
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{name}")
                if any(target.startswith(f"/proc/{pid}/") for pid in pids):
                    out.append(target)
        return out

    sampler = ThreadSampler(interval=0.01)
    opened, left, gone = [], [], []
    for _ in range(4):  # four "epochs" of two workers each
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(2)]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        sampler.watch([p.pid for p in procs])
        for p in procs:
            sampler._count(p.pid, *sampler._process(p.pid, p.pid, {p.pid: "S"}))  # one look, in this thread
        assert all(sampler.looked(p.pid) for p in procs)
        opened.append(len(opened_for([p.pid for p in procs])))
        for p in procs:
            p.kill()
            p.wait()
            assert p.stdout is not None
            p.stdout.close()
        left.append(opened_for(gone))  # what is still open for the workers of the epochs before this one
        gone.extend(p.pid for p in procs)
    sampler.stop()
    assert all(opened), opened  # the premise: the sampler had files open for each epoch's workers
    assert left == [[]] * 4, left  # the last epoch's workers' files at most, never an earlier epoch's


BEHIND_A_QUEUE = (
    "import queue, threading, time\n"
    "from fastdata.core.system._thread_name import name_this_thread\n"
    "q = queue.Queue()\n"
    "def read():\n"
    "    if NAMED: name_this_thread('fastdata-loader-0')\n"
    "    while True:\n"
    "        time.sleep(0.05); q.put(1)\n"
    "threading.Thread(target=read, daemon=True).start()\n"
    "print('ready', flush=True)\n"
    "while True: q.get()\n"
)


def test_a_process_waiting_on_its_own_reading_threads_waits_on_what_they_do() -> None:
    """The main thread waits on a futex (a queue) for a thread that sleeps: fastdata's own reading thread
    (named fastdata-..., as a hybrid worker's threads are) makes the process sleeping; a thread of the user's
    doing the same is a lock's holder, and the process waits on a lock (a hybrid worker over sleeping items
    read as 'lock' with the advice 'more threads will not help', though 2 threads doubled its speed)."""
    looked, _ = _sampled({named: f"NAMED = {named}\n" + BEHIND_A_QUEUE for named in (True, False)})
    for named, looks in looked.items():
        counted = _by_kind(looks)
        expected = "sleep" if named else "lock"
        assert counted.get(expected, 0) >= 0.6 * sum(counted.values()), (named, counted)


def test_hybrid_workers_over_sleeping_items_are_sleeping_not_on_a_lock() -> None:
    """fastdata bench fastdata.bench:IOWaitDataset --modes hybrid: each worker's main thread waits for its
    loader threads, which sleep in the dataset."""
    result = fd.bench.sweep(
        fd.bench.IOWaitDataset(n=100_000, delay=0.005),
        modes=["hybrid"],
        workers=[2],
        batch_size=16,
        seconds=1.0,
        window=0.25,
        warmup=0.25,
        confirm=False,
    )
    assert fd.bench.recommend(result).bottleneck == "sleep", fd.bench.recommend(result).diagnosis
