"""Rank planning without launching ranks: each rank's Loader built with ``rank=``/``world_size=``.

Cheap enough to cover many world sizes (``test_distributed.py`` proves the same with real ranks).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import fastdata as fd
from fastdata.core.errors import DecodeFailed, PlanError
from tests.datagen import make_shards
from tests.dist_backends import BACKENDS, BATCH, FAST, batch_keys, make_loader


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, s3_env: dict[str, str]) -> dict[str, tuple[Path, list[str]]]:
    out = {}
    for name in BACKENDS:
        folder = tmp_path_factory.mktemp(name)
        out[name] = (folder, BACKENDS[name].prepare(folder))
    return out


# world sizes 2 and 3 on every backend, 1 and 5 too on the fast ones
@pytest.mark.parametrize(
    ("name", "world_size"), [(n, w) for n in BACKENDS for w in (1, 2, 3, 5) if n in FAST or w in (2, 3)]
)
@pytest.mark.parametrize("remainder", ["drop", "pad", "uneven"])
def test_ranks_split_the_epoch_by_the_remainder_policy(data: dict, name: str, remainder: str, world_size: int) -> None:
    folder, expected = data[name]
    n = len(expected)
    seen: Counter[str] = Counter()
    lengths, counts = [], []
    for rank in range(world_size):
        loader = make_loader(name, folder, num_workers=0, remainder=remainder, rank=rank, world_size=world_size)
        loader.set_epoch(3)
        batches = batch_keys(name, loader)
        lengths.append(len(loader))
        counts.append(len(batches))
        seen.update(k for b in batches for k in b)
    assert lengths == counts, "len(loader) is not the number of batches read"
    assert set(seen) <= set(expected)
    if remainder == "drop":
        assert max(seen.values()) == 1 and len(seen) == world_size * (n // world_size)
    elif remainder == "pad":
        assert set(seen) == set(expected) and sum(seen.values()) == world_size * -(-n // world_size)
        assert max(seen.values()) <= 2
    else:
        assert sorted(seen.elements()) == sorted(expected)
    if remainder != "uneven":
        assert len(set(counts)) == 1, f"ranks would read different numbers of batches: {counts}"
    else:
        assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize("remainder", ["drop", "uneven"])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_more_ranks_than_samples_fails_at_construction_on_every_rank(data: dict, name: str, remainder: str) -> None:
    folder, expected = data[name]
    world_size = len(expected) + 1
    for rank in (0, world_size - 1):  # under "uneven", rank 0 alone would have had a sample
        with pytest.raises(PlanError, match="cannot be split"):
            make_loader(name, folder, num_workers=0, remainder=remainder, rank=rank, world_size=world_size)


@pytest.mark.parametrize(("remainder", "per_rank"), [("drop", BATCH - 1), ("uneven", BATCH)])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_drop_last_leaving_a_rank_no_batch_fails_at_construction_on_every_rank(
    data: dict, name: str, remainder: str, per_rank: int
) -> None:
    folder, expected = data[name]
    # "drop": every rank gets BATCH - 1 samples; "uneven": the first ranks get a full batch, the last ones
    # one sample less
    world_size = len(expected) // per_rank
    if remainder == "uneven":
        world_size = -(-len(expected) // per_rank)
        assert len(expected) % world_size, "the data must leave the last rank short for this case"
    for rank in (0, world_size - 1):
        with pytest.raises(PlanError, match="no batch"):
            make_loader(
                name, folder, num_workers=0, drop_last=True, remainder=remainder, rank=rank, world_size=world_size
            )


@pytest.mark.parametrize("name", list(BACKENDS))
def test_pad_allows_more_ranks_than_samples_with_equal_batches(data: dict, name: str) -> None:
    folder, expected = data[name]
    world_size = len(expected) + 2
    lengths = [
        len(make_loader(name, folder, num_workers=0, remainder="pad", rank=r, world_size=world_size))
        for r in (0, world_size - 1)
    ]
    assert lengths == [1, 1]


def failing_decoder(bad: set[str]):  # type: ignore[no-untyped-def]
    def decode(sample: dict) -> dict:
        if sample["__key__"] in bad:
            raise DecodeFailed(f"{sample['__key__']}: test decoder refuses it", sample["__key__"])
        return sample

    return decode


def test_skipped_samples_shrink_their_batch_and_never_shift_later_ones(tmp_path: Path) -> None:
    urls = make_shards(tmp_path, shards=2, per_shard=10, seed=2)
    plain = fd.TarShardDataset(urls, batch_size=BATCH)
    reference = [list(b["__key__"]) for b in plain]
    bad = {reference[1][0], reference[1][2]}
    ds = fd.TarShardDataset(urls, batch_size=BATCH, on_error="skip", decode=failing_decoder(bad))
    got = [list(b["__key__"]) for b in fd.Loader(ds, num_workers=2)]  # (the workers warn, on their stderr)
    assert got == [[k for k in batch if k not in bad] for batch in reference]
    assert ds.skipped == 2


def test_a_batch_of_only_bad_samples_is_a_substitute_instead_of_vanishing(tmp_path: Path) -> None:
    # a missing batch would leave this rank one step short of the others: a hang at the next collective;
    # the next good sample in the rank's plan order stands in (more in tests/test_substitute.py)
    urls = make_shards(tmp_path, shards=2, per_shard=10, seed=2)
    reference = [list(b["__key__"]) for b in fd.TarShardDataset(urls, batch_size=BATCH)]
    ds = fd.TarShardDataset(urls, batch_size=BATCH, on_error="skip", decode=failing_decoder(set(reference[2])))
    with pytest.warns(UserWarning, match=r"every sample of batch 2 .*train-000000\.tar.*stands in"):
        got = [list(b["__key__"]) for b in ds]
    assert got == [*reference[:2], [reference[3][0]], *reference[3:]]
    assert ds.counters()["substituted"] == 1 and ds.skipped == len(reference[2])
