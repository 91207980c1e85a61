"""Seeding: per-(seed, epoch, rank, worker) random streams, ``worker_init_fn``, and staggered starts."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import numpy as np
import torch

from fastdata.core.protocol import Warmable, WorkerAware
from fastdata.core.world import World


def derive_seed(*parts: int) -> int:
    """A 63-bit seed mixed from ``parts`` (seed, epoch, rank, worker ...), never the same stream."""
    state = np.random.SeedSequence([p & 0xFFFFFFFFFFFFFFFF for p in parts]).generate_state(2)
    return int((int(state[0]) << 32 | int(state[1])) & 0x7FFFFFFFFFFFFFFF)


def seed_process(world: World) -> int:
    """Seed ``random``, ``numpy`` and ``torch`` in this process from (seed, epoch, rank, worker)."""
    seed = derive_seed(world.seed, world.epoch, world.rank, world.worker)
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)
    return seed


# Set by worker_init_fn in a worker process: datasets then reseed the process at each new epoch, so
# persistent workers (whose init function runs only once) still get a new random stream per epoch.
_reseed_each_epoch = False
_seeded_epoch: int | None = None


def on_epoch(world: World) -> None:
    """Called by datasets when a worker starts an epoch; reseeds if ``worker_init_fn`` asked for it."""
    global _seeded_epoch
    if _reseed_each_epoch and _seeded_epoch != world.epoch:
        seed_process(world)
        _seeded_epoch = world.epoch


class WorkerInit:
    """The ``worker_init_fn`` to pass to ``DataLoader``; see :data:`worker_init_fn`.

    Args:
        *then: the user's own init functions, called after ours with the worker id.
    """

    def __init__(self, *then: Callable[[int], object]) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        global _reseed_each_epoch, _seeded_epoch
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        dataset = info.dataset if info is not None else None
        if isinstance(dataset, WorkerAware):
            world = dataset.worker_world()
            seed_process(world)
            _reseed_each_epoch, _seeded_epoch = True, world.epoch
        elif info is not None:
            # not a fastdata dataset: torch already seeded random and torch; give numpy a stream too
            np.random.seed(info.seed % (1 << 32))
        if isinstance(dataset, Warmable):
            dataset.warm()
        for fn in self.then:
            fn(worker_id)

    def __repr__(self) -> str:
        return f"WorkerInit(then={self.then!r})"


worker_init_fn = WorkerInit()
"""Pass to ``DataLoader(worker_init_fn=...)``: seeds ``random``/``numpy``/``torch`` from
(seed, epoch, rank, worker), reseeds at every new epoch even with ``persistent_workers=True``, and
opens the worker's handles before the first batch is asked for. fastdata datasets are correct without
it; it makes user transforms reproducible. Use :func:`compose_worker_init` to run your own function too.
"""


def compose_worker_init(*user_fns: Callable[[int], object]) -> WorkerInit:
    """``worker_init_fn`` followed by the user's own functions (each called with the worker id)."""
    return WorkerInit(*user_fns)


def stagger(world: World, low: float, high: float) -> float:
    """Sleep a delay drawn from [low, high) seconds, seeded by (seed, rank, worker); return it.

    Spreads the first reads of many workers so they do not all open the same files at one instant.
    """
    if high <= 0:
        return 0.0
    rng = random.Random(derive_seed(world.seed, world.rank, world.worker, 0x57A6))
    delay = rng.uniform(low, high)
    time.sleep(delay)
    return delay


__all__ = ["WorkerInit", "compose_worker_init", "derive_seed", "on_epoch", "seed_process", "stagger", "worker_init_fn"]
