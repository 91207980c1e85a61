"""Seeding: per-(seed, epoch, rank, worker) random streams, ``worker_init_fn``, and staggered starts.

What a DataLoader worker's ``random``, ``numpy`` and ``torch`` streams are seeded from, with
:data:`worker_init_fn`:

* **the epoch was set** for this pass (``ds.set_epoch(e)`` since the previous pass began, which
  :class:`fastdata.Loader` does for every pass): from (seed, epoch, rank, worker) alone, so that epoch
  ``e`` gets the same streams in any run, a resumed one too;
* **otherwise** (only ``sampler.set_epoch`` called, as with torch's ``DistributedSampler``, or nothing):
  from (seed, epoch, rank, worker) and the pass's token, which mixes in the ``base_seed`` torch draws
  for every ``iter(DataLoader)`` (from the DataLoader's ``generator``): new streams every pass, the same
  ones again only when the user fixes that generator.

A pass is one iteration over a dataset; its token (:func:`pass_token`) is the same in every worker of
the pass and differs from one pass to the next. The decision is made by the first process of the pass
and read by the others from the dataset's shared state (:meth:`~fastdata.core.process.SharedState.begin_pass`).
Persistent workers run ``worker_init_fn`` once: an iterable dataset starts each later pass in
``__iter__`` (and reseeds the same way); a map-style dataset sees no pass boundary in its workers, so
their streams continue (they never repeat), and restart from (seed, epoch, rank, worker) when the
epoch changes.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

import numpy as np
import torch

from fastdata.core.epoch._protocol import PassAware, Warmable, WorkerAware
from fastdata.core.epoch._world import World, acting_token


def derive_seed(*parts: int) -> int:
    """A 63-bit seed mixed from ``parts`` (seed, epoch, rank, worker ...), never the same stream."""
    state = np.random.SeedSequence([p & 0xFFFFFFFFFFFFFFFF for p in parts]).generate_state(2)
    return int((int(state[0]) << 32 | int(state[1])) & 0x7FFFFFFFFFFFFFFF)


def _seed_all(seed: int) -> int:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)
    return seed


def seed_process(world: World) -> int:
    """Seed ``random``, ``numpy`` and ``torch`` in this process from (seed, epoch, rank, worker)."""
    return _seed_all(derive_seed(world.seed, world.epoch, world.rank, world.worker))


def pass_seed(world: World, epoch_set: bool, token: int) -> int:
    """The seed of this process's streams for one pass: from (seed, epoch, rank, worker) when the epoch
    was set for the pass, else mixed with the pass's ``token`` too (new streams every pass)."""
    parts = [world.seed, world.epoch, world.rank, world.worker]
    return derive_seed(*parts) if epoch_set else derive_seed(*parts, token, 0xF5E5)


_MAIN = 0x4D41


def pass_token(k: int) -> int:
    """The identity of this process's ``k``-th pass (1-based) over a dataset: in a DataLoader worker, mixed
    from the iterator's ``base_seed`` (the same in every worker of one ``iter(DataLoader)``, new for the
    next unless the DataLoader's generator is reseeded alike) and ``k`` (persistent workers count their
    passes alike); in the main process, from the process id and ``k`` (and, in loader threads, the token
    of their set: :func:`fastdata.core.epoch.acting_as_worker`)."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is None:
        # loader threads of the main process: their set's token, the same in each of them (0 elsewhere)
        return derive_seed(os.getpid(), k, _MAIN, acting_token())  # not process.pid(): epoch is below process
    return derive_seed((info.seed - info.id) & 0xFFFFFFFFFFFFFFFF, k)


# Set by worker_init_fn in a worker process: datasets then reseed the process at each new pass or epoch,
# so persistent workers (whose init function runs only once) still get new streams.
_reseed = False
_seeded_token: int | None = None  # the pass this process's streams were last seeded for
_seeded_epoch: int | None = None  # ... and its epoch


def on_pass(world: World, token: int, epoch_set: bool) -> None:
    """Called by a dataset in each process where a pass starts (after :func:`pass_token` and
    ``SharedState.begin_pass``): reseeds for the pass if ``worker_init_fn`` asked for it, once per pass."""
    global _seeded_token, _seeded_epoch
    if _reseed and _seeded_token != token:
        _seed_all(pass_seed(world, epoch_set, token))
        _seeded_token, _seeded_epoch = token, world.epoch


def on_epoch(world: World) -> None:
    """Called by datasets on reads, where no pass boundary is seen (a map-style dataset's workers):
    reseeds from (seed, epoch, rank, worker) when the epoch moved since the last seeding, if
    ``worker_init_fn`` asked for it."""
    global _seeded_epoch
    if _reseed and _seeded_epoch != world.epoch:
        seed_process(world)
        _seeded_epoch = world.epoch


class WorkerInit:
    """The ``worker_init_fn`` to pass to ``DataLoader``; see :data:`worker_init_fn`.

    Args:
        *then: the user's own init functions, called after ours with the worker id.
        before: functions called first, with the worker id (the Loader's warning relay: so that what seeding
            and warming the dataset warn reaches the training process too). Defaults to none.
    """

    def __init__(self, *then: Callable[[int], object], before: tuple[Callable[[int], object], ...] = ()) -> None:
        self.then = then
        self.before = before

    def __call__(self, worker_id: int) -> None:
        global _reseed, _seeded_token, _seeded_epoch
        from torch.utils.data import get_worker_info

        for fn in self.before:
            fn(worker_id)

        info = get_worker_info()
        dataset = info.dataset if info is not None else None
        if isinstance(dataset, PassAware):
            _reseed, _seeded_token = True, None
            dataset.begin_pass(first=True)  # calls on_pass: seeds for this pass
        elif isinstance(dataset, WorkerAware):
            # a dataset that keeps no log of passes: streams from (seed, epoch, rank, worker), as always
            world = dataset.worker_world()
            seed_process(world)
            _reseed, _seeded_token, _seeded_epoch = True, None, world.epoch
        elif info is not None:
            # not a fastdata dataset: torch already seeded random, numpy and torch from its base_seed
            pass
        if isinstance(dataset, Warmable):
            dataset.warm()
        for fn in self.then:
            fn(worker_id)

    def __repr__(self) -> str:
        return f"WorkerInit(then={self.then!r}, before={self.before!r})"


worker_init_fn = WorkerInit()
"""Pass to ``DataLoader(worker_init_fn=...)``: seeds ``random``/``numpy``/``torch`` in every worker for
every pass: from (seed, epoch, rank, worker) when the dataset's epoch was set for the pass (reproducible,
also after a resume), else with torch's per-iterator ``base_seed`` mixed in (new streams every pass, as
torch's own seeding gives); reseeds persistent workers too; and opens the worker's handles before the
first batch is asked for. fastdata datasets are correct without it; it makes user transforms
reproducible. Use :func:`compose_worker_init` to run your own function too.
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


class RepeatedEpochWarning(UserWarning):
    """A pass started at an epoch already read, and the epoch was not set again (``set_epoch``): the
    dataset's own randomness (shuffle, clip starts) repeats the last pass's."""


__all__ = [
    "RepeatedEpochWarning",
    "WorkerInit",
    "compose_worker_init",
    "derive_seed",
    "on_epoch",
    "on_pass",
    "pass_seed",
    "pass_token",
    "seed_process",
    "stagger",
    "worker_init_fn",
]
