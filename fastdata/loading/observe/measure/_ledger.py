"""Bad samples a restart would count twice, given back.

Under ``on_error="skip"`` each worker counts the bad samples it leaves out into its own slot of the dataset's
shared counters (:class:`fastdata.core.process.SharedState`). A worker reads ahead of the training loop
(``prefetch_factor`` batches), so when ``num_workers="auto"`` restarts the workers mid-epoch, the batches they
made and never handed out are read again by the new workers, and their bad samples counted again.

The :class:`Ledger` knows which of each worker's counts belong to batches handed out: each worker notes its
own count after every batch it collates (into its row of the stage table, :meth:`StageTable.ledger`), and the
loop counts the batches it received from each worker (the DataLoader hands them out in order, each worker's
in the order it made them). At a restart, once the old workers have stopped, each worker's slot is set back
to what it had counted by the last batch of its that was handed out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fastdata.core.process import SharedState
from fastdata.loading.observe.measure._stage_table import StageTable


def _own(shared: SharedState, counter: str) -> float:
    return float(shared.slot_value(counter, shared.own_slot()))


def next_worker(iterator: Any) -> int | None:
    """The worker whose batch a DataLoader iterator hands out next (None: not known, or none is coming).

    Reads the iterator's private task table the way its ``_next_data`` does (stable since torch 1.x): the
    first task from the next index on whose worker is still running, or whose batch has arrived."""
    tasks, idx = getattr(iterator, "_task_info", None), getattr(iterator, "_rcvd_idx", None)
    sent, running = getattr(iterator, "_send_idx", None), getattr(iterator, "_workers_status", None)
    if tasks is None or idx is None or sent is None or running is None:
        return None
    while idx < sent:
        task = tasks.get(idx)
        if task and (len(task) == 2 or running[task[0]]):
            return int(task[0])
        idx += 1
    return None


class Ledger:
    """A dataset counter (``skipped``) kept right across restarts (see the module doc).

    Args:
        shared (SharedState): the dataset's shared counters.
        counter (str): the counter. Defaults to "skipped".
    """

    def __init__(self, shared: SharedState, counter: str = "skipped") -> None:
        self.shared, self.counter = shared, counter
        self._delivered: dict[int, int] = {}  # worker id -> batches handed out, since its processes started
        self._pids: list[int] = []
        self._next: int | None = None

    def noter(self) -> Callable[[], float]:
        """What each worker calls after each batch: its own count (picklable, for spawned workers)."""
        return functools.partial(_own, self.shared, self.counter)

    def began(self, pids: list[int]) -> None:
        """The iterator's worker processes: new ones count their batches from zero."""
        if pids != self._pids:
            self._pids, self._delivered = list(pids), {}

    def asking(self, iterator: Any) -> None:
        """Just before ``next(iterator)``."""
        self._next = next_worker(iterator)

    def handed(self) -> None:
        """The batch asked for was handed out."""
        if self._next is not None:
            self._delivered[self._next] = self._delivered.get(self._next, 0) + 1
        self._next = None

    def restarted(self, table: StageTable) -> int:
        """The old workers have stopped: give back what each counted for batches it never handed out.
        Returns the count given back."""
        given = 0
        for w in range(len(self._pids)):
            noted = table.ledger(1 + w, self._delivered.get(w, 0))
            if noted is None:
                continue  # the batch is out of the ring, or the worker never attached: leave its count
            extra = self.shared.slot_value(self.counter, 1 + w) - int(noted)
            if extra > 0:
                self.shared.take_back(self.counter, 1 + w, extra)
                given += extra
        self._pids, self._delivered = [], {}
        return given


__all__ = ["Ledger", "next_worker"]
