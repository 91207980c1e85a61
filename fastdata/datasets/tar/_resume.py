"""``TarShardDataset``'s side of the one resume protocol (:mod:`fastdata.core.epoch`): its plan, the state it
saves (a whole rank's, or one DataLoader worker's, as torchdata's ``StatefulDataLoader`` collects them), the
state it loads, and where each worker's next pass starts; an epoch resumed on another number of ranks or with
another batch size is read by :mod:`fastdata.datasets.tar`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fastdata.core import process
from fastdata.core.epoch import (
    REMAINDERS,
    Remainder,
    ResumeState,
    Stop,
    World,
    data_digest,
    load_state,
    next_layout,
)
from fastdata.core.errors import ConfigError, PlanError
from fastdata.datasets.tar._elastic import tail_length


class TarResume:
    """Mixin of :class:`fastdata.TarShardDataset`: ``state_dict``, ``load_state_dict`` and what they rest on."""

    total: int
    source: Any  # its TarSource: the shards' sample counts
    shuffle: bool
    world_size: int
    seed: int
    batch_size: int | None
    remainder: Remainder
    drop_last: bool
    window: int
    epoch: int
    # (epoch, batches, worker, num_workers, history): where the next pass starts; worker None = the whole
    # rank; history: the earlier layouts of an epoch resumed on another number of ranks (_tar_elastic)
    _resume: tuple[int, int, int | None, int | None, tuple[Stop, ...]] | None
    # (pid, epoch, next batch, worker, num_workers, history) of this process's latest pass, for state_dict()
    _progress: tuple[int, int, int, int, int, tuple[Stop, ...]] | None
    _shards: int | None = None  # the digest of the shards (names, order, sample counts), made on first use

    if TYPE_CHECKING:  # given by the dataset (declared for the type checker only: defined, they would win)

        @property
        def urls(self) -> list[str]: ...

        def set_epoch(self, epoch: int) -> None: ...

        def __len__(self) -> int: ...

    def _first_batch(self, world: World) -> tuple[int, int, int]:
        """``(first batch, stride, worker slot)`` of this worker's pass, from a pending resume."""
        resume = self._resume
        if resume is None or resume[0] != world.epoch:
            return world.worker, world.num_workers, world.worker
        self._resume = None
        _, batches, saved_worker, saved_workers, _ = resume
        if saved_worker is None:  # a rank-level position: deal batches from ``batches`` on afresh
            return batches + world.worker, world.num_workers, world.worker
        if (saved_worker, saved_workers) != (world.worker, world.num_workers):
            raise ConfigError(
                f"this state was saved by worker {saved_worker} of {saved_workers} and is being "
                f"loaded in worker {world.worker} of {world.num_workers}; a per-worker state "
                "(from StatefulDataLoader) needs the same num_workers, or resume through "
                "fastdata.Loader, which allows any"
            )
        return batches, world.num_workers, 0

    def resume_plan(self) -> dict[str, int]:
        """What the order and the split of an epoch depend on, besides the epoch: the plan a resume state
        records and is checked against (see :class:`fastdata.core.ResumeState`)."""
        plan = {"size": self.total, "world_size": self.world_size, "seed": self.seed, "shuffle": int(self.shuffle)}
        if self.batch_size is not None:
            plan["batch_size"] = self.batch_size
        # how the epoch is split and shuffled: an epoch finished on another number of ranks replays it
        plan.update(remainder=REMAINDERS.index(self.remainder), drop_last=int(self.drop_last), window=self.window)
        if self._shards is None:  # once: the shards do not change (a StatefulDataLoader saves every batch)
            self._shards = data_digest(self.urls, self.source.counts)
        plan["shards"] = self._shards
        return plan

    def elastic_length(self, history: Sequence[Stop]) -> int:
        """Batches of this rank in an epoch read after the stops of ``history`` (resumed on another number of
        ranks or with another batch size; see :mod:`fastdata.datasets.tar`)."""
        return tail_length(self, history)

    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        """Where to resume: a :class:`~fastdata.core.epoch.ResumeState` (as a dict) counting the batches of
        the current epoch the rank has consumed.

        Args:
            batches (int | None): batches of this epoch the rank has consumed (what
                :class:`fastdata.Loader` passes). Defaults to this process's own position: in the main
                process (no workers), the batches it has yielded; in a DataLoader worker, that worker's next
                batch (``worker``/``num_workers`` set), which is what ``torchdata``'s ``StatefulDataLoader``
                collects from each worker.
        """
        plan = self.resume_plan()
        if batches is not None:
            return ResumeState(self.epoch, batches, "batches", plan).to_dict()
        if self._resume is not None and self._resume[0] == self.epoch:
            epoch, batches, worker, workers, history = self._resume
        elif self._progress is not None and self._progress[:2] == (process.pid(), self.epoch):
            _, epoch, batches, worker, workers, history = self._progress
            if workers == 1:
                worker = None
        else:
            return ResumeState(self.epoch, 0, "batches", plan).to_dict()
        if worker is None:
            workers = None
        return ResumeState(epoch, batches, "batches", plan, worker, workers, history).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next pass over the state's epoch start after the batches it counts.

        Needs ``batch_size`` (so that a batch means the same samples for any number of workers). A state
        with ``worker``/``num_workers`` (one worker's, as ``StatefulDataLoader`` saves) resumes that worker
        and needs the same ``num_workers``; one without resumes the whole rank, with any ``num_workers``,
        and also when it was saved at another world size or batch size: the next pass then reads this
        rank's part of what no rank had consumed of that epoch (:mod:`fastdata.core.epoch`; load the same
        state on every rank), and ``len()`` counts its batches until it starts.

        Raises:
            ConfigError: when the state lies outside this rank's epoch, was saved for another plan (its shards,
                seed, shuffle, shuffle window, remainder, ``drop_last``; or, for a per-worker state, batch size
                or world size: :meth:`resume_plan`), naming every setting that differs with both values; or
                resumes mid-epoch without ``batch_size``; or is not a state fastdata saved (a field of the wrong
                type or out of range, named).
        """
        s = load_state(
            state,
            into="TarShardDataset",
            unit="batches",
            plan=self.resume_plan(),
            length=len(self),
            per_worker=True,
            elastic=self.batch_size is not None,
        )
        if s.position and self.batch_size is None:
            raise ConfigError(
                "resuming mid-epoch needs TarShardDataset(batch_size=...), so that the "
                "order of batches does not depend on num_workers"
            )
        history: tuple[Stop, ...] = ()
        position = s.position
        if s.worker is None and self.batch_size is not None:
            history, position = next_layout(s, self.world_size, self.batch_size)
            try:
                length = self.elastic_length(history) if history else 0
            except PlanError as e:  # a layout no run of this dataset could have read: not a state it saved
                raise ConfigError(f"this state names a layout this dataset cannot be read in: {e}") from None
            if history and position > length:
                raise ConfigError(f"batches={position} is outside this rank's resumed epoch of {length} batches")
        self.set_epoch(s.epoch)
        self._resume = (s.epoch, position, s.worker, s.num_workers, history)
