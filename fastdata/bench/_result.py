"""What a sweep measured: one :class:`Point` per DataLoader configuration, in a :class:`SweepResult`.

Plain dataclasses of numbers, so results round-trip through JSON (:meth:`SweepResult.to_dict`,
:meth:`SweepResult.from_dict`) and two runs can be compared, and so :func:`~fastdata.bench.recommend`
can be tested on hand-built results.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

from fastdata.core.stages import STAGES
from fastdata.loading._builder import Transport

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
            (:data:`fastdata.loading._builder.Transport`). Defaults to "stock", the DataLoader's own way.
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
class Window:
    """Raw counters of one measurement window (differences between two probe readings).

    Times in seconds; ``*_cpu`` in CPU-seconds. ``stages`` maps a stage to (seconds, items) summed over
    every process that ran it during the window.
    """

    wall: float
    samples: int
    batches: int
    nbytes: int
    wait: float  # main loop blocked in next(loader)
    unpickle: float  # rebuilding batches received from workers (tensor hand-over waits included)
    unpickle_cpu: float  # CPU-seconds of that rebuilding
    pin: float  # copying batches to pinned memory
    step: float  # the simulated or real training step
    step_cpu: float  # main-thread CPU the step used (0 for a simulated, sleeping step)
    main_cpu: float  # the main thread
    main_runq: float  # main thread runnable but not running (another process held the core)
    threads_cpu: float  # other threads of the main process (pin-memory thread, ...)
    workers_cpu: list[float]
    workers_busy: list[float]  # each worker's main thread running or runnable (CPU + run-queue wait)
    machine_busy: float  # CPU-seconds every process of the machine used
    machine_iowait: float
    procs_blocked: int  # processes in uninterruptible sleep (D state) on the machine, at the end
    dstate: int  # of ours (main and workers) in D state, at the end
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)
    threads_runq: float = 0.0  # other threads of the main process runnable but not running
    main_threads: dict[str, float] = field(default_factory=dict)  # CPU by thread name, main's other threads
    worker_threads: dict[str, float] = field(default_factory=dict)  # CPU by thread name, workers summed
    voluntary: int = 0  # context switches, every thread of every process
    involuntary: int = 0
    blkio: float = 0.0  # block-I/O delay, every thread of every process
    read_bytes: int = 0  # bytes read from the storage device, every process
    rchar: int = 0  # bytes read through any read call
    threads_main: int = 0  # threads alive at the end
    threads_worker: int = 0  # the most threads of a worker at the end
    dstate_looks: int = 0  # looks at our threads' states, and those that found one in D state
    dstate_blocked: int = 0
    restart_wait: float = 0.0  # seconds of this window spent waiting for an epoch's first batch

    @property
    def rate(self) -> float:
        return self.samples / self.wall if self.wall > 0 else 0.0


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _per_s(dicts: list[dict[str, float]], wall: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return {k: v / wall for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v / wall >= 0.005}


@dataclass
class Point:
    """What one configuration achieved. Rates are medians over windows; fractions are of wall time.

    Attributes:
        config (Config): the configuration.
        startup_s (float): from ``iter(loader)`` (starting the workers) to the first batch, seconds.
        restart_s (float | None): the same at a later epoch's start, median (None if no epoch ended).
        samples_per_s, mb_per_s (float): throughput after the warm-up: every sample over all measured
            time, the restarts of later epochs included (training pays for them too).
        spread (float): (max - min) / median of the windows' samples/s: the run's noise.
        window_rates (list[float]): samples/s of each window.
        measured_s (float): seconds of steady state measured.
        stall (float | None): with a step time, fraction of the loop's time spent waiting for data.
        wait, unpickle, pin (float): main process: fraction of time blocked in ``next(loader)``,
            rebuilding received batches (waits for tensor hand-over included), pinning them.
        unpickle_cpu (float): fraction of time the main process spent computing to rebuild batches.
        main_busy (float): main thread running or runnable (CPU + run-queue wait), as a share of the time
            outside the step (the step's own CPU left out).
        main_cores, worker_cores (float): CPU used, in cores (CPU-seconds per second).
        per_worker_cores (list[float]): each worker's CPU use, in cores.
        worker_busy (list[float]): each worker's demand for a core: running or runnable (waiting for
            a core another program holds), summed over its threads. Near 1 for a computing worker however
            busy the machine is (more when it computes in several threads at once).
        machine_busy_cores (float): CPU used by the whole machine (other programs too), in cores.
        iowait (float): fraction of the machine's CPU time idle waiting for I/O.
        procs_blocked (int): most processes seen in uninterruptible sleep on the machine.
        dstate (int): most of our processes seen in uninterruptible sleep.
        stage_ms (dict[str, float | None]): milliseconds per sample in each stage (over the whole run,
            warm-up included), None when unknown.
        stage_busy (dict[str, float | None]): fraction of the producing processes' time in each stage,
            during the measured windows.
        pss_main, pss_workers (float | list[float]): proportional set size in bytes (shared pages
            divided among the processes sharing them).
        fds (int): open file descriptors, main process and workers together.
        ctx_voluntary, ctx_involuntary (float): context switches per second, every thread of every
            process: voluntary (a thread waited: I/O, a lock, a queue) and involuntary (it was pushed off
            its core: CPU pressure).
        main_process_busy (float): every thread of the main process running or runnable, summed, the
            step left out (helper threads included: a decoder's watchdog thread, the pin-memory thread).
        main_loader_cores (float): cores the main process's threads used for the loader (CPU only), as a
            share of the time outside the step (the step's CPU left out).
        main_threads, worker_threads (dict[str, float]): cores used per thread name (the main process's
            threads other than the main one; the workers' threads, summed over workers).
        threads_main, threads_worker (int): threads of the main process, and of the largest worker.
        dstate_share (float): share of looks (about 20 a second) that found one of our threads in D state.
        blkio_share (float): block-I/O delay over all our threads, per producing process, as a share of
            time (0 unless the kernel's delay accounting is on; ``blkio_known`` says whether it is).
        device_mb_s, read_mb_s (float): MB/s read from the storage device, and through any read call.
        epoch_start (float): share of the measured time spent waiting for epochs' first batches (or,
            when no epoch ended while measuring, the first batch's wait against an epoch's time).
        start_split, restart_split (dict[str, float]): where the first batch's wait went (launch, init,
            fill, produce, deliver; see :class:`fastdata.loading.observe._stage_table.StartSplit`), at the start and
            (median) at later epochs' starts.
        parent_rss (float): the main process's resident memory when the workers started, bytes.
        round_labels (list[str]): the label of each separate measurement of this configuration (rounds).
        usable_cores (int): cores available when measured.
        error (str | None): why the point failed, if it did.
    """

    config: Config
    startup_s: float = 0.0
    restart_s: float | None = None
    samples_per_s: float = 0.0
    mb_per_s: float = 0.0
    spread: float = 0.0
    window_rates: list[float] = field(default_factory=list)
    measured_s: float = 0.0
    stall: float | None = None
    wait: float = 0.0
    unpickle: float = 0.0
    unpickle_cpu: float = 0.0
    pin: float = 0.0
    main_busy: float = 0.0
    main_cores: float = 0.0
    worker_cores: float = 0.0
    per_worker_cores: list[float] = field(default_factory=list)
    worker_busy: list[float] = field(default_factory=list)
    machine_busy_cores: float = 0.0
    iowait: float = 0.0
    procs_blocked: int = 0
    dstate: int = 0
    stage_ms: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(STAGES))
    stage_busy: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(STAGES))
    pss_main: float = 0.0
    pss_workers: list[float] = field(default_factory=list)
    fds: int = 0
    ctx_voluntary: float = 0.0
    ctx_involuntary: float = 0.0
    main_process_busy: float = 0.0
    main_loader_cores: float = 0.0
    main_threads: dict[str, float] = field(default_factory=dict)
    worker_threads: dict[str, float] = field(default_factory=dict)
    threads_main: int = 0
    threads_worker: int = 0
    dstate_share: float = 0.0
    blkio_share: float = 0.0
    blkio_known: bool = False
    device_mb_s: float = 0.0
    read_mb_s: float = 0.0
    epoch_start: float = 0.0
    start_split: dict[str, float] = field(default_factory=dict)
    restart_split: dict[str, float] = field(default_factory=dict)
    parent_rss: float = 0.0
    round_labels: list[str] = field(default_factory=list)
    usable_cores: int = 1
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.samples_per_s > 0

    @property
    def pss_total(self) -> float:
        return self.pss_main + sum(self.pss_workers)

    @property
    def total_cores(self) -> float:
        return self.main_cores + self.worker_cores

    @property
    def demand(self) -> float:
        """Cores the loader would keep busy if it had them: the workers' and the main thread's busy
        fractions summed (in thread mode, every thread of the main process: the loader threads are there).
        Unlike CPU used, it does not fall when other programs take the cores."""
        if self.config.mode == "threads":
            return self.main_process_busy
        return sum(self.worker_busy) + self.main_busy

    @classmethod
    def from_windows(
        cls,
        config: Config,
        windows: list[Window],
        *,
        startup_s: float,
        restart_s: list[float],
        step_time: bool,
        usable_cores: int,
        stage_totals: dict[str, tuple[float, float]] | None = None,
    ) -> Point:
        """Aggregate raw windows: totals over all windows for rates and fractions; stage time per sample
        from ``stage_totals`` (the whole run, warm-up included) where given."""
        p = cls(config, startup_s=startup_s, usable_cores=usable_cores)
        p.restart_s = _median(restart_s) if restart_s else None
        if not windows:
            p.error = "no complete measurement window (the dataset may be too small or too slow)"
            return p
        rates = [w.rate for w in windows]
        wall = sum(w.wall for w in windows)
        p.window_rates = rates
        # all samples over all measured time: right for loaders that deliver in bursts, where a
        # median of windows would pick a burst or a gap
        p.samples_per_s = sum(w.samples for w in windows) / wall
        p.mb_per_s = sum(w.nbytes for w in windows) / wall / 1e6
        p.spread = (max(rates) - min(rates)) / _median(rates) if _median(rates) else 0.0
        p.measured_s = wall
        p.wait = sum(w.wait for w in windows) / wall
        p.unpickle = sum(w.unpickle for w in windows) / wall
        p.unpickle_cpu = sum(w.unpickle_cpu for w in windows) / wall
        p.pin = sum(w.pin for w in windows) / wall
        step = sum(w.step for w in windows)
        if step_time:
            waited = sum(w.wait for w in windows)
            p.stall = waited / (waited + step) if waited + step > 0 else 0.0
        busy = sum(w.main_cpu + w.main_runq - w.step_cpu for w in windows)
        # the main process can compute for the loader only outside the step (a sleep, or the model)
        free = max(wall - step, 1e-9) if step_time else wall
        p.main_busy = max(0.0, min(1.0, busy / free))
        p.main_cores = sum(w.main_cpu + w.threads_cpu for w in windows) / wall
        nworkers = max((len(w.workers_cpu) for w in windows), default=0)
        per = [sum(w.workers_cpu[i] for w in windows if i < len(w.workers_cpu)) / wall for i in range(nworkers)]
        p.per_worker_cores = per
        p.worker_busy = [
            sum(w.workers_busy[i] for w in windows if i < len(w.workers_busy)) / wall for i in range(nworkers)
        ]
        p.worker_cores = sum(per)
        p.machine_busy_cores = sum(w.machine_busy for w in windows) / wall
        total_cpu = sum(w.machine_busy + w.machine_iowait for w in windows)
        p.iowait = sum(w.machine_iowait for w in windows) / total_cpu if total_cpu > 0 else 0.0
        p.procs_blocked = max(w.procs_blocked for w in windows)
        p.dstate = max(w.dstate for w in windows)
        helpers = sum(w.threads_cpu + w.threads_runq for w in windows)
        p.main_process_busy = max(0.0, busy + helpers) / free
        own = sum(w.main_cpu - w.step_cpu + w.threads_cpu for w in windows)
        p.main_loader_cores = max(0.0, own) / free
        p.main_threads = _per_s([w.main_threads for w in windows], wall)
        p.worker_threads = _per_s([w.worker_threads for w in windows], wall)
        p.ctx_voluntary = sum(w.voluntary for w in windows) / wall
        p.ctx_involuntary = sum(w.involuntary for w in windows) / wall
        p.threads_main = max(w.threads_main for w in windows)
        p.threads_worker = max(w.threads_worker for w in windows)
        looks = sum(w.dstate_looks for w in windows)
        p.dstate_share = sum(w.dstate_blocked for w in windows) / looks if looks else 0.0
        p.blkio_share = sum(w.blkio for w in windows) / wall / config.producers
        p.device_mb_s = sum(w.read_bytes for w in windows) / wall / 1e6
        p.read_mb_s = sum(w.rchar for w in windows) / wall / 1e6
        p.epoch_start = sum(w.restart_wait for w in windows) / wall
        # time in each stage, over what produces batches (the workers, the loader threads, or the main process)
        producers = config.producers
        for stage in STAGES:
            secs = sum(w.stages.get(stage, (0.0, 0.0))[0] for w in windows)
            items = sum(w.stages.get(stage, (0.0, 0.0))[1] for w in windows)
            if items > 0:
                p.stage_ms[stage] = 1000.0 * secs / items
                p.stage_busy[stage] = secs / (wall * producers)
        # a dataset that reads in bursts may do a stage's work outside every window (during the warm-up,
        # or ahead, while the loop drains prefetched batches): per sample, use the whole run's totals
        for name, (secs, items) in (stage_totals or {}).items():
            if items > 0:
                p.stage_ms[name] = 1000.0 * secs / items
        return p


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
        return float(self.settings.get("step_time") or 0.0)

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
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepResult:
        points = []
        known = {f.name for f in dataclasses.fields(Point)}
        for raw in data["points"]:
            raw = dict(raw)
            config = Config(**raw.pop("config"))
            points.append(Point(config, **{k: v for k, v in raw.items() if k in known}))
        return cls(
            points,
            data.get("settings", {}),
            data.get("machine", {}),
            data.get("dataset", ""),
            data.get("epoch_samples"),
        )


__all__ = ["MODES", "Config", "Mode", "Point", "SweepResult", "Window"]
