"""One report, one story (issue 22): the advice fits where it is shown (inside training it names no option
of fastdata bench; under spawn it says nothing of fork's speed; with num_workers="auto" it leaves the worker
count to auto), and the label, its evidence and its advice agree. Windows built from raw counters, read by
the library's one evidence builder and rules."""

from __future__ import annotations

from fastdata.loading.observe import Context, Process, Window, classify, evidence
from fastdata.loading.observe.measure import StartSplit


def idle_workers() -> Window:
    """Two workers busy a fifth of the time, nothing else seen: no label can be read."""
    w = Window(seconds=2.0, loop_s=2.0, batches=40, samples=320, wait_s=1.8, wait_cpu_s=0.1, loop_cpu_s=0.1)
    w.main = Process(cpu_s=0.1, pid=1, threads=2)
    w.workers = [Process(cpu_s=0.4, pid=2), Process(cpu_s=0.4, pid=3)]
    return w


def test_inside_training_the_advice_names_no_option_of_fastdata_bench() -> None:
    bench = classify(evidence(idle_workers(), Context(cores=2)))
    training = classify(evidence(idle_workers(), Context(cores=2, where="training")))
    assert bench.label == training.label == "unknown"
    assert any("--profile" in a for a in bench.advice)
    said = " ".join(training.advice + training.evidence)
    assert "--profile" not in said and "--step-ms" not in said and "step_time" not in said, said


def forking(start_method: str) -> Window:
    """Short epochs whose first batch waits for the workers to start, most of it launching them."""
    w = Window(seconds=3.0, loop_s=3.0, batches=30, samples=240, wait_s=2.0, wait_cpu_s=0.05, first_wait_s=1.5)
    w.starts = 3
    w.workers = [Process(cpu_s=0.1, pid=2)]
    return w


def test_under_spawn_the_start_up_advice_says_nothing_of_fork() -> None:
    split = StartSplit(total=0.5, launch=0.4, init=0.05, produce=0.03, deliver=0.02)
    fork = classify(evidence(forking("fork"), Context(cores=2, start=split, start_method="fork", parent_rss=2e9)))
    spawn = classify(evidence(forking("spawn"), Context(cores=2, start=split, start_method="spawn")))
    assert fork.label == spawn.label == "fork"
    assert "forks faster" in " ".join(fork.advice) and "page tables" in fork.evidence[0]
    assert "fork" not in " ".join(spawn.advice).replace("persistent_workers", ""), spawn.advice
    assert "spawn starts a fresh interpreter" in spawn.evidence[0]


def computing_workers() -> Window:
    """One worker computing 95% of the time on a 4-core machine: cores are left."""
    w = Window(seconds=2.0, loop_s=2.0, batches=40, samples=320, wait_s=1.8, wait_cpu_s=0.1, loop_cpu_s=0.1)
    w.workers = [Process(cpu_s=1.9, pid=2, looks={"computing/": 40})]
    return w


def test_with_auto_the_advice_leaves_the_worker_count_to_it() -> None:
    plain = classify(evidence(computing_workers(), Context(cores=4, where="training")))
    auto = classify(evidence(computing_workers(), Context(cores=4, where="training", auto=True)))
    assert plain.label == auto.label == "cpu"
    assert plain.advice == ["cores are left: more workers would help"]
    assert "num_workers='auto'" in auto.advice[0] and "more workers would help" not in auto.advice[0]
