"""``sweep``: run real DataLoaders over a grid of settings and measure each.

For each configuration (:func:`grid`): start the workers and time the first batch; warm up; then
measure windows of about ``window`` seconds until the last ``min_windows`` agree within ``max_spread``
(or ``seconds`` of measurement are spent); see :mod:`fastdata.bench`. With ``step_time``, the loop
also runs the training step (a sleep, or the user's function) after every batch, and the fraction of
time spent waiting for data is the stall. With ``rounds`` > 1 the grid is measured several times, in
turn, and each configuration's windows are pooled.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, cast

import torch

from fastdata.bench._diagnose import label
from fastdata.bench._environment import describe, start_method
from fastdata.bench._loop import StepFn, Timing, measure
from fastdata.bench._result import MODES, Config, Mode, Point, SweepResult
from fastdata.bench._step import CPUStep
from fastdata.bench._wider import wider
from fastdata.bench.backends._shards import fetched_bytes
from fastdata.core.errors import ConfigError, check_choice, check_positive
from fastdata.core.system import usable_cores
from fastdata.loading import Dataset as FastdataDataset
from fastdata.loading import Transport

Progress = Callable[[int, int, Point], object]

DEFAULT_THREADS_PER_WORKER = 2  # hybrid: threads in each worker process, unless told


def default_workers(cores: int | None = None) -> list[int]:
    """0, 1, 2, 4, 8 ... up to the usable cores, and the usable cores themselves."""
    cores = usable_cores() if cores is None else cores
    counts = [0, 1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    if counts[-1] != cores:
        counts.append(cores)
    return counts


def grid(
    workers: Iterable[int],
    prefetch_factor: Iterable[int],
    pin_memory: Iterable[bool],
    persistent_workers: Iterable[bool],
    batch_size: int | None,
    *,
    modes: Sequence[Mode] = ("processes",),
    threads: Iterable[int] | None = None,
    threads_per_worker: int = DEFAULT_THREADS_PER_WORKER,
    transport: Sequence[Transport] = ("stock",),
) -> list[Config]:
    """Every configuration, without repeats (prefetch and persistence mean nothing with 0 workers).

    ``modes`` says who reads (``Mode``): worker processes (``workers``, each
    ``transport``), loader threads (``threads``, defaulting to the worker counts above 0), and the
    hybrid (the worker counts above 0, each with ``threads_per_worker`` threads).
    """
    modes = check_modes(modes)
    for t in transport:
        check_choice("transport", t, Transport)
    check_positive("threads_per_worker", threads_per_worker)
    workers = list(workers)
    prefetch_factor, pin_memory, persistent_workers = list(prefetch_factor), list(pin_memory), list(persistent_workers)
    seen: dict[Config, None] = {}
    for w, pf, pin, persist in itertools.product(workers, prefetch_factor, pin_memory, persistent_workers):
        if w < 0:
            raise ConfigError(f"workers={w} must be >= 0")
        check_positive("prefetch_factor", pf)
        if "processes" in modes:
            kinds: Sequence[Transport] = transport if w else ("stock",)
            for tr in kinds:
                cfg = Config(w, pf if w else None, bool(pin), bool(persist) if w else False, batch_size, transport=tr)
                seen.setdefault(cfg)
        if "hybrid" in modes and w:
            for tr in transport:
                cfg = Config(w, pf, bool(pin), bool(persist), batch_size, "hybrid", threads_per_worker, tr)
                seen.setdefault(cfg)
    if "threads" in modes:
        counts = [n for n in workers if n > 0] if threads is None else list(threads)
        for n, pf, pin in itertools.product(counts, prefetch_factor, pin_memory):
            check_positive("threads", n)
            seen.setdefault(Config(n, pf, bool(pin), False, batch_size, "threads"))
    return sorted(seen, key=Config.cost)


def check_modes(modes: Iterable[str]) -> list[Mode]:
    """``modes`` as a list, each checked (a typo fails listing the modes there are)."""
    out = list(modes)
    if not out:
        raise ConfigError(f"modes is empty; give one or more of {', '.join(MODES)}")
    for m in out:
        check_choice("mode", m, Mode)
    return cast(list[Mode], out)


def _dataset(dataset_or_factory: Any) -> tuple[Any, bool]:
    """(the dataset, whether we built it and must close it)."""
    if not isinstance(dataset_or_factory, type) and (
        hasattr(dataset_or_factory, "__getitem__") or hasattr(dataset_or_factory, "__iter__")
    ):
        return dataset_or_factory, False
    if callable(dataset_or_factory):
        return dataset_or_factory(), True
    raise ConfigError(f"sweep() needs a dataset or a function returning one, not {type(dataset_or_factory).__name__}")


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or repr(obj)


def sweep(
    dataset_or_factory: Any,
    *,
    workers: Sequence[int] | None = None,
    modes: Sequence[Mode] = ("processes",),
    threads: Sequence[int] | None = None,
    threads_per_worker: int = DEFAULT_THREADS_PER_WORKER,
    transport: Sequence[Transport] = ("stock",),
    batch_size: int | None = 64,
    prefetch_factor: Sequence[int] = (2,),
    pin_memory: Sequence[bool] | None = None,
    persistent_workers: Sequence[bool] | None = None,
    step_time: float | StepFn = 0.0,
    step_cpu: float = 0.0,
    seconds: float = 6.0,
    window: float = 1.0,
    warmup: float = 1.0,
    min_windows: int = 3,
    max_spread: float = 0.1,
    rounds: int = 1,
    shuffle: bool = True,
    collate_fn: Callable[[Any], Any] | None = None,
    worker_init_fn: Callable[[int], object] | None = None,
    multiprocessing_context: Any = None,
    probes: bool = True,
    main_threads: int | None = None,
    confirm: bool = True,
    memory: float | None = None,
    progress: Progress | None = None,
) -> SweepResult:
    """Measure real DataLoaders over a grid of settings.

    Args:
        dataset_or_factory: a dataset (map-style or iterable), or a function that builds one; a
            function is called afresh for every point, so no point inherits another's caches.
        workers (list[int] | None): worker counts. Defaults to 0, 1, 2, 4 ... up to the usable cores
            (CPU affinity and cgroup quota respected; see :func:`fastdata.core.system.usable_cores`), and,
            where the workers wait off the CPU and throughput still rises at the largest, twice as many, and
            so on (up to 16, or twice the cores; :mod:`fastdata.bench`; ``settings["widened"]``).
        modes (list["processes" | "threads" | "hybrid"]): who reads the batches: DataLoader worker
            processes (``workers``), threads of this process (``threads``; ``fd.Loader(...,
            workers="threads")``), or ``workers`` processes of ``threads_per_worker`` threads each (the
            hybrid, worker counts above 0). Every mode is measured through the same probes, and the
            recommendation chooses among them. Defaults to ("processes",): each mode more costs about
            as long again.
        threads (list[int] | None): loader-thread counts for thread mode. Defaults to the worker counts
            above 0.
        threads_per_worker (int): threads in each worker process in hybrid mode. Defaults to 2.
        transport (list["stock" | "slots"]): how worker processes hand batches over
            (:data:`fastdata.loading.Transport`), each measured for every worker count. Defaults
            to ("stock",), the DataLoader's own way (``fd.Loader`` defaults to "slots").
        batch_size (int | None): samples per batch. None when the dataset yields batches itself.
            Defaults to 64.
        prefetch_factor (list[int]): batches loaded ahead per worker. Defaults to (2,).
        pin_memory (list[bool] | None): Defaults to (False, True) where CUDA is present, else (False,).
        persistent_workers (list[bool] | None): Defaults to None: (False,), and where starting the workers
            costs 5% of an epoch or more at the recommended or the best point, that point again with
            ``persistent_workers=True`` (so that it is recommended only if measured faster).
        step_time (float | Callable): the training step after each batch: seconds to wait (a step the GPU
            runs: the training process sleeps, its cores free for the loader), or a function called with the
            batch. Defaults to 0 (no step: the loader's maximum throughput).
        step_cpu (float): seconds of CPU work in the training step (a model trained on the CPU, host-side
            augmentation: torch operators on the training process's threads, taking cores from the workers
            as a real CPU step does; see ``CPUStep``), before the wait of
            ``step_time``. Defaults to 0.
        seconds (float): most seconds of steady state measured per point. Defaults to 6.
        window (float): seconds per measurement window. Defaults to 1.
        warmup (float): seconds discarded after the first batch. Defaults to 1.
        min_windows (int): windows that must agree (within ``max_spread``) to stop early. Defaults to 3.
        max_spread (float): Defaults to 0.1.
        rounds (int): passes over the grid, in turn; each figure is the median over the passes, so a
            burst of load from other programs is shared among the points instead of hitting one.
            Defaults to 1.
        shuffle (bool): read in shuffled order (map-style datasets). Defaults to True.
        collate_fn, worker_init_fn, multiprocessing_context: passed to the DataLoader.
        probes (bool): measure stages, processes and the machine. Defaults to True; False measures
            throughput only (to measure the probes' own overhead).
        main_threads (int | None): torch intra-op threads in the main process during the sweep (it
            collates when ``num_workers=0``; workers always use one). Defaults to None: leave as set.
        confirm (bool): when the figures contradict the probes or are too noisy to decide (see
            :func:`doubts`), measure the configurations in question twice more, in turn, and keep the
            medians. Defaults to True.
        memory (float | None): bytes the loader may use (the "memory" verdict fires at 80% of it).
            Defaults to None: the cgroup's limit or the machine's RAM.
        progress (Callable[[int, int, Point], object] | None): called after each point with
            (points done, points in all, the point).

    Returns:
        SweepResult: one :class:`~fastdata.bench.Point` per configuration.
    """
    check_positive("rounds", rounds)
    timing = Timing(seconds, window, warmup, min_windows, max_spread)
    cores = usable_cores()
    workers_default = workers is None
    workers = list(workers) if workers is not None else default_workers(cores)
    if pin_memory is None:
        pin_memory = (False, True) if torch.cuda.is_available() else (False,)
    auto_persistent = persistent_workers is None
    persistent_workers = [False] if persistent_workers is None else list(persistent_workers)
    modes = check_modes(modes)
    configs = grid(
        workers,
        prefetch_factor,
        pin_memory,
        persistent_workers,
        batch_size,
        modes=modes,
        threads=threads,
        threads_per_worker=threads_per_worker,
        transport=transport,
    )
    step_desc: Any = step_time if not callable(step_time) else _name(step_time)
    if not callable(step_time):
        check_positive("step_time", step_time, allow_zero=True)
    check_positive("step_cpu", step_cpu, allow_zero=True)
    if step_cpu and callable(step_time):
        raise ConfigError("step_cpu= simulates the step's CPU work: with a step function of your own, leave it at 0")
    step: float | StepFn = step_time
    if step_cpu and not callable(step_time):
        step = CPUStep(step_cpu, wait=step_time)  # calibrated once, before any worker starts
    settings = {
        "workers": workers,
        "modes": list(modes),
        "threads": list(threads) if threads is not None else None,
        "threads_per_worker": threads_per_worker if "hybrid" in modes else None,
        "transport": list(transport),
        "batch_size": batch_size,
        "prefetch_factor": list(prefetch_factor),
        "pin_memory": list(pin_memory),
        "persistent_workers": "auto" if auto_persistent else list(persistent_workers),
        "step_time": step_desc,
        "step_cpu": step_cpu,
        "seconds": seconds,
        "window": window,
        "warmup": warmup,
        "min_windows": min_windows,
        "max_spread": max_spread,
        "rounds": rounds,
        "shuffle": shuffle,
        "probes": probes,
        "collate_fn": _name(collate_fn) if collate_fn else None,
        "multiprocessing_context": _context_name(multiprocessing_context),
        "memory": memory,
        "fetched_bytes": 0,  # from a remote store (S3), by every process of every point
    }
    if callable(step_time):
        settings["step_time_callable"] = True
    if main_threads is not None:
        check_positive("main_threads", main_threads)
    threads_before = torch.get_num_threads()
    settings["main_threads"] = main_threads or threads_before
    per_config: dict[Config, list[Point]] = {c: [] for c in configs}
    total, done = len(configs) * rounds, 0
    description, epoch_samples = "", None
    threads_read = False  # a fastdata dataset: fd.Loader(workers="threads") can read it
    given: list[Any] = []  # the dataset passed as it is (not a factory)

    def run(config: Config) -> None:
        nonlocal done, description, epoch_samples, threads_read
        ds, owned = _dataset(dataset_or_factory)
        description = description or dataset_name(ds)
        threads_read = threads_read or isinstance(ds, FastdataDataset)
        try:
            # a dataset that batches itself has a length in batches, not samples
            epoch_samples = epoch_samples or (_length(ds) if batch_size is not None else None)
            if batch_size is None and isinstance(getattr(ds, "batch_size", None), int):
                settings["dataset_batch_size"] = ds.batch_size  # the dataset yields batches of this size
            point = measure(
                ds,
                config,
                timing=timing,
                step=step,
                shuffle=shuffle,
                collate_fn=collate_fn,
                worker_init_fn=worker_init_fn,
                multiprocessing_context=multiprocessing_context,
                probes=probes,
                cores=cores,
            )
        finally:
            # bytes from a remote store, counted per dataset built (the counters die with it): a dataset
            # given as it is counts over the whole sweep, read once at the end
            if owned:
                settings["fetched_bytes"] += fetched_bytes(ds)
            elif not given:
                given.append(ds)
            if owned and callable(getattr(ds, "close", None)):
                ds.close()
        per_config[config].append(point)
        done += 1
        if progress is not None:
            progress(done, total, point)

    def result() -> SweepResult:
        machine = {"usable_cores": cores}
        merged = []
        for pts in per_config.values():
            if not pts:
                continue
            point = merge(pts)
            if len(pts) > 1:
                point.round_labels = [
                    label(p, SweepResult([p], settings, machine, description, epoch_samples)) for p in pts if p.ok
                ]
            merged.append(point)
        return SweepResult(merged, settings, machine, description, epoch_samples)

    try:
        if main_threads is not None:
            torch.set_num_threads(main_threads)
        for _ in range(rounds):
            for config in configs:
                run(config)
        settings["widened"] = []
        while workers_default:
            # workers that wait: past the core count while throughput rises (fastdata.bench._wider)
            extra = [c for c in wider(result(), threads=threads_read) if c not in per_config]
            if not extra:
                break
            for config in extra:
                per_config[config] = []
            settings["widened"] += [c.label() for c in extra]
            total += rounds * len(extra)
            for _ in range(rounds):
                for config in extra:
                    run(config)
        if auto_persistent:
            extra = [c for c in persistent_candidates(result()) if c not in per_config]
            for config in extra:
                per_config[config] = []
            total += rounds * len(extra)
            for _ in range(rounds):
                for config in extra:
                    run(config)
        again = doubts(result()) if confirm and probes else []
        settings["confirmed"] = [c.label() for c in again]
        total += CONFIRM_ROUNDS * len(again)
        for _ in range(CONFIRM_ROUNDS):
            for config in again:
                run(config)
    finally:
        torch.set_num_threads(threads_before)
    if given:
        settings["fetched_bytes"] = fetched_bytes(given[0])
    final = result()
    final.machine = describe()
    return final


CONFIRM_ROUNDS = 2


def _context_name(ctx: Any) -> str:
    if ctx is None:
        return start_method()
    if isinstance(ctx, str):
        return ctx
    get = getattr(ctx, "get_start_method", None)
    return str(get()) if callable(get) else str(ctx)


def dataset_name(ds: Any) -> str:
    """What the report calls the dataset: its own ``repr`` where its class writes one (fastdata's say
    what they read), else its class's name and length, never ``<... object at 0x...>``."""
    kind = type(ds)
    if kind.__repr__ is not object.__repr__:
        text = repr(ds)
        return text if len(text) <= 200 else text[:197] + "..."
    name = f"{kind.__module__}.{kind.__qualname__}"
    n = _length(ds)
    return f"{name} ({n} items)" if n is not None else name


def persistent_candidates(result: SweepResult) -> list[Config]:
    """The persistent variants of the recommended and the best points, where starting their workers
    costs ``STARTUP_NOTE`` of an epoch or more (so that the advice to keep
    workers alive is a measurement, not a guess)."""
    from fastdata.bench._advise import fair_points, pick
    from fastdata.bench._diagnose import STARTUP_NOTE, startup_share

    rec = pick(result)
    ok = fair_points(result)
    if rec is None or not ok:
        return []
    best = max(ok, key=lambda p: p.samples_per_s)
    out: list[Config] = []
    for p in [rec] if best is rec else [rec, best]:
        share = startup_share(result, p)
        costly = (share is not None and share >= STARTUP_NOTE) or p.window.first_wait >= STARTUP_NOTE
        if p.config.processes and not p.config.persistent_workers and costly:
            out.append(replace(p.config, persistent_workers=True))
    return out


def doubts(result: SweepResult) -> list[Config]:
    """Configurations to measure again before recommending.

    * The recommended point's probes say more workers would help (its workers compute most of the
      time and cores are left), yet a larger worker count measured no faster: the recommended point
      and the next larger one.
    * The recommended point is not the best, and either one's windows spread more than ``NOISY``: both.
    """
    from fastdata.bench._advise import fair_points, pick
    from fastdata.bench._diagnose import NOISY, cores_saturated, label

    rec = pick(result)
    ok = fair_points(result)
    if rec is None or not ok:
        return []
    best = max(ok, key=lambda p: p.samples_per_s)
    out: list[Config] = []
    cores = result.usable_cores
    larger = [
        p
        for p in ok
        if p.config.series() == rec.config.series() and rec.config.num_workers < p.config.num_workers <= cores
    ]
    if rec.config.processes and larger and label(rec, result) == "cpu" and not cores_saturated(rec, cores):
        out = [rec.config, min(larger, key=lambda p: p.config.num_workers).config]
    elif best is not rec and max(rec.spread, best.spread) > NOISY:
        out = [rec.config, best.config]
    return out


def _length(ds: Any) -> int | None:
    try:
        return len(ds)
    except TypeError:
        return None


def merge(points: list[Point]) -> Point:
    """One point from several rounds of the same configuration: every round's windows pooled, the start-ups
    the median round's, and each round's samples/s (their spread is how much the configuration moved between
    rounds, the noise that matters when comparing points)."""
    ok = [p for p in points if p.ok]
    if len(points) == 1 or not ok:
        return points[0]
    base = ok[0]
    order = sorted(ok, key=lambda p: p.startup_s)
    return replace(
        base,
        windows=[w for p in ok for w in p.windows],
        startup_s=order[len(order) // 2].startup_s,
        restarts=[r for p in ok for r in p.restarts],
        stage_totals=_summed([p.stage_totals for p in ok]),
        round_rates=[p.samples_per_s for p in ok],
    )


def _summed(totals: list[dict[str, tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for t in totals:
        for k, (secs, items) in t.items():
            a, b = out.get(k, (0.0, 0.0))
            out[k] = (a + secs, b + items)
    return out


__all__ = [
    "CONFIRM_ROUNDS",
    "DEFAULT_THREADS_PER_WORKER",
    "check_modes",
    "dataset_name",
    "default_workers",
    "doubts",
    "grid",
    "merge",
    "persistent_candidates",
    "sweep",
]
