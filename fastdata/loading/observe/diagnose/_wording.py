"""How the diagnosis says its figures: shares, cores and waits in words a user reads without the docs.

Core counts are cores used (CPU-seconds per second, never more than the machine has); what the loader's threads
ask for (running or waiting for a core) is said apart, as what it wants ("the loader uses 1.95 of the 2 cores
and wants 2.4"); a busy share is
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
    return "no workers" if n == 0 else plural(n, "worker")


def busy(x: float, how: bool = False) -> str:
    """A producer's busy share, with its verb: "is busy 73% of the time", or past one (its threads together)
    "wants 1.75 cores (its threads together)": a demand, not cores used (a thread waiting for a core is busy
    without using one); ``how``: saying what busy is, in the same parentheses ("is busy 73% of the time
    (running or waiting for a core)")."""
    what = "running or waiting for a core"
    if x <= 1.0:
        return f"is busy {x:.0%} of the time" + (f" ({what})" if how else "")
    return f"wants {x:.2f} cores (its threads together" + (f", {what})" if how else ")")


def cores(used: float, machine: int) -> str:
    """Cores used, never more than the machine has (a reading a little above it is rounding)."""
    return f"{min(used, float(machine)):.2f}"


def need(ev: Evidence) -> str:
    """Cores the loader used (CPU time over wall time, never above the machine) and, apart, what its threads
    wanted (running or waiting for a core) where that differs: "the loader uses 0.25 of the 2 cores", "the
    loader uses 1.60 of the 2 cores and wants 2.4 (its threads running or waiting for a core)"."""
    machine = ev.ctx.cores
    text = f"the loader uses {cores(ev.used, machine)} of the {plural(machine, 'core')}"
    if ev.wanted > machine:
        return text + f" and wants {ev.wanted:.1f} (its threads running or waiting for a core)"
    if ev.wanted - ev.used >= 0.1:
        return text + f" and wants {ev.wanted:.2f} (its threads running or waiting for a core)"
    return text


def plural(n: float, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 worker", "2 workers", "0 workers", "3 batches"."""
    if n == 1:
        return f"{n:g} {noun}"
    return f"{n:g} {noun}es" if noun.endswith(("ch", "sh", "s", "x")) else f"{n:g} {noun}s"


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
    "plural",
    "producers",
    "threads_text",
    "workers_text",
]
