"""Synthetic datasets whose best DataLoader settings are known, to check the harness (tests, benchmarks).

* :class:`IOWaitDataset`: each item waits (sleeps) as a slow read would; throughput grows with workers,
  so the best point is the largest tested; diagnosis "storage".
* :class:`CPUDataset`: each item does a fixed amount of pure-Python work; throughput saturates at the
  number of usable cores; diagnosis "cpu".
* :class:`CheapDataset`: each item is an int; no workers is best (IPC costs more than the work);
  diagnosis "ipc".
* :class:`HeavyBatchDataset`: each item waits a little (workers pay off) and is a long list of Python
  floats, which the main process must unpickle; the main process saturates; diagnosis "main-process".
* :class:`SlowStartDataset`: each process's first item waits (an index built, a client opened: work no
  stage probe times); with short epochs and workers that do not persist, diagnosis "worker-init".
* :class:`HoldMemoryDataset`: each process holds (and has touched) a buffer of its own; with a memory
  budget below what the workers hold, diagnosis "memory".
* :class:`ShuffleBufferDataset`: items pass through a shuffle buffer that is filled before the first one
  is yielded (as webdataset's ``.decode().shuffle(n)`` does); each epoch's first batch waits for the
  whole buffer, persistent workers or not; diagnosis "shuffle-fill".

The sleep here *is* the workload (an I/O wait), not a synchronisation.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from fastdata.core import process, stages


class IOWaitDataset(Dataset[Any]):
    """Items that take ``delay`` seconds of waiting and no CPU.

    Args:
        n (int): items. Defaults to 100000.
        delay (float): seconds each item waits. Defaults to 0.005.
        tensor (bool): items are small tensors (True) or ints (False). A tensor reaches the main process
            through shared memory, handed over by the worker on request, so each batch's arrival waits
            until the worker gets a core; ints travel inside the pickled batch. Defaults to True.
    """

    def __init__(self, n: int = 100_000, delay: float = 0.005, tensor: bool = True) -> None:
        self.n, self.delay, self.tensor = n, delay, tensor

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        t = stages.clock()
        time.sleep(self.delay)
        stages.lap("fetch", t)  # timed as a dataset times its reads
        return torch.full((16,), i, dtype=torch.int64) if self.tensor else i

    def __repr__(self) -> str:
        return f"IOWaitDataset(n={self.n}, delay={self.delay}, tensor={self.tensor})"


def spin(iterations: int) -> int:
    """A fixed amount of pure-Python work (it holds the GIL of its process, like a Python transform)."""
    x = 0
    for i in range(iterations):
        x += i * i % 7
    return x


class CPUDataset(Dataset[torch.Tensor]):
    """Items that each cost a fixed amount of CPU work (``iterations`` of a Python loop, ~0.1 us each).

    Args:
        n (int): items. Defaults to 100000.
        iterations (int): loop iterations per item. Defaults to 20000 (about 2 ms here).
    """

    def __init__(self, n: int = 100_000, iterations: int = 20_000) -> None:
        self.n, self.iterations = n, iterations

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), spin(self.iterations), dtype=torch.int64)

    def __repr__(self) -> str:
        return f"CPUDataset(n={self.n}, iterations={self.iterations})"


class CheapDataset(Dataset[int]):
    """Items that cost nothing: the index itself.

    Args:
        n (int): items. Defaults to 1000000.
    """

    def __init__(self, n: int = 1_000_000) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i

    def __repr__(self) -> str:
        return f"CheapDataset(n={self.n})"


class HeavyBatchDataset(Dataset[list[float]]):
    """Items that wait ``delay`` seconds, then return a list of ``floats`` Python floats.

    Pickling such a list in a worker is about twice as fast as unpickling it in the main process, and
    the main process unpickles every worker's batches alone: with enough workers, it is the limit. The
    lists are made once per process (memory: ``POOL`` x ``floats`` floats, ~26 MB by default).
    Use with ``collate_fn=list`` (the default collate would transpose the lists).

    Args:
        n (int): items. Defaults to 100000.
        floats (int): floats per item. Defaults to 100000 (~8 ms to unpickle here).
        delay (float): seconds each item waits. Defaults to 0.02: so that no workers is clearly slower
            than a saturated main process, and four workers are enough to saturate it.
    """

    collate_fn: Any = staticmethod(list)
    POOL = 8  # distinct lists handed out in turn: more than a batch holds, so pickle never shares one

    def __init__(self, n: int = 100_000, floats: int = 100_000, delay: float = 0.02) -> None:
        self.n, self.floats, self.delay = n, floats, delay
        self._pool: list[list[float]] = []
        self._turn = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.delay)
        if not self._pool:
            # built once per process, so a worker's only CPU work is pickling (half the main process's
            # unpickling); consecutive items are distinct lists of distinct floats, which pickle must
            # send in full (it sends an object repeated within a batch only once)
            self._pool = [[float(k * self.floats + j) for j in range(self.floats)] for k in range(self.POOL)]
        self._turn = (self._turn + 1) % self.POOL
        return self._pool[self._turn]

    def __repr__(self) -> str:
        return f"HeavyBatchDataset(n={self.n}, floats={self.floats}, delay={self.delay})"


class SlowStartDataset(Dataset[int]):
    """Cheap items, but each process's first item waits ``setup`` seconds first (building an index,
    opening a client: set-up no stage probe times).

    Args:
        n (int): items. Defaults to 256.
        setup (float): seconds of set-up per process. Defaults to 0.3.
    """

    def __init__(self, n: int = 256, setup: float = 0.3) -> None:
        self.n, self.setup = n, setup
        self._ready_in = -1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if self._ready_in != process.pid():
            time.sleep(self.setup)  # the set-up this dataset simulates
            self._ready_in = process.pid()
        return i

    def __repr__(self) -> str:
        return f"SlowStartDataset(n={self.n}, setup={self.setup})"


class HoldMemoryDataset(Dataset[int]):
    """Items that wait ``delay`` seconds, from processes that each hold ``nbytes`` of touched memory.

    Args:
        n (int): items. Defaults to 100000.
        nbytes (int): bytes each process allocates and touches on its first item. Defaults to 256 MiB.
        delay (float): seconds each item waits. Defaults to 0.001.
    """

    def __init__(self, n: int = 100_000, nbytes: int = 256 << 20, delay: float = 0.001) -> None:
        self.n, self.nbytes, self.delay = n, nbytes, delay
        self._held: np.ndarray | None = None
        self._held_in = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_held": None, "_held_in": -1}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if self._held_in != process.pid():
            self._held = np.ones(self.nbytes, dtype=np.uint8)  # touched: resident, counted in PSS
            self._held_in = process.pid()
        time.sleep(self.delay)
        return i

    def __repr__(self) -> str:
        return f"HoldMemoryDataset(n={self.n}, nbytes={self.nbytes}, delay={self.delay})"


__all__ = [
    "CPUDataset",
    "CheapDataset",
    "HeavyBatchDataset",
    "HoldMemoryDataset",
    "IOWaitDataset",
    "SlowStartDataset",
    "spin",
]


class ShuffleBufferDataset(IterableDataset[int]):
    """Items read (each a ``delay`` second wait, timed as a read) into a buffer of ``window`` before the
    first is yielded, then drawn from it at random: what a decode-then-shuffle pipeline does. Each
    DataLoader worker reads every ``num_workers``-th item.

    Args:
        n (int): items per epoch. Defaults to 2048.
        window (int): the buffer, per worker. Defaults to 512.
        delay (float): seconds each read waits. Defaults to 0.001.
        seed (int): seeds the draws. Defaults to 0.
    """

    def __init__(self, n: int = 2048, window: int = 512, delay: float = 0.001, seed: int = 0) -> None:
        self.n, self.window, self.delay, self.seed = n, window, delay, seed

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        rng = np.random.default_rng([self.seed, worker])
        buffer: list[int] = []
        for i in range(worker, self.n, workers):
            t = stages.clock()
            time.sleep(self.delay)
            stages.lap("fetch", t)
            buffer.append(i)
            if len(buffer) >= self.window:
                yield buffer.pop(int(rng.integers(len(buffer))))
        while buffer:
            yield buffer.pop(int(rng.integers(len(buffer))))

    def __repr__(self) -> str:
        return f"ShuffleBufferDataset(n={self.n}, window={self.window}, delay={self.delay})"
