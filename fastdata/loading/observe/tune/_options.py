"""The vocabulary of ``num_workers="auto"``: the options (:class:`AutoTune`), what it was asked for
(:class:`Requested`), what it moves (:class:`Setting`), what it reads (:class:`Observation`) and what it
answers (:class:`Change`). The decisions are in :class:`~fastdata.loading.observe.tune.Tuner`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fastdata.core.errors import ConfigError, check_positive
from fastdata.loading.observe.diagnose._evidence import Context
from fastdata.loading.observe.measure._window import Window


@dataclass(frozen=True, order=True)
class Setting:
    """What the tuner moves: worker processes and, with workers, batches prefetched per worker."""

    workers: int
    prefetch: int | None = None

    def __str__(self) -> str:
        if not self.workers:
            return "no workers"
        text = "1 worker" if self.workers == 1 else f"{self.workers} workers"
        return text + (f", prefetch {self.prefetch}" if self.prefetch is not None else "")


@dataclass(frozen=True)
class Requested:
    """``num_workers`` and ``prefetch_factor`` as ``fd.Loader`` was given them, checked once (the loader hands
    this to its session): each a count, or None for "auto" (``prefetch`` None also when not given). :meth:`of`
    raises ConfigError for a value that is neither a count nor "auto", or ``prefetch_factor="auto"`` without
    workers."""

    workers: int | None
    prefetch: int | None = None
    auto_prefetch: bool = False

    @classmethod
    def of(cls, num_workers: object, prefetch_factor: object = None) -> Requested:
        auto = num_workers == "auto"
        if not auto:
            if not isinstance(num_workers, int) or isinstance(num_workers, bool):
                raise ConfigError(f"num_workers={num_workers!r}: pass a count (0, 1, 2 ...) or 'auto'")
            check_positive("num_workers", num_workers, allow_zero=True)
        if prefetch_factor == "auto" and not auto and not num_workers:
            raise ConfigError("prefetch_factor='auto' needs workers: pass num_workers >= 1 or 'auto'")
        if isinstance(prefetch_factor, str) and prefetch_factor != "auto":
            raise ConfigError(f"prefetch_factor={prefetch_factor!r}: pass a count (1, 2 ...) or 'auto'")
        fixed = None if prefetch_factor == "auto" else prefetch_factor
        return cls(None if auto else num_workers, fixed, prefetch_factor == "auto")  # type: ignore[arg-type]

    @property
    def tuned(self) -> bool:
        """Something is "auto": the autotuner moves it."""
        return self.workers is None or self.auto_prefetch


@dataclass(frozen=True)
class AutoTune:
    """How ``num_workers="auto"`` (and ``prefetch_factor="auto"``) move. Pass to ``fd.Loader(autotune=...)``.

    Args:
        min_workers (int): fewest workers. Defaults to 0 (the main process makes the batches).
        max_workers (int | None): most workers. Defaults to None: the usable cores for workers that compute,
            and, while the workers mostly wait off the CPU (the network, the disk, a lock, sleeps) and
            throughput keeps rising, up to 16 (or twice the cores, if more), as memory and open files allow.
        start (int | None): the first worker count. Defaults to None: the estimate, as many as the cores
            and memory allow.
        prefetch (tuple[int, ...]): the prefetch factors tried, smallest first (the first is the start).
            Defaults to (2, 4, 8).
        window (float): seconds of training per measurement. Defaults to 1.
        min_batches (int): batches per measurement at least. Defaults to 8.
        interval (float): seconds between two changes at least (each restarts the workers). Defaults to 2.
        margin (float): how much faster a setting must measure to be moved to (and how much slower fewer
            workers may be and still be kept). Defaults to 0.05.
        others_change (float): cores other programs must take or give back to count as a new situation.
            Defaults to 0.5.
        rate_change (float): how much slower or faster the loop must become at the same setting to count as
            a new situation (other programs, or data that got harder). Defaults to 0.3.
        memory_reserve (float | None): bytes of memory kept available. Defaults to None: 2% of the usable
            memory, at least 256 MiB.
        stall_target (float): the loop waiting less than this share of its time means the training step,
            not the loader, is the bottleneck. Defaults to 0.05.
        recall (float): seconds a setting that failed a trial (measured worse than the one it left) is not
            tried again, even after the machine changed, unless other programs' cores moved by
            ``others_change`` since. Defaults to 30.

    Raises:
        ConfigError: for a value out of range.
    """

    min_workers: int = 0
    max_workers: int | None = None
    start: int | None = None
    prefetch: tuple[int, ...] = (2, 4, 8)
    window: float = 1.0
    min_batches: int = 8
    interval: float = 2.0
    margin: float = 0.05
    others_change: float = 0.5
    rate_change: float = 0.3
    memory_reserve: float | None = None
    stall_target: float = 0.05
    recall: float = 30.0

    def __post_init__(self) -> None:
        check_positive("min_workers", self.min_workers, allow_zero=True)
        if self.max_workers is not None:
            check_positive("max_workers", self.max_workers, allow_zero=True)
            if self.max_workers < self.min_workers:
                raise ConfigError(f"max_workers={self.max_workers} is below min_workers={self.min_workers}")
        if not self.prefetch or any(p < 1 for p in self.prefetch) or list(self.prefetch) != sorted(self.prefetch):
            raise ConfigError(f"prefetch={self.prefetch!r}: give one or more factors >= 1, smallest first")
        for name in ("window", "interval"):
            check_positive(name, getattr(self, name))
        check_positive("min_batches", self.min_batches)
        for name in ("margin", "others_change", "rate_change", "stall_target", "recall"):
            check_positive(name, getattr(self, name), allow_zero=True)


@dataclass(frozen=True)
class Observation:
    """One window of training, as the tuner reads it: a view of the window (``w``: its rate, stall, step,
    workers' busy share, other programs' cores ..., each under the window's name) in its context (``ctx``:
    the usable cores and memory), and what the window cannot know.

    Attributes:
        t (float): when the window ended, seconds (any monotonic clock).
        setting (Setting): what ran during it.
        w (Window), ctx (Context): the window, and what the diagnosis reads beside it.
        label (str): the window's diagnosis (:data:`fastdata.loading.observe.Label`).
        memory_available (float): bytes that can still be allocated.
        batches_left (int | None): batches left in the epoch (None: unknown).
        restart_s (float): what the last restart cost, seconds (0: none yet).
        early (bool): the first quarter of the window of a setting not measured yet: acted on only when
            it is clear (``CLEAR``, ``CLEAR_ZERO``); else the whole window is observed again at its end.
        epoch, batch (int): where the training was at the window's end (the epoch, and batches of it).
        open_files (int): descriptors the main process holds, as last read (0: not read). open_files_limit
            (int): its limit (``ulimit -n``, 0: unknown).
    """

    t: float
    setting: Setting
    w: Window
    ctx: Context
    label: str = "unknown"
    memory_available: float = math.inf
    batches_left: int | None = None
    restart_s: float = 0.0
    early: bool = False
    epoch: int = 0
    batch: int = 0
    open_files: int = 0
    open_files_limit: int = 0

    @property
    def worker_bytes(self) -> float:
        """What one worker adds to memory, bytes: the largest unique set size read (0: not measured)."""
        uss = max((p.uss for p in self.w.workers if p.pid), default=0.0)
        return uss if self.setting.workers else 0.0


@dataclass(frozen=True)
class Change:
    """A change of setting and why.

    Attributes:
        t (float): the observation's time. before, after (Setting): from and to.
        reason (str): the measurement behind it, in words.
        at ("now" | "next pass"): restart the workers at the next batch, or at the next pass's start.
        epoch, batch (int): where the training was when it was decided.
    """

    t: float
    before: Setting
    after: Setting
    reason: str
    at: Literal["now", "next pass"] = "now"
    epoch: int = 0
    batch: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "t": self.t,
            "epoch": self.epoch,
            "batch": self.batch,
            "from": {"workers": self.before.workers, "prefetch": self.before.prefetch},
            "to": {"workers": self.after.workers, "prefetch": self.after.prefetch},
            "reason": self.reason,
            "at": self.at,
        }


__all__ = ["AutoTune", "Change", "Observation", "Requested", "Setting"]
