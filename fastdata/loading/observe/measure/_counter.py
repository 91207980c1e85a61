"""The one per-batch counter: what the training loop sees, fed batch by batch by whoever iterates.

The sweep's measuring loop (``fastdata bench``) and the monitor's hook around a training loop both call
:meth:`BatchCounter.handed` once per batch with two clock and two CPU-clock readings (when the batch was
asked for and when it arrived), so both count the loop the same way: the wait inside ``next()``, the step
between a batch and the next request, a pass's first wait. The probe copies the counts
into each reading, so a window's loop figures are differences of this counter.
"""

from __future__ import annotations

import time
from time import perf_counter

Clocks = tuple[float, float, float]  # (wall clock, the loop thread's CPU clock, the process's CPU clock)


class BatchCounter:
    """Cumulative counts of the training loop. Times in seconds; CPU is the loop thread's.

    Attributes:
        batches, samples, nbytes (int): handed out (nbytes: payload, where the caller measures it).
        wait_s, wait_cpu_s (float): inside ``next()``: time, and the loop thread's CPU.
        step_s, step_cpu_s (float): between a batch and the next request inside a pass: the step.
        step_others_s (float): CPU of this process's other threads during the steps (a CPU model's intra-op
            threads), counted only when ``step_threads`` (not in thread mode, where loader threads work then).
        loop_s (float): inside passes: from each pass's start to its last batch.
        first_wait_s (float), starts (int): waits for a pass's first batch (or the first after a restart).
        end_wait_s (float), ends (int): the ``next()`` that found a pass over (where workers that do not
            persist are shut down), counted as a wait: a training loop waits there too.
        recv_s, recv_cpu_s, pin_s (float | None): rebuilding and pinning received batches, where the caller
            times them (the sweep's envelope); None otherwise.
        inside (bool): the loop is inside ``next()`` now (whoever iterates sets it around the call): the
            probe's looks at the loop thread count only then.
    """

    def __init__(self, step_threads: bool = True) -> None:
        self.batches = self.samples = self.nbytes = self.starts = self.ends = 0
        self.wait_s = self.wait_cpu_s = self.step_s = self.step_cpu_s = self.loop_s = self.first_wait_s = 0.0
        self.end_wait_s = 0.0
        self.step_others_s = 0.0
        self.step_threads = step_threads
        self.recv_s: float | None = None
        self.recv_cpu_s: float | None = None
        self.pin_s: float | None = None
        self._last: Clocks | None = None  # the clocks when the last batch was handed out
        self.inside = False

    @staticmethod
    def clocks() -> Clocks:
        """(wall clock, the calling thread's CPU clock, the process's CPU clock) now."""
        return perf_counter(), time.thread_time(), time.process_time()

    def handed(self, asked: Clocks, got: Clocks, samples: int, *, first: bool = False) -> None:
        """Count one batch, asked for at ``asked`` and handed out at ``got`` (each a :meth:`clocks` reading).

        Args:
            samples (int): samples in it.
            first (bool): the first batch of a pass or after a restart: its wait was a start-up, and no step
                came before it (``asked`` is when the pass began).
        """
        t0, c0, p0 = asked
        t1, c1, _ = got
        self.wait_s += t1 - t0
        self.wait_cpu_s += c1 - c0
        if first or self._last is None:
            self.loop_s += t1 - t0
            if first:
                self.first_wait_s += t1 - t0
                self.starts += 1
        else:
            last_t, last_c, last_p = self._last
            self.step_s += max(0.0, t0 - last_t)
            self.step_cpu_s += max(0.0, c0 - last_c)
            if self.step_threads:
                self.step_others_s += max(0.0, (p0 - last_p) - (c0 - last_c))
            self.loop_s += t1 - last_t
        self._last = got
        self.batches += 1
        self.samples += samples

    def ended(self, asked: Clocks, got: Clocks) -> None:
        """The ``next()`` asked at ``asked`` found the pass over at ``got``: its time (shutting down workers
        that do not persist) is a wait of the loop's, and the end of the pass."""
        t0, c0, _ = asked
        t1, c1, _ = got
        self.wait_s += t1 - t0
        self.wait_cpu_s += c1 - c0
        self.end_wait_s += t1 - t0
        self.ends += 1
        if self._last is not None:
            last_t, last_c, _ = self._last
            self.step_s += max(0.0, t0 - last_t)
            self.step_cpu_s += max(0.0, c0 - last_c)
            self.loop_s += t1 - last_t
        self._last = None

    def received(self, recv_s: float, recv_cpu_s: float, pin_s: float, nbytes: int) -> None:
        """Add what the sweep's envelope timed for the batch just counted."""
        self.recv_s = (self.recv_s or 0.0) + recv_s
        self.recv_cpu_s = (self.recv_cpu_s or 0.0) + recv_cpu_s
        self.pin_s = (self.pin_s or 0.0) + pin_s
        self.nbytes += nbytes

    def stepped(self, now: Clocks) -> None:
        """The loop has run its step since the last batch until ``now`` (a :meth:`clocks` reading): count it
        so far, so that a window ending here holds its last batch's step."""
        if self._last is not None:
            last_t, last_c, last_p = self._last
            self.step_s += max(0.0, now[0] - last_t)
            self.step_cpu_s += max(0.0, now[1] - last_c)
            if self.step_threads:
                self.step_others_s += max(0.0, (now[2] - last_p) - (now[1] - last_c))
            self.loop_s += max(0.0, now[0] - last_t)
            self._last = now

    def exclude(self, start: Clocks, end: Clocks) -> None:
        """Leave the span ``start``..``end`` (two :meth:`clocks` readings after a batch was handed out) out of
        the loop: what the measuring itself did there (reading the probe) is neither the step nor a wait."""
        if self._last is not None:
            last_t, last_c, last_p = self._last
            self._last = (last_t + end[0] - start[0], last_c + end[1] - start[1], last_p + end[2] - start[2])

    def resume(self, at: Clocks) -> None:
        """The loop runs on from ``at`` (a :meth:`clocks` reading): the next batch's step is counted from there,
        not lost as a pass's first (the sweep measures from the middle of a pass)."""
        self._last = at

    def pass_ended(self) -> None:
        """The pass ran out: the time until the next pass's first batch is not a step."""
        self._last = None


__all__ = ["BatchCounter", "Clocks"]
