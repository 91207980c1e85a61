"""A user's own torch dataset as :class:`fastdata.Loader` sees it: what fastdata's protocol adds, given
sensible values.

A fastdata dataset offers the rank, world size, seed, a shared epoch and ``close`` (and, map-style, a
rank-aware ``sampler()``; iterable, a resume state). A plain ``torch.utils.data.Dataset`` offers
``__getitem__``/``__len__``, an ``IterableDataset`` only ``__iter__``. The Loader keeps handing the user's
own object to the DataLoader (so ``get_worker_info().dataset`` in a worker is still theirs) and asks this
view for the rest:

- **map-style**: read through an :class:`~fastdata.loading.EpochSampler` over ``range(len(dataset))``:
  shuffled per epoch from (seed 0, epoch), split over ranks like ``DistributedSampler``, and resumable
  mid-epoch (the state is the sampler's position), exactly as a fastdata map-style dataset;
- **iterable**: read as is: its order, its shuffling, its split over ranks and workers (``get_worker_info``)
  are the dataset's own, so the Loader cannot name a point inside its epoch: ``state_dict()`` raises
  a ``ConfigError`` saying so, and ``num_workers="auto"`` changes the workers between passes only.

Both get the dataset's own ``set_epoch(epoch)`` and ``close()`` called, where it has them.

A fastdata dataset that counts nothing ahead (``TarShardDataset(stream=True)``: no length, no position
inside its epoch) is read the same way, as is (:func:`reads_as_is`); its own error says why it cannot resume.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import IterableDataset

from fastdata.core.epoch import RankFollower, Remainder, World, current_worker
from fastdata.core.errors import ConfigError
from fastdata.loading._sampler import EpochSampler


class PlainView(RankFollower):
    """What fastdata's protocol adds to ``dataset``, a plain torch dataset (see the module doc).

    Args:
        dataset: a ``torch.utils.data.Dataset`` with ``__getitem__`` and ``__len__``, or an ``IterableDataset``.
        seed (int): the seed of a shuffled map-style order. Defaults to the dataset's own ``seed`` attribute
            when it is an int, else 0 (the same on every rank, as the split over ranks needs).
    """

    def __init__(self, dataset: Any, seed: int | None = None) -> None:
        self.inner = dataset
        self.iterable = isinstance(dataset, IterableDataset)
        own = getattr(dataset, "seed", None)
        self.seed = seed if seed is not None else (own if isinstance(own, int) and not isinstance(own, bool) else 0)
        self._epoch = 0
        self._init_rank(None, None)

    @property
    def name(self) -> str:
        return type(self.inner).__name__

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch here, and on the dataset when it has its own ``set_epoch``."""
        self._epoch = int(epoch)
        own = getattr(self.inner, "set_epoch", None)
        if callable(own):
            own(self._epoch)

    def worker_world(self) -> World:
        worker, workers = current_worker()
        return World(self.rank, self.world_size, worker, workers, self.seed, self._epoch)

    def sampler(self, *, shuffle: bool = True, remainder: Remainder = "drop") -> EpochSampler:
        """Map-style: an :class:`~fastdata.loading.EpochSampler` over the dataset's indices."""
        return EpochSampler(
            len(self.inner), shuffle=shuffle, seed=self.seed, remainder=remainder, rank_of=self, owner=self.name
        )

    def __getitem__(self, index: int) -> Any:
        return self.inner[index]

    def __len__(self) -> int:
        """Samples (map-style), or the iterable dataset's own ``len()``."""
        return len(self.inner)

    def batches(self, batch_size: int | None, drop_last: bool) -> int | None:
        """Iterable: batches per pass from the dataset's ``len()`` (all of it, one rank), None without one."""
        try:
            n = len(self.inner)
        except TypeError:
            return None
        if batch_size is None:
            return n
        return n // batch_size if drop_last else math.ceil(n / batch_size)

    def close(self) -> None:
        own = getattr(self.inner, "close", None)
        if callable(own):
            own()

    def refuse_resume(self) -> ConfigError:
        """The error of a resume state asked of an iterable dataset read as is (a streamed fastdata dataset's
        own, which names its fix)."""
        if reads_as_is(self.inner):
            try:
                self.inner.state_dict()
            except ConfigError as own:
                return own
        return ConfigError(
            f"{self.name} is a plain IterableDataset: its order and its split over workers and ranks are its own, so "
            "fastdata.Loader cannot name a point inside its epoch to resume from. Save the epoch and call "
            "loader.set_epoch(epoch) to start it again, or read through a map-style dataset "
            "(__getitem__ and __len__: the Loader resumes it at any batch) or a fastdata dataset"
        )


def reads_as_is(dataset: Any) -> bool:
    """Whether ``dataset`` is a fastdata dataset that counts nothing ahead (``TarShardDataset(stream=True)``),
    which the Loader reads as is, like a plain ``IterableDataset``."""
    return isinstance(dataset, IterableDataset) and getattr(dataset, "stream", False) is True


def is_plain(dataset: Any) -> bool:
    """Whether ``dataset`` is a torch dataset the Loader can read through a :class:`PlainView`: an
    ``IterableDataset``, or a map-style one (a ``Dataset`` or a sequence) with ``__getitem__`` and ``__len__``."""
    if isinstance(dataset, IterableDataset):
        return True
    kind = type(dataset)
    has = callable(getattr(kind, "__getitem__", None)) and callable(getattr(kind, "__len__", None))
    return has and isinstance(dataset, (TorchDataset, Sequence))


__all__ = ["PlainView", "is_plain", "reads_as_is"]
