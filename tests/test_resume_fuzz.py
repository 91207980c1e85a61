"""Fuzzing resume states: a state ``fd.Loader`` saved mid-epoch (over ``TarShardDataset``, ``IndexedTarDataset``
and ``fd.Mix``) is mutated (fields changed, removed, retyped, out of range, a plan key changed or removed, the
plan or the whole state swapped with another dataset's, a Mix's with a plain one's) and loaded into a fresh
Loader. Every mutant must be either refused with a fastdata :class:`~fastdata.core.errors.ConfigError`, or read
the rest of its epoch exactly once: the samples the state counts as read (the first ``position`` batches of
every rank of the layout its plan names: another ``world_size`` or ``batch_size`` resumes elastically) and the
samples read after loading are that epoch's samples, each once.

Hypothesis runs with a fixed seed (``derandomize``) and few examples over tiny data at ``num_workers=0``.
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fastdata.core.errors import ConfigError, PlanError
from tests.dist_backends import BACKENDS, BATCH, batch_keys, make_loader
from tests.resume_check import through_json

NAMES = ("tar_shards", "indexed_tar", "mix")
EPOCH, STOP = 1, 2
FUZZ = settings(
    derandomize=True, deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow], database=None
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in NAMES:
        out[name] = tmp_path_factory.mktemp(name)
        BACKENDS[name].prepare(out[name])
    return out


@pytest.fixture(scope="module")
def saved(data: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Each backend's state after ``STOP`` batches of epoch ``EPOCH``, through JSON."""
    out = {}
    for name in NAMES:
        loader = make_loader(name, data[name], num_workers=0, rank=0, world_size=1)
        loader.set_epoch(EPOCH)
        batch_keys(name, loader, STOP)
        out[name] = through_json(loader.state_dict())
        loader.close()
    return out


_EPOCHS: dict[tuple[str, int, int, int], list[list[list[str]]]] = {}


def epoch_batches(data: dict[str, Path], name: str, world: int, batch: int, epoch: int) -> list[list[list[str]]]:
    """Every rank's batches of ``epoch`` on ``world`` ranks with batches of ``batch`` (a reference, cached)."""
    key = (name, world, batch, epoch)
    if key not in _EPOCHS:
        ranks = []
        for rank in range(world):
            loader = make_loader(name, data[name], num_workers=0, rank=rank, world_size=world, batch_size=batch)
            loader.set_epoch(epoch)
            ranks.append(batch_keys(name, loader))
            loader.close()
        _EPOCHS[key] = ranks
    return _EPOCHS[key]


# -- mutations ---------------------------------------------------------------------------------------------
FIELDS = ("version", "epoch", "unit", "position", "plan", "worker", "num_workers", "history", "surprise")
PLAN_KEYS = ("batch_size", "world_size", "size", "seed", "shuffle", "window", "remainder", "drop_last", "unit")
PLAN_KEYS += ("shards", "mix", "mix_counts", "mix_orders", "lanes")
ODD = st.one_of(
    st.sampled_from([-1, 0, 1, 2, 3, 4, 9, 10, 10**6, 2**63, -(2**40)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(-1, 3), max_size=2),
    st.dictionaries(st.sampled_from(["world_size", "batch_size", "position"]), st.integers(-1, 4), max_size=3),
)
MUTATION = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(FIELDS), ODD),
    st.tuples(st.just("set"), st.sampled_from(["epoch", "position"]), st.integers(0, 12)),
    st.tuples(st.just("drop"), st.sampled_from(FIELDS)),
    st.tuples(st.just("set_plan"), st.sampled_from(PLAN_KEYS), ODD),
    st.tuples(
        st.just("set_plan"),
        st.sampled_from(["batch_size", "world_size"]),
        st.integers(1, 5) | st.sampled_from([40, 2**63]),
    ),
    st.tuples(st.just("drop_plan"), st.sampled_from(PLAN_KEYS)),
    st.tuples(st.just("swap_plan"), st.sampled_from(NAMES)),  # the plan of another dataset's state
    st.tuples(st.just("swap"), st.sampled_from(NAMES)),  # another dataset's whole state
)


def mutate(state: dict[str, Any], mutations: list[tuple[Any, ...]], saved: dict[str, dict[str, Any]]) -> Any:
    out: Any = copy.deepcopy(state)
    for op, *args in mutations:
        plan = out.get("plan") if isinstance(out, dict) else None
        if op == "set":
            out[args[0]] = args[1]
        elif op == "drop":
            out.pop(args[0], None)
        elif op == "set_plan" and isinstance(plan, dict):
            plan[args[0]] = args[1]
        elif op == "drop_plan" and isinstance(plan, dict):
            plan.pop(args[0], None)
        elif op == "swap_plan":
            out["plan"] = copy.deepcopy(saved[args[0]]["plan"])
        elif op == "swap":
            out = copy.deepcopy(saved[args[0]])
    return out


def check_mutant(data: dict[str, Path], name: str, mutant: Any) -> str:
    """Load ``mutant`` and check the promise; "refused" or "accepted" (and read exactly once)."""
    loader = make_loader(name, data[name], num_workers=0, rank=0, world_size=1)
    try:
        loader.load_state_dict(mutant)
    except ConfigError:
        return "refused"
    epoch, position, plan = mutant["epoch"], mutant["position"], mutant.get("plan") or {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rest = [k for batch in batch_keys(name, loader) for k in batch]
    loader.close()
    world, batch = plan.get("world_size", 1), plan.get("batch_size", BATCH)
    try:
        layout = epoch_batches(data, name, world, batch, epoch)
    except PlanError:  # accepted a layout no Loader could have saved this state in
        raise AssertionError(f"accepted a state of an impossible layout: {mutant}") from None
    if not plan:
        assert position == 0, mutant
    before = [k for rank in layout for b in rank[:position] for k in b]
    whole = [k for rank in layout for b in rank for k in b]
    read = Counter(before + rest)
    assert read == Counter(whole) and max(read.values()) == 1, (mutant, read - Counter(whole), Counter(whole) - read)
    return "accepted"


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_a_mutated_state_is_refused_or_reads_the_rest_of_its_epoch_exactly_once(
    data: dict[str, Path], saved: dict[str, dict[str, Any]], name: str, mutations: list[tuple[Any, ...]]
) -> None:
    event(check_mutant(data, name, mutate(saved[name], mutations, saved)))


@pytest.mark.parametrize("name", NAMES)
def test_the_unmutated_state_and_its_elastic_forms_read_exactly_once(
    data: dict[str, Path], saved: dict[str, dict[str, Any]], name: str
) -> None:
    # the fuzz's own check, on states that must be accepted: it would pass a checker that refuses everything
    assert check_mutant(data, name, saved[name]) == "accepted"
    for world, batch in ((2, BATCH), (3, 2), (1, 5)):
        loader = make_loader(name, data[name], num_workers=0, rank=0, world_size=world, batch_size=batch)
        loader.set_epoch(EPOCH)
        batch_keys(name, loader, 1)
        state = through_json(loader.state_dict())
        loader.close()
        assert check_mutant(data, name, state) == "accepted", (world, batch)
