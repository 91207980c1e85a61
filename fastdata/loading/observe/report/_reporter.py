"""When and where the monitor reports: a report (:class:`Stats`) every ``Monitor.seconds`` or
``every`` batches, each over the window since the previous one, and on demand over any span up to now
(:class:`Reporter`); it goes to a callback, a log line (the ``logging`` logger ``fastdata.monitor``, at
INFO) or a JSON-lines file, one object a line (:class:`Sinks`).

Every report names the rank that made it (``rank``/``world_size``, from ``torch.distributed`` or the launch
environment, read when the report is made), and on several ranks each writes its own JSON-lines file
(:func:`rank_path`): no collective is run, so a report never waits for another rank.

A :class:`Reporter` reads the loader through the session's probe (full readings, memory included) and
knows nothing of tuning: the changes ``num_workers="auto"`` made are handed to it to report.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, Union

from fastdata.core.epoch import current_rank
from fastdata.core.errors import ConfigError, check_choice, check_positive
from fastdata.core.system import memory_available
from fastdata.loading.observe.diagnose._diagnosis import classify
from fastdata.loading.observe.diagnose._evidence import Context, evidence
from fastdata.loading.observe.measure._window import Window
from fastdata.loading.observe.report._stats import Stats
from fastdata.loading.observe.tune._options import Setting

LOGGER = "fastdata.monitor"

Sink = Union[Callable[["Stats"], object], str, "os.PathLike[str]"]
"""Where reports go: a function called with each :class:`Stats`, or the path of a JSON-lines file."""


@dataclass(frozen=True)
class Monitor:
    """How often the monitor reports, and where to. ``fd.Loader(monitor=True)`` is ``Monitor()``; a function
    or a path passed as ``monitor=`` is ``Monitor(to=...)``.

    Args:
        to (Sink | Sequence[Sink] | None): a function called with each :class:`Stats`, a JSON-lines file's
            path, or several of them. Defaults to None: a log line to the logger ``fastdata.monitor`` (INFO).
            On several ranks, rank 0 writes the path given and rank R > 0 ``NAME.rankR.SUFFIX`` beside it
            (``loader.rank1.jsonl``); a path with ``{rank}`` in it (``"logs/loader-{rank}.jsonl"``) is the
            rank's own on every rank, rank 0's included.
        seconds (float | None): seconds of training per report. Defaults to 10.
        every (int | None): batches per report (with ``seconds``: whichever comes first). Defaults to None.

    Raises:
        ConfigError: when neither ``seconds`` nor ``every`` is set, or one is not positive.
    """

    to: Sink | Sequence[Sink] | None = None
    seconds: float | None = 10.0
    every: int | None = None

    def __post_init__(self) -> None:
        if self.seconds is None and self.every is None:
            raise ConfigError("Monitor needs seconds= or every= (batches): how often to report")
        if self.seconds is not None:
            check_positive("seconds", self.seconds)
        if self.every is not None:
            check_positive("every", self.every)


def as_monitor(spec: object) -> Monitor | None:
    """``monitor=`` as given to ``fd.Loader`` (True, a function, a path or a :class:`Monitor`) as a Monitor."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return Monitor()
    if isinstance(spec, Monitor):
        return spec
    if callable(spec) or isinstance(spec, (str, os.PathLike)):
        return Monitor(to=spec)  # type: ignore[arg-type]
    raise ConfigError(
        f"monitor={spec!r}: pass True (a log line), a function (called with each report), the path of a "
        "JSON-lines file, or fastdata.loading.observe.Monitor(to=..., seconds=..., every=...)"
    )


class MonitorWriteWarning(UserWarning):
    """A monitor's JSON-lines file could not be written (a full disk, ``/dev/full``): training goes on, the
    file's reports stop."""


def rank_path(path: Path, rank: int, world_size: int) -> Path:
    """The JSON-lines file that rank ``rank`` of ``world_size`` writes for the path ``path`` a user gave:
    ``{rank}`` in it replaced by the rank; else the path itself on rank 0 (and in a single process), and
    ``NAME.rankR.SUFFIX`` beside it on rank R > 0, so that ranks never append to one file."""
    text = str(path)
    if "{rank}" in text:
        return Path(text.replace("{rank}", str(rank)))
    if world_size <= 1 or rank == 0:
        return path
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def check_path(path: Path) -> None:
    """Refuse a report file that cannot be written, before training starts: a folder, a path under a file,
    a folder that cannot be made or written, a file that cannot be written.

    Raises:
        ConfigError: naming the path, why, and what to pass instead.
    """
    if path.is_dir():
        raise ConfigError(f"monitor={str(path)!r} is a folder; give a file in it, like {str(path / 'loader.jsonl')!r}")
    folder = path.parent
    for above in (folder, *folder.parents):
        if above.exists():
            if not above.is_dir():
                raise ConfigError(f"monitor={str(path)!r}: {above} is a file, not a folder; choose a path in a folder")
            if not os.access(above, os.W_OK | os.X_OK) and not path.exists():
                raise ConfigError(f"monitor={str(path)!r}: cannot write in {above}; choose a folder you can write to")
            break
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"monitor={str(path)!r}: the file is not writable; choose another path")


class Sinks:
    """Where a monitor's reports go (see :class:`Monitor`). A JSON-lines file's path is checked at once
    (:func:`check_path`); the file is opened on the first report, appended to, flushed at every line, and
    closed by :meth:`close`. A write that fails (a full disk) warns once (:class:`MonitorWriteWarning`) and
    stops that file's reports: the training goes on."""

    def __init__(self, to: Sink | Sequence[Sink] | None) -> None:
        if to is None:
            targets: list[Sink] = []
        elif isinstance(to, (str, os.PathLike)) or callable(to):
            targets = [to]
        else:
            targets = list(to)
        for t in targets:
            if not (callable(t) or isinstance(t, (str, os.PathLike))):
                raise ConfigError(f"monitor target {t!r}: a function or the path of a JSON-lines file")
        self.log = not targets
        self.calls = [t for t in targets if callable(t)]
        self.paths = [Path(t) for t in targets if isinstance(t, (str, os.PathLike))]
        for p in self.paths:
            check_path(rank_path(p, 0, 1))  # its folder: the ranks' files lie beside it
        self._files: dict[Path, IO[str]] = {}
        self._opened = False

    def emit(self, stats: Stats) -> None:
        if self.log:
            logging.getLogger(LOGGER).info("%s", stats.line())
        for fn in self.calls:
            fn(stats)
        if self.paths and not self._opened:
            self._opened = True
            for given in self.paths:
                p = rank_path(given, stats.rank, stats.world_size)  # the rank is known once it reads
                try:
                    p.parent.mkdir(parents=True, exist_ok=True)
                    self._files[p] = p.open("a", encoding="utf-8")
                except OSError as e:
                    _warn(p, e)
        if self._files:
            text = json.dumps(stats.to_dict()) + "\n"
            for p, f in list(self._files.items()):
                try:
                    f.write(text)
                    f.flush()
                except OSError as e:
                    _warn(p, e)
                    del self._files[p]
                    try:
                        f.close()
                    except OSError:
                        pass

    def close(self) -> None:
        for f in self._files.values():
            try:
                f.close()
            except OSError:
                pass  # what it held could not be written: warned at the write
        self._files = {}


def _warn(path: Path, error: OSError) -> None:
    why = error.strerror or str(error)
    warnings.warn(
        f"monitor: cannot write reports to {path} ({why}); its reports stop, the training goes on",
        MonitorWriteWarning,
        stacklevel=4,
    )


def now() -> float:
    """Unix time, for a report's ``time``."""
    return time.time()


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
                f"num_workers='auto' moved {Setting(last['from']['workers'] or 0)} -> "
                f"{Setting(last['to']['workers'] or 0)} at epoch "
                f"{last['epoch']} batch {last['batch']} ({last['reason']}); this report's figures span "
                f"{'that change' if len(changes) == 1 else f'{len(changes)} changes'}"  # type: ignore[arg-type]
            )
        rank, world_size = current_rank()  # where it is read: a loader built before the ranks learns it here
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
            rank=rank,
            world_size=world_size,
            **setting,  # type: ignore[arg-type]
        )

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()


__all__ = [
    "LOGGER",
    "Monitor",
    "MonitorWriteWarning",
    "Reporter",
    "Since",
    "Sink",
    "Sinks",
    "as_monitor",
    "check_path",
    "now",
    "rank_path",
]
