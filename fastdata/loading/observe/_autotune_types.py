"""The vocabulary of ``num_workers="auto"``: the options (:class:`AutoTune`), what it moves (:class:`Setting`),
what it reads (:class:`Observation`) and what it answers (:class:`Change`). The decisions are in
:mod:`fastdata.loading.observe._autotune`, which re-exports these names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fastdata.core.errors import ConfigError, check_positive


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
    """One window of training, as the tuner reads it.

    Attributes:
        t (float): when the window ended, seconds (any monotonic clock).
        setting (Setting): what ran during it.
        samples_per_s (float): samples per second of the training loop.
        stall (float): share of the loop's time waiting for the next batch.
        step (bool): the loop runs a training step between batches.
        label (str): the window's diagnosis (:data:`fastdata.loading.observe._diagnosis.Label`).
        worker_busy (float): per worker, the share of the time it ran or waited for a core.
        others (float): cores other programs used.
        cores (int): usable cores.
        memory_available (float): bytes that can still be allocated.
        memory_total (float): bytes this process's group may use.
        worker_bytes (float): what one worker adds to memory, bytes: its unique set size (0: not measured).
        batches_left (int | None): batches left in the epoch (None: unknown).
        batch_s (float): seconds per batch of the loop. step_s (float): of it, outside ``next()`` (the step).
        data_s (float | None): seconds one process needs to make a batch, from the stage times the dataset
            reports (None: unknown).
        restart_s (float): what the last restart cost, seconds (0: none yet).
        early (bool): the first quarter of the window of a setting not measured yet: acted on only when
            it is clear (a trial ``CLEAR`` faster or slower, or no workers predicted to take ``CLEAR_ZERO`` of
            the loop's time per batch or less); else
            the whole window is observed again at its end.
        epoch, batch (int): where the training was at the window's end (the epoch, and batches of it).
        open_files (int): descriptors the main process holds (0: not read). open_files_limit (int): its limit
            (``ulimit -n``, 0: unknown).
    """

    t: float
    setting: Setting
    samples_per_s: float
    stall: float = 1.0
    step: bool = False
    label: str = "unknown"
    worker_busy: float = 0.0
    others: float = 0.0
    cores: int = 1
    memory_available: float = math.inf
    memory_total: float = math.inf
    worker_bytes: float = 0.0
    batches_left: int | None = None
    batch_s: float = 0.0
    step_s: float = 0.0
    data_s: float | None = None
    restart_s: float = 0.0
    early: bool = False
    epoch: int = 0
    batch: int = 0
    open_files: int = 0
    open_files_limit: int = 0


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


__all__ = ["AutoTune", "Change", "Observation", "Setting"]
