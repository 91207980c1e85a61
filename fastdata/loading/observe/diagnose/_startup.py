"""Start-up verdicts: ``fork``, ``worker-init``, ``shuffle-fill``, when waiting for epochs' first batches takes a
third of the time, or (with a step the loop mostly keeps up with) half of the loop's wait for data, and one part
of that wait (launching the workers, their set-up, filling a shuffle buffer) stands out
(:class:`~fastdata.loading.observe.measure.StartSplit`); and what ``persistent_workers=True`` would save
(:func:`persistent_saving`): the workers' launch and set-up at every epoch, never the first batch's own reading,
which a persistent worker pays at every epoch too."""

from __future__ import annotations

from fastdata.loading.observe.diagnose import _wording as say
from fastdata.loading.observe.diagnose._evidence import Evidence
from fastdata.loading.observe.diagnose._verdict import (
    PERSIST_WORTH,
    STALL_TARGET,
    START_BOUND,
    START_OF_WAIT,
    START_PART,
    Verdict,
)
from fastdata.loading.observe.measure._stage_table import StartSplit


def restart_cost(ev: Evidence) -> float | None:
    """Seconds of an epoch's first-batch wait that persistent workers would not pay: launching the worker
    processes and their set-up (None: no workers, loader threads, or workers that already persist)."""
    split = ev.ctx.start
    if split is None or not ev.workers or ev.ctx.threads or ev.ctx.persistent:
        return None
    return split.launch + split.init


def waits(ev: Evidence) -> tuple[float, float]:
    """``(share of the time waiting for epochs' first batches, share of the time the loop waits for data, those
    waits included)``. A monitor's window holds both; a sweep's window starts after the first batch, and the
    context predicts the first waits' share from the epoch's length (:attr:`Context.first_wait`)."""
    w, first = ev.w, ev.first_wait
    if not w.step:
        return first, 1.0  # no step: the loop does nothing but wait for data
    if w.first_wait_s:
        return first, max(w.stall, first)
    return first, first + w.stall * (1 - first)


def shutdown_cost(ev: Evidence) -> float:
    """Seconds the loop waited at each pass's end (the ``next()`` that found it over: workers that do not
    persist are shut down there), 0 where none ended in the window or the workers persist."""
    w = ev.w
    if not w.ends or not ev.workers or ev.ctx.persistent:
        return 0.0
    return w.end_wait_s / w.ends


def persistent_saving(ev: Evidence) -> tuple[float, float, str] | None:
    """What ``persistent_workers=True`` would save: ``(seconds per epoch, share of the loop's wait for data,
    the sentence that says it)``; None where it saves nothing measurable (see :func:`restart_cost`). Persistent
    workers start once too: the saving is each start after the first, and each pass's end (their shutdown)."""
    start = restart_cost(ev)
    split = ev.ctx.start
    if not start or split is None or split.total <= 0:
        return None
    end = shutdown_cost(ev)
    per = start + end
    first, wait = waits(ev)
    w = ev.w
    epochs = ""
    if w.first_wait_s and w.starts > 1 and w.seconds > 0:
        # never more than the first batches and the passes' ends were waited for
        saved = min(start * (w.starts - 1), w.first_wait_s) + min(end * (w.starts - 1), w.end_wait_s)
        time_share = saved / w.seconds
        epochs = f"{saved:.2f} s over the {w.starts - 1} restarts seen, "
    else:
        time_share = first * min(1.0, start / split.total)  # of each epoch's first wait, the part it saves
        if w.seconds > 0:
            time_share += w.end_wait_s / w.seconds
    share = time_share / wait if wait > 0 else 0.0
    where = "the time the loop waits for data" if w.step else "the time"
    rest = split.fill + split.produce + split.deliver
    parts = f"launch {split.launch:.2f} s + set-up {split.init:.2f} s" + (f" + shutdown {end:.2f} s" if end else "")
    text = (
        f"persistent_workers=True would save the workers' launch, set-up{' and shutdown' if end else ''}, "
        f"{per:.2f} s an epoch after the first ({parts}; {epochs}{share:.0%} of {where}); not the first batch's "
        f"own reading and delivery ({rest:.2f} s), which persistent workers pay at every epoch too"
    )
    return per, share, text


def persistent_advice(ev: Evidence) -> str | None:
    """The sentence advising ``persistent_workers=True`` where it would save a measurable share
    (:data:`PERSIST_WORTH`) of the loop's wait for data (None elsewhere)."""
    saving = persistent_saving(ev)
    return saving[2] if saving is not None and saving[1] >= PERSIST_WORTH else None


def _restarts_dominate(ev: Evidence) -> bool:
    """With a step, the loop waiting for data: most of that wait is for epochs' first batches."""
    first, wait = waits(ev)
    return ev.w.step and wait >= STALL_TARGET and first >= START_OF_WAIT * wait


def start_up(ev: Evidence) -> Verdict | None:
    split = ev.ctx.start
    if split is None or split.total <= 0 or (ev.first_wait < START_BOUND and not _restarts_dominate(ev)):
        return None
    part, secs = split.largest()
    combined = False
    dominate = ev.first_wait < START_BOUND  # here only because the restarts are most of the loop's wait
    if dominate and secs < START_PART * split.total and not ev.ctx.threads:
        # a training loop that mostly keeps up and waits at epochs' starts: launching and set-up together are
        # what each restart costs it (persistent workers save both), named by the larger of the two when
        # together they stand out
        secs = split.launch + split.init
        part = "launch" if split.launch > split.init else "init"
        combined = True
    if secs < START_PART * split.total:
        return None  # no part stands out: the wait is the pipeline's own latency, not one start-up cost
    if ev.first_wait >= START_BOUND:
        share = f"{say.pct(ev.first_wait)} of the time goes to waiting for epochs' first batches"
    else:
        first, wait = waits(ev)
        share = (
            f"{say.pct(first / wait)} of the loop's wait for data ({say.pct(wait)} of the time) goes to waiting for "
            "epochs' first batches"
        )
    share += f" ({split.total:.2f} s each)"
    parts = ", ".join(f"{p} {getattr(split, p):.2f} s" for p in StartSplit.PARTS)
    saving = persistent_saving(ev)
    persist = [saving[2]] if saving is not None else []  # the start-up is the limit: always worth it
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
            "start the loader before the parent grows (a smaller parent forks faster), or use fewer workers"
            if forked
            else "fewer workers, or a lighter dataset to pickle (open files and clients lazily, in the worker)"
        )
        return Verdict(
            "fork",
            [
                f"{share}; starting the worker processes "
                + ("and their set-up take" if combined else "takes")
                + f" {secs:.2f} s of it ({how}); split: {parts}"
            ],
            [*persist, advice],
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
                f"clients, building indexes) "
                + ("and its launch take" if combined else "takes")
                + f" {secs:.2f} s of it; split: {parts}"
            ],
            [*persist, "make the set-up lazier or cheaper (cache the index)"],
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


__all__ = ["persistent_advice", "persistent_saving", "restart_cost", "shutdown_cost", "start_up", "waits"]
