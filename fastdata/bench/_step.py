"""The simulated training step of a sweep: a wait (a GPU step) or CPU work (a CPU-side step), or both.

A sleep stands for a step the GPU runs: the training process waits and its cores are free for the loader.
A CPU-side step (a model trained on the CPU, host-side augmentation, a heavy loss on the CPU) is different:
it takes cores from the loader's workers, and they take cores from it, so a loader that keeps up with a
sleeping step can stall a computing one. :class:`CPUStep` does CPU work as such a step does: the forward
and backward passes of a small convolutional network on the training process's intra-op threads
(``torch.get_num_threads()``), which release the GIL as a model's operators do. Many short operators, each
split over the threads and joined, are what makes a real step slow down when workers take its cores: the
first version multiplied 192x192 matrices, and beside decoding workers its step slowed less than a real
CNN's (``benchmarks/bench_cpu_step.py``, 2 cores: predicted stall 3.2x and 1.9x the real loop's at 1
and 2 workers with products; with this network 0.98-1.44x once the sweep measured the real loop's
transport, and run inside the real loop instead of the sweep it stalled as the CNN did). Its amount of
work is fixed when it is made, calibrated to take ``cpu`` seconds on the machine as it is then (the
fastest of several timings: the least contended), so that a crowded machine makes it take longer, as it
makes a real step take longer.
"""

from __future__ import annotations

import time
from time import perf_counter
from typing import Any

import torch
from torch import nn

from fastdata.core.errors import check_positive

INPUT = (2, 3, 32, 32)  # the network's input: one forward and backward takes ~1 ms on a core


class _SmallConvNet(nn.Module):
    """Two 3x3 convolutions with ReLU and pooling, and a linear layer: a CPU model's kinds of operators."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * (INPUT[2] // 4) * (INPUT[3] // 4), 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class CPUStep:
    """A training step that computes for ``cpu`` seconds on the training process's torch threads, then waits
    ``wait`` seconds (a GPU's share of the step). Call it with the batch (which it does not read).

    Args:
        cpu (float): seconds of computing per step, as measured alone on this machine. Must be > 0.
        wait (float): seconds to sleep after it. Defaults to 0.

    Attributes:
        reps (int): forward and backward passes of the small network per step.
    """

    def __init__(self, cpu: float, wait: float = 0.0) -> None:
        check_positive("step_cpu", cpu)
        check_positive("step_time", wait, allow_zero=True)
        self.cpu, self.wait = cpu, wait
        gen = torch.Generator().manual_seed(0)
        with torch.random.fork_rng():  # the user's random state is left as it was
            torch.manual_seed(0)
            self._net = _SmallConvNet()
        self._x = torch.randn(*INPUT, generator=gen)
        self.reps = max(1, round(cpu / self._per_pass()))

    def _per_pass(self, n: int = 8, tries: int = 5) -> float:
        self._burn(2)  # warm up: the first passes allocate and spin up the intra-op threads
        best = float("inf")
        for _ in range(tries):
            start = perf_counter()
            self._burn(n)
            best = min(best, (perf_counter() - start) / n)
        return best

    def _burn(self, n: int) -> None:
        for _ in range(n):
            self._net.zero_grad(set_to_none=True)
            self._net(self._x).sum().backward()

    def __call__(self, batch: Any = None) -> None:
        self._burn(self.reps)
        if self.wait > 0:
            time.sleep(self.wait)

    def __repr__(self) -> str:
        return f"CPUStep(cpu={self.cpu}, wait={self.wait})"


__all__ = ["INPUT", "CPUStep"]
