"""What limits a loader, from evidence: the label rules, each verdict with the figures that decided it.

The rules read an :class:`Evidence`: what one configuration of a loader did over a window (a sweep's
point in ``fastdata bench``, or a monitor's window inside a training loop), in figures the probes of
:mod:`fastdata.core.system` measure. :func:`classify` returns a :class:`Verdict`: a :data:`Label`
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
  (:class:`fastdata.core.system.ThreadSampler`) find them off the CPU a third of the time they were not
  waiting for a core or more, and more than computing (waiting for a core left out: that is other programs'
  crowding), and say on what: the
  network or the disk (``storage``), a lock (``lock``), a sleep (``sleep``), another system call (``wait``,
  naming it); in thread mode a wait on a futex, likely the GIL, does not outweigh a busy core. The other
  signs of a wait on storage: block-I/O delay, threads seen in D state, and the time in ``fetch`` far above
  the CPU the producers use, this one only where no looks were made or they saw the network or the disk (a
  gzip HDF5 file decompressing in fetch on a crowded machine waits for a core as long, on no storage).
  Producers seen waiting for a core more than computing are starved of cores: ``cpu``, saying so.
* whatever the label, workers restarted at every epoch whose launch and set-up are 10% or more of the
  loop's wait for data: the advice names ``persistent_workers=True`` and that saving (``fork`` and
  ``worker-init`` also fire where epochs' first batches are half of a training loop's wait for data or more,
  below a third of its time).
* ``ipc``: the main process waits in the middle of receiving batches (the hand-over of each tensor's
  shared memory) while neither side computes.
* ``unknown``: none of the above, and the looks could not say either (none were made, or the producers
  were idle); the verdict says what was and was not seen.

``uncertain`` is for callers that compare several measurements of one configuration
(:func:`agree`): when they disagree beyond their noise, a confident label would be a guess.
"""

from __future__ import annotations

from fastdata.loading.observe.diagnose import _wording as say
from fastdata.loading.observe.diagnose._evidence import Evidence
from fastdata.loading.observe.diagnose._startup import persistent_advice, start_up
from fastdata.loading.observe.diagnose._verdict import (
    COMPUTING,
    CORES_SATURATED,
    LEADING,
    LOOKS_ENOUGH,
    MAIN_BUSY,
    MEMORY_NEAR,
    RECEIVE,
    RECEIVE_STEP,
    STALL_TARGET,
    Label,
    Verdict,
)
from fastdata.loading.observe.diagnose._waiting import (
    disk_or_network,
    fetch_dominates,
    more_concurrency,
    storage_signs,
    waiting,
    waits_verdict,
)


def _step(ev: Evidence, stall_target: float) -> Verdict | None:
    """The step sets the pace: the loop hardly waits, or (with producers apart from the loop) what it waits is
    receiving the batches, a small share of the loop, while the producers keep up."""
    if not ev.w.step:
        return None
    if ev.w.stall < stall_target:
        return Verdict(
            "step",
            [f"the training loop waits for data {ev.w.stall:.1%} of the time: the loader keeps up"],
            ["the step sets the pace: a faster loader would not train faster"],
        )
    apart = ev.workers or ev.ctx.threads
    if apart and ev.w.data_wait < stall_target and ev.w.main_busy < RECEIVE_STEP:
        return Verdict(
            "step",
            [
                f"the training loop waits for data {ev.w.stall:.1%} of the time, {ev.w.data_wait:.1%} of it for "
                f"{say.producers(ev)}: the rest ({max(0.0, ev.w.stall - ev.w.data_wait):.1%}) is the main process "
                "rebuilding the batches it receives, which every loader pays: the loader keeps up"
            ],
            [
                "the step sets the pace: a faster loader would not train faster (smaller batches to rebuild would, "
                "a little)"
            ],
        )
    if apart and ev.w.data_wait < stall_target:
        return Verdict(
            "main-process",
            [
                f"the main process spends {say.pct(ev.w.main_busy)} of the loop's time rebuilding the batches it "
                f"receives, while {say.producers(ev)} keep up (the loop waits for them {ev.w.data_wait:.1%} of the "
                "time)"
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
    """The label of one configuration's window, and its evidence (see the module docstring); where workers
    restart at every epoch and their launch and set-up are a measurable share of the loop's wait for data, the
    advice names ``persistent_workers=True`` with what it would save, whatever the label."""
    v = _classify(ev, stall_target)
    if v.label in ("memory", "fork", "worker-init", "step"):
        return v  # start-up verdicts say it themselves; a loop that keeps up has nothing to save
    persist = persistent_advice(ev)
    if persist is not None:
        v.advice.append(persist)
    return v


def _classify(ev: Evidence, stall_target: float) -> Verdict:
    if ev.ctx.memory and ev.w.pss >= MEMORY_NEAR * ev.ctx.memory:
        return Verdict(
            "memory",
            [
                f"the loader's processes hold {say.gib(ev.w.pss)} (PSS) of the {say.gib(ev.ctx.memory)} they may use "
                f"({say.pct(ev.w.pss / ev.ctx.memory)})"
            ],
            ["fewer workers or a smaller prefetch_factor; more risk the OOM killer"],
        )
    start = start_up(ev)
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
    recv, recv_cpu = ev.w.receiving
    # the main process is the limit when it is (nearly) always busy, or computes to receive most of the
    # time, or is busy most of the time receiving while the workers wait for it (a crowded machine
    # keeps it waiting for a core part of the time, below MAIN_BUSY)
    leading = ev.w.main_busy >= LEADING and recv >= RECEIVE / 2 and ev.w.per_worker_busy < COMPUTING
    if ev.w.main_busy >= MAIN_BUSY or recv_cpu + ev.w.pinning >= RECEIVE or leading:
        return Verdict(
            "main-process",
            [
                f"the main process is busy {say.pct(ev.w.main_busy)} of the time: rebuilding received batches "
                f"{say.pct(recv)} (computing {say.pct(recv_cpu)}), pinning {say.pct(ev.w.pinning)}; the workers "
                f"are busy {say.pct(ev.w.per_worker_busy)} of the time each"
            ],
            _receive_advice(),
        )
    # workers that mostly wait add up run-queue waits on a crowded machine without wanting the cores:
    # a worker computes when it alone is running or runnable half the time (and the looks at it agree)
    if ev.w.per_worker_busy >= COMPUTING and waits is None and not (storage and fetch_dominates(ev)):
        threads = say.threads_text({k: v / ev.workers for k, v in ev.w.worker_threads.items()})
        who = "the worker" if ev.workers == 1 else "each worker"
        found = [
            f"{who} {say.busy(ev.w.per_worker_busy, how=True)}; {say.need(ev)}"
            + (f"; per worker, threads {threads}" if threads else "")
            + _stage_note(ev)
        ]
        detail = say.breakdown(ev)
        if detail:
            found.append(detail)
        return Verdict("cpu", found, _cpu_advice(ev))
    if waits is not None:
        return waits_verdict(ev, waits)
    if storage:
        return Verdict("storage", [*storage, disk_or_network(ev)], [more_concurrency(ev)])
    if recv >= RECEIVE:
        return Verdict(
            "ipc",
            [
                f"the main process spends {say.pct(recv)} of its time receiving batches but computes "
                f"{say.pct(recv_cpu)} of it, and the workers are busy {say.pct(ev.w.per_worker_busy)}: it waits "
                "for the hand-over of each tensor"
            ],
            ["larger batches (fewer hand-overs), fewer tensors per batch, or loading in the main process"],
        )
    return _unknown(ev)


def _in_main_process(ev: Evidence, waits: tuple[str, float, float] | None) -> Verdict:
    """No workers: the main process makes every batch, with whatever threads it starts (in thread mode,
    its loader threads, each read from /proc/self/task)."""
    storage = storage_signs(ev) if waits is None else []
    busy = ev.main_process_busy if ev.ctx.threads else ev.w.main_producing
    # loader threads that keep a core busy and otherwise wait on a futex wait for the GIL: computing, in turn
    gil_wait = ev.ctx.threads > 0 and waits is not None and waits[0] == "lock"
    if busy >= MAIN_BUSY and (waits is None or gil_wait) and not (storage and fetch_dominates(ev)):
        helpers = say.threads_text(ev.w.main_threads)
        collate = ev.stage_ms.get("collate") or 0.0
        work = sum(ev.stage_ms.get(s) or 0.0 for s in ("fetch", "decode", "transform"))
        label: Label = "main-process" if collate > work else "cpu"
        if ev.ctx.threads:
            # loader threads collate too: the main process is the limit only when its main thread is
            label = "main-process" if ev.w.main_busy >= MAIN_BUSY else "cpu"
            found = [
                f"the main process uses {say.cores(ev.w.main_cores, ev.ctx.cores)} of the {ev.ctx.cores} cores "
                f"with its {ev.ctx.threads} loader threads (the main thread busy {say.pct(ev.w.main_busy)} of the time"
                + (f"; {helpers}" if helpers else "")
                + ")"
                + _stage_note(ev)
            ]
        else:
            how = f"is busy {busy:.0%} of the time it has for them" if busy <= 1 else f"wants {busy:.2f} cores"
            found = [
                f"the main process makes the batches itself and {how} (running, or waiting for a core; its "
                f"threads together), using {say.cores(ev.w.main_cores, ev.ctx.cores)} cores"
                + (f"; {helpers}" if helpers else "")
                + _stage_note(ev)
            ]
        gil = _one_core_note(ev)
        if gil:
            found.append(gil)
        advice = _cpu_advice(ev) if label == "cpu" else ["collate less: let the dataset batch (batch_size= on it)"]
        lock = ev.w.waits.get("lock", 0.0)
        if ev.ctx.threads and lock >= LOCK_SEEN:
            # a futex wait in a loader thread: the GIL, or a library lock held across the call (h5py holds one for
            # every call, decompression included); threads of one process share both, processes do not
            found.append(
                f"the loader threads wait on a lock {lock:.0%} of the time{say.calls(ev, 'lock')}: the GIL, or a "
                "library's lock that serialises its calls within a process (h5py's, a client's)"
            )
            advice = [
                "worker processes (fd.Loader(workers='processes'), or the hybrid) each have their own interpreter "
                "and library locks: loader threads share one",
                *advice,
            ]
        detail = say.breakdown(ev)
        if detail:
            found.append(detail)
        return Verdict(label, found, advice)
    if waits is not None:
        return waits_verdict(ev, waits)
    if storage:
        return Verdict("storage", [*storage, disk_or_network(ev)], ["workers hide a wait on storage"])
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
    idle = ev.ctx.cores - ev.w.others_cores - ev.w.main_cores
    if ev.ctx.threads < 2 or ev.ctx.cores < 2 or ev.w.main_cores > ONE_CORE or idle < IDLE_LEFT:
        return ""
    return (
        f"the {ev.ctx.threads} loader threads and the main thread used {ev.w.main_cores:.2f} cores of CPU between them "
        f"while {idle:.1f} of the {ev.ctx.cores} usable cores sat idle: about one core's worth, as Python code "
        "that holds the GIL runs in one thread at a time"
    )


LOCK_SEEN = 0.2  # loader threads seen waiting on a lock this share of their time: say so beside a cpu verdict
STARVED = 1 / 3  # producers waiting for a core this share of their time, more than computing: starved of cores


def _cpu_advice(ev: Evidence) -> list[str]:
    runq, computing = ev.w.waits.get("runq", 0.0), ev.w.waits.get("computing", 0.0)
    if ev.looked >= LOOKS_ENOUGH and runq >= STARVED and runq > computing:
        # the looks saw the producers runnable, not running: the machine's cores, not the loader's work or a wait
        return [
            f"{say.producers(ev)} wait for a core {runq:.0%} of the time and compute {computing:.0%}: other programs "
            f"used {ev.w.others_cores:.1f} of the {say.plural(ev.ctx.cores, 'core')}; the cores are the limit: free "
            "them (fewer other jobs, or fewer workers than cores for the training process), cheaper decoding, or "
            "more cores"
        ]
    if _one_core_note(ev):
        return [
            "worker processes (or the hybrid) run such code in parallel: loader threads help where the work "
            "releases the GIL (file and S3 reads, image decoding)"
        ]
    if ev.demand >= CORES_SATURATED * ev.ctx.cores or ev.workers >= ev.ctx.cores or ev.ctx.threads >= ev.ctx.cores:
        if ev.workers >= ev.ctx.cores and ev.demand < CORES_SATURATED * ev.ctx.cores:
            off = max(0.0, 1 - ev.w.per_worker_busy)
            seen = {k: v for k, v in ev.w.waits.items() if k not in ("computing", "runq")}
            top = max(seen, key=lambda k: seen[k]) if seen else ""
            what = f" ({say.WAIT_WORDS[top]} {seen[top]:.0%})" if top and seen[top] >= 0.05 else ""
            return [
                f"as many workers as cores ({ev.workers}), using {say.cores(ev.used, ev.ctx.cores)} of them: each "
                f"is off the CPU {off:.0%} of the time{what}, which more workers would not change; cheaper decoding or "
                "transforms help most"
            ]
        return ["the cores are the limit: cheaper decoding or transforms, smaller images, or more cores"]
    if ev.ctx.auto:
        return ["cores are left: num_workers='auto' tries more workers while the loop waits"]
    return ["cores are left: more workers would help"]


def _unknown(ev: Evidence) -> Verdict:
    fetch = ev.stage_busy.get("fetch")
    seen = [
        f"{say.producers(ev)} {'are' if say.producers(ev).endswith('s') else 'is'} busy "
        f"{say.pct(ev.producer_busy)} of the time",
        f"fetch {say.pct(fetch)} of it" if fetch is not None else "the dataset reports no stage times",
        f"D state in {say.pct(ev.w.dstate)} of the looks",
        f"main process busy {say.pct(ev.w.main_busy)}, receiving {say.pct(ev.w.receiving[0])}",
    ]
    detail = say.breakdown(ev)
    found = ["no measurement shows where the time goes: " + "; ".join(seen)]
    if detail:
        found.append(detail)
    elif not ev.looked:
        found.append("no look at the producers' threads was made (they may have been too short-lived to see)")
    if ev.ctx.where != "bench":
        advice = ["see where the time goes in the workers' stacks: py-spy dump --pid <a worker's pid>"]
    elif ev.w.step:
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


__all__ = ["IDLE_LEFT", "LOCK_SEEN", "MAJORITY", "ONE_CORE", "STARVED", "agree", "classify"]
