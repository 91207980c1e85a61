"""Start-up verdicts: ``fork``, ``worker-init``, ``shuffle-fill``, when waiting for epochs' first batches takes a
third of the time and one part of that wait (launching the workers, their set-up, filling a shuffle buffer)
stands out (:class:`~fastdata.loading.observe.measure.StartSplit`)."""

from __future__ import annotations

from fastdata.loading.observe.diagnose import _wording as say
from fastdata.loading.observe.diagnose._evidence import Evidence
from fastdata.loading.observe.diagnose._verdict import START_BOUND, START_PART, Verdict
from fastdata.loading.observe.measure._stage_table import StartSplit


def start_up(ev: Evidence) -> Verdict | None:
    split = ev.ctx.start
    if split is None or ev.first_wait < START_BOUND or split.total <= 0:
        return None
    part, secs = split.largest()
    if secs < START_PART * split.total:
        return None  # no part stands out: the wait is the pipeline's own latency, not one start-up cost
    share = f"{say.pct(ev.first_wait)} of the time goes to waiting for epochs' first batches ({split.total:.2f} s each)"
    parts = ", ".join(f"{p} {getattr(split, p):.2f} s" for p in StartSplit.PARTS)
    if part == "launch" and ev.ctx.threads:
        return None  # no process is launched in thread mode: no "fork" verdict from a thread's start
    if part == "launch":
        forked = ev.ctx.start_method == "fork"
        how = (
            f"fork copies the page tables of the {say.gib(ev.ctx.parent_rss)} parent"
            if forked
            else f"{ev.ctx.start_method} starts a fresh interpreter that imports torch and unpickles the dataset"
        )
        advice = (
            "persistent_workers=True starts them once; or start the loader before the parent grows "
            "(a smaller parent forks faster), or use fewer workers"
            if forked
            else "persistent_workers=True starts them once; or fewer workers, or a lighter dataset to pickle "
            "(open files and clients lazily, in the worker)"
        )
        return Verdict(
            "fork",
            [f"{share}; starting the worker processes takes {secs:.2f} s of it ({how}); split: {parts}"],
            [advice],
        )
    if part == "init" and ev.ctx.threads:
        return Verdict(
            "worker-init",
            [
                f"{share}; the loader threads' set-up before their first sample (a copy of the dataset for "
                f"each thread, opening files or clients, building indexes) takes {secs:.2f} s of it; split: {parts}"
            ],
            ["make the set-up lazier or cheaper (cache the index); fewer threads copy the dataset fewer times"],
        )
    if part == "init":
        return Verdict(
            "worker-init",
            [
                f"{share}; each worker's set-up before its first sample (worker_init_fn, opening files or "
                f"clients, building indexes) takes {secs:.2f} s of it; split: {parts}"
            ],
            ["persistent_workers=True pays the set-up once; or make it lazier or cheaper (cache the index)"],
        )
    if part == "fill":
        return Verdict(
            "shuffle-fill",
            [
                f"{share}; before its first batch of {split.batch:.0f} samples the worker reads {split.read:.0f} "
                f"(a shuffle buffer), {secs:.2f} s of it; split: {parts}"
            ],
            [
                "a smaller shuffle_window (the buffer is refilled at every epoch, persistent workers or not), "
                "or shards shuffled instead of samples"
            ],
        )
    return None


__all__ = ["start_up"]
