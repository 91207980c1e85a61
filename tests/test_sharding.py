"""The pure planning functions: every sample exactly once, equal spans, seeded shuffles."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from fastdata.core.epoch._sharding import (
    EXACT_ORDER_MAX,
    WindowShuffle,
    epoch_order,
    keyed_permutation,
    locate,
    order_keys,
    rank_index_blocks,
    rank_indices,
    rank_span,
    split_counts,
    worker_ranges,
)
from fastdata.core.errors import ConfigError, PlanError


@pytest.mark.parametrize("n", [1, 7, 10, 33, 100])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_rank_spans_cover_the_epoch_by_policy(n: int, world_size: int) -> None:
    if n < world_size:
        with pytest.raises(PlanError, match="cannot be split"):
            rank_span(n, world_size - 1, world_size, "drop")
        return
    drop = [rank_span(n, r, world_size, "drop") for r in range(world_size)]
    assert len({length for _, length in drop}) == 1, "drop: equal length on every rank"
    covered = [p for start, length in drop for p in range(start, start + length)]
    assert covered == list(range(n - n % world_size)), "drop: contiguous, disjoint, only the tail dropped"

    pad = [rank_span(n, r, world_size, "pad") for r in range(world_size)]
    assert len({length for _, length in pad}) == 1, "pad: equal length on every rank"
    positions = Counter(p % n for start, length in pad for p in range(start, start + length))
    assert set(positions) == set(range(n)), "pad: every sample read"
    assert sum(c - 1 for c in positions.values()) == pad[0][1] * world_size - n, "pad: only the pads repeat"

    uneven = [rank_span(n, r, world_size, "uneven") for r in range(world_size)]
    covered = [p for start, length in uneven for p in range(start, start + length)]
    assert covered == list(range(n)), "uneven: exactly once, nothing dropped"
    assert max(x[1] for x in uneven) - min(x[1] for x in uneven) <= 1


def test_unknown_remainder_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'drop', 'pad', 'uneven'"):
        rank_span(10, 0, 2, "dorp")  # type: ignore[arg-type]


def test_epoch_order_is_seeded_and_changes_with_epoch() -> None:
    a = epoch_order(50, shuffle=True, seed=1, epoch=0)
    assert sorted(a.tolist()) == list(range(50))
    assert np.array_equal(a, epoch_order(50, shuffle=True, seed=1, epoch=0))
    assert not np.array_equal(a, epoch_order(50, shuffle=True, seed=1, epoch=1))
    assert not np.array_equal(a, epoch_order(50, shuffle=True, seed=2, epoch=0))
    assert epoch_order(5, shuffle=False, seed=1, epoch=3).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_rank_indices_are_disjoint_and_identical_on_every_rank_for_a_seed(world_size: int) -> None:
    parts = [rank_indices(20, rank=r, world_size=world_size, shuffle=True, seed=4, epoch=2) for r in range(world_size)]
    flat = np.concatenate(parts).tolist()
    assert len(flat) == len(set(flat)) == 20 - 20 % world_size


@pytest.mark.parametrize("window", [1, 4, 7, 100])
def test_window_shuffle_permutes_within_windows(window: int) -> None:
    shuffle = WindowShuffle(23, window, seed=0, epoch=0, rank=0)
    whole = shuffle.positions(0, 23)
    assert sorted(whole.tolist()) == list(range(23))
    for q, src in enumerate(whole.tolist()):
        assert q // max(window, 1) == src // max(window, 1), "a position only moves inside its window"
    pieces = np.concatenate([shuffle.positions(lo, min(23, lo + 5)) for lo in range(0, 23, 5)])
    assert np.array_equal(pieces, whole), "any slice can be computed on its own"
    if window > 1:
        other = WindowShuffle(23, window, seed=0, epoch=1, rank=0).positions(0, 23)
        assert not np.array_equal(whole, other)


@pytest.mark.parametrize("num_workers", [1, 2, 3, 5])
@pytest.mark.parametrize("unit", [None, 1, 4])
def test_worker_ranges_deal_every_position_once(num_workers: int, unit: int | None) -> None:
    length, start = 37, (8 if unit else 3)
    per_worker = [
        list(worker_ranges(length, worker=w, num_workers=num_workers, unit=unit, start=start))
        for w in range(num_workers)
    ]
    covered = sorted(p for ranges in per_worker for lo, hi in ranges for p in range(lo, hi))
    assert covered == list(range(start, length))
    if unit:
        # the DataLoader takes one unit from each worker in turn: that must give the sequential order
        order: list[int] = []
        iters = [iter(r) for r in per_worker]
        while True:
            got = [next(it, None) for it in iters]
            order.extend(p for rng in got if rng for p in range(*rng))
            if all(g is None for g in got):
                break
        assert order == list(range(start, length))


def test_resume_position_must_fall_on_a_unit() -> None:
    with pytest.raises(PlanError, match="multiple of the batch size"):
        list(worker_ranges(10, worker=0, num_workers=1, unit=4, start=3))


def test_locate_maps_epoch_positions_to_shards() -> None:
    counts = [3, 0, 2, 4]
    order = np.array([2, 0, 3, 1])
    offsets = split_counts(counts, order)
    shards, local = locate(offsets, order, np.arange(9))
    assert list(zip(shards.tolist(), local.tolist())) == [
        (2, 0),
        (2, 1),
        (0, 0),
        (0, 1),
        (0, 2),
        (3, 0),
        (3, 1),
        (3, 2),
        (3, 3),
    ]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 1000, 4097, 65_536, 100_003])
def test_keyed_permutation_is_a_seeded_bijection(n: int) -> None:
    # what epochs of more than EXACT_ORDER_MAX samples are shuffled by, position by position
    keys = order_keys(3, 1)
    x = np.arange(n, dtype=np.int64)
    p = keyed_permutation(x, n, keys)
    assert sorted(p.tolist()) == list(range(n))
    assert np.array_equal(p, keyed_permutation(x, n, order_keys(3, 1)))
    assert np.array_equal(p[n // 3 :], keyed_permutation(x[n // 3 :], n, keys)), "any part, computed alone"
    if n > 5:
        assert not np.array_equal(p, keyed_permutation(x, n, order_keys(3, 2)))
        assert not np.array_equal(p, x)
    if n >= 1000:  # and it looks shuffled: no long stretch of neighbours stays together
        assert np.mean(np.abs(np.diff(p)) == 1) < 0.01


def test_rank_index_blocks_of_a_huge_epoch_split_it_like_rank_indices() -> None:
    n = EXACT_ORDER_MAX + 12_345
    spans = []
    for rank in range(3):
        blocks = list(
            itertools.islice(
                rank_index_blocks(n, rank=rank, world_size=3, shuffle=True, seed=0, epoch=0, block=1000, start=5), 2
            )
        )
        assert [len(b) for b in blocks] == [1000, 1000]
        spans.append(np.concatenate(blocks))
    flat = np.concatenate(spans)
    assert len(set(flat.tolist())) == len(flat) and flat.min() >= 0 and flat.max() < n
    start, _ = rank_span(n, 1, 3, "drop")
    expected = keyed_permutation(np.arange(start + 5, start + 2005), n, order_keys(0, 0))
    assert np.array_equal(spans[1], expected)
    small = list(rank_index_blocks(50, rank=1, world_size=2, shuffle=True, seed=4, epoch=2, start=3))
    assert np.array_equal(
        np.concatenate(small), rank_indices(50, rank=1, world_size=2, shuffle=True, seed=4, epoch=2)[3:]
    )
