"""What the ``fastdata bench`` command line turns into: the sweep's arguments, and its progress bar.

Shared by ``fastdata bench SPEC`` (:mod:`fastdata.bench.command`) and ``--demo`` (:mod:`fastdata.bench.demo`).
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
    if args.rounds < 1:
        raise ConfigError(f"--rounds {args.rounds} must be >= 1")
    return {
        "workers": args.workers,
        "batch_size": args.batch_size or batch_size,
        "prefetch_factor": args.prefetch,
        "pin_memory": _pins(args.pin),
        # without --persistent: measured where starting the workers costs an epoch's 5% (see sweep())
        "persistent_workers": [False, True] if args.persistent else None,
        "step_time": args.step_ms / 1000.0,
        "seconds": args.seconds or seconds,
        "rounds": args.rounds,
        "main_threads": args.main_threads,
    }


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
