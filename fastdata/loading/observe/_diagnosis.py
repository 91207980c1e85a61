"""What limits a loader, from evidence: the label rules, each verdict with the figures that decided it.

The rules read an :class:`Evidence`: what one configuration of a loader did over a window (a sweep's
point in ``fastdata bench``, or a monitor's window inside a training loop), in figures the probes of
:mod:`fastdata.core._proc` measure. :func:`classify` returns a :class:`Verdict`: a :data:`Label`
and the sentences of evidence behind it. The rules, in order:

* ``memory``: the loader's processes hold (PSS) 80% or more of the memory they may use.
* ``fork``, ``worker-init``, ``shuffle-fill`` (start-up): a third or more of the time is spent waiting
  for the first batch of an epoch, and the largest part of that wait is starting the worker processes
  (fork copies a big parent's page tables; spawn starts an interpreter), their set-up (``worker_init_fn``,
  opening what the dataset needs), or reading samples beyond the first batch before yielding it (a
  shuffle buffer, refilled at every epoch, persistent workers or not).
* ``step``: with a training step, the loop waits for data less than the target (5%) of the time: the
  step, not the loader, sets the pace.
* ``main-process``: the main process is busy (its main thread running or waiting for a core) 80% or
  more of the time, or computes to rebuild and pin batches half of it: collate, unpickle, pin.
* ``cpu`` (decode/CPU): the producing processes compute: each worker running or runnable (every thread
  of it counted: a decoder's helper thread too) half the time or more; with no workers, the main
  process with its helper threads 0.8 cores' worth of the time. Unless a wait on storage is seen and
  fetch takes more of the time than decode and transform (busy fetch threads waking on every reply).
* ``storage``: something shows a wait on storage: the time in ``fetch`` far above the CPU the
  producers use (a network or object store), block-I/O delay, or threads seen in D state (a disk).
  Never the fallback: idle workers with no such sign are ``unknown``.
* ``ipc``: the main process waits in the middle of receiving batches (the hand-over of each tensor's
  shared memory) while neither side computes.
* ``unknown``: none of the above; the verdict says what was and was not seen.

``uncertain`` is for callers that compare several measurements of one configuration
(:func:`agree`): when they disagree beyond their noise, a confident label would be a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from fastdata.loading.observe._evidence import Evidence
from fastdata.loading.observe._stage_table import StartSplit

Label = Literal[
    "storage",
    "cpu",
    "main-process",
    "ipc",
    "fork",
    "worker-init",
    "shuffle-fill",
    "memory",
    "step",
    "uncertain",
    "unknown",
]
LABELS: tuple[Label, ...] = get_args(Label)
START_UP: tuple[Label, ...] = ("fork", "worker-init", "shuffle-fill")

MEMORY_NEAR = 0.8  # PSS of the loader's processes against the memory they may use
START_BOUND = 0.3  # share of the time spent waiting for epochs' first batches: start-up is the limit
START_PART = 0.45  # ... and the share of that wait its largest part must take to name it
STALL_TARGET = 0.05  # with a step: the loop waits less than this share of the time: the step is the limit
MAIN_BUSY = 0.8  # main thread running or runnable this much of the time: the main process is the limit
RECEIVE = 0.5  # ... or computing to rebuild and pin batches this much of the time
LEADING = 0.6  # ... or busy this much, receiving a quarter of it, while every worker waits
COMPUTING = 0.5  # a producer running or runnable this much of the time computes (it is not waiting)
CORES_SATURATED = 0.85  # the loader's demand for cores, against the usable cores
FETCH_WAIT = 0.3  # time in fetch minus CPU used, as a share of a producer's time: it waits on storage
BLOCKED = 0.1  # share of time in block-I/O delay, or of looks finding a thread in D state: a disk wait


@dataclass
class Verdict:
    """A label and the evidence for it.

    Attributes:
        label (Label): what limits the loader.
        evidence (list[str]): sentences with the figures that decided it, most important first.
        advice (list[str]): what to do about it.
    """

    label: Label
    evidence: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _share(x: float) -> str:
    """A busy share: "73% of the time", or past one core (several threads) "1.04 cores' worth of the time"."""
    return f"{x:.0%} of the time" if x <= 1.0 else f"{x:.2f} cores' worth of the time"


def _own_share(x: float) -> str:
    """A producer's share of its time: "90% of its time", or past one (a worker's threads together)
    "1.75 cores' worth of its time (its threads together)"."""
    return f"{x:.0%} of its time" if x <= 1.0 else f"{x:.2f} cores' worth of its time (its threads together)"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _workers(n: int) -> str:
    return "no workers" if n == 0 else "1 worker" if n == 1 else f"{n} workers"


def _threads_text(threads: dict[str, float], least: float = 0.05) -> str:
    busy = sorted(((c, n) for n, c in threads.items() if c >= least), reverse=True)[:3]
    return ", ".join(f"'{n}' {c:.2f} cores" for c, n in busy)


def fetch_wait(ev: Evidence) -> float:
    """Share of a producer's time in ``fetch`` beyond the CPU it uses (every thread of it): the wall
    time of fetching far above its CPU time is a wait for bytes. CPU used, not demand: the run-queue
    waits of a pool of fetch threads add up across threads on a crowded machine, and are no work done."""
    fetch = ev.stage_busy.get("fetch")
    if fetch is None:
        return 0.0
    return max(0.0, fetch - ev.producer_cpu)


def fetch_dominates(ev: Evidence) -> bool:
    """More of the producers' time goes to fetch than to decode and transform together.

    On a crowded machine a pool of fetch threads that wakes on every network reply waits for a core at
    each wake-up, and those run-queue waits add up to "busy": a producer that waits for bytes then looks
    busy too. Where the time is spent tells the two apart: a decoder starved of CPU is in decode.
    """
    fetch = ev.stage_busy.get("fetch") or 0.0
    work = (ev.stage_busy.get("decode") or 0.0) + (ev.stage_busy.get("transform") or 0.0)
    return fetch > work


def storage_signs(ev: Evidence) -> list[str]:
    """The measurements that show a wait on storage (empty when none does)."""
    signs = []
    wait = fetch_wait(ev)
    who = "each worker" if ev.workers else "each loader thread" if ev.threads else "the main process"
    if wait >= FETCH_WAIT:
        fetch_ms = ev.stage_ms.get("fetch")
        ms = f" ({fetch_ms:.2f} ms per sample)" if fetch_ms is not None else ""
        signs.append(
            f"{who} spends {_own_share(ev.stage_busy.get('fetch') or 0)} in fetch{ms} but uses only "
            f"{ev.producer_cpu:.2f} cores of CPU, every thread counted: it waits for bytes"
        )
    if ev.blkio >= BLOCKED:
        signs.append(f"block-I/O delay {_pct(ev.blkio)} of the time (the kernel's delay accounting)")
    if ev.dstate >= BLOCKED:
        signs.append(f"a loader thread was in uninterruptible sleep (D state) in {_pct(ev.dstate)} of the looks")
    return signs


def _disk_or_network(ev: Evidence) -> str:
    if ev.blkio >= BLOCKED or ev.dstate >= BLOCKED or ev.device_mb_s >= 1:
        return (
            f"The reads reach the disk ({ev.device_mb_s:.1f} MB/s from the device of {ev.read_mb_s:.1f} MB/s read): "
            "faster storage, larger sequential reads (tar shards) or a warm page cache help."
        )
    accounting = "" if ev.blkio_known else " (delay accounting is off: D-state looks only)"
    return (
        f"No block-I/O wait or D state{accounting} and {ev.device_mb_s:.1f} MB/s from the device: the wait is on "
        "the network or a remote store (or a lock or sleep in fetch)."
    )


def _start_up(ev: Evidence) -> Verdict | None:
    split = ev.start
    if split is None or ev.epoch_start < START_BOUND or split.total <= 0:
        return None
    part, secs = split.largest()
    if secs < START_PART * split.total:
        return None  # no part stands out: the wait is the pipeline's own latency, not one start-up cost
    share = f"{_pct(ev.epoch_start)} of the time goes to waiting for epochs' first batches ({split.total:.2f} s each)"
    parts = ", ".join(f"{p} {getattr(split, p):.2f} s" for p in StartSplit.PARTS)
    if part == "launch" and ev.threads:
        return None  # no process is launched in thread mode: no "fork" verdict from a thread's start
    if part == "launch":
        how = (
            f"fork copies the page tables of the {_gib(ev.parent_rss)} parent"
            if ev.start_method == "fork"
            else f"{ev.start_method} starts a fresh interpreter that imports torch and unpickles the dataset"
        )
        return Verdict(
            "fork",
            [f"{share}; starting the worker processes takes {secs:.2f} s of it ({how}); split: {parts}"],
            [
                "persistent_workers=True starts them once; or start the loader before the parent grows "
                "(a smaller parent forks faster), or use fewer workers"
            ],
        )
    if part == "init" and ev.threads:
        return Verdict(
            "worker-init",
            [
                f"{share}; the loader threads' set-up before their first sample (a copy of the dataset for "
                f"each thread, opening files or clients, building indexes) takes {secs:.2f} s of it; split: {parts}"
            ],
            ["make the set-up lazier or cheaper (cache the index); fewer threads copy the dataset fewer times"],
        )
    if part == "init":
        return Verdict(
            "worker-init",
            [
                f"{share}; each worker's set-up before its first sample (worker_init_fn, opening files or "
                f"clients, building indexes) takes {secs:.2f} s of it; split: {parts}"
            ],
            ["persistent_workers=True pays the set-up once; or make it lazier or cheaper (cache the index)"],
        )
    if part == "fill":
        return Verdict(
            "shuffle-fill",
            [
                f"{share}; before its first batch of {split.batch:.0f} samples the worker reads {split.read:.0f} "
                f"(a shuffle buffer), {secs:.2f} s of it; split: {parts}"
            ],
            [
                "a smaller shuffle_window (the buffer is refilled at every epoch, persistent workers or not), "
                "or shards shuffled instead of samples"
            ],
        )
    return None


def classify(ev: Evidence, stall_target: float = STALL_TARGET) -> Verdict:
    """The label of one configuration's window, and its evidence (see the module docstring)."""
    if ev.memory and ev.pss >= MEMORY_NEAR * ev.memory:
        return Verdict(
            "memory",
            [
                f"the loader's processes hold {_gib(ev.pss)} (PSS) of the {_gib(ev.memory)} they may use "
                f"({_pct(ev.pss / ev.memory)})"
            ],
            ["fewer workers or a smaller prefetch_factor; more risk the OOM killer"],
        )
    start = _start_up(ev)
    if start is not None:
        return start
    if ev.step and ev.stall is not None and ev.stall < stall_target:
        return Verdict(
            "step",
            [f"the training loop waits for data {ev.stall:.1%} of the time: the loader keeps up"],
            ["the step sets the pace: a faster loader would not train faster"],
        )
    storage = storage_signs(ev)
    if ev.workers:
        # the main process is the limit when it is (nearly) always busy, or computes to receive most of the
        # time, or is busy most of the time receiving while the workers wait for it (a crowded machine
        # keeps it waiting for a core part of the time, below MAIN_BUSY)
        leading = ev.main_busy >= LEADING and ev.recv >= RECEIVE / 2 and ev.per_worker_busy < COMPUTING
        if ev.main_busy >= MAIN_BUSY or ev.recv_cpu + ev.pin >= RECEIVE or leading:
            return Verdict(
                "main-process",
                [
                    f"the main process is busy {_pct(ev.main_busy)} of the time: rebuilding received batches "
                    f"{_pct(ev.recv)} (computing {_pct(ev.recv_cpu)}), pinning {_pct(ev.pin)}; the workers "
                    f"compute {_pct(ev.per_worker_busy)} of the time each"
                ],
                [
                    "return tensors or numpy arrays (they travel through shared memory) rather than Python "
                    "lists and dicts; fewer, larger batches; decode later, on the GPU"
                ],
            )
        # workers that mostly wait add up run-queue waits on a crowded machine without wanting the cores:
        # a worker computes when it alone is running or runnable half the time
        if ev.per_worker_busy >= COMPUTING and not (storage and fetch_dominates(ev)):
            threads = _threads_text({k: v / ev.workers for k, v in ev.worker_threads.items()})
            return Verdict(
                "cpu",
                [
                    f"each worker computes {_share(ev.per_worker_busy)} (every thread, running or waiting for a "
                    f"core); the loader wants {ev.demand:.1f} of {ev.cores} cores"
                    + (f"; per worker, threads {threads}" if threads else "")
                    + _stage_note(ev)
                ],
                _cpu_advice(ev),
            )
        if storage:
            return Verdict("storage", [*storage, _disk_or_network(ev)], ["more workers or a larger prefetch_factor"])
        if ev.recv >= RECEIVE:
            return Verdict(
                "ipc",
                [
                    f"the main process spends {_pct(ev.recv)} of its time receiving batches but computes "
                    f"{_pct(ev.recv_cpu)} of it, and the workers compute {_pct(ev.per_worker_busy)}: it waits "
                    "for the hand-over of each tensor"
                ],
                ["larger batches (fewer hand-overs), fewer tensors per batch, or loading in the main process"],
            )
        return _unknown(ev, storage)
    # no workers: the main process makes every batch, with whatever threads it starts (in thread mode,
    # its loader threads, each read from /proc/self/task)
    if ev.main_process_busy >= MAIN_BUSY and not (storage and fetch_dominates(ev)):
        helpers = _threads_text(ev.main_threads)
        collate = ev.stage_ms.get("collate") or 0.0
        work = sum(ev.stage_ms.get(s) or 0.0 for s in ("fetch", "decode", "transform"))
        label: Label = "main-process" if collate > work else "cpu"
        if ev.threads:
            # loader threads collate too: the main process is the limit only when its main thread is
            label = "main-process" if ev.main_busy >= MAIN_BUSY else "cpu"
        its = f"its {ev.threads} loader threads and the others" if ev.threads else "its threads"
        found = [
            f"the main process keeps {ev.main_process_busy:.2f} cores busy with {its} (running or "
            f"waiting for a core; the main thread {_pct(ev.main_busy)} of the time"
            + (f"; {helpers}" if helpers else "")
            + ")"
            + _stage_note(ev)
        ]
        gil = _one_core_note(ev)
        if gil:
            found.append(gil)
        return Verdict(
            label,
            found,
            _cpu_advice(ev) if label == "cpu" else ["collate less: let the dataset batch (batch_size= on it)"],
        )
    if storage:
        return Verdict("storage", [*storage, _disk_or_network(ev)], ["workers hide a wait on storage"])
    return _unknown(ev, storage)


def _stage_note(ev: Evidence) -> str:
    known = {s: ms for s, ms in ev.stage_ms.items() if ms is not None}
    if not any(s != "collate" for s in known):
        return ""
    top = max(known, key=lambda s: ev.stage_busy.get(s) or 0.0)
    return f"; most of it in {top} ({known[top]:.2f} ms per sample)"


ONE_CORE = 1.3  # loader threads using at most this many cores between them: about one core's worth
IDLE_LEFT = 0.5  # ... while at least this many of the usable cores sat idle


def _one_core_note(ev: Evidence) -> str:
    """Thread mode: several loader threads that used about one core between them while cores sat idle
    (not taken by other programs either): what Python code holding the GIL does. Empty otherwise."""
    idle = ev.cores - ev.others - ev.main_cores
    if ev.threads < 2 or ev.cores < 2 or ev.main_cores > ONE_CORE or idle < IDLE_LEFT:
        return ""
    return (
        f"the {ev.threads} loader threads and the main thread used {ev.main_cores:.2f} cores of CPU between them "
        f"while {idle:.1f} of the {ev.cores} usable cores sat idle: about one core's worth, as Python code "
        "that holds the GIL runs in one thread at a time"
    )


def _cpu_advice(ev: Evidence) -> list[str]:
    if _one_core_note(ev):
        return [
            "worker processes (or the hybrid) run such code in parallel: loader threads help where the work "
            "releases the GIL (file and S3 reads, image decoding)"
        ]
    if ev.demand >= CORES_SATURATED * ev.cores or ev.workers >= ev.cores or ev.threads >= ev.cores:
        return ["the cores are the limit: cheaper decoding or transforms, smaller images, or more cores"]
    return ["cores are left: more workers would help"]


def _unknown(ev: Evidence, storage: list[str]) -> Verdict:
    fetch = ev.stage_busy.get("fetch")
    seen = [
        f"producers compute {_pct(ev.producer_busy)} of the time",
        f"fetch {_pct(fetch)} of it" if fetch is not None else "the dataset reports no stage times",
        f"D state in {_pct(ev.dstate)} of the looks",
        f"main process busy {_pct(ev.main_busy)}, receiving {_pct(ev.recv)}",
    ]
    if ev.step and ev.stall is not None:
        seen.append(f"the loop waits {_pct(ev.stall)} of the time, so the workers may be waiting for it")
    return Verdict(
        "unknown",
        ["no measurement shows where the time goes: " + "; ".join(seen)],
        ["run again without a step (step_time=0), or with --profile to see the stacks"],
    )


MAJORITY = 2 / 3  # of separate measurements of one setting, the share that must agree with the pooled label


def agree(labels: list[Label], pooled: Label, spread: float) -> tuple[bool, str]:
    """Whether separate measurements of one configuration (rounds, confirmations, a monitor's windows)
    back the label of their pooled figures: two thirds of them must give it.

    Args:
        labels (list[Label]): the label of each measurement.
        pooled (Label): the label of the pooled figures.
        spread (float): how far apart their throughputs were, (max - min) / median.

    Returns:
        (True, "") when they agree, else (False, the reason).
    """
    if not labels or labels.count(pooled) / len(labels) >= MAJORITY:
        return True, ""
    return False, f"{len(labels)} measurements said {', '.join(labels)}, with throughputs {spread:.0%} apart"


__all__ = [
    "LABELS",
    "ONE_CORE",
    "START_UP",
    "Label",
    "Verdict",
    "agree",
    "classify",
    "fetch_dominates",
    "fetch_wait",
    "storage_signs",
]
