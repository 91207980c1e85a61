"""The monitor's report (:class:`Stats`), how often it is made (:class:`Monitor`) and where it goes.

A report covers the time since the previous one: the training loop's samples per second and data stall,
the stage times in the producing processes, every process of the loader (CPU of all its threads, context
switches voluntary and involuntary, threads, D state, PSS and USS, open files), the cores other programs
used, the memory left, the diagnosis label with its evidence (:mod:`fastdata.loading.observe._diagnosis`), and the
changes ``num_workers="auto"`` made, each with its reason. It goes to a callback, a log line (the
``logging`` logger ``fastdata.monitor``, at INFO) or a JSON-lines file, one object a line.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, Union

from fastdata.core.errors import ConfigError, check_positive
from fastdata.loading.observe._window import Window

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


@dataclass
class ProcessStats:
    """One process of the loader over a report's window (a view of the window's :class:`~._window.Process`).

    Attributes:
        role (str): "main" or "worker K". pid (int).
        cores (float): CPU-seconds per second, every thread. busy (float): running or waiting for a core.
        voluntary, involuntary (int): context switches in the window: a thread gave its core up to wait,
            or was pushed off it (many involuntary ones: more runnable threads than cores).
        threads (int): threads alive. dstate (int): of them in D state (waiting for a disk) at the reading.
        pss, uss (float): proportional and unique set size, bytes. fds (int): open file descriptors.
    """

    role: str
    pid: int
    cores: float
    busy: float
    voluntary: int
    involuntary: int
    threads: int
    dstate: int
    pss: float
    uss: float
    fds: int


@dataclass
class Stats:
    """One report of the monitor (see the module docstring). Times in seconds, memory in bytes.

    The figures are the window's (:class:`~._window.Window`, the record ``fastdata bench`` measures too),
    read through the properties below; :meth:`to_dict` holds them and the window itself.

    Attributes:
        time (float): when it was made (Unix time).
        epoch (int), position (int): where the training is: the epoch, and the batches of it handed out.
        window (Window): what the loader did since the previous report.
        workers (int), prefetch_factor (int | None): the setting at the report's end.
        auto (bool): ``num_workers="auto"`` moves them.
        loader_threads (int): with ``workers="threads"``, the threads of the main process that make the
            batches (``workers`` is then 0: the main process is the producer). Else 0.
        usable_cores (int): cores we may use. memory_available (float): left to allocate.
        label (str), evidence (list[str]), advice (list[str]): the diagnosis of the window.
        changes (list[dict]): what "auto" changed in the window: at which epoch and batch, from, to, why.
    """

    time: float
    epoch: int
    position: int
    window: Window
    workers: int
    prefetch_factor: int | None
    auto: bool
    loader_threads: int = 0
    usable_cores: int = 1
    memory_available: float = 0.0
    label: str = "unknown"
    evidence: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    changes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.window.seconds

    @property
    def batches(self) -> int:
        return self.window.batches

    @property
    def samples(self) -> int:
        return self.window.samples

    @property
    def samples_per_s(self) -> float:
        return self.window.samples_per_s

    @property
    def stall(self) -> float:
        return self.window.stall

    @property
    def wait_ms(self) -> float:
        """Per batch, the wait for it."""
        w = self.window
        return 1000 * w.wait_s / w.batches if w.batches else 0.0

    @property
    def step_ms(self) -> float:
        """Per batch, the time after it until the next was asked for (a pass's first batch has none)."""
        w = self.window
        gaps = w.batches - w.starts
        return 1000 * w.step_s / gaps if gaps > 0 else 0.0

    @property
    def stages(self) -> dict[str, dict[str, float | None]]:
        """Per stage: ``ms_per_sample`` and ``share`` of the producers' time (None where not timed)."""
        ms, busy = self.window.stage_ms(), self.window.stage_busy(self.loader_threads or None)
        return {s: {"ms_per_sample": ms[s], "share": busy[s]} for s in ms}

    @property
    def processes(self) -> list[ProcessStats]:
        """The main process, then each worker still running."""
        w = self.window
        out = []
        secs = max(w.seconds, 1e-9)
        most = float(self.usable_cores)  # threads summed: never more cores than there are
        live = [("main", w.main)] + [(f"worker {k}", p) for k, p in enumerate(w.workers) if p.pid]
        for role, p in live:
            out.append(
                ProcessStats(
                    role,
                    p.pid,
                    min(most, p.cpu_s / secs),
                    min(most, (p.cpu_s + p.runq_s) / secs),
                    p.voluntary,
                    p.involuntary,
                    p.threads,
                    p.dstate,
                    p.pss,
                    p.uss,
                    p.fds,
                )
            )
        return out

    @property
    def waits(self) -> dict[str, float]:
        """What the producers did, shares of their time (computing, runq, network, disk, lock, sleep, idle,
        other: :attr:`Window.waits`); empty when nobody looked."""
        return self.window.waits

    @property
    def machine_cores(self) -> float:
        return self.window.machine_cores

    @property
    def others_cores(self) -> float:
        return self.window.others_cores

    @property
    def pss(self) -> float:
        return self.window.pss

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what a JSON-lines file gets): the figures, and the raw window."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "window"}
        for name in (
            "seconds",
            "batches",
            "samples",
            "samples_per_s",
            "stall",
            "wait_ms",
            "step_ms",
            "stages",
            "waits",
        ):
            out[name] = getattr(self, name)
        out.update(machine_cores=self.machine_cores, others_cores=self.others_cores, pss=self.pss)
        out["processes"] = [asdict(p) for p in self.processes]
        out["window"] = self.window.to_dict()
        return out

    def line(self) -> str:
        """The report in one line (what the log gets)."""
        main = self.processes[0] if self.processes else None
        workers = self.processes[1:]
        setting = "no workers" if not self.workers else f"{self.workers} workers (prefetch {self.prefetch_factor})"
        if self.loader_threads:
            setting = f"{self.loader_threads} loader threads"
        parts = [
            f"epoch {self.epoch} batch {self.position}: {self.samples_per_s:,.0f} samples/s, stall {self.stall:.0%} "
            f"(wait {self.wait_ms:.1f} ms/batch, step {self.step_ms:.1f} ms)",
            setting + (" [auto]" if self.auto else ""),
        ]
        if workers:
            cpu = "+".join(f"{p.cores:.2f}" for p in workers)
            vol, invol = sum(p.voluntary for p in workers), sum(p.involuntary for p in workers)
            parts.append(f"workers {cpu} cores, switches {vol} vol/{invol} invol")
        if main is not None:
            parts.append(f"main {main.cores:.2f} cores, {main.threads} threads")
        known = {s: v["ms_per_sample"] for s, v in self.stages.items() if v.get("ms_per_sample") is not None}
        if known:
            parts.append("per sample " + " ".join(f"{s} {ms:.2f} ms" for s, ms in known.items()))
        waits = {k: v for k, v in self.waits.items() if v >= 0.02}
        if waits:
            who = "workers" if self.workers else "loader threads" if self.loader_threads else "main"
            parts.append(f"{who} " + ", ".join(f"{WAIT_NAMES.get(k, k)} {v:.0%}" for k, v in waits.items()))
        dstate = sum(p.dstate for p in self.processes)
        parts.append(
            f"others {self.others_cores:.1f} of {self.usable_cores} cores; PSS {self.pss / 2**30:.2f} GiB, "
            f"{self.memory_available / 2**30:.1f} GiB free" + (f"; {dstate} threads in D state" if dstate else "")
        )
        parts.append(f"{self.label}: {self.evidence[0]}" if self.evidence else self.label)
        for c in self.changes:
            parts.append(f"auto: {_setting_text(c['from'])} -> {_setting_text(c['to'])} ({c['at']}): {c['reason']}")
        return "; ".join(parts)


WAIT_NAMES = {"runq": "waiting for a core"}  # the rest of Window.waits' kinds read as they are


def _setting_text(s: dict[str, Any]) -> str:
    w = s["workers"]
    return "0 workers" if not w else f"{w} workers (prefetch {s['prefetch']})"


class MonitorWriteWarning(UserWarning):
    """A monitor's JSON-lines file could not be written (a full disk, ``/dev/full``): training goes on, the
    file's reports stop."""


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
            check_path(p)
        self._files: dict[Path, IO[str]] = {}
        self._opened = False

    def emit(self, stats: Stats) -> None:
        if self.log:
            logging.getLogger(LOGGER).info("%s", stats.line())
        for fn in self.calls:
            fn(stats)
        if self.paths and not self._opened:
            self._opened = True
            for p in self.paths:
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


__all__ = [
    "LOGGER",
    "Monitor",
    "MonitorWriteWarning",
    "ProcessStats",
    "Sink",
    "Sinks",
    "Stats",
    "as_monitor",
    "check_path",
    "now",
]
