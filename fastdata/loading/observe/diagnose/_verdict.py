"""The vocabulary of the diagnosis: the labels (:data:`Label`), a verdict (:class:`Verdict`) and the thresholds
the rules of :mod:`~fastdata.loading.observe.diagnose` read (each with what it means)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

Label = Literal[
    "storage",
    "lock",
    "sleep",
    "wait",
    "cpu",
    "main-process",
    "ipc",
    "fork",
    "worker-init",
    "shuffle-fill",
    "memory",
    "step",
    "uncertain",
    "unknown",
]
LABELS: tuple[Label, ...] = get_args(Label)
START_UP: tuple[Label, ...] = ("fork", "worker-init", "shuffle-fill")
WAITING_LABELS: tuple[Label, ...] = ("storage", "lock", "sleep", "wait")  # producers that mostly wait off-CPU

MEMORY_NEAR = 0.8  # PSS of the loader's processes against the memory they may use
START_BOUND = 0.3  # share of the time spent waiting for epochs' first batches: start-up is the limit
START_PART = 0.45  # ... and the share of that wait its largest part must take to name it
START_OF_WAIT = 0.5  # with a step, the loop waiting: first batches take this share of its wait for data (or more)
PERSIST_WORTH = 0.1  # persistent workers would save this share of the loop's wait for data: worth advising
STALL_TARGET = 0.05  # with a step: the loop waits less than this share of the time: the step is the limit
MAIN_BUSY = 0.8  # main thread running or runnable this much of the time: the main process is the limit
RECEIVE = 0.5  # ... or computing to rebuild and pin batches this much of the time
RECEIVE_STEP = 0.25  # ... or, with a step the workers keep up with, receiving this share of the loop
LEADING = 0.6  # ... or busy this much, receiving a quarter of it, while every worker waits
COMPUTING = 0.5  # a producer running or runnable this much of the time computes (it is not waiting)
CORES_SATURATED = 0.85  # the loader's demand for cores, against the usable cores
FETCH_WAIT = 0.3  # time in fetch minus CPU used, as a share of a producer's time: it waits on storage
STORAGE_SEEN = 0.1  # looks finding producers on the network or the disk, for time in fetch to read as storage
BLOCKED = 0.1  # share of time in block-I/O delay, or of looks finding a thread in D state: a disk wait
OFF_CPU = ("network", "disk", "lock", "sleep", "other")  # the kinds of wait of Window.waits a producer is blocked in
WAITS = 1 / 3  # producers off the CPU this share of their time (and more than computing): they wait
LOOKS_ENOUGH = 12  # looks at the producers before their breakdown may decide
KIND_LABEL: dict[str, Label] = {
    "network": "storage",
    "disk": "storage",
    "lock": "lock",
    "sleep": "sleep",
    "other": "wait",
}


@dataclass
class Verdict:
    """A label and the evidence for it.

    Attributes:
        label (Label): what limits the loader.
        evidence (list[str]): sentences with the figures that decided it, most important first.
        advice (list[str]): what to do about it.
    """

    label: Label
    evidence: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)


__all__ = [
    "BLOCKED",
    "COMPUTING",
    "CORES_SATURATED",
    "FETCH_WAIT",
    "KIND_LABEL",
    "LABELS",
    "LEADING",
    "LOOKS_ENOUGH",
    "MAIN_BUSY",
    "MEMORY_NEAR",
    "OFF_CPU",
    "PERSIST_WORTH",
    "RECEIVE",
    "RECEIVE_STEP",
    "STALL_TARGET",
    "START_BOUND",
    "START_OF_WAIT",
    "START_PART",
    "START_UP",
    "STORAGE_SEEN",
    "WAITING_LABELS",
    "WAITS",
    "Label",
    "Verdict",
]
