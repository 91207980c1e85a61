"""What limits a loader, in plain words, from what a sweep measured.

Each point's label comes from the library's rules (:func:`fastdata.loading.observe.diagnose.classify`) over
the point's :func:`evidence`; the same rules label a training loop's windows. This module adds what only
a sweep can see, in order:

* ``memory``: a point died (the OOM killer) or held 80% of the usable memory.
* ``step``: with a step time, the recommended point keeps the stall under the target.
* ``ipc``: no workers is fastest while the main process computes all the time, and with workers the
  main process is seen busy receiving: items are so cheap that moving them between processes costs
  more than making them.
* ``uncertain``: the best point's separate measurements (rounds, confirmations) got different labels,
  and fewer than two thirds of them agree with the label of the pooled figures.
* otherwise the best point's own label, with its evidence.

Beside the label: the rule-of-thumb checks users know (:func:`checks`) and the estimate
``min(cores, data time per batch / step time)`` (:func:`estimate`), printed beside the measured answer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fastdata.bench._result import Point, SweepResult
from fastdata.core.stages import STAGES
from fastdata.loading import observe
from fastdata.loading.observe.diagnose import (
    COMPUTING,
    CORES_SATURATED,
    MAIN_BUSY,
    MEMORY_NEAR,
    WAITING_LABELS,
    Context,
    Evidence,
    Label,
    Verdict,
    agree,
    storage_signs,
    waiting,
)
from fastdata.loading.observe.measure import StartSplit

STARTUP_NOTE = 0.05  # start-up against one epoch's time: worth persistent workers
TRANSFER_BUSY = 0.4  # with workers, the main process busy this much (or receiving half of it): moving costs
NOISY = 0.5  # windows' spread, (max - min) / median, beyond which a 5% comparison is guesswork

HEADLINE: dict[str, str] = {
    "storage": "Storage-bound",
    "lock": "Waiting on a lock",
    "sleep": "Sleep-bound (the dataset sleeps)",
    "wait": "Waiting (off the CPU)",
    "cpu": "CPU-bound",  # the evidence says where: "most of it in decode" (or fetch, transform ...)
    "main-process": "Main-process-bound",
    "ipc": "Transfer-bound",
    "fork": "Start-up-bound (starting the worker processes)",
    "worker-init": "Start-up-bound (the workers' set-up)",
    "shuffle-fill": "Start-up-bound (filling the shuffle buffer)",
    "memory": "Memory-bound",
    "step": "The training step is the bottleneck; the loader keeps up",
    "uncertain": "Uncertain",
    "unknown": "Unknown",
}


def cores_saturated(p: Point, cores: int) -> bool:
    """The loader alone wants (nearly) every usable core, its workers computing (not waiting)."""
    computing = not p.config.processes or p.window.per_worker_busy >= COMPUTING
    return computing and p.demand >= CORES_SATURATED * cores


def oversubscribed(p: Point, cores: int) -> bool:
    """More workers than cores, all computing, wanting every core between them: any gain over ``cores``
    workers is CPU taken from other programs (the training process, on a real job), not loader speed."""
    return (
        p.config.processes > cores
        and p.window.per_worker_busy >= COMPUTING
        and sum(p.window.worker_busy) >= CORES_SATURATED * cores
    )


def startup_share(result: SweepResult, p: Point) -> float | None:
    """Start-up time against one epoch's steady-state time, when the epoch length is known."""
    if not result.epoch_samples or not p.samples_per_s:
        return None
    epoch_s = result.epoch_samples / p.samples_per_s
    return p.startup_s / epoch_s if epoch_s > 0 else None


def memory_budget(result: SweepResult) -> float | None:
    """Bytes the loader may use: the sweep's ``memory`` setting, else the usable memory."""
    given = result.settings.get("memory")
    return float(given) if given else result.usable_memory


def context(p: Point, result: SweepResult) -> Context:
    """What the label rules need beside one point's window."""
    split = p.restart_split or p.start_split
    first_wait = None
    if not p.window.first_wait_s and result.epoch_samples and p.samples_per_s:
        # the windows hold no epoch's first wait (none ended while measuring, or between two windows): the
        # first batch's wait against an epoch's time, predicted, from a later epoch's restart where one was timed
        epoch_s = result.epoch_samples / p.samples_per_s
        startup = p.restart_s if p.restart_s is not None else p.startup_s
        first_wait = startup / (startup + epoch_s)
    return Context(
        cores=result.usable_cores,
        # loader threads are threads of the main process: their CPU is in its figures, read per thread
        threads=p.config.num_workers if p.config.mode == "threads" else 0,
        memory=memory_budget(result),
        start=StartSplit(**split) if split else None,
        start_method=str(result.settings.get("multiprocessing_context") or "fork"),
        parent_rss=p.parent_rss,
        blkio_known=p.blkio_known,
        first_wait=first_wait,
        stage_totals=p.stage_totals,
        persistent=bool(p.config.persistent_workers),
    )


def evidence(p: Point, result: SweepResult) -> Evidence:
    """The figures the label rules read, from one point of a sweep: the library's one builder over the
    point's pooled window (:func:`fastdata.loading.observe.diagnose.evidence`)."""
    return observe.evidence(p.window, context(p, result))


def verdict(p: Point, result: SweepResult, stall_target: float = 0.05) -> Verdict:
    """The label of one point, and its evidence."""
    if not p.ok:
        return Verdict("unknown", [f"{p.config.label()} failed: {p.error}"])
    return observe.classify(evidence(p, result), stall_target)


def label(p: Point, result: SweepResult, stall_target: float = 0.05) -> Label:
    """The table's label of one point."""
    return verdict(p, result, stall_target).label


DIED = re.compile(r"\b(killed|memory|oom|signal)\b")  # whole words: "boom" is no OOM


def _died(result: SweepResult) -> list[Point]:
    return [p for p in result.points if p.error and DIED.search(p.error.lower())]


def _heavy(result: SweepResult) -> Point | None:
    mem = memory_budget(result)
    if not mem:
        return None
    heavy = [p for p in result.ok_points() if p.window.pss >= MEMORY_NEAR * mem]
    return min(heavy, key=lambda p: p.config.cost()) if heavy else None


def _growth(result: SweepResult, p: Point) -> str:
    """How throughput changed from the next smaller worker count to ``p``'s (same other settings)."""
    same = [
        q
        for q in result.ok_points()
        if q.config.series() == p.config.series() and q.config.num_workers < p.config.num_workers
    ]
    if not same:
        return ""
    prev = max(same, key=lambda q: q.config.num_workers)
    if not prev.samples_per_s:
        return ""
    return (
        f"Throughput went {p.samples_per_s / prev.samples_per_s:.2f}x from {prev.config.describe()} "
        f"to {p.config.describe()}."
    )


def _stage_text(p: Point) -> str:
    known = {s: ms for s, ms in p.stage_ms.items() if ms is not None and s != "collate"}
    if not known:
        return "stage times are unknown (the dataset does not report them; see 'Stage probes' in docs/bench.md)"
    parts = [f"{s} {ms:.2f} ms" for s, ms in p.stage_ms.items() if ms is not None]
    return "per sample: " + ", ".join(parts)


def _main_collate_note(result: SweepResult) -> list[str]:
    """Collating in the main process (no workers) much slower than in workers: torch's intra-op threads
    stall when another program holds a core (workers run torch with one thread)."""
    threads = int(result.settings.get("main_threads") or result.machine.get("torch_threads") or 1)
    mains = [p for p in result.ok_points() if not p.config.num_workers and p.stage_ms.get("collate")]
    workers = [
        float(p.stage_ms["collate"] or 0.0)
        for p in result.ok_points()
        if p.config.processes and p.stage_ms.get("collate")
    ]
    if threads <= 1 or not mains or not workers:
        return []
    main_ms = float(mains[0].stage_ms["collate"] or 0.0)
    worker_ms = sorted(workers)[len(workers) // 2]
    if worker_ms <= 0 or main_ms < 3 * worker_ms:
        return []
    return [
        f"Collating with no workers takes {main_ms:.2f} ms per sample against {worker_ms:.2f} in the workers: the "
        f"main process runs torch with {threads} threads, which stall when another program holds a core. "
        "torch.set_num_threads(1) in the main process (or --main-threads 1) may make no workers much faster."
    ]


@dataclass
class Diagnosis:
    """The headline, its evidence, and the notes around it.

    Attributes:
        label (Label): what limits the loader.
        evidence (list[str]): the measurements behind the label.
        advice (list[str]): what to do about it.
        notes (list[str]): other findings (noise, other programs, stages, start-up ...).
        point (Point | None): the point the label was read from.
    """

    label: Label
    evidence: list[str]
    advice: list[str]
    notes: list[str]
    point: Point | None = None

    def sentences(self) -> list[str]:
        head = f"{HEADLINE[self.label]}: {self.evidence[0]}." if self.evidence else f"{HEADLINE[self.label]}."
        out = [head, *(e[0].upper() + e[1:] + ("" if e.endswith(".") else ".") for e in self.evidence[1:])]
        out += [a[0].upper() + a[1:] + ("" if a.endswith(".") else ".") for a in self.advice]
        return out + self.notes


def diagnose(result: SweepResult, rec: Point, best: Point, *, stall_target: float = 0.05) -> Diagnosis:
    """The headline bottleneck, its evidence and the notes (see the module docstring)."""
    notes = _notes(result, rec, best, stall_target)
    died = _died(result)
    heavy = _heavy(result)
    if heavy is not None or died:
        v = verdict(heavy, result, stall_target) if heavy is not None else Verdict("memory", [])
        ev = v.evidence if v.label == "memory" else []
        ev = [f"at {heavy.config.describe()} {ev[0]}" if ev and heavy else "", *ev[1:]]
        ev = [e for e in ev if e] + [f"{p.config.label()} failed: {p.error}" for p in died]
        return Diagnosis("memory", ev, ["fewer workers or a smaller prefetch_factor"], notes, heavy)
    if result.step_time and rec.stall is not None and rec.stall < stall_target:
        v = verdict(rec, result, stall_target)
        text = (
            f"with {rec.config.describe()} the training loop waits for data {rec.stall:.1%} of the "
            f"time with {step_words(result.settings)}"
        )
        return Diagnosis("step", [text], ["a faster loader would not train faster"], notes, rec)
    with_workers = [p for p in result.ok_points() if p.config.processes]  # batches sent between processes
    if rec.config.num_workers == 0 and with_workers and not result.step_time:
        top = max(with_workers, key=lambda p: p.samples_per_s)
        seen = evidence(rec, result)
        waits = storage_signs(seen) or waiting(seen)  # a slow store: the verdict is storage, not transfer
        # and with workers, receiving must be seen to cost: the main process busy, or rebuilding batches
        # (a decode-heavy loader that measured fastest with no workers on a crowded machine is not "ipc")
        moving = (
            top.window.main_busy >= TRANSFER_BUSY or top.window.receiving[0] + top.window.pinning >= TRANSFER_BUSY / 2
        )
        computing = rec.window.main_process_busy >= MAIN_BUSY
        if top.samples_per_s < rec.samples_per_s and computing and moving and not waits:
            text = (
                f"items are so cheap that sending them between processes costs more than making them: no "
                f"workers gives {rec.samples_per_s:,.0f} samples/s with the main process computing "
                f"{rec.window.main_process_busy:.0%} of the time; the best with workers gives "
                f"{top.samples_per_s:,.0f} ({top.config.describe()}, the main process receiving "
                f"{top.window.receiving[0]:.0%} of the time)"
            )
            advice = "load in the main process, or do more work per item (decode, augment) before workers pay off"
            return Diagnosis("ipc", [text], [advice], notes, rec)
    if len(best.round_labels) > 1:
        pooled = verdict(best, result, stall_target)
        ok, why = agree(best.round_labels, pooled.label, best.spread)  # type: ignore[arg-type]
        if not ok:
            # the separate measurements disagree and the pooled figures do not side with a clear majority
            why = f"at {best.config.label()}, {why}"
            return Diagnosis(
                "uncertain",
                [why, f"pooled, the figures say {pooled.label}: {pooled.evidence[0] if pooled.evidence else ''}"],
                ["measure longer (--seconds) or more rounds (--rounds 3) on a quieter machine"],
                notes,
                best,
            )
    v = verdict(best, result, stall_target)
    extra = []
    same_mode = [p for p in result.ok_points() if p.config.mode == best.config.mode and p.config.num_workers]
    largest = max(p.config.num_workers for p in same_mode or [best])
    cores = result.usable_cores
    computing_room = best.config.processes < cores and not cores_saturated(best, cores)
    room = v.label in WAITING_LABELS or (v.label == "cpu" and computing_room)
    if best.config.mode == "threads" and v.label == "cpu":
        room = False  # threads that compute share one interpreter: more of them is no measured promise
    if room and best.config.num_workers == largest and largest:
        w = best.config.num_workers
        flag = "--threads" if best.config.mode == "threads" else "--workers"
        extra.append(
            f"{best.config.describe()} is the most tested and still the best: try more ({flag} {w},{2 * w},{4 * w})"
        )
    todo = list(v.advice)
    if v.label == "cpu" and any("more workers would help" in a for a in todo):
        larger = [p for p in same_mode if p.config.num_workers > best.config.num_workers]
        if larger:
            # the probes say cores are left, but the sweep measured more workers and they were no faster
            top = max(larger, key=lambda p: p.samples_per_s)
            others = best.window.others_cores
            todo = [
                f"cores looked free, but {top.config.label()} measured no faster "
                f"({top.samples_per_s:,.0f} against {best.samples_per_s:,.0f} samples/s): other programs held "
                f"{others:.1f} of the {result.usable_cores} cores; on an idle machine more workers may help"
            ]
    growth = _growth(result, best)
    if v.label == "step":
        # one story: the step sets the pace, so no note that the training will wait for data
        notes = [n for n in notes if not n.startswith("No configuration keeps the stall")]
    return Diagnosis(v.label, v.evidence + ([growth] if growth else []), todo + extra, notes, best)


def _notes(result: SweepResult, rec: Point, best: Point, stall_target: float) -> list[str]:
    out: list[str] = list(_main_collate_note(result))
    noisy = max(rec.spread, best.spread)
    if noisy > NOISY and int(result.settings.get("rounds") or 1) < 3:
        out.append(
            f"The measurements were noisy (windows up to {noisy:.0%} apart): run with --rounds 3 "
            "(sweep(rounds=3)) for a steadier answer."
        )
    cores = result.usable_cores
    others = best.window.others_cores
    if others >= 0.25 * cores:
        out.append(
            f"Other programs used about {others:.1f} of the {cores} cores while this ran: figures are "
            "noisier and lower than on an idle machine."
        )
    if best.stage_ms.get("fetch") is None:
        out.append(f"Stages: {_stage_text(best)}.")
    share = startup_share(result, rec)
    measured_persistent = any(p.config.persistent_workers for p in result.ok_points())
    if share is not None and share >= STARTUP_NOTE and rec.config.processes and not rec.config.persistent_workers:
        out.append(_startup_note(result, rec, share, measured_persistent))
    if result.step_time and rec.stall is not None and rec.stall >= stall_target:
        stalls = [p.stall for p in result.ok_points() if p.stall is not None]
        if stalls and min(stalls) >= stall_target:
            out.append(
                f"No configuration keeps the stall under {stall_target:.0%} (best {min(stalls):.0%}): "
                f"the {'training loop' if result.settings.get('step_cpu') else 'GPU'} will wait for data; the "
                "recommendation is the fastest loader."
            )
    return out


def _startup_note(result: SweepResult, rec: Point, share: float, measured: bool) -> str:
    """The first batch's wait, and the part of it persistent workers would save: launching the workers and
    their set-up, never the first batch's own reading (a persistent worker reads it at every epoch too)."""
    split = rec.restart_split or rec.start_split
    first = f"The first batch of an epoch takes {rec.startup_s:.2f} s, {share:.0%} of an epoch"
    if split:
        s = StartSplit(**split)
        saved = s.launch + s.init
        epoch_s = (result.epoch_samples or 0) / rec.samples_per_s if rec.samples_per_s else 0.0
        of_epoch = f", {saved / epoch_s:.0%} of an epoch" if epoch_s > 0 else ""
        first += (
            f": launching the workers {s.launch:.2f} s and their set-up {s.init:.2f} s, which persistent_workers=True "
            f"would save ({saved:.2f} s{of_epoch}); the rest ({s.fill + s.produce + s.deliver:.2f} s) is making and "
            "delivering the batch itself, paid at every epoch either way"
        )
    else:
        first += ": persistent_workers=True would save the workers' launch and set-up in it"
    if measured:
        return first + "; persistent_workers=True was measured and was not faster here."
    return first + "; --persistent measures it."


def step_words(settings: dict[str, object]) -> str:
    """The simulated step in words: "a 20 ms wait (a GPU step)", "30 ms of CPU work", or both."""
    wait, cpu = settings.get("step_time"), float(settings.get("step_cpu") or 0.0)  # type: ignore[arg-type]
    parts = []
    if cpu:
        parts.append(f"{cpu * 1000:.0f} ms of CPU work")
    if isinstance(wait, (int, float)) and wait:
        parts.append(f"a {float(wait) * 1000:.0f} ms wait" + ("" if cpu else " (a GPU step)"))
    elif wait:
        parts.append(f"the step function {wait}")
    return "a step of " + " then ".join(parts) if parts else "no step"


@dataclass
class Check:
    """A rule of thumb users know, and whether it fires on the recommended point."""

    name: str
    fires: bool
    text: str


def _batch_size(result: SweepResult, p: Point) -> float:
    bs = p.config.batch_size or result.settings.get("batch_size") or result.settings.get("dataset_batch_size")
    return float(bs or 1)


def checks(result: SweepResult, p: Point) -> list[Check]:
    """The rule-of-thumb checks (time to the next batch against the step, worker start-up, pin time),
    each marked where it fires on point ``p``."""
    out = []
    step = result.step_time
    if step and p.samples_per_s:
        per_batch = _batch_size(result, p) / p.samples_per_s
        wait_ms = 1000 * (p.window.wait_s / p.window.seconds if p.window.seconds else 0.0) * per_batch
        out.append(
            Check(
                "next batch vs step",
                wait_ms > 0.1 * step * 1000,
                f"the loop waits {wait_ms:.1f} ms for each batch against a {step * 1000:.0f} ms step "
                "(fires above a tenth of the step: the accelerator idles)",
            )
        )
    share = startup_share(result, p)
    out.append(
        Check(
            "worker start-up",
            p.startup_s > 1.0 or (share is not None and share >= STARTUP_NOTE),
            f"the first batch takes {p.startup_s:.2f} s"
            + (f", {share:.0%} of an epoch" if share is not None else "")
            + " (fires above 1 s or 5% of an epoch)",
        )
    )
    out.append(
        Check(
            "pin time",
            p.window.pinning >= 0.05,
            f"pinning takes {p.window.pinning:.0%} of the main process's time (fires at 5%)"
            + ("" if p.config.pin_memory else "; pin_memory is off"),
        )
    )
    return out


def data_time_ms(result: SweepResult, p: Point) -> float | None:
    """Milliseconds one producing process needs for one batch: its stages' times, else its throughput."""
    stages_ms = [p.stage_ms.get(s) for s in STAGES]
    known = [ms for ms in stages_ms if ms is not None]
    bs = _batch_size(result, p)
    if [s for s, ms in zip(STAGES, stages_ms) if ms is not None and s != "collate"]:
        return sum(known) * bs
    single = [q for q in result.ok_points() if q.config.mode == "processes" and q.config.num_workers <= 1]
    if single:
        q = max(single, key=lambda q: q.samples_per_s)
        return 1000 * bs / q.samples_per_s if q.samples_per_s else None
    return None


def estimate(result: SweepResult, p: Point) -> tuple[int, str]:
    """The rule of thumb ``workers = min(cores, data time per batch / step time)``, and how it was got."""
    cores = result.usable_cores
    data = data_time_ms(result, p)
    step = result.step_time
    if not step:
        return cores, f"min(cores, data time / step time) = {cores} (no step: as many as the {cores} cores)"
    if data is None:
        return cores, "min(cores, data time / step time): the data time per batch is unknown"
    want = max(1, math.ceil(data / (step * 1000)))
    n = min(cores, want)
    return n, f"min(cores, data time / step time) = min({cores}, {data:.1f} ms / {step * 1000:.0f} ms) = {n}"


__all__ = [
    "HEADLINE",
    "Check",
    "Diagnosis",
    "checks",
    "context",
    "cores_saturated",
    "data_time_ms",
    "diagnose",
    "estimate",
    "evidence",
    "label",
    "memory_budget",
    "oversubscribed",
    "startup_share",
    "step_words",
    "verdict",
]
