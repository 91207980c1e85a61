"""What the ``fastdata bench`` command line turns into: the sweep's arguments, and its progress bar.

Shared by ``fastdata bench SPEC`` (:mod:`fastdata.bench`) and ``--demo`` (:mod:`fastdata.bench`).
"""

from __future__ import annotations

import argparse
from typing import Any

from fastdata.core.errors import ConfigError


def _pins(choice: str) -> list[bool] | None:
    return {"auto": None, "on": [True], "off": [False], "both": [False, True]}[choice]


def sweep_args(args: argparse.Namespace, *, batch_size: int, seconds: float) -> dict[str, Any]:
    """Keyword arguments of :func:`fastdata.bench.sweep` from the command line."""
    if args.step_ms < 0:
        raise ConfigError(f"--step-ms {args.step_ms} must be >= 0")
    step_cpu_ms = getattr(args, "step_cpu_ms", 0.0) or 0.0
    if step_cpu_ms < 0:
        raise ConfigError(f"--step-cpu-ms {step_cpu_ms} must be >= 0")
    if args.rounds < 1:
        raise ConfigError(f"--rounds {args.rounds} must be >= 1")
    if getattr(args, "threads_per_worker", 2) < 1:
        raise ConfigError(f"--threads-per-worker {args.threads_per_worker} must be >= 1")
    return {
        "workers": args.workers,
        "modes": getattr(args, "modes", None) or ["processes"],
        "threads": getattr(args, "threads", None),
        "threads_per_worker": getattr(args, "threads_per_worker", None) or 2,
        "transport": getattr(args, "transport", None) or ["stock"],
        "batch_size": args.batch_size or batch_size,
        "prefetch_factor": args.prefetch,
        "pin_memory": _pins(args.pin),
        # without --persistent: measured where starting the workers costs an epoch's 5% (see sweep())
        "persistent_workers": [False, True] if args.persistent else None,
        "step_time": args.step_ms / 1000.0,
        "step_cpu": step_cpu_ms / 1000.0,
        "seconds": args.seconds or seconds,
        "rounds": args.rounds,
        "main_threads": args.main_threads,
    }


def grid_size(kwargs: dict[str, Any]) -> int:
    """Points a sweep with these keyword arguments measures (before any confirmation)."""
    from fastdata.bench._sweep import default_workers, grid

    configs = grid(
        kwargs["workers"] or default_workers(),
        kwargs["prefetch_factor"],
        kwargs["pin_memory"] or [False],
        kwargs["persistent_workers"] or [False],
        kwargs["batch_size"],
        modes=kwargs["modes"],
        threads=kwargs["threads"],
        threads_per_worker=kwargs["threads_per_worker"],
        transport=kwargs["transport"],
    )
    return len(configs) * int(kwargs["rounds"])


def progress_bar(console: Any, total: int, description: str) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
