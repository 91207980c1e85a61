"""Producers that wait off the CPU: what they wait on (the looks at their threads, :func:`waiting`; without
looks, the older signs of a wait on storage, :func:`storage_signs`), and the verdict that says it
(``storage``, ``lock``, ``sleep``, ``wait``: :func:`waits_verdict`)."""

from __future__ import annotations

from fastdata.loading.observe.diagnose import _wording as say
from fastdata.loading.observe.diagnose._evidence import Evidence
from fastdata.loading.observe.diagnose._verdict import (
    BLOCKED,
    FETCH_WAIT,
    KIND_LABEL,
    LOOKS_ENOUGH,
    OFF_CPU,
    STORAGE_SEEN,
    WAITS,
    Verdict,
)


def fetch_wait(ev: Evidence) -> float:
    """Share of a producer's time in ``fetch`` beyond the CPU it uses (every thread of it): the wall
    time of fetching far above its CPU time is a wait for bytes. CPU used, not demand: the run-queue
    waits of a pool of fetch threads add up across threads on a crowded machine, and are no work done."""
    fetch = ev.stage_busy.get("fetch")
    if fetch is None:
        return 0.0
    return max(0.0, fetch - ev.producer_cpu)


def fetch_dominates(ev: Evidence) -> bool:
    """More of the producers' time goes to fetch than to decode and transform together.

    On a crowded machine a pool of fetch threads that wakes on every network reply waits for a core at
    each wake-up, and those run-queue waits add up to "busy": a producer that waits for bytes then looks
    busy too. Where the time is spent tells the two apart: a decoder starved of CPU is in decode.
    """
    fetch = ev.stage_busy.get("fetch") or 0.0
    work = (ev.stage_busy.get("decode") or 0.0) + (ev.stage_busy.get("transform") or 0.0)
    return fetch > work


def waiting(ev: Evidence) -> tuple[str, float, float] | None:
    """What the producers wait on, when the looks at them say they mostly wait off the CPU: ``(kind, its
    share, the share of every off-CPU wait)``; None when they do not, or too few looks were made."""
    if ev.looked < LOOKS_ENOUGH or not ev.w.waits:
        return None
    off = sum(ev.w.waits.get(k, 0.0) for k in OFF_CPU)
    # against computing alone: waiting for a core is the machine's crowding (another program's), not work
    # the producer has to do; a CPU-bound producer on a crowded machine still waits off the CPU for nothing.
    # For the same reason the share is of the time the producer was not kept waiting for a core: a reader of a
    # cold disk on a crowded machine (computing 13%, waiting for a core 54%, on the disk 29%) waits on the disk
    had = 1.0 - ev.w.waits.get("runq", 0.0)
    if had <= 0 or off < WAITS * had or off <= ev.w.waits.get("computing", 0.0):
        return None
    top = max(OFF_CPU, key=lambda k: ev.w.waits.get(k, 0.0))
    return top, ev.w.waits.get(top, 0.0), off


def storage_seen(ev: Evidence) -> float:
    """Share of the looks at the producers that found them waiting on the network or the disk (0 with no looks)."""
    return sum(ev.w.waits.get(k, 0.0) for k in ("network", "disk"))


def storage_signs(ev: Evidence) -> list[str]:
    """The measurements that show a wait on storage without looks at the threads (empty when none does).

    Time in ``fetch`` beyond the CPU used is a wait, but not necessarily on storage: a reader that decompresses
    inside fetch (h5py's gzip filter) on a crowded machine waits for a core, or for a library's lock, as long.
    Where the threads were looked at, that sign counts only if the looks saw them on the network or the disk
    (:data:`STORAGE_SEEN` of them); the kernel's own signs (block-I/O delay, D state) count regardless.
    """
    signs = []
    wait = fetch_wait(ev)
    who = "each worker" if ev.workers else "each loader thread" if ev.ctx.threads else "the main process"
    looked = ev.looked >= LOOKS_ENOUGH and bool(ev.w.waits)
    if wait >= FETCH_WAIT and (not looked or storage_seen(ev) >= STORAGE_SEEN):
        fetch_ms = ev.stage_ms.get("fetch")
        ms = f" ({fetch_ms:.2f} ms per sample)" if fetch_ms is not None else ""
        fetch = ev.stage_busy.get("fetch") or 0.0
        spent = f"{fetch:.0%} of its time" if fetch <= 1 else f"{fetch:.2f} cores' worth of time (its threads together)"
        signs.append(
            f"{who} spends {spent} in fetch{ms} but uses only {ev.producer_cpu:.2f} cores of CPU, every thread "
            "counted: it waits for bytes"
        )
    if ev.blkio >= BLOCKED:
        signs.append(f"block-I/O delay {say.pct(ev.blkio)} of the time (the kernel's delay accounting)")
    if dstate_on_disk(ev):
        signs.append(f"a loader thread was in uninterruptible sleep (D state) in {say.pct(ev.w.dstate)} of the looks")
    return signs


def dstate_on_disk(ev: Evidence) -> bool:
    """Whether the looks that found a loader thread in D state show a wait on the disk: D state is also a
    page-cache page's lock or memory reclaim, so where the processes' I/O counters work (they counted bytes
    read) and no byte came from the device, it is not (issue 35: a page-cached gzip HDF5 file under a busy core,
    D state in 13% of the looks, 0.0 MB/s from the device of 101.7 MB/s read, was labelled storage)."""
    if ev.w.dstate < BLOCKED:
        return False
    counted = ev.w.read_mb_s > 0 or ev.w.device_mb_s > 0
    return not counted or ev.w.device_mb_s >= DEVICE_READ


# MB/s read from the storage device by the loader's processes above which their D state is taken for the disk
DEVICE_READ = 1.0


def disk_or_network(ev: Evidence) -> str:
    if ev.blkio >= BLOCKED or dstate_on_disk(ev) or ev.w.device_mb_s >= DEVICE_READ:
        return (
            f"The reads reach the disk ({ev.w.device_mb_s:.1f} MB/s from the device of {ev.w.read_mb_s:.1f} MB/s "
            "read): faster storage, larger sequential reads (tar shards) or a warm page cache help."
        )
    accounting = "" if ev.ctx.blkio_known else " (delay accounting is off: D-state looks only)"
    return (
        f"No block-I/O wait or D state{accounting} and {ev.w.device_mb_s:.1f} MB/s from the device: the wait is on "
        "the network or a remote store (or a lock or sleep in fetch)."
    )


def more_concurrency(ev: Evidence) -> str:
    """The advice for producers that wait: more of them overlap the waits, past the core count."""
    if ev.ctx.auto:
        return "num_workers='auto' adds workers past the core count while they wait and throughput rises"
    threads = "; or loader threads (fd.Loader(workers='threads')), lighter than processes" if ev.workers else ""
    return (
        f"the waits overlap: more workers, past the {ev.ctx.cores} cores (they mostly wait), or a larger "
        f"prefetch_factor{threads}"
    )


def waits_verdict(ev: Evidence, found: tuple[str, float, float]) -> Verdict:
    kind, share, off = found
    label = KIND_LABEL[kind]
    who = say.producers(ev)
    verb = "are" if who.endswith("s") else "is"
    first = f"{who} {verb} {say.WAIT_WORDS[kind]} {share:.0%} of the time{say.calls(ev, kind)}"
    if off - share >= 0.1:
        first += f", off the CPU {off:.0%} in all"
    found_text = [first]
    detail = say.breakdown(ev)
    if detail:
        found_text.append(detail)
    advice = [more_concurrency(ev)]
    if kind in ("network", "disk"):
        found_text.append(disk_or_network(ev) if kind == "disk" else network_note(ev))
    elif kind == "lock":
        advice = [
            "a lock held by another thread of the same process serialises the reads (a client library's "
            "connection lock, a logging handler, a cache's lock): worker processes each hold their own, loader "
            "threads share one, so more threads will not help; find who holds it (--profile shows the stacks)"
            if ev.ctx.where == "bench"
            else "a lock held by another thread of the same process serialises the reads: worker processes each "
            "hold their own, loader threads share one; find who holds it (py-spy dump --pid <a worker's pid>)"
        ]
    elif kind == "sleep":
        advice = [
            "the dataset sleeps (time.sleep, a rate limit, a retry's back-off): "
            + more_concurrency(ev)
            + ", or make it sleep less"
        ]
    return Verdict(label, found_text, advice)


def network_note(ev: Evidence) -> str:
    return (
        f"{ev.w.device_mb_s:.1f} MB/s from the device, {ev.w.read_mb_s:.1f} MB/s read through any call: the wait is "
        "the round trip to a server (an object store, a database, an HTTP service), not the bytes"
    )


__all__ = [
    "disk_or_network",
    "fetch_dominates",
    "fetch_wait",
    "more_concurrency",
    "network_note",
    "storage_seen",
    "storage_signs",
    "waiting",
    "waits_verdict",
]
