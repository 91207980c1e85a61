"""One resume protocol: the state every resumable fastdata object saves, and the one check on loading it.

Four objects can stop mid-epoch and resume exactly: :class:`fastdata.Loader`, and
:class:`~fastdata.loading.EpochSampler`, :class:`~fastdata.loading.ChunkBatchSampler` and
:class:`fastdata.TarShardDataset`. Each one's ``state_dict()`` is a :class:`ResumeState` as a dict, and each one's
``load_state_dict()`` reads it back through :func:`load_state`, which checks the state against the object it is
loaded into. The dict holds only ints, strings and a dict of ints, so it goes through JSON and
``torch.load(weights_only=True)`` unchanged::

    {"version": 1, "epoch": 3, "unit": "batches", "position": 120,
     "plan": {"batch_size": 64, "world_size": 8, "size": 1281167, "seed": 0}}

- ``position`` counts what of this rank's epoch ``epoch`` has been consumed, in ``unit``: "batches" for
  the objects that hand out batches (the Loader, ``TarShardDataset``), "samples" for the samplers (as
  ``EpochSampler.state_dict(consumed=...)`` always counted; ``ChunkBatchSampler`` counts whole batches'
  samples).
- ``plan`` holds what the order of the epoch depends on (batch size, world size, dataset size, seed): a
  state saved under another plan names other samples, so loading it is refused, naming the key.
- ``worker`` and ``num_workers`` appear only in a state saved inside a DataLoader worker (what torchdata's
  ``StatefulDataLoader`` collects from ``TarShardDataset``): that state resumes that worker only.
- ``history`` appears only in a state saved while an epoch resumed on another number of ranks (or with
  another batch size) was read: the :class:`Stop` of every layout that epoch was read in before, oldest
  first, so that the epoch can be resumed again, on any number of ranks (see :mod:`fastdata.core.epoch._elastic`).
  ``position`` then counts the batches of the newest layout, the one ``plan`` describes.

A state saved at another ``world_size`` or ``batch_size`` is *elastic*: an object that can (``fastdata.Loader``,
``TarShardDataset``) reads the samples of that epoch no rank had consumed, exactly once across its ranks
(:func:`next_layout`, :mod:`fastdata.core.epoch._elastic`); the others refuse it, naming the key.

The states fastdata saved before this schema load too, and so serve as short hand-written forms:
``{"epoch": e, "batches": k}`` (a Loader's or ``TarShardDataset``'s, with ``batch_size``, ``world_size``,
``samples`` and ``seed`` checked when present) and ``{"epoch": e, "consumed": n}`` (a sampler's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fastdata.core.errors import ConfigError

SCHEMA = 1  # the ``version`` a state of this schema carries; states without one are read as older ones
Unit = Literal["batches", "samples"]
UNITS: tuple[Unit, ...] = ("batches", "samples")
# keys of a state saved before this schema (fastdata <= 0.x), and where they went


@dataclass(frozen=True)
class Stop:
    """One layout an epoch was read in, and how far: ``position`` batches of ``batch_size`` samples read by
    every rank of ``world_size`` ranks (a rank with fewer batches had read all of its own)."""

    world_size: int
    batch_size: int
    position: int

    def to_dict(self) -> dict[str, int]:
        return {"world_size": self.world_size, "batch_size": self.batch_size, "position": self.position}


@dataclass(frozen=True)
class ResumeState:
    """Where a resumable object stands in its epochs; see the module doc for the dict it becomes.

    Attributes:
        epoch (int): the epoch.
        position (int): of this rank's part of ``epoch``, the units already consumed.
        unit ("batches" | "samples"): what ``position`` counts.
        plan (Mapping[str, int]): what the epoch's order depends on, checked on loading. Defaults to
            empty (nothing to check: a state one fastdata object makes for another it drives).
        worker, num_workers (int | None): set in a state saved inside DataLoader worker ``worker``.
        history (tuple[Stop, ...]): the earlier layouts of a resumed epoch read on another number of
            ranks, oldest first; empty (the default) for an epoch read in one layout.
    """

    epoch: int
    position: int
    unit: Unit
    plan: Mapping[str, int] = field(default_factory=dict)
    worker: int | None = None
    num_workers: int | None = None
    history: tuple[Stop, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """This state as a dict of ints and strings (JSON- and ``weights_only``-safe)."""
        out: dict[str, Any] = {
            "version": SCHEMA,
            "epoch": self.epoch,
            "unit": self.unit,
            "position": self.position,
            "plan": dict(self.plan),
        }
        if self.worker is not None:
            out["worker"], out["num_workers"] = self.worker, self.num_workers
        if self.history:
            out["history"] = [stop.to_dict() for stop in self.history]
        return out

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ResumeState:
        """Read a state of this schema.

        Raises:
            ConfigError: when ``state`` is not a resume state, or comes from a newer fastdata.
        """
        if not isinstance(state, Mapping) or "epoch" not in state or "version" not in state:
            raise ConfigError(
                f"not a resume state: {_short(state)}; pass what state_dict() returned (a dict with 'version', "
                "'epoch', 'unit', 'position' and 'plan')"
            )
        try:
            return cls._read(state)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"a damaged resume state ({type(e).__name__}: {e}): {_short(state)}") from None

    @classmethod
    def _read(cls, state: Mapping[str, Any]) -> ResumeState:
        version = int(state["version"])
        if version > SCHEMA:
            raise ConfigError(
                f"this state has resume schema version {version}, saved by a newer fastdata; this one reads "
                f"versions up to {SCHEMA}: upgrade fastdata to resume from it"
            )
        unit = state["unit"]
        if unit not in UNITS:
            raise ConfigError(f"a resume state with unit={unit!r}; the units are {', '.join(UNITS)}")
        worker = state.get("worker")
        history = tuple(
            Stop(int(h["world_size"]), int(h["batch_size"]), int(h["position"])) for h in state.get("history") or ()
        )
        return cls(
            epoch=int(state["epoch"]),
            position=int(state["position"]),
            unit=unit,
            plan={str(k): int(v) for k, v in dict(state.get("plan") or {}).items()},
            worker=None if worker is None else int(worker),
            num_workers=None if worker is None else int(state["num_workers"]),
            history=history,
        )


ELASTIC_KEYS = ("world_size", "batch_size")
"""Plan keys a state may differ in when the object resumes elastically (see :func:`next_layout`)."""


def load_state(
    state: Mapping[str, Any],
    *,
    into: str,
    unit: Unit,
    plan: Mapping[str, int],
    length: int,
    per_worker: bool = False,
    elastic: bool = False,
) -> ResumeState:
    """Read ``state`` (see :meth:`ResumeState.from_dict`) and check that it fits the object it is loaded into.

    Args:
        state: what a ``state_dict()`` returned, possibly through JSON or ``torch.save``.
        into (str): the object's name, for the messages ("Loader", "EpochSampler" ...).
        unit ("batches" | "samples"): what the object counts.
        plan (Mapping[str, int]): the object's own plan; every key the state also has must agree (but
            :data:`ELASTIC_KEYS`, when ``elastic``).
        length (int): units in this rank's epoch.
        per_worker (bool): the object takes a state saved inside one DataLoader worker. Defaults to False.
        elastic (bool): the object resumes a state saved at another world size or batch size (or in a
            resumed epoch's later layout, with ``history``); its position is then checked by the object,
            against the layout :func:`next_layout` names. Defaults to False.

    Raises:
        ConfigError: naming what does not fit (the plan key and both values, the unit, the position) and
            the fix.
    """
    s = ResumeState.from_dict(state)
    if s.position and s.unit != unit:
        raise ConfigError(
            f"this state counts {s.unit} ({s.position}), {into} counts {unit}: load a state into the kind of "
            "object that saved it (a Loader's into a Loader, a sampler's into that sampler)"
        )
    moved = False
    for key, mine in plan.items():
        if key in s.plan and s.plan[key] != mine:
            if elastic and key in ELASTIC_KEYS and s.worker is None:
                moved = True
                continue
            hint = (
                "; fastdata.Loader resumes a state saved on another number of ranks or with another batch size"
                if key in ELASTIC_KEYS
                else ""
            )
            raise ConfigError(
                f"this state was saved with {key}={s.plan[key]}, this {into} has {key}={mine}; a resumed run "
                f"must use the same batch size, world size, seed and data{hint}"
            )
    if s.history and (not elastic or s.worker is not None):
        raise ConfigError(
            f"this state was saved in an epoch resumed on another number of ranks (or batch size), which {into} "
            "cannot continue: resume it through fastdata.Loader"
        )
    if s.worker is not None:
        if not per_worker:
            raise ConfigError(
                f"this state was saved inside DataLoader worker {s.worker} of {s.num_workers}; {into} resumes "
                "a whole rank: load the state its own state_dict() returned"
            )
        # a worker's next batch may lie up to num_workers - 1 batches past the end of the epoch
        if not 0 <= s.position < length + (s.num_workers or 1):
            raise ConfigError(f"{unit}={s.position} is outside this rank's epoch of {length} {unit}")
    elif not (moved or s.history) and not 0 <= s.position <= length:
        raise ConfigError(f"{unit}={s.position} is outside this rank's epoch of {length} {unit}")
    elif s.position < 0:
        raise ConfigError(f"{unit}={s.position} is negative")
    return s


def next_layout(state: ResumeState, world_size: int, batch_size: int) -> tuple[tuple[Stop, ...], int]:
    """Where an object at ``world_size`` ranks with batches of ``batch_size`` resumes ``state`` (read through
    :func:`load_state` with ``elastic=True``): ``(history, position)``.

    ``history`` empty: the epoch's own layout, at batch ``position`` (the state was saved in this layout).
    Otherwise the epoch is read in the layout that follows the stops of ``history`` (see
    :mod:`fastdata.core.epoch._elastic`), from its batch ``position``: 0 when the state was saved in another layout
    (it becomes the last stop), the state's own position when it was saved in that same later layout.
    """
    saved = Stop(
        int(state.plan.get("world_size", world_size)), int(state.plan.get("batch_size", batch_size)), state.position
    )
    if (saved.world_size, saved.batch_size) == (world_size, batch_size):
        return state.history, state.position
    return (*state.history, saved), 0


def _short(state: object) -> str:
    text = repr(state)
    return text if len(text) <= 120 else text[:117] + "..."


__all__ = ["ELASTIC_KEYS", "SCHEMA", "UNITS", "ResumeState", "Stop", "Unit", "load_state", "next_layout"]
