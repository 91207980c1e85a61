"""The sweep's grid past the core count, while the workers wait.

The default grid stops at the usable cores (0, 1, 2, 4 ... cores): more workers than cores only take CPU
from other programs when the work computes. Workers that mostly wait off the CPU (a round trip to a server,
the disk, sleeps, a lock per process) overlap their waits instead, so :func:`wider` asks for twice the
largest count measured while the best point is that largest count, its label says the workers wait, and it
measured :data:`GAIN` faster than the count below it: throughput still rises. It stops at the most workers
``num_workers="auto"`` would run while they wait (16, or twice the cores), and where the workers' memory
would pass 80% of the budget. For a fastdata dataset it also measures loader threads at the new count:
threads wait as well as processes, with no process to start and no batch to send between processes.
"""

from __future__ import annotations

from dataclasses import replace

from fastdata.bench._result import Config, SweepResult
from fastdata.loading.observe._autotune import WAIT_WORKERS
from fastdata.loading.observe._diagnosis import MEMORY_NEAR, WAITING_LABELS

GAIN = 0.15  # the largest count measured this much faster than the one below it: throughput still rises


def waiting_cap(cores: int) -> int:
    """The most workers measured while they wait: what ``num_workers="auto"`` would run (16, or twice the cores)."""
    return max(WAIT_WORKERS, 2 * cores)


def wider(result: SweepResult, *, threads: bool = False) -> list[Config]:
    """The configurations to measure next past the largest count (see the module doc); empty when none.

    Args:
        result (SweepResult): what was measured so far.
        threads (bool): the dataset is a fastdata dataset, which ``fd.Loader(workers="threads")`` reads: also
            measure loader threads at the new count. Defaults to False.
    """
    from fastdata.bench._advise import fair_points
    from fastdata.bench._diagnose import label, memory_budget

    ok = fair_points(result)
    if not ok:
        return []
    best = max(ok, key=lambda p: p.samples_per_s)
    if not best.config.num_workers or label(best, result) not in WAITING_LABELS:
        return []
    same = [p for p in ok if p.config.series() == best.config.series() and p.config.mode == best.config.mode]
    largest = max(p.config.num_workers for p in same)
    if best.config.num_workers != largest:
        return []  # a smaller count won: the top is found
    below = [p for p in same if p.config.num_workers < largest]
    if below:
        prev = max(below, key=lambda p: p.config.num_workers)
        if best.samples_per_s < (1 + GAIN) * prev.samples_per_s:
            return []  # no longer rising
    n = 2 * largest
    if n > waiting_cap(result.usable_cores):
        return []
    budget = memory_budget(result)
    if budget and best.pss_workers:
        more = max(best.pss_workers) * (n - largest)
        if best.pss_total + more > MEMORY_NEAR * budget:
            return []
    out = [replace(best.config, num_workers=n)]
    if threads and best.config.mode == "processes":
        out.append(
            Config(n, best.config.prefetch_factor, best.config.pin_memory, False, best.config.batch_size, "threads")
        )
    return out


__all__ = ["GAIN", "waiting_cap", "wider"]
