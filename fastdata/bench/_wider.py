"""The sweep's grid past the core count, while the workers wait.

The default grid stops at the usable cores (0, 1, 2, 4 ... cores): more workers than cores only take CPU
from other programs when the work computes. Workers that mostly wait off the CPU (a round trip to a server,
the disk, sleeps, a lock per process) overlap their waits instead, so :func:`wider` asks for twice the
largest count measured while the best point is that largest count, its label says the workers wait, and it
measured :data:`GAIN` faster than the count below it: throughput still rises. It stops at the most workers
``num_workers="auto"`` would run while they wait (16, or twice the cores), and where the workers' memory
would pass 80% of the budget. Worker processes and loader threads widen each on their own (a mode whose
best is under half the sweep's best is left). For a fastdata dataset, where no loader threads were measured,
it also measures them at the new count: threads wait as well as processes, with no process to start and no
batch to send between processes.
"""

from __future__ import annotations

from dataclasses import replace

from fastdata.bench._result import Config, Point, SweepResult
from fastdata.loading.observe.diagnose import MEMORY_NEAR, WAITING_LABELS
from fastdata.loading.observe.tune import WAIT_WORKERS

GAIN = 0.15  # the largest count measured this much faster than the one below it: throughput still rises
HOPELESS = 0.5  # a mode whose best is under this share of the sweep's best is not widened


def waiting_cap(cores: int) -> int:
    """The most workers measured while they wait: what ``num_workers="auto"`` would run (16, or twice the cores)."""
    return max(WAIT_WORKERS, 2 * cores)


def wider(result: SweepResult, *, threads: bool = False) -> list[Config]:
    """The configurations to measure next past the largest count (see the module doc); empty when none. Each
    mode (worker processes, loader threads) widens on its own, while its own largest count is its best.

    Args:
        result (SweepResult): what was measured so far.
        threads (bool): the dataset is a fastdata dataset, which ``fd.Loader(workers="threads")`` reads: also
            measure loader threads at the new count. Defaults to False.
    """
    from fastdata.bench._advise import fair_points

    ok = fair_points(result)
    if not ok:
        return []
    best = max(ok, key=lambda p: p.samples_per_s)
    groups: dict[tuple[str, str], list[Point]] = {}
    for p in ok:
        if p.config.num_workers:
            groups.setdefault((p.config.mode, p.config.series()), []).append(p)
    out: list[Config] = []
    for same in groups.values():
        top = max(same, key=lambda p: p.samples_per_s)
        if top.samples_per_s >= HOPELESS * best.samples_per_s:
            out += _next(result, same, top)
    if threads and out and not any(c.mode == "threads" for c in out) and "threads" not in {m for m, _ in groups}:
        c = out[0]
        out.append(Config(c.num_workers, c.prefetch_factor, c.pin_memory, False, c.batch_size, "threads"))
    return out


def _next(result: SweepResult, same: list[Point], top: Point) -> list[Config]:
    """Twice the largest count of one mode's points, when that count is their best, waits, and still rises."""
    from fastdata.bench._diagnose import label, memory_budget

    largest = max(p.config.num_workers for p in same)
    if top.config.num_workers != largest or label(top, result) not in WAITING_LABELS:
        return []  # a smaller count won (the top is found), or the workers compute
    below = [p for p in same if p.config.num_workers < largest]
    if below:
        prev = max(below, key=lambda p: p.config.num_workers)
        if top.samples_per_s < (1 + GAIN) * prev.samples_per_s:
            return []  # no longer rising
    n = 2 * largest
    if n > waiting_cap(result.usable_cores):
        return []
    budget = memory_budget(result)
    if budget and top.pss_workers:
        more = max(top.pss_workers) * (n - largest)
        if top.window.pss + more > MEMORY_NEAR * budget:
            return []
    return [replace(top.config, num_workers=n)]


__all__ = ["GAIN", "waiting_cap", "wider"]
