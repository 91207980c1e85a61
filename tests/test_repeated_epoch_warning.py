"""The one-time warning for a pass that repeats an epoch already read while the dataset's own randomness
follows the epoch (TarShardDataset's shuffle, an EpochSampler's order, VideoClipDataset's random clip
starts), and its absence when the epoch is set or fd.Loader drives it. Warnings raised in forked workers
are printed there (the test lets them print) and read back from the captured stderr."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from torch.utils.data import DataLoader, DistributedSampler

import fastdata as fd
from fastdata.core.epoch._seeding import RepeatedEpochWarning
from tests.datagen import make_shards
from tests.videogen import make_videos
from tests.worker_probe import as_list, printing


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("shards"), shards=2, per_shard=6, seed=4)


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_videos(tmp_path_factory.mktemp("videos"), count=2, frames=12, seed=3)


def repeats(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RepeatedEpochWarning)]


def tar(shards: list[str], **options: Any) -> fd.TarShardDataset:
    return fd.TarShardDataset(shards, shuffle=True, shuffle_window=4, batch_size=3, **options)


def test_tar_shards_warn_once_naming_the_dataset_and_the_fix(shards: list[str]) -> None:
    ds = tar(shards)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = [list(b["__key__"]) for b in ds]
        assert not repeats(caught), "the first pass repeats nothing"
        assert [list(b["__key__"]) for b in ds] == first
        (message,) = repeats(caught)
        assert "TarShardDataset(" in message and "epoch 0" in message
        assert "set_epoch" in message and "fastdata.Loader" in message
        list(ds)
    assert len(repeats(caught)) == 1, "warned once per dataset"


def test_no_warning_when_the_epoch_is_set_through_the_loader_or_without_shuffle(shards: list[str]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = tar(shards)
        for epoch in (0, 0, 1):  # the same epoch set again: the user asks for the same pass
            ds.set_epoch(epoch)
            list(ds)
        loader = fd.Loader(tar(shards), num_workers=0)
        for _ in range(3):  # never set_epoch: the Loader sets it for every pass
            list(loader)
        indexed = fd.IndexedTarDataset(shards)
        for _ in range(2):
            list(fd.Loader(indexed, batch_size=4))
        unshuffled = fd.TarShardDataset(shards, batch_size=3)
        list(unshuffled)
        list(unshuffled)
    assert not repeats(caught)


def test_a_forked_worker_warns_once(shards: list[str], capfd: pytest.CaptureFixture[str]) -> None:
    for persistent in (False, True):
        ds = tar(shards)
        loader = DataLoader(
            ds,
            batch_size=None,
            collate_fn=fd.as_is,
            num_workers=2,
            multiprocessing_context="fork",
            persistent_workers=persistent,
            worker_init_fn=fd.worker_init_fn,
        )
        with printing():
            list(loader)
            assert "RepeatedEpochWarning" not in capfd.readouterr().err
            list(loader)
            list(loader)
        err = capfd.readouterr().err
        assert err.count("RepeatedEpochWarning") == 1, err
        assert "TarShardDataset(" in err


def test_epoch_sampler_warns_naming_the_dataset(shards: list[str]) -> None:
    ds = fd.IndexedTarDataset(shards)
    sampler = ds.sampler()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(sampler) == list(sampler)
    (message,) = repeats(caught)
    assert "EpochSampler of IndexedTarDataset(" in message and "set_epoch" in message


def video(videos: list[str], tmp_path: Any, **options: Any) -> fd.VideoClipDataset:
    return fd.VideoClipDataset(videos, clip_len=2, clips_per_video=3, index_cache=tmp_path / "index.json", **options)


@pytest.mark.parametrize("workers", ["none", "forked", "persistent"])
def test_video_with_distributed_sampler_warns_when_its_epoch_is_not_set(
    videos: list[str], tmp_path: Any, workers: str, capfd: pytest.CaptureFixture[str]
) -> None:
    ds = video(videos, tmp_path)
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=0)
    loader = DataLoader(
        ds,
        batch_size=2,
        sampler=sampler,
        collate_fn=as_list,
        num_workers=0 if workers == "none" else 2,
        multiprocessing_context=None if workers == "none" else "fork",
        persistent_workers=workers == "persistent",
        worker_init_fn=fd.worker_init_fn,
    )
    with printing():
        for epoch in range(4):  # what DDP tutorials do: only the sampler's epoch
            sampler.set_epoch(epoch)
            list(loader)
    err = capfd.readouterr().err
    # once per loader, not once per pass: two workers noticing at the very same instant may both warn
    # (SharedState.once is a check then a store, not an atomic exchange); without it every later read warns
    assert 1 <= err.count("RepeatedEpochWarning") <= (1 if workers == "none" else 2), err
    assert "VideoClipDataset(" in err and "clip starts" in err and "set_epoch" in err


def test_video_with_its_epoch_set_or_fixed_starts_does_not_warn(
    videos: list[str], tmp_path: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    with printing():
        for ds, set_epoch in (
            (video(videos, tmp_path), True),
            (video(videos, tmp_path, clip_sampling="uniform"), False),
        ):
            sampler = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True, seed=0)
            loader = DataLoader(ds, batch_size=2, sampler=sampler, collate_fn=as_list, num_workers=0)
            for epoch in range(3):
                sampler.set_epoch(epoch)
                if set_epoch:
                    ds.set_epoch(epoch)
                list(loader)
        loader = fd.Loader(video(videos, tmp_path), batch_size=2, collate_fn=as_list, num_workers=2)
        for _ in range(3):
            list(loader)
    assert "RepeatedEpochWarning" not in capfd.readouterr().err
