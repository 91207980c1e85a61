"""Resuming an epoch on another number of ranks, or with another batch size (:mod:`fastdata.core.epoch._elastic`).

In one process, ranks simulated by ``rank=``/``world_size=``: a state saved mid-epoch at 4 ranks is loaded at 2
and at 3 (and 1, 5), with other ``num_workers`` and batch sizes; across the two runs every sample of the
epoch is read exactly once, every new rank reads the same number of batches (``len(loader) - consumed``, as
after a same-size resume), and
the next epoch is what a run of the new size reads. The tail layout itself is checked exhaustively over small
plans, resumes of resumes included. ``test_distributed_elastic.py`` does the same under torchrun.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata as fd
from fastdata.core.epoch._elastic import Base, layout, rank_plan
from fastdata.core.epoch._resume import Stop
from fastdata.core.epoch._sharding import rank_span
from fastdata.core.errors import ConfigError
from fastdata.loading import EpochSampler
from tests.dist_backends import BACKENDS, BATCH, batch_keys, make_dataset, make_loader, make_stateful

EPOCH = 1
SAVED_WORLD, SAVED_AFTER = 4, 1  # at 4 ranks 33 samples give 8 per rank: 2 batches of 4; stop after the first
ELASTIC = ["tar_shards", "indexed_tar", "hdf5", "mix"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in ELASTIC:
        folder = tmp_path_factory.mktemp(name)
        BACKENDS[name].prepare(folder)
        out[name] = folder
    return out


# --- the layout ---


def check_layout(lengths: list[int], batch: int, stops: list[Stop], world: int, new_batch: int) -> None:
    lay = layout(Base(tuple(lengths), batch), stops, world, new_batch)
    read = []
    for m in range(world):
        ranks, positions, bounds = rank_plan(lay, m)
        sizes = np.diff(bounds)
        assert len(sizes) == lay.batches(0), "ranks read different numbers of batches"
        assert (sizes >= 1).all() and (sizes <= new_batch).all(), f"batch sizes {sizes.tolist()}"
        read += list(zip(ranks.tolist(), positions.tolist()))
    # what the stops consumed, walked forward layout by layout
    done: set[tuple[int, int]] = set()
    for i, stop in enumerate(stops):
        before = layout(Base(tuple(lengths), batch), stops[:i], stop.world_size, stop.batch_size)
        for r in range(stop.world_size):
            ranks, positions, bounds = rank_plan(before, r)
            upto = int(bounds[min(stop.position, len(bounds) - 1)])
            done |= set(zip(ranks[:upto].tolist(), positions[:upto].tolist()))
    rest = {(r, j) for r, n in enumerate(lengths) for j in range(n)} - done
    pads = getattr(lay, "pads", 0)
    assert set(read) == rest and len(read) == len(rest) + pads, "not every sample left exactly once"
    if pads:  # only when fewer samples are left than ranks x batches: fewer than the ranks, or batches of 1
        assert len(rest) < world * lay.batches(0) and (len(rest) < world or new_batch == 1)


@pytest.mark.parametrize("remainder", ["drop", "pad", "uneven"])
@pytest.mark.parametrize("n", [1, 7, 33, 64])
def test_the_tail_reads_what_is_left_exactly_once_in_equal_batches(n: int, remainder: str) -> None:
    for saved in (1, 2, 4):
        if n < saved and remainder != "pad":
            continue
        lengths = [rank_span(n, r, saved, remainder)[1] for r in range(saved)]  # type: ignore[arg-type]
        for batch in (1, 3, 4):
            for k in range(0, -(-max(lengths) // batch) + 1):
                for world in (1, 2, 3, 5):
                    for new_batch in (1, 2, 4, 5):
                        check_layout(lengths, batch, [Stop(saved, batch, k)], world, new_batch)


def test_a_tail_stopped_again_resumes_on_yet_another_number_of_ranks() -> None:
    lengths = [rank_span(101, r, 4, "drop")[1] for r in range(4)]
    for k1 in (0, 1, 3):
        first = layout(Base(tuple(lengths), 5), [Stop(4, 5, k1)], 3, 4)
        end = max(first.batches(r) for r in range(3))  # saved after the whole tail
        with pytest.raises(ConfigError, match=f"batches={end + 1} is outside the epoch"):
            layout(Base(tuple(lengths), 5), [Stop(4, 5, k1), Stop(3, 4, end + 1)], 2, 3)
        for k2 in sorted({min(k, end) for k in (0, 2, 5, end)}):
            for world in (1, 2, 6):
                stops = [Stop(4, 5, k1), Stop(3, 4, k2)]
                check_layout(lengths, 5, stops, world, 3)
                check_layout(lengths, 5, [*stops, Stop(world, 3, int(k2 < end))], 2, 4)  # a tail with no batch: 0


def test_batches_that_must_stay_whole_are_cut_never_joined() -> None:
    # keep_batches (a Mix's per-source batches): a tail batch lies within one batch of the layout before
    lengths = [12, 12, 12]
    lay = layout(Base(tuple(lengths), 4, keep_batches=True), [Stop(3, 4, 1)], 2, 8)
    for m in range(2):
        ranks, positions, bounds = rank_plan(lay, m)
        for lo, hi in itertools.pairwise(bounds):
            assert len({(int(r), int(j) // 4) for r, j in zip(ranks[lo:hi], positions[lo:hi])}) == 1


# --- through the Loader ---


def run_epoch(name: str, folder: Path, world: int, *, stop: int | None = None, **options: Any) -> Any:
    """Every rank's batches of epoch ``EPOCH`` (the first ``stop`` only), and rank 0's state after them."""
    per_rank, state = [], None
    for rank in range(world):
        loader = make_loader(name, folder, rank=rank, world_size=world, **options)
        loader.set_epoch(EPOCH)
        per_rank.append(batch_keys(name, loader, stop))
        if rank == 0:
            state = json.loads(json.dumps(loader.state_dict()))  # as through a checkpoint
        loader.close()
    return per_rank, state


def resume(name: str, folder: Path, state: dict[str, Any], world: int, **options: Any) -> Any:
    """Every rank's batches of the rest of the state's epoch, the batch counts each reported, each rank's
    state at the end, and its batches of the next epoch."""
    batches, lens, states, nxt = [], [], [], []
    for rank in range(world):
        loader = make_loader(name, folder, rank=rank, world_size=world, **options)
        loader.load_state_dict(state)
        assert loader.epoch == EPOCH
        lens.append(len(loader) - loader.consumed)
        batches.append(batch_keys(name, loader))
        states.append(loader.state_dict())
        loader.set_epoch(EPOCH + 1)
        nxt.append(batch_keys(name, loader))
        loader.close()
    return batches, lens, states, nxt


def flat(per_rank: list[list[list[str]]]) -> list[str]:
    return [k for rank in per_rank for batch in rank for k in batch]


@pytest.mark.parametrize(
    ("world", "workers", "batch_size"), [(2, 2, BATCH), (3, 1, BATCH), (3, 0, 3), (1, 3, 8), (5, 2, 2)]
)
@pytest.mark.parametrize("name", ELASTIC)
def test_an_epoch_saved_at_4_ranks_finishes_on_another_number(
    data: dict, name: str, world: int, workers: int, batch_size: int
) -> None:
    folder = data[name]
    whole, _ = run_epoch(name, folder, SAVED_WORLD, num_workers=0)
    head, state = run_epoch(name, folder, SAVED_WORLD, stop=SAVED_AFTER, num_workers=2)
    assert state["position"] == SAVED_AFTER and state["plan"]["world_size"] == SAVED_WORLD
    rest, lens, states, nxt = resume(name, folder, state, world, num_workers=workers, batch_size=batch_size)
    assert Counter(flat(head) + flat(rest)) == Counter(flat(whole)), "not every sample of the epoch exactly once"
    counts = [len(r) for r in rest]
    assert counts == lens and len(set(counts)) == 1, f"batches per rank {counts}, len(loader) said {lens}"
    assert all(1 <= len(b) <= batch_size for r in rest for b in r)
    # a state saved at the end of the resumed epoch says where it was read: resumed again, it reads nothing
    assert states[0]["history"] == [{"world_size": SAVED_WORLD, "batch_size": BATCH, "position": SAVED_AFTER}]
    # the next epoch is the new run's own
    own = []
    for rank in range(world):
        loader = make_loader(name, folder, rank=rank, world_size=world, num_workers=0, batch_size=batch_size)
        loader.set_epoch(EPOCH + 1)
        own.append(batch_keys(name, loader))
        loader.close()
    assert nxt == own, "the epoch after the resumed one is not what a run of this size reads"


@pytest.mark.parametrize("name", ["tar_shards", "hdf5", "mix"])
def test_a_resumed_epoch_stopped_again_resumes_exactly(data: dict, name: str) -> None:
    folder = data[name]
    whole, _ = run_epoch(name, folder, SAVED_WORLD, num_workers=0)
    head, state = run_epoch(name, folder, SAVED_WORLD, stop=SAVED_AFTER, num_workers=0)
    # at 3 ranks, each stops after one batch of the tail: that state goes on at 3 ranks exactly, and at 2 too
    middle, again = [], None
    tails = []
    for rank in range(3):
        loader = make_loader(name, folder, rank=rank, world_size=3, num_workers=2, batch_size=3)
        loader.load_state_dict(state)
        tails.append(batch_keys(name, loader))
        loader.load_state_dict(state)
        middle.append(batch_keys(name, loader, 1))
        if rank == 0:
            again = json.loads(json.dumps(loader.state_dict()))
        loader.close()
    assert again is not None and again["position"] == 1 and again["plan"]["world_size"] == 3
    same, lens, _, _ = resume(name, folder, again, 3, num_workers=1, batch_size=3)
    assert [m + s for m, s in zip(middle, same)] == tails, "not the same tail, in the same order"
    last, lens, _, _ = resume(name, folder, again, 2, num_workers=0, batch_size=BATCH)
    assert Counter(flat(head) + flat(middle) + flat(last)) == Counter(flat(whole))
    assert len(set(lens)) == 1


def test_threads_read_the_same_tail(data: dict) -> None:
    folder = data["mix"]
    _, state = run_epoch("mix", folder, SAVED_WORLD, stop=SAVED_AFTER, num_workers=0)
    procs, _, _, _ = resume("mix", folder, state, 3, num_workers=2)
    threads, _, _, _ = resume("mix", folder, state, 3, num_workers=2, workers="threads")
    assert threads == procs


def test_the_hdf5_chunk_sampler_finishes_an_epoch_elsewhere(data: dict) -> None:
    folder = data["hdf5"]

    def loader(rank: int, world: int, batch: int, workers: int) -> fd.Loader:
        ds = make_dataset("hdf5", folder, rank=rank, world_size=world)
        return fd.Loader(ds, batch_sampler=ds.chunk_sampler(batch), num_workers=workers)

    keys = BACKENDS["hdf5"].keys_of
    whole, head, state = [], [], None
    for rank in range(SAVED_WORLD):
        ld = loader(rank, SAVED_WORLD, BATCH, 0)
        ld.set_epoch(EPOCH)
        whole += [k for b in ld for k in keys(b)]
        ld.set_epoch(EPOCH)
        head += [k for b in batch_keys("hdf5", ld, SAVED_AFTER) for k in b]
        if rank == 0:
            state = ld.state_dict()
        ld.close()
    rest, counts = [], []
    for rank in range(3):
        ld = loader(rank, 3, 3, 2)
        ld.load_state_dict(state)
        left = len(ld) - ld.consumed
        got = batch_keys("hdf5", ld)
        counts.append((len(got), left))
        rest += [k for b in got for k in b]
        assert all(sorted(map(int, b)) == list(map(int, b)) for b in got), "a chunk sampler's batches are sorted"
        ld.close()
    assert Counter(head + rest) == Counter(whole)
    assert len(set(counts)) == 1 and counts[0][0] == counts[0][1]


def test_what_cannot_finish_an_epoch_elsewhere_says_so(data: dict) -> None:
    state = EpochSampler(33, seed=4, rank=0, world_size=4).state_dict(consumed=4)
    with pytest.raises(ConfigError, match=r"world_size: saved 4, now 2 \(fastdata\.Loader resumes"):
        EpochSampler(33, seed=4, rank=0, world_size=2).load_state_dict(state)
    # a state saved inside one DataLoader worker (StatefulDataLoader's) resumes that worker only
    ds = make_dataset("tar_shards", data["tar_shards"], rank=0, world_size=4)
    ds.set_epoch(EPOCH)
    sdl = make_stateful("tar_shards", ds, num_workers=2)
    batch_keys("tar_shards", sdl, 1)
    worker_state = sdl.state_dict()["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    with pytest.raises(ConfigError, match="world_size: saved 4, now 2"):
        make_dataset("tar_shards", data["tar_shards"], rank=0, world_size=2).load_state_dict(worker_state)
    # a tail's state through an object that cannot continue it
    _, saved = run_epoch("hdf5", data["hdf5"], SAVED_WORLD, stop=SAVED_AFTER, num_workers=0)
    loader = make_loader("hdf5", data["hdf5"], rank=0, world_size=2, num_workers=0)
    loader.load_state_dict(saved)
    tail_state = {**loader.state_dict(), "unit": "samples", "position": 0}
    with pytest.raises(ConfigError, match=r"resume it through fastdata\.Loader"):
        EpochSampler(33, seed=11, rank=0, world_size=2).load_state_dict(tail_state)


class PlainSampler(EpochSampler):
    """A resumable sampler that cannot tell where its indices lay on another number of ranks."""

    elastic_base = None  # type: ignore[assignment]


def test_a_sampler_without_an_elastic_plan_is_refused_naming_the_fix(data: dict) -> None:
    _, saved = run_epoch("indexed_tar", data["indexed_tar"], SAVED_WORLD, stop=SAVED_AFTER, num_workers=0)
    ds = make_dataset("indexed_tar", data["indexed_tar"], rank=0, world_size=2)
    loader = fd.Loader(ds, batch_size=BATCH, sampler=PlainSampler(33, seed=11, rank=0, world_size=2))
    with pytest.raises(ConfigError, match="cannot finish an epoch on another number of ranks"):
        loader.load_state_dict(saved)


def test_a_per_source_mix_finishes_elsewhere_keeping_every_batch_to_one_source(data: dict) -> None:
    from tests.dist_backends import make_mix_sources

    def loader(rank: int, world: int, workers: int) -> fd.Loader:
        mix = fd.Mix(make_mix_sources(data["mix"]), batches="per_source", batch_size=4, seed=2, rank=rank,
                     world_size=world)  # fmt: skip
        return fd.Loader(mix, batch_size=4, num_workers=workers)

    whole, head, state = [], [], None
    for rank in range(SAVED_WORLD):
        ld = loader(rank, SAVED_WORLD, 0)
        ld.set_epoch(EPOCH)
        whole += batch_keys("mix", ld)
        ld.set_epoch(EPOCH)
        head += batch_keys("mix", ld, 2)
        if rank == 0:
            state = ld.state_dict()
        ld.close()
    rest, counts = [], set()
    for rank in range(3):
        ld = loader(rank, 3, 2)
        ld.load_state_dict(state)
        got = batch_keys("mix", ld)
        counts.add(len(got))
        rest += got
        ld.close()
    assert len(counts) == 1
    assert all(len({k[0] for k in b}) == 1 for b in rest), "a resumed batch mixes two sources"
    assert Counter(k for b in head + rest for k in b) == Counter(k for b in whole for k in b)


@pytest.mark.parametrize("name", ["tar_shards", "hdf5"])
@pytest.mark.parametrize("world", [1, 8])
def test_a_loop_counting_from_the_saved_position_reads_the_tail_and_later_epochs_whole(
    data: dict, name: str, world: int
) -> None:
    # Lightning's loop: its own counter restored to the saved position, len(loader) taken once at the start,
    # an epoch ends at len(loader) or at the loader's end
    folder = data[name]
    whole, _ = run_epoch(name, folder, SAVED_WORLD, num_workers=0)
    head, state = run_epoch(name, folder, SAVED_WORLD, stop=SAVED_AFTER, num_workers=0)
    read, later = [], []
    for rank in range(world):
        loader = make_loader(name, folder, rank=rank, world_size=world, num_workers=0)
        loader.load_state_dict(state)
        cached = len(loader)
        assert cached - loader.consumed == len(list(make_tail(name, folder, state, rank, world)))
        counter = state["position"]
        for batch in loader:
            if counter >= cached:
                break
            counter += 1
            read.append(batch)
        loader.set_epoch(EPOCH + 1)
        n = sum(1 for i, _ in enumerate(loader) if i < cached)
        later.append((n, len(loader)))
        loader.close()
    assert Counter(flat(head) + flat([batch_keys(name, read)])) == Counter(flat(whole))
    assert all(n == full for n, full in later), f"a later epoch cut short: {later}"


def make_tail(name: str, folder: Path, state: dict[str, Any], rank: int, world: int) -> Any:
    loader = make_loader(name, folder, rank=rank, world_size=world, num_workers=0)
    loader.load_state_dict(state)
    yield from loader
    loader.close()
