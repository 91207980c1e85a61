"""What one report of the monitor holds (:class:`Stats`): the training loop's samples per second and data
stall over the time since the previous report, the stage times in the producing processes, every process of
the loader (CPU of all its threads, context switches voluntary and involuntary, threads, D state, PSS and
USS, open files), the cores other programs used, the memory left, the diagnosis label with its evidence, and
the changes ``num_workers="auto"`` made, each with its reason. When and where reports go: ``._reporter``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from fastdata.loading.observe.diagnose._wording import plural
from fastdata.loading.observe.measure._window import OfWindow, Window


@dataclass
class ProcessStats:
    """One process of the loader over a report's window (a view of the window's
    :class:`~fastdata.loading.observe.Process`).

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

    The figures are the window's (:class:`~fastdata.loading.observe.Window`, the record ``fastdata bench``
    measures too), read through the properties below; :meth:`to_dict` holds them and the window itself.

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
        rank (int), world_size (int): the training process that made the report, among how many
            (``torch.distributed`` once initialised, else the launch environment; 0 and 1 in a single process).
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
    rank: int = 0
    world_size: int = 1

    # the window's own figures (waits: what the producers did, shares of their time; empty when nobody looked)
    seconds = OfWindow[float]()
    batches = OfWindow[int]()
    samples = OfWindow[int]()
    samples_per_s = OfWindow[float]()
    stall = OfWindow[float]()
    waits = OfWindow[dict[str, float]]()
    machine_cores = OfWindow[float]()
    others_cores = OfWindow[float]()
    pss = OfWindow[float]()

    @property
    def cores_used(self) -> float:
        """Cores the loader used: CPU-seconds per second of all threads of its workers, and of the main process
        the loop thread inside ``next()`` and its other threads (a dataset's own threads counted where they
        run), never more than :attr:`usable_cores`."""
        w = self.window
        return min(float(self.usable_cores), sum(w.worker_cores) + w.main_cores)

    @property
    def cores_wanted(self) -> float:
        """Cores the loader's threads asked for: running or waiting for a core, per second (a demand: above
        :attr:`cores_used` when threads waited for a core; may pass the machine's cores)."""
        w = self.window
        return max(self.cores_used, sum(w.worker_busy) + w.main_process_busy)

    @property
    def setting(self) -> str:
        """The setting in words: "no workers", "1 worker, prefetch 2 (default)", "3 loader threads"."""
        if self.loader_threads:
            return plural(self.loader_threads, "loader thread")
        return _setting_text({"workers": self.workers, "prefetch": self.prefetch_factor})

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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what a JSON-lines file gets): the figures, and the raw window."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "window"}
        out.update((name, getattr(self, name)) for name in FIGURES.split())
        out["processes"] = [asdict(p) for p in self.processes]
        out["window"] = self.window.to_dict()
        return out

    def line(self) -> str:
        """The report in one line (what the log gets)."""
        main = self.processes[0] if self.processes else None
        workers = self.processes[1:]
        setting = self.setting
        who = f"rank {self.rank}/{self.world_size} " if self.world_size > 1 else ""
        parts = [
            f"{who}epoch {self.epoch} batch {self.position}: {self.samples_per_s:,.0f} samples/s, "
            f"stall {self.stall:.0%} (wait {self.wait_ms:.1f} ms/batch, step {self.step_ms:.1f} ms)",
            setting + (" [auto]" if self.auto else ""),
        ]
        if workers:
            cpu = "+".join(f"{p.cores:.2f}" for p in workers)
            vol, invol = sum(p.voluntary for p in workers), sum(p.involuntary for p in workers)
            parts.append(f"workers {cpu} cores, switches {vol} vol/{invol} invol")
        if main is not None:
            parts.append(f"main {main.cores:.2f} cores, {plural(main.threads, 'thread')}")
        parts.append(self._cores_text())
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

    def _cores_text(self) -> str:
        used, wanted, machine = self.cores_used, self.cores_wanted, self.usable_cores
        text = f"loader uses {used:.2f} of {plural(machine, 'core')}"
        if wanted - used >= 0.1:
            text += f", wants {wanted:.2f} (running or waiting for a core)"
        return text

    def __str__(self) -> str:
        """The report as a short table: one figure a row."""
        rows = [
            (
                "throughput",
                f"{self.samples_per_s:,.0f} samples/s ({plural(self.batches, 'batch')} in {self.seconds:.1f} s)",
            ),
            ("data stall", f"{self.stall:.0%} (wait {self.wait_ms:.1f} ms/batch, step {self.step_ms:.1f} ms/batch)"),
            ("setting", self.setting + (" [auto]" if self.auto else "")),
            ("cores", self._cores_text()),
        ]
        procs = self.processes
        if procs:
            rows.append(("processes", "; ".join(f"{p.role} {p.cores:.2f}" for p in procs) + " cores"))
        rows.append(("memory", f"PSS {self.pss / 2**30:.2f} GiB, {self.memory_available / 2**30:.1f} GiB available"))
        rows.append(("diagnosis", f"{self.label}: {self.evidence[0]}" if self.evidence else self.label))
        rows += [("advice", a) for a in self.advice[:2]]
        rows += [
            ("auto", f"{_setting_text(c['from'])} -> {_setting_text(c['to'])} ({c['at']}): {c['reason']}")
            for c in self.changes
        ]
        who = f", rank {self.rank}/{self.world_size}" if self.world_size > 1 else ""
        head = f"fastdata loader{who}, epoch {self.epoch} batch {self.position}"
        width = max(len(k) for k, _ in rows)
        return "\n".join([head, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])


# the figures a JSON-lines report holds beside its fields, in this order
FIGURES = (
    "seconds batches samples samples_per_s stall wait_ms step_ms cores_used cores_wanted setting stages waits "
    "machine_cores others_cores pss"
)
WAIT_NAMES = {"runq": "waiting for a core"}  # the rest of Window.waits' kinds read as they are


def _setting_text(s: dict[str, Any]) -> str:
    """ "no workers", "1 worker, prefetch 2 (default)", "4 workers, prefetch 3": the prefetch as a value, the
    DataLoader's default (2) said where none was given."""
    w, prefetch = s["workers"], s.get("prefetch")
    if not w:
        return "no workers"
    shown = "2 (default)" if prefetch is None else str(prefetch)
    return f"{plural(w, 'worker')}, prefetch {shown}"


__all__ = ["FIGURES", "WAIT_NAMES", "ProcessStats", "Stats"]
