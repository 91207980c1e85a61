"""The simulated training step of a sweep: a wait (a GPU step) or CPU work (a CPU-side step), or both.

A sleep stands for a step the GPU runs: the training process waits and its cores are free for the loader.
A CPU-side step (a model trained on the CPU, host-side augmentation, a heavy loss on the CPU) is different:
it takes cores from the loader's workers, and they take cores from it, so a loader that keeps up with a
sleeping step can stall a computing one. :class:`CPUStep` does CPU work as such a step does: torch matrix
products on the training process's intra-op threads (``torch.get_num_threads()``), which release the GIL as
a model's operators do. Its amount of work is fixed when it is made, calibrated to take ``cpu`` seconds on
the machine as it is then (the fastest of several timings: the least contended), so that a crowded machine
makes it take longer, as it makes a real step take longer.
"""

from __future__ import annotations

import time
from time import perf_counter
from typing import Any

import torch

from fastdata.core.errors import check_positive

SIZE = 192  # the side of the matrices multiplied: ~14 MFLOP a product, ~0.1-0.5 ms on one core


class CPUStep:
    """A training step that computes for ``cpu`` seconds on the training process's torch threads, then waits
    ``wait`` seconds (a GPU's share of the step). Call it with the batch (which it does not read).

    Args:
        cpu (float): seconds of computing per step, as measured alone on this machine. Must be > 0.
        wait (float): seconds to sleep after it. Defaults to 0.

    Attributes:
        reps (int): matrix products per step.
    """

    def __init__(self, cpu: float, wait: float = 0.0) -> None:
        check_positive("step_cpu", cpu)
        check_positive("step_time", wait, allow_zero=True)
        self.cpu, self.wait = cpu, wait
        gen = torch.Generator().manual_seed(0)
        self._a = torch.randn(SIZE, SIZE, generator=gen)
        self._b = torch.randn(SIZE, SIZE, generator=gen)
        self._out = torch.empty(SIZE, SIZE)
        self.reps = max(1, round(cpu / self._per_product()))

    def _per_product(self, n: int = 16, tries: int = 7) -> float:
        self._burn(n)  # warm up: first products allocate and spin up the intra-op threads
        best = float("inf")
        for _ in range(tries):
            start = perf_counter()
            self._burn(n)
            best = min(best, (perf_counter() - start) / n)
        return best

    def _burn(self, n: int) -> None:
        for _ in range(n):
            torch.mm(self._a, self._b, out=self._out)

    def __call__(self, batch: Any = None) -> None:
        self._burn(self.reps)
        if self.wait > 0:
            time.sleep(self.wait)

    def __repr__(self) -> str:
        return f"CPUStep(cpu={self.cpu}, wait={self.wait})"


__all__ = ["SIZE", "CPUStep"]
