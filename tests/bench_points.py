"""Hand-built sweep points for the recommendation's tests: a point whose one window holds the raw counters
that give the figures asked for (the figures themselves are computed by the library from the counters, as
for a measured point)."""

from __future__ import annotations

from typing import Any

from fastdata.bench._result import Config, Point, SweepResult
from fastdata.loading.observe.measure import Process, Window

GIB = 2**30
SECONDS = 3.0  # each hand-built point measured this long
BATCH = 64
# what workers waiting on reads show: most of their time in fetch, little of it computing
WAITING = {
    "stage_ms": {"fetch": 9.0, "decode": None, "transform": None, "collate": 0.01},
    "stage_busy": {"fetch": 0.9, "decode": None, "transform": None, "collate": 0.001},
}


def window_of(
    workers: int,
    sps: float,
    *,
    stall: float | None = None,
    main_busy: float = 0.2,
    main_process_busy: float | None = None,
    main_cores: float | None = None,
    main_threads: dict[str, float] | None = None,
    worker_busy: list[float] | None = None,
    per_worker_cores: list[float] | None = None,
    worker_threads: dict[str, float] | None = None,
    unpickle: float = 0.0,
    unpickle_cpu: float = 0.0,
    pin: float = 0.0,
    stage_ms: dict[str, float | None] | None = None,
    stage_busy: dict[str, float | None] | None = None,
    pss_main: float = 0.3 * GIB,
    pss_workers: list[float] | None = None,
    machine_busy_cores: float | None = None,
    dstate_share: float = 0.0,
    device_mb_s: float = 0.0,
    read_mb_s: float = 0.0,
    first_wait: float = 0.0,
    wait: float | None = None,
    producers: int | None = None,
    looks: dict[str, int] | None = None,
) -> Window:
    """A window of ``SECONDS`` whose figures are the ones given (the defaults: an unremarkable loader);
    ``producers``: what stage shares are per (the loader threads, in thread mode); ``looks``: each worker's looks
    at its threads by ``"kind/call"`` (none by default: a hand-made window)."""
    s = SECONDS
    samples = int(sps * s)
    wait_s = (wait if wait is not None else stall if stall is not None else 1.0) * s
    step_s = s - wait_s if stall is not None else 0.0
    free = wait_s if stall is not None else s
    wait_cpu = main_busy * free
    mpb = main_busy if main_process_busy is None else main_process_busy
    if main_cores is None:
        helper_cpu, helper_runq = (mpb - main_busy) * s, 0.0
    else:
        helper_cpu = max(0.0, main_cores * s - wait_cpu)
        helper_runq = max(0.0, (mpb - main_busy) * s - helper_cpu)
    busy = worker_busy if worker_busy is not None else [0.2] * workers
    cores = (
        per_worker_cores
        if per_worker_cores is not None
        else (list(busy) if worker_busy is not None else [0.1] * workers)
    )
    pss = pss_workers if pss_workers is not None else [0.1 * GIB] * workers
    procs = []
    for k in range(workers):
        threads = {n: c * s / workers for n, c in (worker_threads or {}).items()}
        procs.append(
            Process(
                cpu_s=cores[k] * s,
                runq_s=max(0.0, busy[k] - cores[k]) * s,
                pid=1000 + k,
                threads=1,
                pss=pss[k],
                by_thread=threads,
                looks=dict(looks or {}),
            )
        )
    producers = producers or max(1, workers)
    stages: dict[str, tuple[float, float]] = {}
    names = set(stage_ms or {}) | set(stage_busy or {})
    for name in names:
        ms = (stage_ms or {}).get(name)
        share = (stage_busy or {}).get(name)
        if ms is None and share is None:
            continue
        secs = share * s * producers if share is not None else ms * samples / 1000  # type: ignore[operator]
        items = 1000 * secs / ms if ms else float(samples)
        stages[name] = (secs, items)
    main = Process(
        cpu_s=wait_cpu + helper_cpu,
        runq_s=helper_runq,
        pid=999,
        threads=1 + len(main_threads or {}),
        pss=pss_main,
        read_bytes=int(device_mb_s * s * 1e6),
        rchar=int(read_mb_s * s * 1e6),
        by_thread={n: c * s for n, c in (main_threads or {}).items()},
    )
    ours = main.cpu_s + sum(p.cpu_s for p in procs)
    return Window(
        seconds=s,
        loop_s=s,
        batches=max(1, samples // BATCH),
        samples=samples,
        nbytes=samples * 10_000,
        wait_s=wait_s,
        wait_cpu_s=wait_cpu,
        step_s=step_s,
        first_wait_s=first_wait * s,
        recv_s=unpickle * s,
        recv_cpu_s=unpickle_cpu * s,
        pin_s=pin * s,
        loop_cpu_s=wait_cpu,
        main=main,
        workers=procs,
        stages=stages,
        machine_cpu_s=machine_busy_cores * s if machine_busy_cores is not None else ours,
        looks=100,
        blocked_looks=round(dstate_share * 100),
    )


POINT_FIELDS = ("startup_s", "restart_split", "start_split", "parent_rss", "round_labels", "usable_cores", "error")


def pt(
    workers: int,
    sps: float,
    *,
    prefetch: int = 2,
    spread: float | None = None,
    restart_s: float | None = None,
    mode: str = "processes",
    **fields: Any,
) -> Point:
    """A point of ``workers`` workers (or loader threads, ``mode="threads"``) that measured ``sps``
    samples/s, its other figures as given."""
    config = Config(workers, prefetch if workers else None, False, False, BATCH, mode)  # type: ignore[arg-type]
    if mode == "threads":
        fields.setdefault("producers", workers)
        workers = 0  # no worker process: the loader threads are the main process's
    own = {k: fields.pop(k) for k in POINT_FIELDS if k in fields}
    own.setdefault("startup_s", 0.2)
    own.setdefault("usable_cores", 2)
    stall = fields.get("stall")
    point = Point(config, windows=[window_of(workers, sps, **fields)], step=stall is not None, **own)
    if spread:
        point.round_rates = [sps * (1 - spread / 2), sps, sps * (1 + spread / 2)]
    if restart_s is not None:
        point.restarts = [restart_s]
    return point


def sweep_of(
    *points: Point,
    cores: int = 2,
    memory: float = 16 * GIB,
    step_time: float = 0.0,
    epoch_samples: int | None = 1_000_000,
) -> SweepResult:
    return SweepResult(
        list(points),
        {"step_time": step_time, "batch_size": BATCH},
        {"usable_cores": cores, "usable_memory": memory},
        "hand-built",
        epoch_samples,
    )


__all__ = ["GIB", "WAITING", "pt", "sweep_of", "window_of"]
