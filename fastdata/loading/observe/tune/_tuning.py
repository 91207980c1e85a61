"""``num_workers="auto"`` inside training: windows of the loader handed to the :class:`Tuner`, and
the change it answers carried to the next batch (or pass).

:class:`Tuning` is fed the session's probe readings; it knows nothing of reporting. Its state is one of:

* ``idle``: no window open (a setting's first batch has not arrived since the last change);
* ``measuring``: a window runs from a reading; its first quarter may already decide for a setting not
  measured yet (``EARLY``), else its end does;
* ``restart``: a change to make at the next batch (the workers restart mid-pass);
* ``next pass``: a change to make when the next pass starts (the workers restart there anyway).

Each window becomes an :class:`~fastdata.loading.observe.tune.Observation`: a view of the window
(:class:`~fastdata.loading.observe.Window`) with its diagnosis, so the tuner reads what the monitor reports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from fastdata.core.system import memory_available
from fastdata.loading.observe.diagnose._diagnosis import classify
from fastdata.loading.observe.diagnose._evidence import Context, evidence
from fastdata.loading.observe.measure._window import Window
from fastdata.loading.observe.tune._decide import EARLY, Tuner
from fastdata.loading.observe.tune._options import Change, Observation, Setting

CHANGES = "fastdata.autotune"  # the logger every change of setting goes to, at INFO
USS_EVERY = 5  # windows between two reads of the workers' memory (smaps_rollup costs ~1 ms a process)
State = Literal["idle", "measuring", "restart", "next pass"]


class Tuning:
    """The autotuner's side of a session (see the module doc).

    Args:
        tuner (Tuner): the decisions.
        read (Callable[[bool], Window]): a reading of the probe (cumulative), with memory when asked.
    """

    def __init__(self, tuner: Tuner, read: Callable[[bool], Window]) -> None:
        self.tuner = tuner
        self._read = read
        self.state: State = "idle"
        self._start: Window | None = None  # where the open window began
        self._early_done = False
        self._change: Change | None = None
        self._windows = 0
        self._memory: dict[int, tuple[float, float]] = {}  # pid -> (PSS, USS) as last read
        self.restart_s = 0.0
        self._fds = 0
        self.observations: list[Observation] = []  # latest last (bounded)

    @property
    def window(self) -> float:
        return self.tuner.options.window

    def started(self, reading: Window) -> None:
        """A setting's first batch arrived: measure it from here."""
        if self.state == "idle":
            self.state, self._start, self._early_done = "measuring", reading, False

    def due_at(self) -> float:
        """The probe time (seconds) at which the open window (or its first quarter) falls due."""
        if self.state != "measuring" or self._start is None:
            return float("inf")
        early = self.tuner.wants_early() and not self._early_done
        return self._start.seconds + self.window * (EARLY if early else 1.0)

    def tick(
        self, t: float, batches: int, context: Context, setting: Setting, position: tuple[int, int], left: int | None
    ) -> Change | None:
        """At probe time ``t`` after ``batches`` batches: observe the window if it is due; the change, if any."""
        w = self._start
        if self.state != "measuring" or w is None or batches - w.batches < self.tuner.options.min_batches:
            return None
        if t - w.seconds >= self.window:
            early = False
        elif not self._early_done and self.tuner.wants_early() and t - w.seconds >= EARLY * self.window:
            early, self._early_done = True, True  # the window's first quarter, for a setting not measured yet
        else:
            return None
        self._windows += 1
        reading = self._read(self._windows % USS_EVERY == 1)
        window = self._with_memory(reading.since(w))
        obs = self._observation(window, reading.seconds, context, setting, position, left, early)
        self.observations = [*self.observations[-999:], obs]
        if not early:
            self._start, self._early_done = reading, False
        change = self.tuner.observe(obs)
        if change is None:
            return None
        logging.getLogger(CHANGES).info(
            "epoch %d batch %d: %s -> %s (%s): %s",
            position[0],
            position[1],
            change.before,
            change.after,
            change.at,
            change.reason,
        )
        self.state, self._change, self._start = ("restart" if change.at == "now" else "next pass"), change, None
        return change

    def take(self, when: Literal["restart", "next pass"]) -> Change | None:
        """The change waiting to be made ``when`` (then measuring starts again at its first batch)."""
        if self.state != when:
            return None
        change, self._change, self.state = self._change, None, "idle"
        return change

    def _with_memory(self, w: Window) -> Window:
        """``w`` with every process's memory as last read (a reading reads it every ``USS_EVERY`` windows)."""
        for p in [w.main, *w.workers]:
            if p.pss:
                self._memory[p.pid] = (p.pss, p.uss)
            elif p.pid in self._memory:
                p.pss, p.uss = self._memory[p.pid]
        return w

    def _observation(
        self,
        w: Window,
        t: float,
        context: Context,
        setting: Setting,
        position: tuple[int, int],
        left: int | None,
        early: bool,
    ) -> Observation:
        verdict = classify(evidence(w, context), self.tuner.options.stall_target)
        return Observation(
            t,
            setting,
            w,
            context,
            label=verdict.label,
            memory_available=float(memory_available()),
            batches_left=left,
            restart_s=self.restart_s,
            early=early,
            epoch=position[0],
            batch=position[1],
            open_files=self._files(w),
            open_files_limit=_file_limit(),
        )

    def _files(self, w: Window) -> int:
        """The main process's open descriptors, as last read (every ``USS_EVERY`` windows)."""
        if w.main.fds:
            self._fds = w.main.fds
        return self._fds


def _file_limit() -> int:
    """This process's open-file limit (the soft ``RLIMIT_NOFILE``), 0 where unknown or unlimited."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 0
    return 0 if soft == resource.RLIM_INFINITY else int(soft)


__all__ = ["CHANGES", "USS_EVERY", "State", "Tuning"]
