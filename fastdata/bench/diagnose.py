"""What limits a loader, in plain words, from what the probes measured.

Each point gets a label (:func:`classify`); the sweep as a whole gets a headline and sentences that
follow from the numbers (:func:`diagnose`). The rules, in order:

* ``memory``: the processes' PSS at some point comes near the usable memory (or a point died).
* ``none``: with a step time, the loader keeps the stall under the target: the model is the limit.
* ``ipc``: no workers is fastest, with the main process busy making items: they are so cheap that
  moving them between processes costs more than making them.
* ``main-process``: the main process is busy receiving batches (unpickling, pinning) most of the time,
  so more workers cannot help.
* ``ipc`` again, with workers: the main process mostly waits in the middle of receiving batches (the
  hand-over of each tensor's shared memory) while neither it nor the workers compute.
* ``cpu``: the usable cores are saturated (decode, transforms): more workers cannot help.
* ``storage``: workers are neither computing nor held up by the main process: they wait for reads.
* ``start-up``: starting workers costs a large part of an epoch (suggest ``persistent_workers``).
"""

from __future__ import annotations

from typing import Literal

from fastdata.bench.result import Point, SweepResult
from fastdata.core.stages import STAGES

Bottleneck = Literal["storage", "cpu", "main-process", "memory", "start-up", "ipc", "none", "unknown"]

MAIN_BUSY = 0.8  # main thread running or runnable this much of the time: it is the limit
RECEIVE = 0.5  # ... or computing to rebuild and pin batches this much of the time
CORES_SATURATED = 0.85  # the loader's demand for cores, against the usable cores
WORKER_COMPUTING = 0.5  # a worker running or runnable half the time or more is computing, not waiting
MEMORY_NEAR = 0.8  # PSS of all our processes against the usable memory
STARTUP_NOTE = 0.05  # start-up against one epoch's time: worth persistent workers
STARTUP_BOUND = 0.5  # ... the main cost
NOISY = 0.5  # windows' spread, (max - min) / median, beyond which a 5% comparison is guesswork
LOADER_BOUND_STALL = 0.25  # with a step time, the loop waits this much: the loader is the limit, not the step


def cores_saturated(p: Point, cores: int) -> bool:
    """The loader alone wants (nearly) every usable core.

    Judged by demand (running or runnable), not by CPU used: on a machine shared with other programs,
    a computing worker gets less CPU but stays runnable, so the verdict does not depend on the neighbours.
    The workers must also be computing most of the time: many workers that mostly wait add up run-queue
    waits on a crowded machine without wanting the cores.
    """
    computing = not p.config.num_workers or _per_worker_busy(p) >= WORKER_COMPUTING
    return computing and p.demand >= CORES_SATURATED * cores


def oversubscribed(p: Point, cores: int) -> bool:
    """More workers than cores, all computing, wanting every core between them: any gain over ``cores``
    workers is CPU taken from other programs (the training process, on a real job), not loader speed.

    Workers that mostly wait (on storage) are never oversubscribed, even when, on a crowded machine,
    the run-queue waits of their many wake-ups add up to the cores.
    """
    return (
        p.config.num_workers > cores
        and _per_worker_busy(p) >= WORKER_COMPUTING
        and sum(p.worker_busy) >= CORES_SATURATED * cores
    )


def _per_worker_busy(p: Point) -> float:
    if p.worker_busy:
        return sum(p.worker_busy) / len(p.worker_busy)
    return p.worker_cores / max(1, p.config.num_workers)


def classify(p: Point, cores: int | None = None) -> Bottleneck:
    """What limits this one configuration's throughput."""
    cores = cores or p.usable_cores
    if not p.ok:
        return "unknown"
    if p.config.num_workers == 0:
        # the main process makes every batch itself: it is the limit unless it waits on reads
        return "main-process" if p.main_busy >= MAIN_BUSY else "storage"
    if p.unpickle_cpu + p.pin >= RECEIVE or p.main_busy >= MAIN_BUSY:
        return "main-process"
    if cores_saturated(p, cores) or _per_worker_busy(p) >= WORKER_COMPUTING:
        return "cpu"  # (with cores to spare in the second case: more workers would help)
    if p.unpickle >= RECEIVE:
        # neither side computes, yet the main process waits in the middle of receiving: the hand-over
        # of every tensor (a socket round trip per storage) is the cost
        return "ipc"
    return "storage"


def _dominant_stage(p: Point, among: tuple[str, ...] = STAGES) -> tuple[str, float, float] | None:
    """(stage, ms per sample, share of producer time) of the stage that takes the most time, when the
    dataset reports its stages (collate alone, timed by the harness, says little)."""
    known = [(s, p.stage_ms[s], p.stage_busy[s]) for s in among if p.stage_ms.get(s) is not None]
    if not any(s != "collate" for s, _, _ in known):
        return None
    s, ms, share = max(known, key=lambda k: k[2] or 0.0)
    return s, float(ms or 0.0), float(share or 0.0)


def _stage_text(p: Point) -> str:
    known = {s: ms for s, ms in p.stage_ms.items() if ms is not None and s != "collate"}
    if not known:
        return "stage times are unknown (the dataset does not report them; see 'Stage probes' in docs/bench.md)"
    parts = [f"{s} {ms:.2f} ms" for s, ms in p.stage_ms.items() if ms is not None]
    return "per sample: " + ", ".join(parts)


def _workers(n: int) -> str:
    return "no workers" if n == 0 else "1 worker" if n == 1 else f"{n} workers"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _mem_pressure(result: SweepResult) -> Point | None:
    mem = result.usable_memory
    if not mem:
        return None
    heavy = [p for p in result.ok_points() if p.pss_total >= MEMORY_NEAR * mem]
    return min(heavy, key=lambda p: p.config) if heavy else None


def _died(result: SweepResult) -> list[Point]:
    words = ("killed", "memory", "oom", "signal")
    return [p for p in result.points if p.error and any(w in p.error.lower() for w in words)]


def startup_share(result: SweepResult, p: Point) -> float | None:
    """Start-up time against one epoch's steady-state time, when the epoch length is known."""
    if not result.epoch_samples or not p.samples_per_s:
        return None
    epoch_s = result.epoch_samples / p.samples_per_s
    return p.startup_s / epoch_s if epoch_s > 0 else None


def diagnose(
    result: SweepResult, rec: Point, best: Point, *, stall_target: float = 0.05
) -> tuple[Bottleneck, list[str]]:
    """The headline bottleneck and the sentences that explain it (most important first)."""
    cores = result.usable_cores
    notes: list[str] = []
    by_workers = sorted(result.ok_points(), key=lambda p: p.config)
    largest = max(p.config.num_workers for p in by_workers)

    heavy, died = _mem_pressure(result), _died(result)
    if heavy is not None or died:
        mem = result.usable_memory or 0.0
        if heavy is not None:
            notes.append(
                f"Memory-bound: at {_workers(heavy.config.num_workers)} the loader's processes take "
                f"{_gib(heavy.pss_total)} (PSS) of {_gib(mem)} usable; more workers or a larger "
                "prefetch_factor risk the OOM killer."
            )
        for p in died:
            notes.append(f"{p.config.label()} failed: {p.error}.")
        return "memory", notes + _explain(result, rec, best, cores, largest, stall_target)

    if result.step_time and rec.stall is not None and rec.stall < stall_target:
        step = result.settings.get("step_time")
        step_text = f"a step of {float(step) * 1000:.0f} ms" if isinstance(step, (int, float)) else "the step"
        notes.append(
            f"The loader keeps up: with {_workers(rec.config.num_workers)} the training loop waits for data "
            f"{rec.stall:.1%} of the time with {step_text}; the model, not the data, sets the pace."
        )
        return "none", notes + _explain(result, rec, best, cores, largest, stall_target, headline=False)

    return _headline(result, rec, best, cores, largest, stall_target)


def _headline(
    result: SweepResult, rec: Point, best: Point, cores: int, largest: int, stall_target: float
) -> tuple[Bottleneck, list[str]]:
    share = startup_share(result, rec)
    if share is not None and share >= STARTUP_BOUND and rec.config.num_workers:
        text = (
            f"Start-up-bound: starting {_workers(rec.config.num_workers)} takes {rec.startup_s:.2f} s, "
            f"{share:.0%} of an epoch ({result.epoch_samples} samples); use persistent_workers=True."
        )
        return "start-up", [text, *_explain(result, rec, best, cores, largest, stall_target)]
    with_workers = [p for p in result.ok_points() if p.config.num_workers]
    if rec.config.num_workers == 0 and with_workers and not result.step_time and rec.main_busy >= MAIN_BUSY:
        # no workers is fastest while the main process computes all the time: making items is cheaper
        # than moving them. (When it mostly waits instead, on a slow store, the verdict is storage.)
        top = max(with_workers, key=lambda p: p.samples_per_s)
        if top.samples_per_s < rec.samples_per_s:
            text = (
                f"Transfer-bound: items are so cheap that sending them between processes costs more than "
                f"making them: no workers gives {rec.samples_per_s:,.0f} samples/s, the best with workers "
                f"{top.samples_per_s:,.0f} ({_workers(top.config.num_workers)}, the main process busy "
                f"{top.main_busy:.0%} of the time receiving). Load in the main "
                "process, or do more work per item (decode, augment) in the dataset before workers pay off."
            )
            return "ipc", [text]
    if result.step_time and best.stall is not None and best.stall < LOADER_BOUND_STALL:
        # the workers wait for the training loop part of the time (their queue is full): their idle
        # time says nothing about what limits them
        text = (
            f"The loader nearly keeps up: at best ({best.config.label()}) the training loop waits for data "
            f"{best.stall:.0%} of the time. Its workers spend part of the time waiting for the loop, so what "
            "limits them cannot be read from this sweep: run it again without --step-ms (step_time=0)."
        )
        return "unknown", [text, *_explain(result, rec, best, cores, largest, stall_target, headline=False)]
    return classify(best, cores), _explain(result, rec, best, cores, largest, stall_target)


def label(p: Point, result: SweepResult, stall_target: float = 0.05) -> Bottleneck:
    """The table's label of one point: :func:`classify`, or, with a step time, "none" where the loader
    keeps up and "unknown" where it nearly does (its workers then wait for the training loop)."""
    if result.step_time and p.ok and p.stall is not None:
        if p.stall < stall_target:
            return "none"
        if p.stall < LOADER_BOUND_STALL:
            return "unknown"
    return classify(p, result.usable_cores)


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
        f" Throughput went {p.samples_per_s / prev.samples_per_s:.2f}x from {_workers(prev.config.num_workers)} "
        f"to {_workers(p.config.num_workers)}."
    )


def _main_collate_note(result: SweepResult) -> list[str]:
    """Collating in the main process (no workers) much slower than in workers: torch's intra-op threads.

    Workers run torch with one thread; the main process with several, and on a machine where another
    program holds a core, ``torch.stack`` then waits for the thread that cannot run.
    """
    threads = int(result.settings.get("main_threads") or result.machine.get("torch_threads") or 1)
    mains = [p for p in result.ok_points() if not p.config.num_workers and p.stage_ms.get("collate")]
    workers = [
        float(p.stage_ms["collate"] or 0.0)
        for p in result.ok_points()
        if p.config.num_workers and p.stage_ms.get("collate")
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


def _explain(
    result: SweepResult, rec: Point, best: Point, cores: int, largest: int, stall_target: float, headline: bool = True
) -> list[str]:
    """Sentences about the best point's limit (and start-up, stages, stall). With ``headline`` False
    (the loader keeps up with the model), only the notes: what limits the loader does not matter then."""
    out: list[str] = []
    kind = classify(best, cores) if headline else "none"
    w = best.config.num_workers
    if kind == "main-process" and w:
        out.append(
            f"Main-process-bound: at {_workers(w)} the main process spends {best.unpickle:.0%} of its time "
            f"rebuilding received batches (unpickling) and {best.pin:.0%} pinning them, and is busy "
            f"{best.main_busy:.0%} of the time; more workers cannot help. Return tensors or numpy arrays "
            "(they travel through shared memory) rather than Python lists and dicts, send fewer, larger "
            "batches, or decode later, on the GPU."
        )
    elif kind == "main-process":
        out.append(
            f"Main-process-bound: with no workers the main process makes every batch itself ({_stage_text(best)})."
        )
    elif kind == "cpu":
        if cores_saturated(best, cores):
            stage = _dominant_stage(best, ("decode", "transform", "collate", "fetch"))
            where = f"; most of the workers' time goes to {stage[0]} ({stage[1]:.2f} ms per sample)" if stage else ""
            if stage is not None and stage[0] == "fetch":
                # computing to fetch: the storage client's work per request (an S3 client spends a few ms of
                # CPU per GET), or a storage server sharing these cores
                label, cure = (
                    "CPU-bound",
                    (
                        "Fewer, larger reads (tar shards rather than an object per sample), "
                        "storage served from another machine, or more cores will."
                    ),
                )
            else:
                label, cure = "Decode/CPU-bound", "Cheaper decoding or transforms, smaller images, or more cores will."
            out.append(
                f"{label}: the {cores} usable cores are saturated (at {_workers(w)} the loader keeps "
                f"{best.demand:.1f} cores busy or waiting for one){where}; more workers will not help. "
                f"{cure}"
            )
        elif w >= cores:
            out.append(
                f"Decode/CPU-bound: {_workers(w)} on {cores} usable cores compute "
                f"{_per_worker_busy(best):.0%} of the time and want {best.demand:.1f} cores between them and "
                "the main process; more workers than cores will not help. Cheaper decoding or transforms, "
                "or more cores, will."
            )
        elif best.machine_busy_cores >= CORES_SATURATED * cores:
            # the loader leaves cores free, but other programs hold them: more workers would only compete
            out.append(
                f"CPU-bound in the workers: each of the {w} workers computes {_per_worker_busy(best):.0%} of "
                f"the time and the loader wants only {best.demand:.1f} of {cores} cores, but other programs "
                f"held the rest (the machine was busy {best.machine_busy_cores:.1f} of {cores} cores), so more "
                "workers measured no faster here; on an idle machine, try more workers."
            )
        else:
            out.append(
                f"CPU-bound in the workers, with cores to spare: each of the {w} workers computes "
                f"{_per_worker_busy(best):.0%} of the time, and the loader wants only {best.demand:.1f} of "
                f"{cores} cores; try more workers."
            )
    elif kind == "ipc":
        out.append(
            f"Transfer-bound: at {_workers(w)} the main process spends {best.unpickle:.0%} of its time "
            f"receiving batches, mostly waiting for the workers to hand over each tensor (it computes "
            f"{best.unpickle_cpu:.0%} of the time), while neither side is busy. Larger batches (fewer "
            "hand-overs), fewer tensors per batch, or loading in the main process help."
        )
    elif kind == "storage":
        busy = _per_worker_busy(best)
        fetch = best.stage_ms.get("fetch")
        who, whose = ("the workers", "their") if w else ("the main process, loading by itself,", "its")
        fetch_text = (
            (f", and fetching takes {fetch:.2f} ms per sample ({best.stage_busy['fetch'] or 0:.0%} of {whose} time)")
            if fetch is not None
            else ""
        )
        computes = f"each computes {busy:.0%} of the time" if w else f"it is busy {best.main_busy:.0%} of the time"
        out.append(
            f"Storage-bound: {who} spend{'s' if not w else ''} most of {whose} time waiting for data, not "
            f"computing ({computes}{fetch_text}).{_growth(result, best)}"
        )
        if best.iowait >= 0.05 or best.dstate or best.procs_blocked:
            out.append(
                f"The disk is the wait: iowait {best.iowait:.0%} of CPU time, up to {best.procs_blocked} "
                "processes in uninterruptible sleep. Faster storage, larger sequential reads (tar shards), "
                "or the page cache help."
            )
        else:
            hide = (
                "More workers or a larger prefetch_factor hide it."
                if w
                else "Workers did not hide it here: the store itself is the limit (or what serves it, when it "
                "runs on these cores)."
            )
            out.append(
                "There is no iowait, so the wait is not on a local disk: network or object storage, a "
                f"remote server, sleeps or locks. {hide}"
            )
        if w == largest:
            out.append(
                f"{_workers(w)} is the most tested and still the best: try more (--workers {w},{2 * w},{4 * w})."
            )
    out.extend(_main_collate_note(result))
    noisy = max(rec.spread, best.spread)
    if noisy > NOISY and int(result.settings.get("rounds") or 1) < 3:
        out.append(
            f"The measurements were noisy (windows up to {noisy:.0%} apart): run with --rounds 3 "
            "(sweep(rounds=3)) for a steadier answer."
        )
    others = best.machine_busy_cores - best.total_cores
    if others >= 0.25 * cores:
        out.append(
            f"Other programs used about {others:.1f} of the {cores} cores while this ran: figures are "
            "noisier and lower than on an idle machine."
        )
    if best.stage_ms.get("fetch") is None and kind not in ("main-process", "none"):
        out.append(f"Stages: {_stage_text(best)}.")
    share = startup_share(result, rec)
    if (
        share is not None
        and STARTUP_NOTE <= share < STARTUP_BOUND
        and rec.config.num_workers
        and not rec.config.persistent_workers
    ):
        out.append(
            f"Starting the workers takes {rec.startup_s:.2f} s, {share:.0%} of an epoch: "
            "persistent_workers=True (set above) saves it at every epoch."
        )
    if result.step_time and rec.stall is not None and rec.stall >= stall_target:
        stalls = [p.stall for p in result.ok_points() if p.stall is not None]
        if stalls and min(stalls) >= stall_target:
            out.append(
                f"No configuration keeps the stall under {stall_target:.0%} (best {min(stalls):.0%}): "
                "the GPU will wait for data; the recommendation is the fastest loader."
            )
    return out


__all__ = ["Bottleneck", "classify", "cores_saturated", "diagnose", "label", "oversubscribed", "startup_share"]
