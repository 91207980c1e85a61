"""The monitor's reporting: a report (:class:`~._report.Stats`) every ``Monitor.seconds`` or ``every``
batches, each over the window since the previous one, and on demand over any span up to now.

A :class:`Reporter` reads the loader through the session's probe (full readings, memory included) and
knows nothing of tuning: the changes ``num_workers="auto"`` made are handed to it to report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from fastdata.core.errors import check_choice
from fastdata.core.system._machine import memory_available
from fastdata.loading.observe._diagnosis import classify
from fastdata.loading.observe._evidence import Context, evidence
from fastdata.loading.observe._report import Monitor, Sinks, Stats, now
from fastdata.loading.observe._window import Window

Since = Literal["report", "epoch", "start"]
"""Where an on-demand report starts: the last periodic report, the current epoch's start, or the loader's."""


class Reporter:
    """Reports of one loader (see the module doc).

    Args:
        monitor (Monitor | None): how often and where; None: reports only when asked (:meth:`stats`).
        read (Callable[[], Window]): a full reading of the probe (cumulative).
        stall_target (float): the stall below which the step, not the loader, is the limit. Defaults to 0.05.
    """

    def __init__(self, monitor: Monitor | None, read: Callable[[], Window], stall_target: float = 0.05) -> None:
        self.monitor = monitor
        self.sinks = Sinks(monitor.to) if monitor is not None else None
        self.stall_target = stall_target
        self._read = read
        self._start: Window | None = None  # the reading each span starts from
        self._last: Window | None = None
        self._epoch: tuple[int, Window] | None = None
        self.latest: Stats | None = None  # the last periodic report
        self._due_t = float("inf")
        self._due_batches = 1 << 62

    def begin(self, reading: Window) -> None:
        """The first pass starts at ``reading``: reports count from here."""
        if self._start is None:
            self._start = self._last = reading
            self._set_due(reading)

    def epoch_began(self, epoch: int, reading: Window) -> None:
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, reading)

    def due(self, t: float, batches: int) -> bool:
        """A periodic report falls due at loop time ``t`` (seconds since the probe began) or batch ``batches``."""
        return self.monitor is not None and (t >= self._due_t or batches >= self._due_batches)

    def _set_due(self, reading: Window) -> None:
        m = self.monitor
        if m is None:
            return
        self._due_t = reading.seconds + m.seconds if m.seconds is not None else float("inf")
        self._due_batches = reading.batches + m.every if m.every is not None else 1 << 62

    def report(self, context: Context, *, position: tuple[int, int], setting: dict[str, object]) -> Stats:
        """The periodic report: the window since the previous one, sent to the monitor's sinks."""
        assert self._last is not None
        reading = self._read()
        stats = self._stats(reading.since(self._last), context, position, setting)
        self._last, self.latest = reading, stats
        self._set_due(reading)
        if self.sinks is not None:
            self.sinks.emit(stats)
        return stats

    def stats(
        self, context: Context, *, position: tuple[int, int], setting: dict[str, object], since: Since = "report"
    ) -> Stats | None:
        """A report made now over what was seen since ``since`` (None before the first batch; the last periodic
        report when ``since="report"`` and no batch came after it); the periodic reports' windows are not moved
        by it."""
        check_choice("since", since, Since)
        if self._start is None or self._last is None:
            return None
        start = {"report": self._last, "start": self._start}.get(since)
        if since == "epoch":
            start = self._epoch[1] if self._epoch is not None else self._start
        assert start is not None
        reading = self._read()
        if reading.batches == start.batches:
            return self.latest if since == "report" else None
        return self._stats(reading.since(start), context, position, setting)

    def _stats(self, w: Window, context: Context, position: tuple[int, int], setting: dict[str, object]) -> Stats:
        verdict = classify(evidence(w, context), self.stall_target)
        advice = list(verdict.advice)
        changes = setting.get("changes") or []
        if changes:
            # one story: the report says what auto did in its window, and that its figures mix the settings
            last = changes[-1]  # type: ignore[index]
            advice.append(
                f"num_workers='auto' moved {_setting(last['from'])} -> {_setting(last['to'])} at epoch "
                f"{last['epoch']} batch {last['batch']} ({last['reason']}); this report's figures span "
                f"{'that change' if len(changes) == 1 else f'{len(changes)} changes'}"  # type: ignore[arg-type]
            )
        return Stats(
            time=now(),
            epoch=position[0],
            position=position[1],
            window=w,
            usable_cores=context.cores,
            memory_available=float(memory_available()),
            label=verdict.label,
            evidence=verdict.evidence,
            advice=advice,
            **setting,  # type: ignore[arg-type]
        )

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()


def _setting(s: dict[str, object]) -> str:
    w = s.get("workers") or 0
    return "no workers" if not w else "1 worker" if w == 1 else f"{w} workers"


__all__ = ["Reporter", "Since"]
