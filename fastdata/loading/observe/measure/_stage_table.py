"""The stage table: what each process of a loader writes into shared memory for the others to read.

One row per process (0: the main process, 1 + k: worker k) holding its stage totals (fetch, decode,
transform, collate, from :mod:`fastdata.core.stages`), the marks of its latest epoch's first batch (when
the worker started, when its ``worker_init_fn`` ended, when it began the batch, how much it had read by
then), from which :func:`start_split` splits a start-up into launching the process, its set-up, filling
a shuffle buffer, producing and delivering the batch; and its own CPU, run-queue wait and context
switches, which it writes itself (a worker of a short epoch exits between two readings of its /proc
files). :class:`ProbeInit` (the workers' ``worker_init_fn``) attaches a worker to its row;
:func:`batch_begin` / :func:`batch_end` are called around each batch's ``collate_fn``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter

import torch

from fastdata.core import stages
from fastdata.core.stages import STAGES
from fastdata.core.system import own_counters

NSTAGE = 2 * len(STAGES)
# the marks of the latest epoch's first batch in a process's row, after the stage totals
MARKS = ("init_start", "init_end", "first_begin", "first_read", "first_read_s", "first_n", "epoch", "pid")
# the process's own counters, written by itself (cumulative over the processes that held the row): a
# worker that lives one short epoch exits before anyone reads its /proc files
SELF = ("cpu", "runq", "voluntary", "involuntary")
SELF_EVERY = 0.02  # seconds between two updates of them (a getrusage and a few small reads)
# the ledger: batches the process collated since it attached, what a counter of its own (its skipped samples)
# read when it attached, and after each of its last RING batches
LEDGER = ("batches", "ledger0")
RING = 32  # more than a worker reads ahead (prefetch_factor x 1, plus the batch being made)
_COL = {name: NSTAGE + i for i, name in enumerate(MARKS + SELF + LEDGER)}
_RING = NSTAGE + len(MARKS) + len(SELF) + len(LEDGER)
COLUMNS = _RING + RING


class StageTable:
    """A shared-memory table: per process (row 0: main, 1 + k: worker k), stage totals and the marks of
    its latest epoch's first batch; and the epoch counter the main process bumps at each epoch's start.

    Pickled into ``spawn`` workers by the DataLoader, the tensors travel as shared memory. Clock values
    are ``time.perf_counter()`` readings: CLOCK_MONOTONIC on Linux, one clock for every process.

    Args:
        slots (int): rows; the main process and each worker need one.
    """

    def __init__(self, slots: int) -> None:
        self.tensor = torch.zeros((slots, COLUMNS), dtype=torch.float64).share_memory_()
        self.control = torch.zeros(2, dtype=torch.float64).share_memory_()  # epoch, when it started

    def attach(self, slot: int, ledger: Callable[[], float] | None = None) -> None:
        """Probe the calling process, flushing into row ``slot`` (counting on from what it holds: the
        workers of a new epoch take over the rows of the last epoch's). ``ledger``: a count of the process's
        own (its skipped samples) to note after each batch (see :meth:`ledger`)."""
        global _attached
        row = self.tensor.numpy()[slot]
        stages.enable(row[:NSTAGE], start=row[:NSTAGE].tolist())
        row[_COL["pid"]] = os.getpid()
        row[_COL["batches"]] = 0
        row[_COL["ledger0"]] = ledger() if ledger is not None else 0.0
        _attached = _Attached(self, slot)
        _attached.ledger = ledger
        _attached.read_at_end = _read_so_far()  # a replaced worker's row holds its predecessor's totals

    def new_epoch(self) -> None:
        """Called by the main process just before an epoch's ``iter(loader)``: each process marks its next
        batch as that epoch's first."""
        c = self.control.numpy()
        c[0] += 1
        c[1] = perf_counter()

    def totals(self) -> dict[str, tuple[float, float]]:
        """``{stage: (seconds, items)}`` summed over every process."""
        sums = self.tensor.numpy()[:, :NSTAGE].sum(axis=0)
        return {name: (float(sums[2 * i]), float(sums[2 * i + 1])) for i, name in enumerate(STAGES)}

    def counters(self, slot: int) -> dict[str, float]:
        """Row ``slot``'s own process counters (see :data:`SELF`): CPU-seconds and run-queue seconds of all
        its threads, voluntary and involuntary context switches; summed over the processes that held it."""
        row = self.tensor.numpy()[slot]
        return {name: float(row[_COL[name]]) for name in SELF}

    def batches(self, slot: int) -> int:
        """Batches the process in row ``slot`` collated since it attached."""
        return int(self.tensor.numpy()[slot][_COL["batches"]])

    def ledger(self, slot: int, batches: int) -> float | None:
        """What the process in row ``slot`` noted of its ledger count (:meth:`attach`) after its first
        ``batches`` batches (0: when it attached); None when that is no longer in the ring (or not yet made)."""
        row = self.tensor.numpy()[slot]
        made = int(row[_COL["batches"]])
        if batches == 0:
            return float(row[_COL["ledger0"]])
        if batches > made or batches <= made - RING:
            return None
        return float(row[_RING + (batches - 1) % RING])

    def marks(self, slot: int) -> dict[str, float]:
        """The marks of row ``slot`` (see :data:`MARKS`)."""
        row = self.tensor.numpy()[slot]
        return {name: float(row[_COL[name]]) for name in MARKS}

    @property
    def epoch(self) -> int:
        return int(self.control.numpy()[0])


class _Attached:
    """This process's row, and what it has read up to the end of its last batch."""

    def __init__(self, table: StageTable, slot: int) -> None:
        self.table, self.slot = table, slot
        self.row = table.tensor.numpy()[slot]
        self.epoch = -1.0
        self.read_at_end = (0.0, 0.0)  # (items, seconds) read by the end of the last batch
        self.first = False
        # the row's counters count on from the process that held it before; ours from now
        self.base = [float(self.row[_COL[n]]) for n in SELF]
        self.start = own_counters()
        self.updated = 0.0
        self.ledger: Callable[[], float] | None = None

    def update(self, now: float) -> None:
        current = own_counters()
        for i, name in enumerate(SELF):
            self.row[_COL[name]] = self.base[i] + max(0.0, current[i] - self.start[i])
        self.updated = now


_attached: _Attached | None = None


def _read_so_far() -> tuple[float, float]:
    """(samples read, seconds fetching, decoding and transforming) by this process so far."""
    tot = stages.totals()
    items = max(tot["fetch"][1], tot["decode"][1], tot["transform"][1])
    return items, tot["fetch"][0] + tot["decode"][0] + tot["transform"][0]


def batch_begin() -> None:
    """Called as a batch's ``collate_fn`` starts: the first batch of an epoch records its marks."""
    a = _attached
    if a is None:
        return
    epoch = float(a.table.control.numpy()[0])
    a.first = epoch != a.epoch
    if a.first:
        a.epoch = epoch
        items, secs = _read_so_far()
        row = a.row
        row[_COL["first_begin"]] = perf_counter()
        row[_COL["first_read"]] = items - a.read_at_end[0]
        row[_COL["first_read_s"]] = secs - a.read_at_end[1]


def batch_end(n: int) -> None:
    """Called as a batch's ``collate_fn`` returns ``n`` samples: remembers what was read, flushes."""
    a = _attached
    if a is None:
        return
    if a.first:
        a.row[_COL["first_n"]] = n
        a.row[_COL["epoch"]] = a.epoch
    a.read_at_end = _read_so_far()
    if a.ledger is not None:
        made = int(a.row[_COL["batches"]])
        a.row[_RING + made % RING] = a.ledger()  # noted before the count says it is there
        a.row[_COL["batches"]] = made + 1
    now = perf_counter()
    if now - a.updated >= SELF_EVERY or a.first:
        a.update(now)
    stages.flush()


def detach() -> None:
    """Stop probing the calling process."""
    global _attached
    _attached = None
    stages.disable()


class ProbeInit:
    """``worker_init_fn`` that attaches each worker to its row of a :class:`StageTable` (marking when it
    started and when its set-up ended), then runs the user's own.

    Args:
        table (StageTable): where the workers' totals go.
        then (Callable[[int], object] | None): the user's ``worker_init_fn``.
        ledger (Callable[[], float] | None): a count of the worker's own to note after each batch (its
            skipped samples: see ``Ledger``). Defaults to None.
    """

    def __init__(
        self, table: StageTable, then: Callable[[int], object] | None = None, ledger: Callable[[], float] | None = None
    ) -> None:
        self.table, self.then, self.ledger = table, then, ledger

    def __call__(self, worker_id: int) -> None:
        started = perf_counter()
        slot = 1 + worker_id
        if slot >= self.table.tensor.shape[0]:  # more workers than the table has rows: unprobed, not broken
            if self.then is not None:
                self.then(worker_id)
            return
        self.table.attach(slot, self.ledger)
        row = self.table.tensor.numpy()[slot]
        row[_COL["init_start"]] = started
        row[_COL["init_end"]] = 0.0
        if self.then is not None:
            self.then(worker_id)
        row[_COL["init_end"]] = perf_counter()


@dataclass
class StartSplit:
    """Where the wait for an epoch's first batch went, in seconds.

    Attributes:
        total (float): from ``iter(loader)`` to the first batch in the training loop.
        launch (float): starting the worker process (fork: copying the parent's page tables; spawn: a
            fresh interpreter importing torch and unpickling the dataset), until its ``worker_init_fn``.
        init (float): the worker's set-up: its ``worker_init_fn``, and whatever the dataset does before
            reading that no stage probe times (opening files or clients, building an index).
        fill (float): reading samples beyond the first batch before yielding it (a shuffle buffer).
        produce (float): reading the first batch's own samples.
        deliver (float): collating it and sending it to the training loop.
        read (float): samples the producing process read before its first batch.
        batch (float): samples in that first batch.
    """

    total: float = 0.0
    launch: float = 0.0
    init: float = 0.0
    fill: float = 0.0
    produce: float = 0.0
    deliver: float = 0.0
    read: float = 0.0
    batch: float = 0.0

    PARTS = ("launch", "init", "fill", "produce", "deliver")

    def largest(self) -> tuple[str, float]:
        name = max(self.PARTS, key=lambda p: getattr(self, p))
        return name, float(getattr(self, name))


def start_split(
    table: StageTable, slot: int, asked: float, started: float, arrived: float, restarted: bool
) -> StartSplit:
    """Split the wait for an epoch's first batch (``iter(loader)`` called at ``asked``, returned at
    ``started``; the batch in the loop at ``arrived``), from the marks of the process in row ``slot``
    (the one that made it: worker 0, or the main process).

    Launching is the longer of ``iter(loader)`` itself (under fork it forks every worker before any
    gets work: each fork copies the parent's page tables) and the time until the worker's
    ``worker_init_fn`` ran (under spawn the child boots after ``iter`` returns).

    Args:
        restarted (bool): the worker process was started for this epoch (not persistent, or the first).
    """
    m = table.marks(slot)
    split = StartSplit(total=max(0.0, arrived - asked))
    if not m["first_begin"] or m["first_begin"] < asked:
        return split  # the marks are an older epoch's: nothing to split
    ready = started
    split.launch = max(0.0, started - asked)
    if restarted and m["init_start"] >= asked:
        split.launch = max(split.launch, m["init_start"] - asked)
        init_end = m["init_end"] or m["init_start"]
        split.init = max(0.0, init_end - m["init_start"])
        ready = max(started, init_end)
    span = max(0.0, m["first_begin"] - ready)  # from ready to reading until the first collate
    read_s = min(m["first_read_s"], span)
    split.init += span - read_s  # time before the first batch no stage accounts for: set-up
    split.read, split.batch = m["first_read"], m["first_n"]
    if split.read > split.batch > 0:
        split.fill = read_s * (1 - split.batch / split.read)
    split.produce = read_s - split.fill
    split.deliver = max(0.0, arrived - m["first_begin"])
    return split


__all__ = [
    "COLUMNS",
    "MARKS",
    "SELF",
    "ProbeInit",
    "StageTable",
    "StartSplit",
    "batch_begin",
    "batch_end",
    "detach",
    "start_split",
]
