"""What a sweep measured: one :class:`Point` per DataLoader configuration, in a :class:`SweepResult`.

A point is a configuration plus its windows (the library's one measurement record) and the few facts only
a sweep sees around them (start-ups, the step, rounds); its figures are properties of its windows. Plain
dataclasses of numbers, so results round-trip through JSON (:meth:`SweepResult.to_dict`,
:meth:`SweepResult.from_dict`) and two runs can be compared.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

from fastdata.loading import Transport
from fastdata.loading.observe.measure import Window

Mode = Literal["processes", "threads", "hybrid"]
"""Who reads the batches: ``"processes"``, DataLoader worker processes (``num_workers``); ``"threads"``,
``num_workers`` threads of the training process (``fd.Loader(..., workers="threads")``); ``"hybrid"``,
``num_workers`` processes of ``threads_per_worker`` threads each."""
MODES: tuple[Mode, ...] = ("processes", "threads", "hybrid")
_MODE_RANK = {m: i for i, m in enumerate(MODES)}


@dataclass(frozen=True, order=True)
class Config:
    """One loader configuration. Sorts from the cheapest (fewest workers, least prefetch) up; see
    :meth:`cost` for the order the recommendation reads them in across modes.

    Attributes:
        num_workers (int): worker processes (or, in thread mode, loader threads); 0 loads in the main
            process.
        prefetch_factor (int | None): batches loaded ahead per worker (or thread); None with 0 workers.
        pin_memory (bool): copy batches to page-locked memory (only useful with CUDA).
        persistent_workers (bool): keep workers alive between epochs (threads always persist).
        batch_size (int | None): samples per batch; None when the dataset yields batches itself.
        mode (Mode): "processes", "threads" or "hybrid". Defaults to "processes".
        threads_per_worker (int): threads in each worker process (hybrid); 1 otherwise.
        transport ("stock" | "slots"): how worker processes hand batches over
            (:data:`fastdata.loading.Transport`). Defaults to "stock", the DataLoader's own way.
    """

    num_workers: int
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    batch_size: int | None = None
    mode: Mode = "processes"
    threads_per_worker: int = 1
    transport: Transport = "stock"

    @property
    def processes(self) -> int:
        """Worker processes this configuration starts (none in thread mode)."""
        return 0 if self.mode == "threads" else self.num_workers

    @property
    def loader_threads(self) -> int:
        """Threads that read batches, over every process (0: each worker reads by itself)."""
        if self.mode == "threads":
            return self.num_workers
        return self.num_workers * self.threads_per_worker if self.mode == "hybrid" else 0

    @property
    def producers(self) -> int:
        """What makes batches in parallel, for per-producer shares: the loader threads in thread mode,
        else the worker processes (or the main process)."""
        return max(1, self.num_workers)

    @property
    def in_main_process(self) -> bool:
        """The batches are made in the main process (no workers, or loader threads)."""
        return self.processes == 0

    def cost(self) -> tuple[Any, ...]:
        """The order "cheapest first" across modes: fewer processes, then fewer threads, then less
        prefetch, no pinning, no persistence; the stock transport before slots at equal settings."""
        return (
            self.processes,
            self.loader_threads,
            self.prefetch_factor or 0,
            self.pin_memory,
            self.persistent_workers,
            _MODE_RANK.get(self.mode, 0),
            self.transport != "stock",
        )

    def loader_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of this configuration, ready to paste: a ``DataLoader``'s for worker
        processes with the stock transport, else ``fd.Loader``'s (:meth:`uses_loader`)."""
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "num_workers": self.num_workers}
        if self.mode == "threads":
            kwargs["workers"] = "threads"
        if self.mode == "hybrid":
            kwargs["threads_per_worker"] = self.threads_per_worker
        if self.num_workers:
            kwargs["prefetch_factor"] = self.prefetch_factor
            if self.mode != "threads":
                kwargs["persistent_workers"] = self.persistent_workers
                if self.transport != "stock":
                    kwargs["transport"] = self.transport
        kwargs["pin_memory"] = self.pin_memory
        return kwargs

    def uses_loader(self) -> bool:
        """Whether only ``fd.Loader`` (not a plain ``DataLoader``) can run this configuration."""
        return self.mode != "processes" or (self.num_workers > 0 and self.transport != "stock")

    def label(self) -> str:
        """Short text for tables and plots: ``"4w pf2 pin"``, ``"4t pf2"`` (threads), ``"2wx2t pf2"``."""
        if self.mode == "threads":
            parts = [f"{self.num_workers}t"]
        elif self.mode == "hybrid":
            parts = [f"{self.num_workers}wx{self.threads_per_worker}t"]
        else:
            parts = [f"{self.num_workers}w"]
        if self.num_workers:
            parts.append(f"pf{self.prefetch_factor}")
            if self.persistent_workers:
                parts.append("persist")
            if self.transport != "stock" and self.mode != "threads":
                parts.append(self.transport)
        if self.pin_memory:
            parts.append("pin")
        return " ".join(parts)

    def series(self) -> str:
        """The settings other than the worker count (one plot line per series)."""
        parts = []
        if self.mode == "threads":
            parts.append("threads")
        elif self.mode == "hybrid":
            parts.append(f"{self.threads_per_worker} threads per worker")
        parts.append(f"prefetch {self.prefetch_factor or 2}")
        if self.pin_memory:
            parts.append("pin")
        if self.persistent_workers:
            parts.append("persistent")
        if self.transport != "stock" and self.mode != "threads":
            parts.append(self.transport)
        return ", ".join(parts)

    def describe(self) -> str:
        """In words: "no workers", "1 worker", "4 loader threads", "2 workers x 2 threads"."""
        n = self.num_workers
        if self.mode == "threads":
            return "1 loader thread" if n == 1 else f"{n} loader threads"
        base = "no workers" if n == 0 else "1 worker" if n == 1 else f"{n} workers"
        return f"{base} x {self.threads_per_worker} threads" if self.mode == "hybrid" and n else base


@dataclass
class Point:
    """What one configuration achieved: its windows of steady state (the library's one measurement record,
    :class:`~fastdata.loading.observe.measure.Window`, the monitor's too) and what happened around them.
    Every figure is the pooled window's (:attr:`window`), so the same loader over the same time gives the
    same figures here and in a monitor's report.

    Attributes:
        config (Config): the configuration.
        windows (list[Window]): the measurement windows after the warm-up, in order (a later epoch's start-up
            inside the window it fell in: training pays for it too).
        startup_s (float): from ``iter(loader)`` (starting the workers) to the first batch, seconds.
        restarts (list[float]): each later epoch's start-up, seconds.
        step (bool): a training step (a sleep or the user's function) ran after each batch.
        stage_totals (dict[str, tuple[float, float]]): per stage (seconds, items) over the whole run, warm-up
            included (a dataset that reads in bursts may do a stage's work outside every window).
        start_split, restart_split (dict[str, float]): where the first batch's wait went (launch, init,
            fill, produce, deliver; see :class:`fastdata.loading.observe.measure.StartSplit`), at the
            start and (median) at later epochs' starts.
        parent_rss (float): the main process's resident memory when the workers started, bytes.
        blkio_known (bool): the kernel's delay accounting was on (else block-I/O delay reads 0).
        round_labels (list[str]): the label of each separate measurement of this configuration (rounds).
        round_rates (list[float]): samples/s of each of them (empty for a single measurement).
        usable_cores (int): cores available when measured.
        error (str | None): why the point failed, if it did (one line; ``traceback`` holds the rest).
        traceback (str | None): the failure's traceback, for the JSON report.
    """

    config: Config
    windows: list[Window] = field(default_factory=list)
    startup_s: float = 0.0
    restarts: list[float] = field(default_factory=list)
    step: bool = False
    stage_totals: dict[str, tuple[float, float]] = field(default_factory=dict)
    start_split: dict[str, float] = field(default_factory=dict)
    restart_split: dict[str, float] = field(default_factory=dict)
    parent_rss: float = 0.0
    blkio_known: bool = False
    round_labels: list[str] = field(default_factory=list)
    round_rates: list[float] = field(default_factory=list)
    usable_cores: int = 1
    error: str | None = None
    traceback: str | None = None

    @functools.cached_property
    def window(self) -> Window:
        """Every window pooled: the point's figures."""
        return Window.pooled(self.windows)

    @property
    def ok(self) -> bool:
        return self.error is None and self.samples_per_s > 0

    @property
    def samples_per_s(self) -> float:
        """Every sample over all measured time (right for loaders that deliver in bursts, where a median of
        windows would pick a burst or a gap)."""
        return self.window.samples_per_s

    @property
    def window_rates(self) -> list[float]:
        return [w.samples_per_s for w in self.windows]

    @property
    def spread(self) -> float:
        """How far apart its measurements were, (max - min) / median: of its rounds where it was measured
        several times, else of its windows that measured at least half the median window's loop time (a
        window holding one batch right after a pass's end lasts a few ms, and its rate says nothing: such
        windows once made a spread of 17,407%). The run's noise."""
        rates = self.round_rates
        if not rates and self.windows:
            typical = statistics.median(w.loop_s for w in self.windows)
            rates = [w.samples_per_s for w in self.windows if w.loop_s >= typical / 2]
        mid = statistics.median(rates) if rates else 0.0
        return (max(rates) - min(rates)) / mid if mid else 0.0

    @property
    def stall(self) -> float | None:
        """With a step, the share of the loop's time spent waiting for data."""
        return self.window.stall if self.step else None

    @property
    def restart_s(self) -> float | None:
        """A later epoch's start-up, median (None if no epoch ended)."""
        return statistics.median(self.restarts) if self.restarts else None

    @property
    def stage_ms(self) -> dict[str, float | None]:
        return self.window.stage_ms(self.stage_totals)

    @property
    def pss_workers(self) -> list[float]:
        return [w.pss for w in self.window.workers]

    @property
    def fds(self) -> int:
        w = self.window
        return w.main.fds + sum(p.fds for p in w.workers)

    def figures(self) -> dict[str, Any]:
        """The point's figures by name (for a JSON report; all of them derived from its windows)."""
        w = self.window
        recv, recv_cpu = w.receiving
        voluntary, involuntary = w.switches
        return {
            "samples_per_s": self.samples_per_s,
            "mb_per_s": w.mb_per_s,
            "spread": self.spread,
            "window_rates": self.window_rates,
            "measured_s": w.seconds,
            "stall": self.stall,
            "restart_s": self.restart_s,
            "stage_ms": self.stage_ms,
            "stage_busy": w.stage_busy(self.config.producers),
            "main_busy": w.main_busy,
            "main_process_busy": w.main_process_busy,
            "main_cores": w.main_cores,
            "main_threads": w.main_threads,
            "worker_cores": w.worker_cores,
            "worker_busy": w.worker_busy,
            "worker_threads": w.worker_threads,
            "receiving": recv,
            "receiving_cpu": recv_cpu,
            "pinning": w.pinning,
            "cores_used": w.cores_used,
            "others_cores": w.others_cores,
            "demand": self.demand,
            "dstate": w.dstate,
            "blkio": w.blkio(self.config.producers),
            "device_mb_s": w.device_mb_s,
            "read_mb_s": w.read_mb_s,
            "switches_per_s": {"voluntary": voluntary, "involuntary": involuntary},
            "first_wait": w.first_wait,
            "pss_main": w.main.pss,
            "pss_workers": self.pss_workers,
            "fds": self.fds,
        }

    @property
    def demand(self) -> float:
        """Cores the loader would keep busy if it had them: the workers' and the main thread's busy shares
        summed (in thread mode, every thread of the main process: the loader threads are there). Unlike
        CPU used, it does not fall when other programs take the cores."""
        w = self.window
        if self.config.mode == "threads":
            # threads waiting for a core (or the GIL) want no more cores than there are
            return min(w.main_process_busy, float(self.usable_cores))
        return sum(w.worker_busy) + w.main_busy


@dataclass
class SweepResult:
    """Every point of a sweep, and what is needed to reproduce and compare it.

    Attributes:
        points (list[Point]): in the order measured.
        settings (dict): the sweep's arguments (grid, step time, seconds ...).
        machine (dict): cores, memory, CPU model, kernel, library versions.
        dataset (str): the dataset's ``repr``.
        epoch_samples (int | None): samples per epoch, when the dataset has a length.
    """

    points: list[Point]
    settings: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    dataset: str = ""
    epoch_samples: int | None = None

    @property
    def step_time(self) -> float:
        """Seconds of the simulated training step: its wait and its CPU work (0 for a step function, whose
        time is not known ahead)."""
        wait = self.settings.get("step_time") or 0.0
        wait = float(wait) if isinstance(wait, (int, float)) else 0.0
        return wait + float(self.settings.get("step_cpu") or 0.0)

    @property
    def usable_cores(self) -> int:
        return int(self.machine.get("usable_cores") or max((p.usable_cores for p in self.points), default=1))

    @property
    def usable_memory(self) -> float | None:
        mem = self.machine.get("usable_memory")
        return float(mem) if mem else None

    def ok_points(self) -> list[Point]:
        return [p for p in self.points if p.ok]

    def best(self) -> Point | None:
        """The point with the highest throughput."""
        ok = self.ok_points()
        return max(ok, key=lambda p: p.samples_per_s) if ok else None

    def to_dict(self) -> dict[str, Any]:
        """The result as plain values: each point's windows (the raw record) and, beside them, its figures
        (what reading the JSON wants: samples/s, stall, stage times ...), which :meth:`from_dict` recomputes."""
        out = dataclasses.asdict(self)
        for point, raw in zip(self.points, out["points"]):
            raw.update(point.figures())
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepResult:
        points = []
        known = {f.name for f in dataclasses.fields(Point)}
        for raw in data["points"]:
            raw = dict(raw)
            config = Config(**raw.pop("config"))
            raw["windows"] = [Window.from_dict(w) for w in raw.get("windows") or []]
            raw["stage_totals"] = {k: (float(v[0]), float(v[1])) for k, v in (raw.get("stage_totals") or {}).items()}
            points.append(Point(config, **{k: v for k, v in raw.items() if k in known}))
        return cls(
            points,
            data.get("settings", {}),
            data.get("machine", {}),
            data.get("dataset", ""),
            data.get("epoch_samples"),
        )


__all__ = ["MODES", "Config", "Mode", "Point", "SweepResult"]
