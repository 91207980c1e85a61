"""What every fastdata dataset has: the rank read at construction, the epoch and skip counters
shared with its workers, the bad-input policy, and ``close``."""

from __future__ import annotations

from typing import Any

from fastdata.core import process
from fastdata.core.errors import ErrorPolicy, OnError
from fastdata.core.seeding import on_epoch
from fastdata.core.shared import SharedEpoch, SharedState
from fastdata.core.world import World, current_rank, current_worker


class DatasetBase(SharedEpoch):
    """Mixin for fastdata datasets (map-style and iterable).

    Args:
        seed (int): seeds every shuffle and per-worker stream. Defaults to 0.
        on_error ("raise" | "skip"): bad-input policy, see :mod:`fastdata.core.errors`. Defaults to "raise".
        rank, world_size (int | None): Default to the detected ones, read now, at construction.
        counters (tuple[str, ...]): names of extra counters shared with the workers.
    """

    def _init_base(
        self,
        *,
        seed: int,
        on_error: OnError,
        rank: int | None,
        world_size: int | None,
        counters: tuple[str, ...] = (),
    ) -> None:
        detected = current_rank()
        self.rank = detected[0] if rank is None else rank
        self.world_size = detected[1] if world_size is None else world_size
        self.seed = seed
        self._shared = SharedState(("skipped", *counters))
        self._policy = ErrorPolicy(on_error, self._shared)
        World(self.rank, self.world_size, seed=seed)  # checks rank and world size
        self._seen_epoch: tuple[int, int] | None = None  # (pid, epoch) last reseeded for: see follow_epoch

    @property
    def on_error(self) -> OnError:
        return self._policy.on_error  # type: ignore[return-value]

    @property
    def skipped(self) -> int:
        """Samples skipped under ``on_error="skip"``, summed over the main process and every worker."""
        return self._shared.total("skipped")

    def counters(self) -> dict[str, int]:
        """Every shared counter (skipped samples, and backend-specific ones like retries)."""
        return self._shared.totals()

    def worker_world(self) -> World:
        """The :class:`World` of the calling process (its worker id and count filled in)."""
        worker, num_workers = current_worker()
        return World(self.rank, self.world_size, worker, num_workers, self.seed, self.epoch)

    def follow_epoch(self) -> None:
        """Reseed this process's random streams (:func:`fastdata.core.seeding.on_epoch`) when the shared epoch
        has moved since it last looked: map-style datasets call it on every read, so persistent workers
        get new streams each epoch even without ``worker_init_fn``. Keyed by pid too: a worker forked
        from a parent that already read (``ds[0]`` before training) still seeds its own streams."""
        seen = (process.pid(), self.epoch)
        if self._seen_epoch != seen:
            self._seen_epoch = seen
            on_epoch(self.worker_world())

    def close(self) -> None:
        """Close every handle this process opened. Idempotent; the dataset reopens on next use."""

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
