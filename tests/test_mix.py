"""``fd.Mix``: several datasets in set proportions, exactly per epoch, through ``fd.Loader``.

The shared suites run the ``mix`` entry of ``tests/dist_backends.py`` too (resume at every batch with any
``num_workers``, StatefulDataLoader, every remainder policy, torchrun); here: the proportions (per epoch,
per batch, per rank), each source's passes, the epoch's definitions, determinism, ``per_source`` batches,
bad samples stood in for from the same source, the Loader's modes, ``num_workers="auto"``, the counters
the monitor can show per source, every backend as a source, and what is refused.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata as fd
from fastdata.core.epoch._mixing import apportion, prefix
from fastdata.core.errors import ConfigError
from tests.dist_backends import BACKENDS, batch_keys, make_dataset, make_mix_sources, mix_key_of_tar
from tests.test_autotune_loader import Scripted


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mix")
    BACKENDS["mix"].prepare(folder)
    return folder


def mix_of(folder: Path, **options: Any) -> fd.Mix:
    sources = make_mix_sources(folder, seed=options.pop("source_seed", 11))
    weights = options.pop("weights", {"tar": 0.75, "h5": 0.25})
    return fd.Mix(sources, weights, **{"seed": 3, "epoch_size": 40, **options})


def epoch(loader: fd.Loader, e: int) -> list[list[str]]:
    loader.set_epoch(e)
    return [list(b["key"]) for b in loader]


def source_of(key: str) -> str:
    return "tar" if key.startswith("t:") else "h5"


# --- proportions ---


def test_every_epoch_and_every_batch_holds_each_sources_share(data: Path) -> None:
    mix = mix_of(data)
    assert mix.counts.tolist() == [30, 10] and len(mix) == 40
    loader = fd.Loader(mix, batch_size=4, num_workers=0)
    for e in (0, 1, 2):
        batches = epoch(loader, e)
        assert Counter(source_of(k) for b in batches for k in b) == {"tar": 30, "h5": 10}
        assert [Counter(map(source_of, b))["tar"] for b in batches] == [3] * 10  # 3 of 4, every batch
    # uneven weights, three sources: every batch within one sample of its share (Webster), the epoch exact
    counts = apportion(1000, [0.5, 0.3, 0.2])
    assert counts.tolist() == [500, 300, 200]
    mix3 = fd.Mix([*make_mix_sources(data).values(), make_dataset("indexed_tar", data / "tar")], [5, 3, 2],
                  epoch_size=1000)  # fmt: skip
    sources, _ = mix3.locate(np.arange(1000))
    assert np.bincount(sources).tolist() == [500, 300, 200]
    for size in (7, 16, 64):
        windows = np.lib.stride_tricks.sliding_window_view(sources, size)
        share = np.stack([(windows == s).sum(axis=1) for s in range(3)], axis=1)
        assert np.abs(share - size * counts / 1000).max() <= 1.0 + 1e-9


@pytest.mark.parametrize(("world", "remainder"), [(2, "drop"), (4, "uneven"), (3, "drop"), (3, "pad")])
def test_ranks_together_read_the_epochs_shares(data: Path, world: int, remainder: str) -> None:
    per_rank = []
    for rank in range(world):
        loader = fd.Loader(mix_of(data, rank=rank, world_size=world), batch_size=4, num_workers=0, remainder=remainder)
        per_rank.append(epoch(loader, 1))
    lengths = {len(r) for r in per_rank}
    assert len(lengths) == 1 or remainder == "uneven"
    read = Counter(source_of(k) for r in per_rank for b in r for k in b)
    n = sum(read.values())
    if 40 % world == 0 or remainder == "uneven":  # nothing left out: the epoch's shares exactly
        assert read == {"tar": 30, "h5": 10}
    elif remainder == "drop":  # the sequence's last 40 % world left out: the apportionment of what is read
        assert n == 40 - 40 % world and [read["tar"], read["h5"]] == prefix([30, 10], n).tolist()
    else:  # pad: the first few read twice
        assert n == world * -(-40 // world)


# --- each source's passes, the epoch ---


def test_a_source_is_read_once_per_pass_and_starts_its_next_when_it_runs_out(data: Path) -> None:
    # 50 HDF5 draws per epoch of a source of 33: over 3 epochs, 150 draws are 4 passes and 18 of the fifth
    mix = mix_of(data, weights={"tar": 1, "h5": 1}, epoch_size=100)
    loader = fd.Loader(mix, batch_size=5, num_workers=0)
    h5 = [k for e in (0, 1, 2) for b in epoch(loader, e) for k in b if k.startswith("h:")]
    assert len(h5) == 150 and set(Counter(h5).values()) == {4, 5}
    assert sum(1 for v in Counter(h5).values() if v == 5) == 18
    # each pass is a permutation of the source, a new one each pass
    reader = mix._readers[1]
    orders = [reader.indices(np.arange(33 * q, 33 * (q + 1))) for q in range(3)]
    assert all(sorted(o.tolist()) == list(range(33)) for o in orders)
    assert not np.array_equal(orders[0], orders[1])


def test_an_epoch_can_be_a_sample_count_or_one_pass_of_a_source(data: Path) -> None:
    by_pass = mix_of(data, weights={"tar": 0.6, "h5": 0.4}, epoch_size="h5")
    assert by_pass.counts.tolist() == [49, 33] and len(by_pass) == 82  # h5 exactly once; round(33 / 0.4)
    loader = fd.Loader(by_pass, batch_size=8, num_workers=0)
    for e in (0, 1):
        h5 = [k for b in epoch(loader, e) for k in b if k.startswith("h:")]
        assert sorted(h5) == sorted(f"h:{i}" for i in range(33))  # one pass of it, every epoch
    default = fd.Mix(make_mix_sources(data))  # weights by size, an epoch of both: each read once
    assert default.counts.tolist() == [33, 33]
    assert mix_of(data, epoch_size=8).counts.tolist() == [6, 2]


def test_the_order_follows_seed_and_epoch_only(data: Path) -> None:
    a = epoch(fd.Loader(mix_of(data), batch_size=4, num_workers=0), 1)
    assert epoch(fd.Loader(mix_of(data, source_seed=99), batch_size=4, num_workers=2), 1) == a  # sources' seeds unused
    assert epoch(fd.Loader(mix_of(data), batch_size=4, num_workers=0), 2) != a
    assert epoch(fd.Loader(mix_of(data, seed=4), batch_size=4, num_workers=0), 1) != a


# --- per-source batches ---


def test_per_source_batches_hold_one_source_each_in_the_epochs_shares(data: Path) -> None:
    sources = make_mix_sources(data)
    sources["h5"].transform = None  # unlike samples: HDF5 rows as they are, collated by HDF5Dataset.collate
    mix = fd.Mix(sources, {"tar": 2, "h5": 1}, epoch_size=48, batches="per_source", batch_size=4, seed=5)
    assert mix.counts.tolist() == [32, 16]
    loader = fd.Loader(mix, batch_size=4, num_workers=2)
    for e in (0, 1):
        loader.set_epoch(e)
        names = []
        for batch in loader:
            (name,) = set(batch["__source__"])
            names.append(name)
            if name == "h5":
                assert batch["image"].shape[0] == 4 and "__index__" in batch
            else:
                assert all(k.startswith("t:") for k in batch["key"])
        assert Counter(names) == {"tar": 8, "h5": 4}
    with pytest.raises(ConfigError, match="batch_size=4"):
        fd.Loader(mix, batch_size=3, num_workers=0)
    mix.set_epoch(2)
    with pytest.raises(ConfigError, match="must be read in batches of 4"):
        mix.__getitems__([2, 3, 4])  # read some other way


# --- bad samples ---


def test_bad_samples_are_stood_in_for_from_the_same_source(data: Path) -> None:
    bad = {"s000003", "s000004", "s000005", "s000020"}

    def refuse(sample: dict[str, Any]) -> dict[str, Any]:
        if sample["__key__"] in bad:
            raise fd.DecodeFailed(f"{sample['__key__']}: damaged", sample["__key__"])
        return sample

    sources = make_mix_sources(data)
    sources["tar"] = fd.TarShardDataset(
        sources["tar"].urls, shuffle=False, decode=refuse, transform=mix_key_of_tar, on_error="skip", seed=1
    )
    mix = fd.Mix(sources, {"tar": 1, "h5": 1}, epoch_size=66, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fd.BadSampleWarning)
        batches = epoch(fd.Loader(mix, batch_size=6, num_workers=2), 0)
    assert [Counter(map(source_of, b)) for b in batches] == [{"tar": 3, "h5": 3}] * 11  # every batch its share
    tar_keys = Counter(k for b in batches for k in b if k.startswith("t:"))
    assert not set(tar_keys) & {f"t:{k}" for k in bad} and sum(tar_keys.values()) == 33
    assert mix.counters()["substituted"] == 4 and mix.skipped == 4
    assert mix.source_stats()["tar"]["skipped"] == 4


def test_a_bad_sample_of_a_map_style_source_is_counted_once(data: Path) -> None:
    bad = {"s000003", "s000020"}

    def refuse(sample: dict[str, Any]) -> dict[str, Any]:
        if sample["__key__"] in bad:
            raise fd.DecodeFailed(f"{sample['__key__']}: damaged", sample["__key__"])
        return sample

    sources = make_mix_sources(data)
    indexed = fd.IndexedTarDataset(sources["tar"].urls, decode=refuse, transform=mix_key_of_tar, on_error="skip")
    mix = fd.Mix({"tar": indexed, "h5": sources["h5"]}, {"tar": 1, "h5": 1}, epoch_size=2 * len(indexed), seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fd.BadSampleWarning)
        keys = [k for b in epoch(fd.Loader(mix, batch_size=6, num_workers=0), 0) for k in b]
    assert sum(k.startswith("t:") for k in keys) == len(indexed)  # one pass of the source: each bad read once
    assert not {f"t:{k}" for k in bad} & set(keys)
    # before: 4 (the batch's read counted each bad sample, and so did reading it again alone)
    assert mix.skipped == 2 and mix.counters()["tar/skipped"] == 2


def test_a_mix_source_with_no_good_sample_left_is_named_with_its_shards(data: Path) -> None:
    def refuse(sample: dict[str, Any]) -> dict[str, Any]:
        raise fd.DecodeFailed(f"{sample['__key__']}: damaged", sample["__key__"])

    sources = make_mix_sources(data)
    urls = sources["tar"].urls
    sources["tar"] = fd.TarShardDataset(urls, decode=refuse, transform=mix_key_of_tar, on_error="skip")
    mix = fd.Mix(sources, {"tar": 1, "h5": 1}, epoch_size=20, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fd.BadSampleWarning)
        with pytest.raises(fd.TooManyBadSamples) as got:
            next(iter(fd.Loader(mix, batch_size=6, num_workers=0)))
    message = str(got.value)
    # before: no source named, and the samples' keys listed as "files"
    assert message.startswith("Mix source 'tar': TarShardDataset(")
    assert f"(files: {', '.join(urls)}; samples: s0000" in message


def test_weights_are_numbers_checked_and_shared_out_without_overflow(data: Path) -> None:
    sources = make_mix_sources(data)
    with pytest.raises(ConfigError, match=r"weight '0\.7' of source 'tar': weights must be positive and finite"):
        fd.Mix(sources, {"tar": "0.7", "h5": 1})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"weight None of source 'h5'"):
        fd.Mix(sources, [1, None])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="give a number per source"):
        fd.Mix(sources, "tar")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="give a number per source"):
        fd.Mix(sources, 3)  # type: ignore[arg-type]
    # before: 1e308 + 1e308 overflowed to inf, each share became 0, and the mix was refused
    mix = fd.Mix(sources, {"tar": 1e308, "h5": 1e308}, epoch_size=40)
    assert mix.counts.tolist() == [20, 20]


# --- through the Loader's modes, the autotuner, the monitor ---


@pytest.mark.parametrize(
    "options",
    [
        {"num_workers": 2},
        {"num_workers": 2, "transport": "stock", "multiprocessing_context": "spawn"},
        {"num_workers": 2, "workers": "threads"},
        {"num_workers": 1, "threads_per_worker": 2},
    ],
)
def test_every_way_of_reading_gives_the_same_batches(data: Path, options: dict[str, Any]) -> None:
    expected = [epoch(fd.Loader(mix_of(data), batch_size=4, num_workers=0), e) for e in (0, 1)]
    loader = fd.Loader(mix_of(data), batch_size=4, persistent_workers=options["num_workers"] > 0, **options)
    assert [epoch(loader, e) for e in (0, 1)] == expected
    loader.close()


def test_automatic_worker_changes_keep_the_mix_exact(data: Path) -> None:
    expected = [epoch(fd.Loader(mix_of(data), batch_size=2, num_workers=0), e) for e in (0, 1)]
    loader = fd.Loader(mix_of(data), batch_size=2, num_workers="auto")
    assert loader._session is not None
    loader._session.tuner = Scripted([0, 2, 1])
    assert [epoch(loader, e) for e in (0, 1)] == expected
    assert [c.after.workers for c in loader.changes] == [0, 2, 1]
    loader.close()


def test_the_counters_say_what_each_source_cost(data: Path) -> None:
    reports: list[Any] = []
    mix = mix_of(data)
    loader = fd.Loader(mix, batch_size=4, num_workers=2, monitor=reports.append)
    epoch(loader, 0)
    stats = mix.source_stats()
    assert {name: s["samples"] for name, s in stats.items()} == {"tar": 30, "h5": 10}  # summed over workers
    assert all(s["seconds"] > 0 for s in stats.values())
    assert loader.stats() is not None
    loader.close()


# --- every backend as a source ---


def test_sources_of_every_backend_mix_in_one_epoch(tmp_path: Path, s3_env: dict[str, str]) -> None:
    sources = {}
    for name in ("tar_shards", "hdf5", "video", "s3_objects"):
        folder = tmp_path / name
        folder.mkdir()
        BACKENDS[name].prepare(folder)
        sources[name] = make_dataset(name, folder)
    mix = fd.Mix(sources, [1, 1, 1, 1], epoch_size=32, batches="per_source", batch_size=2, seed=0)
    loader = fd.Loader(mix, batch_size=2, num_workers=2)
    loader.set_epoch(0)
    names = Counter(next(iter(set(b["__source__"]))) for b in loader)
    assert names == {name: 4 for name in sources}
    loader.close()


# --- refused ---


def test_what_cannot_mix_is_refused_naming_the_fix(data: Path) -> None:
    sources = make_mix_sources(data)
    with pytest.raises(ConfigError, match="at least one"):
        fd.Mix({})
    with pytest.raises(ConfigError, match="positive and finite"):
        fd.Mix(sources, {"tar": 1, "h5": 0})
    with pytest.raises(ConfigError, match="name each once"):
        fd.Mix(sources, {"tar": 1, "books": 1})
    with pytest.raises(ConfigError, match="one weight per source"):
        fd.Mix(sources, [1.0])
    with pytest.raises(ConfigError, match="names no source"):
        fd.Mix(sources, epoch_size="books")
    with pytest.raises(ConfigError, match="gives no sample to 'h5'"):
        fd.Mix(sources, {"tar": 100, "h5": 1}, epoch_size=10)
    with pytest.raises(ConfigError, match="needs batch_size"):
        fd.Mix(sources, batches="per_source")
    with pytest.raises(ConfigError, match="batches"):
        fd.Mix(sources, batches="by_source")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="is iterable"):
        fd.Mix({"gen": _Stream()})
    sources["h5"].transform = None
    with pytest.raises(ConfigError, match="have keys"):
        next(iter(fd.Loader(fd.Mix(sources), batch_size=8, num_workers=0)))


class _Stream(__import__("torch").utils.data.IterableDataset):  # type: ignore[misc]
    def __iter__(self) -> Any:
        yield from range(3)


def test_a_per_source_mix_resumes_mid_epoch_with_any_num_workers(data: Path) -> None:
    def loader(workers: int) -> fd.Loader:
        return fd.Loader(
            fd.Mix(make_mix_sources(data), batches="per_source", batch_size=4, seed=1),
            batch_size=4,
            num_workers=workers,
        )

    whole = batch_keys("mix", _at(loader(0), 1))
    stopped = _at(loader(2), 1)
    head = batch_keys("mix", stopped, 5)
    state = stopped.state_dict()
    stopped.close()
    resumed = loader(1)
    resumed.load_state_dict(state)
    assert head + batch_keys("mix", resumed) == whole
    resumed.close()


def test_a_mix_with_lanes_resumes_mid_epoch_with_any_num_workers(data: Path) -> None:
    # lanes decide the order (each worker's batches draw from blocks of their own), not the workers that read it:
    # 5 batches read by 2 workers, the rest after a resume by 1, give the batches one process reads
    def loader(workers: int, lanes: int = 2) -> fd.Loader:
        mix = fd.Mix(make_mix_sources(data), seed=1, lanes=lanes, batch_size=4)
        return fd.Loader(mix, batch_size=4, num_workers=workers)

    whole = batch_keys("mix", _at(loader(0), 1))
    plain = batch_keys("mix", _at(loader(0, lanes=1), 1))
    assert sorted(k for b in whole for k in b) == sorted(k for b in plain for k in b)  # the same samples
    stopped = _at(loader(2), 1)
    head = batch_keys("mix", stopped, 5)
    state = stopped.state_dict()
    stopped.close()
    resumed = loader(1)
    resumed.load_state_dict(state)
    assert head + batch_keys("mix", resumed) == whole
    resumed.close()
    with pytest.raises(ConfigError, match="lanes"):  # saved under other lanes: another order, refused
        loader(0, lanes=3).load_state_dict(state)


def _at(loader: fd.Loader, e: int) -> fd.Loader:
    loader.set_epoch(e)
    return loader


def test_a_worker_reads_its_next_batch_along_with_the_one_asked_for(data: Path) -> None:
    # each source is read once per two batches (its share of both at once), and the batches are the same
    mix = mix_of(data)
    calls = []
    for reader in mix._readers:
        read = reader.read
        reader.read = lambda draws, read=read: calls.append(len(draws)) or read(draws)  # type: ignore[method-assign]
    loader = fd.Loader(mix, batch_size=4, num_workers=0)
    got = epoch(loader, 0)
    assert got == epoch(fd.Loader(mix_of(data), batch_size=4, num_workers=0), 0)
    # batch 0 alone (no stride learnt yet), then pairs: 1+2, 3+4 ... and the 9th alone (no 10th to pair with)
    assert len(calls) == 2 * (1 + 4 + 1) and sum(calls) == 40


def test_read_ahead_stops_guessing_when_the_batches_do_not_follow_a_stride() -> None:
    from fastdata.datasets.mix._ahead import MISSES, ReadAhead

    ahead = ReadAhead()
    run = lambda first: np.arange(first, first + 4)  # noqa: E731
    assert ahead.plan(0, run(0), 100) is None  # nothing learnt yet
    nxt = ahead.plan(0, run(8), 100)  # a stride of 8
    assert nxt is not None and nxt.tolist() == [16, 17, 18, 19]
    ahead.hold(0, nxt, ["x"] * 4)
    assert ahead.take(0, run(16)) == ["x"] * 4
    for first in (40, 90):  # asked for others: each held batch dropped, then no more guesses this epoch
        nxt = ahead.plan(0, run(first - 8), 1000)
        assert nxt is not None and nxt[0] != first
        ahead.hold(0, nxt, ["y"] * 4)
        assert ahead.take(0, run(first)) is None
    assert ahead._misses == (0, MISSES)
    ahead.plan(0, run(0), 100)
    assert ahead.plan(0, run(8), 100) is None
    assert ahead.plan(1, run(0), 100) is None and ahead.plan(1, run(8), 100) is not None  # a new epoch
