"""How the diagnosis says its figures: shares, cores and waits in words a user reads without the docs.

Core counts are cores used (CPU-seconds per second, never more than the machine has); what the loader would
use with more cores is said as a need ("the loader needs 2.4 cores, the machine has 2"); a busy share is
"busy 57% of the time (running or waiting for a core)"; a wait names what it waits on and the system calls
seen ("waiting on the network 85% of the time (recvfrom/poll)").
"""

from __future__ import annotations

from fastdata.loading.observe.diagnose._evidence import Evidence

# what a kind of wait is, in words (the kinds of fastdata.core.system._waits, and the probe's "runq")
WAIT_WORDS = {
    "computing": "computing",
    "runq": "waiting for a core",
    "network": "waiting on the network",
    "disk": "waiting on the disk (or a network file system)",
    "lock": "waiting on a lock",
    "sleep": "sleeping",
    "idle": "idle (waiting to be asked for more)",
    "other": "waiting in another system call",
}
SHORT = {
    "computing": "computing",
    "runq": "waiting for a core",
    "network": "network",
    "disk": "disk",
    "lock": "lock",
    "sleep": "sleep",
    "idle": "idle",
    "other": "other",
}


def pct(x: float) -> str:
    return f"{x:.0%}"


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def workers_text(n: int) -> str:
    return "no workers" if n == 0 else "1 worker" if n == 1 else f"{n} workers"


def busy(x: float, how: bool = False) -> str:
    """A producer's busy share, with its verb: "is busy 73% of the time", or past one (its threads together)
    "keeps 1.75 cores busy (its threads together)"; ``how``: saying what busy is, in the same parentheses
    ("is busy 73% of the time (running or waiting for a core)")."""
    what = "running or waiting for a core"
    if x <= 1.0:
        return f"is busy {x:.0%} of the time" + (f" ({what})" if how else "")
    return f"keeps {x:.2f} cores busy (its threads together" + (f", {what})" if how else ")")


def cores(used: float, machine: int) -> str:
    """Cores used, never more than the machine has (a reading a little above it is rounding)."""
    return f"{min(used, float(machine)):.2f}"


def need(ev: Evidence) -> str:
    """What the loader asks of the cores: "the loader needs 2.4 cores, the machine has 2", or "the loader uses
    1.2 of the 2 cores"."""
    if ev.demand > ev.ctx.cores:
        return f"the loader needs {ev.demand:.1f} cores, the machine has {ev.ctx.cores}"
    return f"the loader uses {cores(ev.demand, ev.ctx.cores)} of the {ev.ctx.cores} cores"


def producers(ev: Evidence) -> str:
    """Who makes the batches, as a subject: "the workers", "the loader threads", "the main process"."""
    if ev.workers:
        return "the worker" if ev.workers == 1 else "the workers"
    return "the loader threads" if ev.ctx.threads else "the main process (no workers)"


def calls(ev: Evidence, kind: str) -> str:
    """The system calls seen for ``kind``: " (recvfrom/poll)", or "" when none was named."""
    seen = ev.w.wait_calls(kind)
    return f" ({'/'.join(seen[:2])})" if seen else ""


def breakdown(ev: Evidence, least: float = 0.02) -> str:
    """What the producers did, in shares of their time: "computing 5%, waiting for a core 1%, network 85%,
    idle 9%" (empty when nobody looked)."""
    parts = [f"{SHORT.get(k, k)} {v:.0%}" for k, v in ev.w.waits.items() if v >= least]
    if not parts:
        return ""
    return f"what {producers(ev)} did: " + ", ".join(parts) + f" ({ev.looked} looks)"


def threads_text(threads: dict[str, float], least: float = 0.05) -> str:
    top = sorted(((c, n) for n, c in threads.items() if c >= least), reverse=True)[:3]
    return ", ".join(f"'{n}' {c:.2f} cores" for c, n in top)


__all__ = [
    "SHORT",
    "WAIT_WORDS",
    "breakdown",
    "busy",
    "calls",
    "cores",
    "gib",
    "need",
    "pct",
    "producers",
    "threads_text",
    "workers_text",
]
