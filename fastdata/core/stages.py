"""Stage timers that datasets call around fetch, decode and transform, for ``fastdata bench``.

A dataset reports where its time goes with two calls per stage::

    from fastdata.core import stages

    t = stages.clock()                       # 0.0 unless the benchmark is probing this process
    raw = read_bytes(...)
    t = stages.lap("fetch", t, n=len(raw))   # adds the time since t to "fetch"; returns the new t
    sample = decode(raw)
    t = stages.lap("decode", t)

or, where a block is clearer than a chain, ``with stages.timed("decode"): ...``.

Off (always, outside ``fastdata bench``), ``clock()`` returns 0.0 and ``lap()`` returns at once: one
global read and one call per call site, nothing stored. On, each call adds one ``perf_counter()`` and
two float additions to a list private to the process; the benchmark copies that list to shared memory
once per batch (:func:`flush`), so the main process sees every worker's totals without a lock or a
message. The start time lives in the caller's local variable, so the calls are safe from several
threads (a thread pool of fetches); concurrent additions may rarely lose one lap, which only
under-reports.

Stages (:data:`STAGES`): ``fetch`` (bytes from storage, indexes and opens included), ``decode``
(bytes to arrays/images), ``transform`` (the user's function), ``collate`` (timed by the benchmark
itself, around the DataLoader's ``collate_fn``). A dataset that never calls these still benchmarks;
its stages are reported as unknown.

This module imports nothing heavy: every dataset may import it.
"""

from __future__ import annotations

from time import perf_counter
from types import TracebackType
from typing import Any, Literal

Stage = Literal["fetch", "decode", "transform", "collate"]
STAGES: tuple[Stage, ...] = ("fetch", "decode", "transform", "collate")
_INDEX = {name: i for i, name in enumerate(STAGES)}

# Per stage: seconds at 2*i, items at 2*i + 1. None when this process is not being probed.
_acc: list[float] | None = None
# Where flush() copies _acc: this process's row of the benchmark's shared-memory table.
_sink: Any = None


def clock() -> float:
    """The start of a stage: ``perf_counter()`` when probing is on, else 0.0 (which :func:`lap` ignores)."""
    return perf_counter() if _acc is not None else 0.0


def lap(stage: Stage, since: float, n: int = 1) -> float:
    """Add the time since ``since`` to ``stage`` (``n`` items done); return now, the next stage's start.

    Args:
        stage ("fetch" | "decode" | "transform" | "collate"): what the time was spent on.
        since (float): the value of :func:`clock` (or of the previous :func:`lap`) at the stage's start.
        n (int): items (samples) the stage handled in that time. Defaults to 1.
    """
    acc = _acc
    if acc is None or not since:
        return 0.0
    now = perf_counter()
    i = _INDEX[stage] * 2
    acc[i] += now - since
    acc[i + 1] += n
    return now


class _Timed:
    __slots__ = ("n", "stage", "start")

    def __init__(self, stage: Stage, n: int) -> None:
        self.stage, self.n, self.start = stage, n, 0.0

    def __enter__(self) -> _Timed:
        self.start = clock()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        lap(self.stage, self.start, self.n)


class _Off:
    __slots__ = ()

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_OFF = _Off()


def timed(stage: Stage, n: int = 1) -> _Timed | _Off:
    """A context manager that adds the time spent in its block to ``stage`` (nothing when probing is off)."""
    return _OFF if _acc is None else _Timed(stage, n)


def enabled() -> bool:
    """Whether this process is being probed."""
    return _acc is not None


def enable(sink: Any = None, start: list[float] | None = None) -> None:
    """Start probing this process; :func:`flush` will copy the totals into ``sink``.

    Args:
        sink: a writable sequence of ``2 * len(STAGES)`` floats (a row of shared memory), or None.
        start (list[float] | None): totals to count on from (a replaced worker continues its
            predecessor's row, so totals never go down). Defaults to zeros.
    """
    global _acc, _sink
    _acc = list(start) if start is not None else [0.0] * (2 * len(STAGES))
    _sink = sink


def disable() -> None:
    """Stop probing this process."""
    global _acc, _sink
    _acc, _sink = None, None


def flush() -> None:
    """Copy this process's totals into its sink (cheap: one copy of eight floats)."""
    if _acc is not None and _sink is not None:
        _sink[:] = _acc


def totals() -> dict[str, tuple[float, float]]:
    """This process's ``{stage: (seconds, items)}`` since :func:`enable` (zeros when off)."""
    acc = _acc or [0.0] * (2 * len(STAGES))
    return {name: (acc[2 * i], acc[2 * i + 1]) for i, name in enumerate(STAGES)}


__all__ = ["STAGES", "Stage", "clock", "disable", "enable", "enabled", "flush", "lap", "timed", "totals"]
