"""Workers' random streams with ``fd.worker_init_fn`` under torch's ``DistributedSampler`` (rank and world
size given, no process group), for every backend, persistent and not, fork and spawn: a transform records
``random``, ``numpy`` and ``torch`` draws per sample. Calling only ``sampler.set_epoch`` (what DDP tutorials
do) gives new draws every epoch; setting the dataset's epoch too, with the DataLoader's generator fixed,
gives the same draws in a fresh run (also when a persistent worker reaches that epoch as its third pass).
The iterable ``TarShardDataset`` has no sampler: it is tested with its own epoch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

import fastdata as fd
from tests.datagen import make_shards
from tests.hdf5_datagen import make_h5
from tests.s3_server import MotoServer, upload_files
from tests.videogen import make_videos
from tests.worker_probe import Draws, as_list, draw

# passes of one run: (the dataset's epoch to set, or None: leave it; the sampler's epoch)
ONLY_SAMPLER = [(None, 0), (None, 1), (2, 2)]
DATASET_EPOCH = [(2, 2)]


def run(
    make: Callable[[], Any], passes: list[tuple[int | None, int]], *, persistent: bool, context: str
) -> list[list[Draws]]:
    """The draws of each pass, in the order the loader hands the samples out."""
    ds = make()
    generator = torch.Generator()
    generator.manual_seed(1234)
    iterable = isinstance(ds, IterableDataset)
    sampler = None if iterable else DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True, seed=0)
    loader = DataLoader(
        ds,
        batch_size=None if iterable else 2,
        sampler=sampler,
        collate_fn=fd.as_is if iterable else as_list,
        num_workers=2,
        persistent_workers=persistent,
        multiprocessing_context=context,
        worker_init_fn=fd.worker_init_fn,
        generator=generator,
    )
    out = []
    try:
        for ds_epoch, sampler_epoch in passes:
            if sampler is not None:
                sampler.set_epoch(sampler_epoch)
            if ds_epoch is not None:
                ds.set_epoch(ds_epoch)
            out.append([d for batch in loader for d in batch])
    finally:
        del loader
        ds.close()
    return out


def check(make: Callable[[], Any], context: str) -> None:
    """Persistent and not: new draws each pass when only the sampler's epoch moves; the draws of a pass
    whose epoch is set are those of a fresh run's first pass at that epoch (one run, non-persistent)."""
    (again,) = run(make, DATASET_EPOCH, persistent=False, context=context)
    for persistent in (False, True):
        first, second, epoch_set = run(make, ONLY_SAMPLER, persistent=persistent, context=context)
        assert len(first) == len(second) > 0
        assert not set(first) & set(second), "only sampler.set_epoch called: the workers' streams must not repeat"
        assert len(set(first)) == len(first), "every worker has a stream of its own"
        assert epoch_set == again, f"epoch set, generator fixed: the draws of a fresh run (persistent={persistent})"


# spawn for one map-style and the iterable backend: every backend keeps its pass log in the same shared
# state (fastdata.datasets._base), pickled into spawned workers alike; a spawned worker costs seconds here
EVERY = pytest.mark.parametrize("context", ["fork"])
BOTH = pytest.mark.parametrize("context", ["fork", "spawn"])


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("shards"), shards=2, per_shard=4, seed=3)


@BOTH
def test_indexed_tar(shards: list[str], context: str) -> None:
    check(lambda: fd.IndexedTarDataset(shards, transform=draw), context)


@BOTH
def test_tar_shards_with_its_own_epoch(shards: list[str], context: str) -> None:
    def make() -> fd.TarShardDataset:
        return fd.TarShardDataset(
            shards, shuffle=True, shuffle_window=4, batch_size=2, collate_fn=as_list, transform=draw
        )

    check(make, context)


@EVERY
def test_hdf5(tmp_path_factory: pytest.TempPathFactory, context: str) -> None:
    path = tmp_path_factory.mktemp("h5") / "data.h5"
    make_h5(path, 8, blob=False)
    check(lambda: fd.HDF5Dataset([str(path)], fields=("image", "label"), transform=draw), context)


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_videos(tmp_path_factory.mktemp("videos"), count=2, frames=12, seed=2)


@EVERY
def test_video(videos: list[str], tmp_path: Any, context: str) -> None:
    def make() -> fd.VideoClipDataset:
        return fd.VideoClipDataset(
            videos, clip_len=2, clips_per_video=4, transform=draw, index_cache=tmp_path / "index.json"
        )

    check(make, context)


@pytest.fixture(scope="module")
def objects(s3_server: MotoServer) -> str:
    client = s3_server.client()
    client.create_bucket(Bucket="seeding")
    upload_files(client, "seeding", {f"o/{i}.bin": bytes([i]) * 10 for i in range(8)})
    return "s3://seeding/o/"


@EVERY
def test_s3(objects: str, s3_options: dict[str, Any], context: str) -> None:
    check(lambda: fd.S3Dataset(objects, transform=draw, **s3_options), context)
