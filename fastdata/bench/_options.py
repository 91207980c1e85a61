"""What the ``fastdata bench`` command line turns into: the sweep's arguments, and its progress bar.

Shared by ``fastdata bench SPEC`` (:mod:`fastdata.bench`) and ``--demo`` (:mod:`fastdata.bench`).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import warnings
from collections.abc import Iterator
from typing import Any

from fastdata.core.errors import BadSampleWarning, ConfigError


def _pins(choice: str) -> list[bool] | None:
    return {"auto": None, "on": [True], "off": [False], "both": [False, True]}[choice]


def default_transport() -> str:
    """The transport ``fd.Loader`` hands batches over with unless told (``fastdata.loading.DEFAULT_TRANSPORT``)."""
    from fastdata.loading import DEFAULT_TRANSPORT

    return DEFAULT_TRANSPORT


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
        # the transport fd.Loader uses unless told, so the prediction is for the loader the user will run
        "transport": getattr(args, "transport", None) or [default_transport()],
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


# a dataset's advice ("pass on_error='skip'", "fields=(...)") in the words of the command line
_AS_OPTIONS = (
    (re.compile(r"(?<![\w(-])on_error='skip'"), "-o on_error=skip"),
    (re.compile(r"(?<![\w-])fields= ?\('(\w+)': '([^']*)'\)"), '-o \'fields={"\\1": "\\2"}\''),
    (re.compile(r"(?<![\w-])fields=\(\.\.\.\)"), "-o fields=NAME,NAME"),
    (re.compile(r"(?<![\w'-])fields=(?=[\s,;)]|$)"), "-o fields="),
)


def as_options(message: str) -> str:
    """``message`` (a dataset's error) with its advice in ``fastdata bench`` terms: ``-o on_error=skip`` for
    ``on_error='skip'``, ``-o fields=...`` for ``fields=``."""
    for pattern, words in _AS_OPTIONS:
        message = pattern.sub(words, message)
    return message


def bench_error(error: Exception, options: dict[str, Any]) -> Exception:
    """The error to print for ``error``, raised by opening the dataset with ``options``: a bad file (a
    :class:`~fastdata.core.errors.BadSample`, such as a video shorter than one clip) names ``-o
    on_error=skip`` unless that is set; the dataset's advice is given as ``-o`` options."""
    from fastdata.core.errors import BadSample

    message = as_options(str(error))
    if isinstance(error, BadSample) and options.get("on_error") != "skip" and "-o on_error=skip" not in message:
        message += "; or pass -o on_error=skip to leave such samples out (counted; each file named once)"
    if message == str(error):
        return error
    return ConfigError(message)


@contextlib.contextmanager
def skips_said_once() -> Iterator[None]:
    """Each skipped file's warning shown once per run: every point of a sweep opens its own dataset, whose
    policy warns once per file, so without this a run said each skip once per point. (The ``"once"``
    warnings filter cannot do it: the sweep's own ``catch_warnings`` clears the registry it keeps.)"""
    shown = warnings.showwarning
    seen: set[str] = set()

    def show_once(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, BadSampleWarning):
            if str(message) in seen:
                return
            seen.add(str(message))
        shown(message, category, *args, **kwargs)

    with warnings.catch_warnings():
        warnings.showwarning = show_once
        yield
