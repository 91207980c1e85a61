"""One resume protocol: the state every resumable fastdata object saves, and the one check on loading it.

Four objects can stop mid-epoch and resume exactly: :class:`fastdata.Loader`, and
:class:`~fastdata.loading.EpochSampler`, :class:`~fastdata.loading.ChunkBatchSampler` and
:class:`fastdata.TarShardDataset`. Each one's ``state_dict()`` is a :class:`ResumeState` as a dict, and each one's
``load_state_dict()`` reads it back through :func:`load_state`, which checks the state against the object it is
loaded into. The dict holds only ints, strings and a dict of ints, so it goes through JSON and
``torch.load(weights_only=True)`` unchanged::

    {"version": 2, "epoch": 3, "unit": "batches", "position": 120,
     "plan": {"batch_size": 64, "world_size": 8, "size": 1281167, "seed": 0, "shuffle": 1, "window": 1000,
              "shards": 91275533, "remainder": 0, "drop_last": 0}}

- ``position`` counts what of this rank's epoch ``epoch`` has been consumed, in ``unit``: "batches" for
  the objects that hand out batches (the Loader, ``TarShardDataset``), "samples" for the samplers (as
  ``EpochSampler.state_dict(consumed=...)`` always counted; ``ChunkBatchSampler`` counts whole batches'
  samples).
- ``plan`` holds everything the order and the split of the epoch depend on (:data:`PLAN_KEYS`: batch size,
  world size, the data's size and identity (a digest of its shards' names and sample counts), seed,
  shuffle, shuffle window, remainder, ``drop_last``, a Mix's sources and shares): a state saved under
  another plan names other samples, so loading it is refused with a :class:`~fastdata.core.errors.ConfigError`
  naming every setting that differs, with both values. A key only one side has differs too (a Mix's state
  loaded into a plain dataset's loader). What provably keeps every sample exactly once is not in the plan and
  may change: ``num_workers``, the transport, threads; and the elastic keys below.
- Every field is checked on loading: whole numbers (not ``2.7``, not ``True``) in range (``epoch`` and
  ``position`` at least 0, ``batch_size`` and ``world_size`` at least 1 ...), ``position`` within the epoch.
- ``worker`` and ``num_workers`` appear only in a state saved inside a DataLoader worker (what torchdata's
  ``StatefulDataLoader`` collects from ``TarShardDataset``): that state resumes that worker only.
- ``history`` appears only in a state saved while an epoch resumed on another number of ranks (or with
  another batch size) was read: the :class:`Stop` of every layout that epoch was read in before, oldest
  first, so that the epoch can be resumed again, on any number of ranks (see :mod:`fastdata.core.epoch`).
  ``position`` then counts the batches of the newest layout, the one ``plan`` describes.

A state saved at another ``world_size`` or ``batch_size`` is *elastic*: an object that can (``fastdata.Loader``,
``TarShardDataset``) reads the samples of that epoch no rank had consumed, exactly once across its ranks
(:func:`next_layout`, :mod:`fastdata.core.epoch`); the others refuse it, naming the key.

Older states are refused, naming the way out: a ``version`` 1 state (fastdata before the plan held the shuffle,
the window and the data's identity) cannot be checked against what it resumes, and loading it could read
samples twice; start its epoch again (``set_epoch(epoch)`` instead of ``load_state_dict``). A state without a
plan (``"plan": {}``) is accepted only at ``position`` 0 without ``history``: it starts its epoch, which reads
every sample once in any order (what one fastdata object hands another it drives).
"""

from __future__ import annotations

import numbers
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from fastdata.core.epoch._sharding import REMAINDERS
from fastdata.core.errors import ConfigError

SCHEMA = 2  # the ``version`` a state of this schema carries (1: before the plan held shuffle, window, identity)
Unit = Literal["batches", "samples"]
UNITS: tuple[Unit, ...] = ("batches", "samples")
FIELDS = ("version", "epoch", "unit", "position", "plan", "worker", "num_workers", "history")


@dataclass(frozen=True)
class PlanKey:
    """What one plan key stands for, for the checks and the messages.

    Attributes:
        setting (str): the option(s) it records, as the user passes them.
        low (int | None): the smallest value a state may hold. Defaults to None (any).
        names (tuple[str, ...]): the values' names, for a key that records a choice by its index.
        digest (bool): the value is a digest (:func:`digest`) of what it names, not a setting.
        option (str | None): the keyword argument that sets it, for the fix ("resume with shuffle_window=8").
    """

    setting: str
    low: int | None = None
    names: tuple[str, ...] = ()
    digest: bool = False
    option: str | None = None

    def show(self, value: int | None) -> str:
        if value is None:
            return "absent"
        if self.digest:
            return f"#{value:08x}"
        return self.names[value] if self.names else str(value)


_BOOL = ("False", "True")
PLAN_KEYS: dict[str, PlanKey] = {
    "batch_size": PlanKey("batch_size", 1, option="batch_size"),
    "world_size": PlanKey("world_size", 1),
    "size": PlanKey("the dataset's size (samples)", 0),
    "seed": PlanKey("seed", option="seed"),
    "shuffle": PlanKey("shuffle", 0, _BOOL, option="shuffle"),
    "window": PlanKey("shuffle_window (as cut to shuffle_bytes)", 1, option="shuffle_window"),
    "remainder": PlanKey("remainder", 0, tuple(map(repr, REMAINDERS)), option="remainder"),
    "drop_last": PlanKey("drop_last", 0, _BOOL, option="drop_last"),
    "unit": PlanKey("the samples laid out together (Mix(batches='per_source', batch_size=...))", 1),
    "shards": PlanKey("the shards (their names, order and sample counts)", digest=True),
    "files": PlanKey("the files (their names, order and sample counts)", digest=True),
    "mix": PlanKey("the Mix's sources (their names and sizes)", digest=True),
    "mix_counts": PlanKey("the samples each Mix source supplies per epoch (weights, epoch_size)", digest=True),
    "mix_orders": PlanKey(
        "the Mix sources' orders (shuffle; lanes and batch_size; a tar source's shuffle, window, shards)", digest=True
    ),
    "block_mix": PlanKey("mix (chunks shuffled together)", 1, option="mix"),
    "chunks": PlanKey("the HDF5 chunks (where each starts)", digest=True),
}
"""The plan keys fastdata's objects record. Another key (a sampler's own) holds any whole number."""

MAX_WORLD = 1 << 20  # ranks: no state names a larger layout (a garbled one must not make us plan 2**63 ranks)
ELASTIC_KEYS = ("world_size", "batch_size")
"""Plan keys a state may differ in when the object resumes elastically (see :func:`next_layout`)."""


def digest(*parts: object) -> int:
    """A stable 31-bit digest of ``parts`` (their ``repr``), for a plan key that names data: shard names and counts."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def data_digest(urls: Sequence[str], counts: Any) -> int:
    """The digest of a dataset's files for its plan: their names (not their folder: data moved elsewhere reads
    the same), their order and their sample counts."""
    names = "\n".join(str(url).rstrip("/").rsplit("/", 1)[-1] for url in urls)
    return zlib.crc32(ints_digest(counts).to_bytes(4, "little"), zlib.crc32(names.encode())) & 0x7FFFFFFF


def ints_digest(values: Any) -> int:
    """The digest of a sequence of whole numbers (an HDF5 file's chunk starts: millions of them, in milliseconds)."""
    return zlib.crc32(np.ascontiguousarray(values, dtype="<i8").tobytes()) & 0x7FFFFFFF


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
            empty (a state one fastdata object makes for another it drives, at position 0).
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
        """Read a state of this schema, every field checked (type and range).

        Raises:
            ConfigError: when ``state`` is not a resume state, holds a field of the wrong type or out of range
                (naming it), comes from an older fastdata (schema 1) or a newer one.
        """
        if not isinstance(state, Mapping) or "epoch" not in state or "version" not in state:
            raise ConfigError(
                f"not a resume state: {_short(state)}; pass what state_dict() returned (a dict with 'version', "
                "'epoch', 'unit', 'position' and 'plan')"
            )
        version = _whole(state, "version", 1)
        if version > SCHEMA:
            raise ConfigError(
                f"this state has resume schema version {version}, saved by a newer fastdata; this one reads "
                f"versions up to {SCHEMA}: upgrade fastdata to resume from it"
            )
        epoch = _whole(state, "epoch", 0)
        if version < SCHEMA:
            raise ConfigError(
                f"this state has resume schema version {version}, saved by an older fastdata that did not record "
                "everything the order of an epoch depends on (shuffle, the shuffle window, the data's identity), "
                f"so it cannot be checked against what it resumes: start epoch {epoch} again (set_epoch({epoch}) "
                "instead of load_state_dict)"
            )
        unknown = sorted(str(k) for k in state if k not in FIELDS)
        if unknown:
            raise ConfigError(f"a resume state has no field {', '.join(map(repr, unknown))}: {_short(state)}")
        unit = state.get("unit")
        if unit not in UNITS:
            raise ConfigError(f"a resume state with unit={unit!r}; the units are {', '.join(UNITS)}")
        plan = state.get("plan")
        if not isinstance(plan, Mapping):
            raise ConfigError(f"a resume state's plan={_short(plan)} is not a dict: pass what state_dict() returned")
        checked: dict[str, int] = {}
        for key in plan:
            if not isinstance(key, str):
                raise ConfigError(f"a resume state's plan has the key {key!r}, not a name: {_short(state)}")
            spec = PLAN_KEYS.get(key)
            checked[key] = _whole(plan, key, spec.low if spec is not None else None, where="plan ")
            if spec is not None and spec.names and checked[key] >= len(spec.names):
                raise ConfigError(f"a resume state's plan {key}={checked[key]} names no {key}: {_short(state)}")
        worker = num_workers = None
        if "worker" in state or "num_workers" in state:
            num_workers = _whole(state, "num_workers", 1)
            worker = _whole(state, "worker", 0)
            if worker >= num_workers:
                raise ConfigError(f"a resume state's worker={worker} is not one of num_workers={num_workers}")
        history = state.get("history", ())
        if not isinstance(history, Sequence) or isinstance(history, str):
            raise ConfigError(f"a resume state's history={_short(history)} is not a list of stops")
        stops = []
        for stop in history:
            if not isinstance(stop, Mapping) or set(stop) != {"world_size", "batch_size", "position"}:
                raise ConfigError(
                    f"a resume state's history holds {_short(stop)}, not a stop (world_size, batch_size, position)"
                )
            lows = {"world_size": 1, "batch_size": 1, "position": 0}
            stops.append(Stop(*(_whole(stop, k, low, where="history ") for k, low in lows.items())))
        return cls(
            epoch=epoch,
            position=_whole(state, "position", 0),
            unit=unit,
            plan=checked,
            worker=worker,
            num_workers=num_workers,
            history=tuple(stops),
        )


def _whole(fields: Mapping[Any, Any], key: Any, low: int | None, where: str = "") -> int:
    """``fields[key]``, a whole number at least ``low``; else a ConfigError naming the field."""
    if key not in fields:
        raise ConfigError(f"a resume state has no {where}{key}: pass what state_dict() returned, unchanged")
    value = fields[key]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (low is not None and value < low):
        need = "a whole number" + (f" of at least {low}" if low is not None else "")
        raise ConfigError(
            f"a resume state's {where}{key}={value!r} is not {need}: pass what state_dict() returned, unchanged"
        )
    return int(value)


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
        plan (Mapping[str, int]): the object's own plan; the state's must hold the same keys with the same
            values (but :data:`ELASTIC_KEYS`, when ``elastic``). A state without a plan is taken at position 0
            only (it starts its epoch).
        length (int): units in this rank's epoch.
        per_worker (bool): the object takes a state saved inside one DataLoader worker. Defaults to False.
        elastic (bool): the object resumes a state saved at another world size or batch size (or in a
            resumed epoch's later layout, with ``history``); its position is then checked by the object,
            against the layout :func:`next_layout` names. Defaults to False.

    Raises:
        ConfigError: naming what does not fit (every plan key that differs and both values, the unit, the
            position) and the fix.
    """
    s = ResumeState.from_dict(state)
    if s.position and s.unit != unit:
        raise ConfigError(
            f"this state counts {s.unit} ({s.position}), {into} counts {unit}: load a state into the kind of "
            "object that saved it (a Loader's into a Loader, a sampler's into that sampler)"
        )
    if s.history and (not elastic or s.worker is not None):
        raise ConfigError(
            f"this state was saved in an epoch resumed on another number of ranks (or batch size), which {into} "
            "cannot continue: resume it through fastdata.Loader"
        )
    moved = _check_plan(s, into, plan, elastic)
    if moved or s.history:  # the saved layouts are planned rank by rank: a garbled world size must not hang it
        world = max([stop.world_size for stop in s.history] + [s.plan.get("world_size", 1)])
        # every rank reads a sample at least, but under remainder="pad" (which pads a rank with none)
        most = MAX_WORLD if plan.get("remainder") == REMAINDERS.index("pad") else plan.get("size", MAX_WORLD)
        if world > min(max(most, 1), MAX_WORLD):
            raise ConfigError(
                f"this state names a layout of {world} ranks for a dataset of {plan.get('size')} samples, which no "
                f"run could have saved: pass what state_dict() returned, or start epoch {s.epoch} again "
                f"(set_epoch({s.epoch}) instead of load_state_dict)"
            )
    if s.worker is not None:
        assert s.num_workers is not None
        if not per_worker:
            raise ConfigError(
                f"this state was saved inside DataLoader worker {s.worker} of {s.num_workers}; {into} resumes "
                "a whole rank: load the state its own state_dict() returned"
            )
        # a worker's next batch may lie up to num_workers - 1 batches past the end of the epoch
        if not s.position < length + s.num_workers:
            raise ConfigError(f"{unit}={s.position} is outside this rank's epoch of {length} {unit}")
    elif not (moved or s.history) and not s.position <= length:
        raise ConfigError(f"{unit}={s.position} is outside this rank's epoch of {length} {unit}")
    return s


def _check_plan(s: ResumeState, into: str, plan: Mapping[str, int], elastic: bool) -> bool:
    """Refuse a state whose plan differs from ``plan`` (naming every key); whether it was saved at another world
    size or batch size that ``into`` resumes elastically."""
    if not s.plan:
        if s.position or s.history:
            raise ConfigError(
                f"this state has no plan, so {into} cannot check that {s.position} {s.unit} of epoch {s.epoch} name "
                f"the samples they named when it was saved: pass what state_dict() returned, or start epoch "
                f"{s.epoch} again (set_epoch({s.epoch}) instead of load_state_dict)"
            )
        return False
    moved, differ, fixes = False, [], []
    for key in sorted(set(plan) | set(s.plan), key=lambda k: (k not in PLAN_KEYS, k)):
        saved, mine = s.plan.get(key), plan.get(key)
        if saved == mine:
            continue
        if elastic and key in ELASTIC_KEYS and s.worker is None and saved is not None and mine is not None:
            moved = True
            continue
        spec = PLAN_KEYS.get(key, PlanKey(key))
        line = f"{spec.setting}: saved {spec.show(saved)}, now {spec.show(mine)}"
        if key in ELASTIC_KEYS and not elastic:
            line += " (fastdata.Loader resumes a state saved on another number of ranks or with another batch size)"
        differ.append(line)
        if spec.option is not None and saved is not None:
            fixes.append(f"{spec.option}={spec.show(saved)}")
    if differ:
        again = f"start epoch {s.epoch} again (set_epoch({s.epoch}) instead of load_state_dict)"
        how = f"with {', '.join(fixes)}" if fixes else "with the data and settings it was saved with"
        raise ConfigError(
            f"this state was saved under another plan than this {into}'s, so the {s.position} {s.unit} it counts as "
            f"read are not the ones this {into} would skip: {'; '.join(differ)}. Resume {how}, or {again}"
        )
    return moved


def next_layout(state: ResumeState, world_size: int, batch_size: int) -> tuple[tuple[Stop, ...], int]:
    """Where an object at ``world_size`` ranks with batches of ``batch_size`` resumes ``state`` (read through
    :func:`load_state` with ``elastic=True``): ``(history, position)``.

    ``history`` empty: the epoch's own layout, at batch ``position`` (the state was saved in this layout).
    Otherwise the epoch is read in the layout that follows the stops of ``history`` (see
    :mod:`fastdata.core.epoch`), from its batch ``position``: 0 when the state was saved in another layout
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


__all__ = [
    "ELASTIC_KEYS",
    "PLAN_KEYS",
    "SCHEMA",
    "UNITS",
    "PlanKey",
    "ResumeState",
    "Stop",
    "Unit",
    "data_digest",
    "digest",
    "ints_digest",
    "load_state",
    "next_layout",
]
