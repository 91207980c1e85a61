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
* ``step``: with a training step, the loop waits for data less than the target (5%) of the time; or,
  with workers, what it waits is the main process rebuilding the batches it receives (a share of the loop
  every loader pays, under a quarter of it) while the producers keep up: the step sets the pace.
* ``main-process``: the main process is busy (its main thread running or waiting for a core) 80% or
  more of the loop's time, or computes to rebuild and pin batches half of it, or with a step a quarter of
  the loop while the workers keep up: collate, unpickle, pin.
* ``cpu`` (decode/CPU): the producing processes compute: each worker running or runnable (every thread
  of it counted: a decoder's helper thread too) half the time or more; with no workers, the main
  process with its helper threads 0.8 cores' worth of the time it has between steps. Unless the looks at
  the producers show them waiting (off the CPU) more than computing.
* ``storage``, ``lock``, ``sleep``, ``wait`` (waiting producers): the looks at the producers' threads
  (:class:`fastdata.core._proc.ThreadSampler`) find them off the CPU a third of the time or more, and more
  than computing (waiting for a core left out: that is other programs' crowding), and say on what: the
  network or the disk (``storage``), a lock (``lock``), a sleep (``sleep``), another system call (``wait``,
  naming it); in thread mode a wait on a futex, likely the GIL, does not outweigh a busy core. Without
  looks (a hand-made window), the older signs of a wait on storage: the time in ``fetch`` far above the CPU
  the producers use, block-I/O delay, threads seen in D state.
* ``ipc``: the main process waits in the middle of receiving batches (the hand-over of each tensor's
  shared memory) while neither side computes.
* ``unknown``: none of the above, and the looks could not say either (none were made, or the producers
  were idle); the verdict says what was and was not seen.

``uncertain`` is for callers that compare several measurements of one configuration
(:func:`agree`): when they disagree beyond their noise, a confident label would be a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from fastdata.loading.observe import _wording as say
from fastdata.loading.observe._evidence import Evidence
from fastdata.loading.observe._stage_table import StartSplit

Label = Literal[
    "storage",
    "lock",
    "sleep",
    "wait",
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
WAITING_LABELS: tuple[Label, ...] = ("storage", "lock", "sleep", "wait")  # producers that mostly wait off-CPU

MEMORY_NEAR = 0.8  # PSS of the loader's processes against the memory they may use
START_BOUND = 0.3  # share of the time spent waiting for epochs' first batches: start-up is the limit
START_PART = 0.45  # ... and the share of that wait its largest part must take to name it
STALL_TARGET = 0.05  # with a step: the loop waits less than this share of the time: the step is the limit
MAIN_BUSY = 0.8  # main thread running or runnable this much of the time: the main process is the limit
RECEIVE = 0.5  # ... or computing to rebuild and pin batches this much of the time
RECEIVE_STEP = 0.25  # ... or, with a step the workers keep up with, receiving this share of the loop
LEADING = 0.6  # ... or busy this much, receiving a quarter of it, while every worker waits
COMPUTING = 0.5  # a producer running or runnable this much of the time computes (it is not waiting)
CORES_SATURATED = 0.85  # the loader's demand for cores, against the usable cores
FETCH_WAIT = 0.3  # time in fetch minus CPU used, as a share of a producer's time: it waits on storage
BLOCKED = 0.1  # share of time in block-I/O delay, or of looks finding a thread in D state: a disk wait
OFF_CPU = ("network", "disk", "lock", "sleep", "other")  # the kinds of wait of Window.waits a producer is blocked in
WAITS = 1 / 3  # producers off the CPU this share of their time (and more than computing): they wait
LOOKS_ENOUGH = 12  # looks at the producers before their breakdown may decide
KIND_LABEL: dict[str, Label] = {
    "network": "storage",
    "disk": "storage",
    "lock": "lock",
    "sleep": "sleep",
    "other": "wait",
}


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


def waiting(ev: Evidence) -> tuple[str, float, float] | None:
    """What the producers wait on, when the looks at them say they mostly wait off the CPU: ``(kind, its
    share, the share of every off-CPU wait)``; None when they do not, or too few looks were made."""
    if ev.looked < LOOKS_ENOUGH or not ev.waits:
        return None
    off = sum(ev.waits.get(k, 0.0) for k in OFF_CPU)
    # against computing alone: waiting for a core is the machine's crowding (another program's), not work
    # the producer has to do; a CPU-bound producer on a crowded machine still waits off the CPU for nothing
    if off < WAITS or off <= ev.waits.get("computing", 0.0):
        return None
    top = max(OFF_CPU, key=lambda k: ev.waits.get(k, 0.0))
    return top, ev.waits.get(top, 0.0), off


def storage_signs(ev: Evidence) -> list[str]:
    """The measurements that show a wait on storage without looks at the threads (empty when none does)."""
    signs = []
    wait = fetch_wait(ev)
    who = "each worker" if ev.workers else "each loader thread" if ev.threads else "the main process"
    if wait >= FETCH_WAIT:
        fetch_ms = ev.stage_ms.get("fetch")
        ms = f" ({fetch_ms:.2f} ms per sample)" if fetch_ms is not None else ""
        fetch = ev.stage_busy.get("fetch") or 0.0
        spent = f"{fetch:.0%} of its time" if fetch <= 1 else f"{fetch:.2f} cores' worth of time (its threads together)"
        signs.append(
            f"{who} spends {spent} in fetch{ms} but uses only {ev.producer_cpu:.2f} cores of CPU, every thread "
            "counted: it waits for bytes"
        )
    if ev.blkio >= BLOCKED:
        signs.append(f"block-I/O delay {say.pct(ev.blkio)} of the time (the kernel's delay accounting)")
    if ev.dstate >= BLOCKED:
        signs.append(f"a loader thread was in uninterruptible sleep (D state) in {say.pct(ev.dstate)} of the looks")
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


def _more_concurrency(ev: Evidence) -> str:
    """The advice for producers that wait: more of them overlap the waits, past the core count."""
    if ev.auto:
        return "num_workers='auto' adds workers past the core count while they wait and throughput rises"
    threads = "; or loader threads (fd.Loader(workers='threads')), lighter than processes" if ev.workers else ""
    return (
        f"the waits overlap: more workers, past the {ev.cores} cores (they mostly wait), or a larger "
        f"prefetch_factor{threads}"
    )


def _waits_verdict(ev: Evidence, found: tuple[str, float, float]) -> Verdict:
    kind, share, off = found
    label = KIND_LABEL[kind]
    who = say.producers(ev)
    verb = "are" if who.endswith("s") else "is"
    first = f"{who} {verb} {say.WAIT_WORDS[kind]} {share:.0%} of the time{say.calls(ev, kind)}"
    if off - share >= 0.1:
        first += f", off the CPU {off:.0%} in all"
    found_text = [first]
    detail = say.breakdown(ev)
    if detail:
        found_text.append(detail)
    advice = [_more_concurrency(ev)]
    if kind in ("network", "disk"):
        found_text.append(_disk_or_network(ev) if kind == "disk" else _network_note(ev))
    elif kind == "lock":
        advice = [
            "a lock held by another thread of the same process serialises the reads (a client library's "
            "connection lock, a logging handler, a cache's lock): worker processes each hold their own, loader "
            "threads share one, so more threads will not help; find who holds it (--profile shows the stacks)"
            if ev.where == "bench"
            else "a lock held by another thread of the same process serialises the reads: worker processes each "
            "hold their own, loader threads share one; find who holds it (fastdata bench --profile)"
        ]
    elif kind == "sleep":
        advice = [
            "the dataset sleeps (time.sleep, a rate limit, a retry's back-off): "
            + _more_concurrency(ev)
            + ", or make it sleep less"
        ]
    return Verdict(label, found_text, advice)


def _network_note(ev: Evidence) -> str:
    return (
        f"{ev.device_mb_s:.1f} MB/s from the device, {ev.read_mb_s:.1f} MB/s read through any call: the wait is "
        "the round trip to a server (an object store, a database, an HTTP service), not the bytes"
    )


def _start_up(ev: Evidence) -> Verdict | None:
    split = ev.start
    if split is None or ev.epoch_start < START_BOUND or split.total <= 0:
        return None
    part, secs = split.largest()
    if secs < START_PART * split.total:
        return None  # no part stands out: the wait is the pipeline's own latency, not one start-up cost
    share = (
        f"{say.pct(ev.epoch_start)} of the time goes to waiting for epochs' first batches ({split.total:.2f} s each)"
    )
    parts = ", ".join(f"{p} {getattr(split, p):.2f} s" for p in StartSplit.PARTS)
    if part == "launch" and ev.threads:
        return None  # no process is launched in thread mode: no "fork" verdict from a thread's start
    if part == "launch":
        forked = ev.start_method == "fork"
        how = (
            f"fork copies the page tables of the {say.gib(ev.parent_rss)} parent"
            if forked
            else f"{ev.start_method} starts a fresh interpreter that imports torch and unpickles the dataset"
        )
        advice = (
            "persistent_workers=True starts them once; or start the loader before the parent grows "
            "(a smaller parent forks faster), or use fewer workers"
            if forked
            else "persistent_workers=True starts them once; or fewer workers, or a lighter dataset to pickle "
            "(open files and clients lazily, in the worker)"
        )
        return Verdict(
            "fork",
            [f"{share}; starting the worker processes takes {secs:.2f} s of it ({how}); split: {parts}"],
            [advice],
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


def _step(ev: Evidence, stall_target: float) -> Verdict | None:
    """The step sets the pace: the loop hardly waits, or (with producers apart from the loop) what it waits is
    receiving the batches, a small share of the loop, while the producers keep up."""
    if not ev.step or ev.stall is None:
        return None
    if ev.stall < stall_target:
        return Verdict(
            "step",
            [f"the training loop waits for data {ev.stall:.1%} of the time: the loader keeps up"],
            ["the step sets the pace: a faster loader would not train faster"],
        )
    apart = ev.workers or ev.threads
    if apart and ev.data_wait < stall_target and ev.main_busy < RECEIVE_STEP:
        return Verdict(
            "step",
            [
                f"the training loop waits for data {ev.stall:.1%} of the time, {ev.data_wait:.1%} of it for "
                f"{say.producers(ev)}: the rest ({max(0.0, ev.stall - ev.data_wait):.1%}) is the main process "
                "rebuilding the batches it receives, which every loader pays: the loader keeps up"
            ],
            [
                "the step sets the pace: a faster loader would not train faster (smaller batches to rebuild would, "
                "a little)"
            ],
        )
    if apart and ev.data_wait < stall_target:
        return Verdict(
            "main-process",
            [
                f"the main process spends {say.pct(ev.main_busy)} of the loop's time rebuilding the batches it "
                f"receives, while {say.producers(ev)} keep up (the loop waits for them {ev.data_wait:.1%} of the time)"
            ],
            _receive_advice(),
        )
    return None


def _receive_advice() -> list[str]:
    return [
        "return tensors or numpy arrays (they travel through shared memory) rather than Python lists and dicts; "
        "fewer, larger batches; decode later, on the GPU"
    ]


def classify(ev: Evidence, stall_target: float = STALL_TARGET) -> Verdict:
    """The label of one configuration's window, and its evidence (see the module docstring)."""
    if ev.memory and ev.pss >= MEMORY_NEAR * ev.memory:
        return Verdict(
            "memory",
            [
                f"the loader's processes hold {say.gib(ev.pss)} (PSS) of the {say.gib(ev.memory)} they may use "
                f"({say.pct(ev.pss / ev.memory)})"
            ],
            ["fewer workers or a smaller prefetch_factor; more risk the OOM killer"],
        )
    start = _start_up(ev)
    if start is not None:
        return start
    step = _step(ev, stall_target)
    if step is not None:
        return step
    waits = waiting(ev)
    if ev.workers:
        return _with_workers(ev, waits)
    return _in_main_process(ev, waits)


def _with_workers(ev: Evidence, waits: tuple[str, float, float] | None) -> Verdict:
    storage = storage_signs(ev) if waits is None else []
    # the main process is the limit when it is (nearly) always busy, or computes to receive most of the
    # time, or is busy most of the time receiving while the workers wait for it (a crowded machine
    # keeps it waiting for a core part of the time, below MAIN_BUSY)
    leading = ev.main_busy >= LEADING and ev.recv >= RECEIVE / 2 and ev.per_worker_busy < COMPUTING
    if ev.main_busy >= MAIN_BUSY or ev.recv_cpu + ev.pin >= RECEIVE or leading:
        return Verdict(
            "main-process",
            [
                f"the main process is busy {say.pct(ev.main_busy)} of the time: rebuilding received batches "
                f"{say.pct(ev.recv)} (computing {say.pct(ev.recv_cpu)}), pinning {say.pct(ev.pin)}; the workers "
                f"are busy {say.pct(ev.per_worker_busy)} of the time each"
            ],
            _receive_advice(),
        )
    # workers that mostly wait add up run-queue waits on a crowded machine without wanting the cores:
    # a worker computes when it alone is running or runnable half the time (and the looks at it agree)
    if ev.per_worker_busy >= COMPUTING and waits is None and not (storage and fetch_dominates(ev)):
        threads = say.threads_text({k: v / ev.workers for k, v in ev.worker_threads.items()})
        who = "the worker" if ev.workers == 1 else "each worker"
        found = [
            f"{who} is {say.busy(ev.per_worker_busy)} (running, or waiting for a core); {say.need(ev)}"
            + (f"; per worker, threads {threads}" if threads else "")
            + _stage_note(ev)
        ]
        detail = say.breakdown(ev)
        if detail:
            found.append(detail)
        return Verdict("cpu", found, _cpu_advice(ev))
    if waits is not None:
        return _waits_verdict(ev, waits)
    if storage:
        return Verdict("storage", [*storage, _disk_or_network(ev)], [_more_concurrency(ev)])
    if ev.recv >= RECEIVE:
        return Verdict(
            "ipc",
            [
                f"the main process spends {say.pct(ev.recv)} of its time receiving batches but computes "
                f"{say.pct(ev.recv_cpu)} of it, and the workers are busy {say.pct(ev.per_worker_busy)}: it waits "
                "for the hand-over of each tensor"
            ],
            ["larger batches (fewer hand-overs), fewer tensors per batch, or loading in the main process"],
        )
    return _unknown(ev)


def _in_main_process(ev: Evidence, waits: tuple[str, float, float] | None) -> Verdict:
    """No workers: the main process makes every batch, with whatever threads it starts (in thread mode,
    its loader threads, each read from /proc/self/task)."""
    storage = storage_signs(ev) if waits is None else []
    busy = ev.main_process_busy if ev.threads else ev.main_producing
    # loader threads that keep a core busy and otherwise wait on a futex wait for the GIL: computing, in turn
    gil_wait = ev.threads > 0 and waits is not None and waits[0] == "lock"
    if busy >= MAIN_BUSY and (waits is None or gil_wait) and not (storage and fetch_dominates(ev)):
        helpers = say.threads_text(ev.main_threads)
        collate = ev.stage_ms.get("collate") or 0.0
        work = sum(ev.stage_ms.get(s) or 0.0 for s in ("fetch", "decode", "transform"))
        label: Label = "main-process" if collate > work else "cpu"
        if ev.threads:
            # loader threads collate too: the main process is the limit only when its main thread is
            label = "main-process" if ev.main_busy >= MAIN_BUSY else "cpu"
            found = [
                f"the main process uses {say.cores(ev.main_cores, ev.cores)} of the {ev.cores} cores with its "
                f"{ev.threads} loader threads (the main thread busy {say.pct(ev.main_busy)} of the time"
                + (f"; {helpers}" if helpers else "")
                + ")"
                + _stage_note(ev)
            ]
        else:
            how = f"is busy {busy:.0%} of the time it has for them" if busy <= 1 else f"keeps {busy:.2f} cores busy"
            found = [
                f"the main process makes the batches itself and {how} (running, or waiting for a core; its "
                f"threads together), using {say.cores(ev.main_cores, ev.cores)} cores"
                + (f"; {helpers}" if helpers else "")
                + _stage_note(ev)
            ]
        gil = _one_core_note(ev)
        if gil:
            found.append(gil)
        detail = say.breakdown(ev)
        if detail:
            found.append(detail)
        return Verdict(
            label,
            found,
            _cpu_advice(ev) if label == "cpu" else ["collate less: let the dataset batch (batch_size= on it)"],
        )
    if waits is not None:
        return _waits_verdict(ev, waits)
    if storage:
        return Verdict("storage", [*storage, _disk_or_network(ev)], ["workers hide a wait on storage"])
    return _unknown(ev)


def _stage_note(ev: Evidence) -> str:
    known = {s: ms for s, ms in ev.stage_ms.items() if ms is not None}
    if not any(s != "collate" for s in known):
        return ""
    top = max(known, key=lambda s: ev.stage_busy.get(s) or 0.0)
    if top == "fetch":
        # busy in fetch: the CPU side of reading (parsing, copying, a client library), not a wait
        return f"; most of the CPU goes to fetch ({known[top]:.2f} ms per sample: parsing and copying what is read)"
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
        if ev.workers >= ev.cores and ev.demand < CORES_SATURATED * ev.cores:
            off = max(0.0, 1 - ev.per_worker_busy)
            seen = {k: v for k, v in ev.waits.items() if k not in ("computing", "runq")}
            top = max(seen, key=lambda k: seen[k]) if seen else ""
            what = f" ({say.WAIT_WORDS[top]} {seen[top]:.0%})" if top and seen[top] >= 0.05 else ""
            return [
                f"as many workers as cores ({ev.workers}), using {say.cores(ev.demand, ev.cores)} of them: each is off "
                f"the CPU {off:.0%} of the time{what}, which more workers would not change; cheaper decoding or "
                "transforms help most"
            ]
        return ["the cores are the limit: cheaper decoding or transforms, smaller images, or more cores"]
    if ev.auto:
        return ["cores are left: num_workers='auto' tries more workers while the loop waits"]
    return ["cores are left: more workers would help"]


def _unknown(ev: Evidence) -> Verdict:
    fetch = ev.stage_busy.get("fetch")
    seen = [
        f"{say.producers(ev)} {'are' if say.producers(ev).endswith('s') else 'is'} busy "
        f"{say.pct(ev.producer_busy)} of the time",
        f"fetch {say.pct(fetch)} of it" if fetch is not None else "the dataset reports no stage times",
        f"D state in {say.pct(ev.dstate)} of the looks",
        f"main process busy {say.pct(ev.main_busy)}, receiving {say.pct(ev.recv)}",
    ]
    detail = say.breakdown(ev)
    found = ["no measurement shows where the time goes: " + "; ".join(seen)]
    if detail:
        found.append(detail)
    elif not ev.looked:
        found.append("no look at the producers' threads was made (they may have been too short-lived to see)")
    if ev.where != "bench":
        advice = ["run fastdata bench on this dataset with --profile to see the stacks"]
    elif ev.step:
        advice = ["run again without a step (--step-ms 0) to see the loader alone, or with --profile to see the stacks"]
    else:
        advice = ["run again with --profile to see the stacks"]
    return Verdict("unknown", found, advice)


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
    "WAITING_LABELS",
    "Label",
    "Verdict",
    "agree",
    "classify",
    "fetch_dominates",
    "fetch_wait",
    "storage_signs",
    "waiting",
]
