"""``Loader``: the DataLoader a fastdata dataset needs, which can stop mid-epoch and resume exactly.

It builds the ``torch.utils.data.DataLoader`` the right way for each kind of dataset (an iterable
dataset batches itself, so ``batch_size=None``; a map-style one is read through its rank-aware
``.sampler()``), sets the epoch, counts the batches handed out, and saves that count.

Why a count of batches is enough: for both kinds the rank's sequence of batches depends only on
(seed, epoch, rank, world size, batch size), never on ``num_workers`` (see :mod:`fastdata.core.sharding`), and
the DataLoader hands batches out in that order. So ``(epoch, batches consumed)`` names the exact point to
resume from, in a new process, with any number of workers. The state is the same on every rank (all
ranks consume the same number of batches per step), so saving rank 0's is enough.

We write this small wrapper because ``torchdata``'s ``StatefulDataLoader`` (which fastdata's datasets
and samplers also work with) keeps one state per worker and refuses a different ``num_workers`` on resume.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from fastdata.core.errors import ConfigError, PlanError, check_positive
from fastdata.core.seeding import WorkerInit, compose_worker_init
from fastdata.core.seeding import worker_init_fn as default_worker_init
from fastdata.core.sharding import Remainder, rank_span

# DataLoader options the Loader decides itself, and why a user may not pass them.
_OWNED = {
    "batch_sampler": "the Loader batches through the dataset's sampler; pass batch_size",
    "shuffle": "pass shuffle= to Loader (map-style) or to the dataset (iterable)",
}
# Fields of a saved state that must match the Loader it is loaded into.
_CHECKED = ("batch_size", "world_size", "samples", "seed")


def as_is(batch: Any) -> Any:
    """The ``collate_fn`` for a dataset that yields finished batches (``TarShardDataset(batch_size=...)``).

    With ``batch_size=None`` the DataLoader otherwise runs ``default_convert`` over every batch: for a
    batch of 64 dicts of bytes that is ~0.5 ms (8 us a sample, measured here), as much as reading the
    samples, to redo what the dataset's own collate already did. Pass it to a plain ``DataLoader`` too.
    """
    return batch


class Loader:
    """Iterate a fastdata dataset through a ``DataLoader``, and resume mid-epoch from a saved state.

    Example::

        loader = fd.Loader(ds, batch_size=64, num_workers=4)
        if checkpoint:
            loader.load_state_dict(checkpoint["loader"])
        for epoch in range(loader.epoch, epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                ...
                checkpoint = {"loader": loader.state_dict(), ...}

    Args:
        dataset: a fastdata dataset. Iterable ones (``TarShardDataset``) must be built with
            ``batch_size``; map-style ones need a ``sampler()`` method (all fastdata map-style datasets).
        batch_size (int | None): samples per batch. Required for map-style datasets; for iterable ones it
            defaults to the dataset's and must equal it.
        num_workers (int): DataLoader worker processes. Defaults to 0.
        shuffle (bool | None): map-style only: a new order every epoch. Defaults to True. For an iterable
            dataset, set it on the dataset (it must agree if given here).
        remainder ("drop" | "pad" | "uneven" | None): how an epoch that does not split evenly over ranks
            is handled, see :data:`fastdata.core.sharding.Remainder`. Map-style: passed to ``sampler()``,
            defaults to "drop". Iterable: set it on the dataset (it must agree if given here).
        drop_last (bool | None): drop the rank's last, smaller batch. Map-style: defaults to False.
            Iterable: set it on the dataset (it must agree if given here).
        sampler: map-style only: a sampler with ``set_epoch``, ``state_dict`` and ``load_state_dict``
            (an :class:`~fastdata.EpochSampler`) to use instead of ``dataset.sampler()``.
        worker_init_fn (Callable | None): run in each worker after :data:`fastdata.worker_init_fn`, which
            the Loader always installs. Defaults to None.
        **dataloader_kwargs: passed to ``DataLoader`` (``pin_memory``, ``persistent_workers``,
            ``prefetch_factor``, ``multiprocessing_context``, ``timeout``, ``collate_fn`` for map-style ...).
            ``in_order=False`` is refused: batches out of order cannot be resumed exactly.

    Raises:
        ConfigError: for a combination that cannot resume exactly, at construction.
        PlanError: when a rank would get no batch at all (``drop_last`` with fewer samples than a batch).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int | None = None,
        num_workers: int = 0,
        shuffle: bool | None = None,
        remainder: Remainder | None = None,
        drop_last: bool | None = None,
        sampler: Any = None,
        worker_init_fn: Any = None,
        **dataloader_kwargs: Any,
    ) -> None:
        for name, why in _OWNED.items():
            if name in dataloader_kwargs:
                raise ConfigError(f"Loader sets the DataLoader's {name} itself: {why}")
        if dataloader_kwargs.get("in_order", True) is False:
            raise ConfigError(
                "in_order=False hands batches out as workers finish them, so a count of consumed "
                "batches no longer names a point to resume from; leave in_order at True"
            )
        if not callable(getattr(dataset, "set_epoch", None)):
            raise ConfigError(f"Loader needs a dataset with set_epoch() (a fastdata dataset), not {type(dataset)}")
        self.dataset = dataset
        self.num_workers = num_workers
        self.iterable = isinstance(dataset, IterableDataset)
        if self.iterable:
            self.batch_size = self._check_iterable(
                batch_size, shuffle, remainder, drop_last, sampler, dataloader_kwargs
            )
            self.sampler: Any = None
        else:
            if batch_size is None:
                raise ConfigError("Loader needs batch_size= for a map-style dataset")
            check_positive("batch_size", batch_size)
            self.batch_size = batch_size
            self.sampler = self._make_sampler(sampler, shuffle, remainder)
        self._drop_last = bool(drop_last)
        if worker_init_fn is None:
            self._worker_init = default_worker_init
        elif isinstance(worker_init_fn, WorkerInit):
            self._worker_init = worker_init_fn
        else:
            self._worker_init = compose_worker_init(worker_init_fn)
        self._kwargs = dataloader_kwargs
        self._dataloader: DataLoader[Any] | None = None
        self._pending: tuple[int, int] | None = None  # (epoch, batches) loaded and not yet iterated
        self._position: tuple[int, int] = (self.epoch, 0)  # (epoch, batches handed out of it)
        if len(self) == 0 or self._starves_a_rank():
            raise PlanError(
                f"a rank reads fewer samples per epoch than batch_size={self.batch_size}, so "
                "drop_last=True leaves it no batch; use a smaller batch_size, fewer ranks, or "
                "drop_last=False"
            )

    def _check_iterable(
        self,
        batch_size: int | None,
        shuffle: bool | None,
        remainder: Remainder | None,
        drop_last: bool | None,
        sampler: Any,
        kwargs: dict[str, Any],
    ) -> int:
        ds = self.dataset
        name = type(ds).__name__
        if sampler is not None:
            raise ConfigError(f"{name} is iterable and reads its own part of the epoch: pass no sampler")
        if "collate_fn" in kwargs:
            raise ConfigError(f"{name} batches itself: pass collate_fn to the dataset, not the Loader")
        own = getattr(ds, "batch_size", None)
        if own is None or not callable(getattr(ds, "load_state_dict", None)):
            raise ConfigError(
                f"Loader needs {name}(batch_size=...): an iterable dataset batches itself, so that "
                "its batches do not depend on num_workers and can be resumed"
            )
        if batch_size is not None and batch_size != own:
            raise ConfigError(f"batch_size={batch_size} differs from {name}(batch_size={own}); pass one or the other")
        for option, given in (("shuffle", shuffle), ("remainder", remainder), ("drop_last", drop_last)):
            if given is not None and given != getattr(ds, option, given):
                raise ConfigError(
                    f"{option}={given!r} differs from {name}({option}={getattr(ds, option)!r}); "
                    f"an iterable dataset plans its epoch itself, so set {option} there"
                )
        return int(own)

    def _make_sampler(self, sampler: Any, shuffle: bool | None, remainder: Remainder | None) -> Any:
        if sampler is None:
            make = getattr(self.dataset, "sampler", None)
            if not callable(make):
                raise ConfigError(
                    f"Loader needs {type(self.dataset).__name__}.sampler() (a rank-aware sampler), or pass sampler="
                )
            return make(shuffle=True if shuffle is None else shuffle, remainder=remainder or "drop")
        if shuffle is not None or remainder is not None:
            raise ConfigError("pass shuffle/remainder to the sampler you built, not to the Loader")
        for method in ("set_epoch", "state_dict", "load_state_dict"):
            if not callable(getattr(sampler, method, None)):
                raise ConfigError(f"sampler {type(sampler).__name__} has no {method}(); use fastdata.EpochSampler")
        return sampler

    def _starves_a_rank(self) -> bool:
        """Whether ``drop_last`` leaves the rank that reads the fewest samples (the last one, under
        ``remainder="uneven"``) without a batch: judged alike on every rank, so all of them refuse it."""
        sampler = self.sampler
        if (
            self.iterable
            or not self._drop_last
            or not all(hasattr(sampler, a) for a in ("n", "world_size", "remainder"))
        ):
            return False
        ws = sampler.world_size
        return rank_span(sampler.n, ws - 1, ws, sampler.remainder)[1] < self.batch_size

    @property
    def dataloader(self) -> DataLoader[Any]:
        """The ``torch.utils.data.DataLoader`` underneath (built on first use)."""
        if self._dataloader is None:
            if self.iterable:
                self._dataloader = DataLoader(
                    self.dataset,
                    batch_size=None,
                    num_workers=self.num_workers,
                    collate_fn=as_is,
                    worker_init_fn=self._worker_init,
                    **self._kwargs,
                )
            else:
                self._dataloader = DataLoader(
                    self.dataset,
                    batch_size=self.batch_size,
                    sampler=self.sampler,
                    drop_last=self._drop_last,
                    num_workers=self.num_workers,
                    worker_init_fn=self._worker_init,
                    **self._kwargs,
                )
        return self._dataloader

    @property
    def epoch(self) -> int:
        """The current epoch (shared with the dataset and its sampler)."""
        return int(self.dataset.epoch)

    @property
    def consumed(self) -> int:
        """Batches of the current epoch handed out so far (or loaded by :meth:`load_state_dict`)."""
        return self.state_dict()["batches"]

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: a new order on every rank. Keeps a loaded state if it is for ``epoch``."""
        self.dataset.set_epoch(epoch)
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
        if self._pending is not None and self._pending[0] != epoch:
            self._pending = None

    def __len__(self) -> int:
        """Batches per epoch on this rank: the same on every rank, unless ``remainder="uneven"``."""
        return len(self.dataset) if self.iterable else len(self.dataloader)

    def __iter__(self) -> Iterator[Any]:
        epoch = self.epoch
        start = 0
        if self._pending is not None and self._pending[0] == epoch:
            start = self._pending[1]
        self._pending = None
        if self.iterable:
            self.dataset.load_state_dict({"epoch": epoch, "batches": start})
        else:
            # the last batch may be short: k batches are at most the whole epoch
            consumed = min(start * self.batch_size, len(self.sampler))
            self.sampler.load_state_dict({"epoch": epoch, "consumed": consumed})
        self._position = (epoch, start)
        batches = iter(self.dataloader)
        if self.iterable:
            # the workers took their copy of the resume position when the iterator started them (the main
            # process, without workers, when it took the iterator); ours must not apply to a later pass
            self.dataset.load_state_dict({"epoch": epoch, "batches": 0})
        return self._count(batches, epoch, start)

    def _count(self, batches: Iterator[Any], epoch: int, start: int) -> Iterator[Any]:
        done = start
        for batch in batches:
            done += 1
            self._position = (epoch, done)  # before the yield: a state saved while training on it counts it
            yield batch

    def state_dict(self) -> dict[str, int]:
        """Where to resume: the epoch, the batches of it consumed, and what they were consumed with.

        The batch count is the batches handed out by this Loader in the current epoch, so save the state
        after the training step of the last batch. It is the same on every rank (except near the end of an
        epoch with ``remainder="uneven"``, where each rank should keep its own).
        """
        epoch = self.epoch
        if self._pending is not None and self._pending[0] == epoch:
            batches = self._pending[1]
        elif self._position[0] == epoch:
            batches = self._position[1]
        else:
            batches = 0
        ds = self.dataset
        samples = int(getattr(ds, "total", len(ds)) if self.iterable else len(ds))
        return {
            "epoch": epoch,
            "batches": batches,
            "batch_size": self.batch_size,
            "world_size": int(getattr(ds, "world_size", 1)),
            "samples": samples,
            "seed": int(getattr(ds, "seed", 0)),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Make the next pass over ``state["epoch"]`` start after ``state["batches"]`` batches.

        Sets the epoch to ``state["epoch"]``. Any ``num_workers`` works. Restarts persistent workers.

        Raises:
            ConfigError: when the state was saved with another batch size, world size, seed or dataset
                size (it would name other samples), or lies outside the epoch.
        """
        mine = self.state_dict()
        for key in _CHECKED:
            if key in state and int(state[key]) != mine[key]:
                raise ConfigError(
                    f"this state was saved with {key}={state[key]}, this Loader has {key}={mine[key]}; "
                    "a resumed run must use the same batch size, world size, seed and data"
                )
        epoch, batches = int(state["epoch"]), int(state["batches"])
        if not 0 <= batches <= len(self):
            raise ConfigError(f"batches={batches} is outside this rank's epoch of {len(self)} batches")
        self.close()  # persistent workers hold a copy of the dataset from before this state
        self.set_epoch(epoch)
        self._pending = (epoch, batches)

    def close(self) -> None:
        """Stop the workers (persistent ones too) and close the dataset's handles. Idempotent; the Loader
        can be iterated again afterwards."""
        self._dataloader = None  # the DataLoader's iterator shuts its workers down when it is dropped
        close = getattr(self.dataset, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "iterable" if self.iterable else "map-style"
        return (
            f"Loader({type(self.dataset).__name__} ({kind}), batch_size={self.batch_size}, "
            f"num_workers={self.num_workers}, epoch={self.epoch})"
        )
