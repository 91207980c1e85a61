"""The one DataLoader builder (``fastdata/loading/_builder.py``) and the declared dataset protocols
(``fastdata/loading/_protocol.py``): every fastdata dataset and sampler offers its protocol; the builder
reads each kind the fastdata way; ``fd.Loader`` and the harness get the same DataLoader from it."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import RandomSampler, default_convert

import fastdata as fd
from fastdata.bench._loop import make_loader
from fastdata.bench._probes import ProbedCollate
from fastdata.bench._result import Config
from fastdata.core.epoch._protocol import Warmable, WorkerAware
from fastdata.core.epoch._seeding import WorkerInit
from fastdata.core.errors import ConfigError
from fastdata.loading import EpochSampler
from fastdata.loading._builder import build_dataloader
from fastdata.loading._chunk_sampler import ChunkBatchSampler
from fastdata.loading._plan import ReadPlan
from fastdata.loading._protocol import (
    BatchingDataset,
    Collating,
    Dataset,
    MapDataset,
    RankSampler,
    Resumable,
    ResumableBatchSampler,
    ResumableSampler,
)
from fastdata.loading.observe.measure import ProbeInit, StageTable
from fastdata.loading.transport._collate import SlotCollate, checked_default_collate
from fastdata.loading.transport._collate import batch_as_is as as_is
from fastdata.loading.transport._samples import PlainBatches
from tests.datagen import make_shards
from tests.hdf5_datagen import make_files


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("tar"), shards=2, per_shard=10)


@pytest.fixture(scope="module")
def h5(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    paths, _ = make_files(tmp_path_factory.mktemp("h5"), (11, 13, 9))
    return paths


class Plain(TorchDataset[int]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        return i


def test_every_dataset_and_sampler_offers_its_protocol(shards: list[str], h5: list[str]) -> None:
    tar = fd.TarShardDataset(shards, batch_size=4)
    indexed = fd.IndexedTarDataset(shards)
    hdf5 = fd.HDF5Dataset(h5, ("image", "key"))
    for ds in (tar, indexed, hdf5):
        assert isinstance(ds, Dataset) and isinstance(ds, WorkerAware), type(ds).__name__
    assert isinstance(tar, BatchingDataset) and not isinstance(tar, MapDataset)
    for ds in (indexed, hdf5):
        assert isinstance(ds, MapDataset) and isinstance(ds, Warmable) and not isinstance(ds, BatchingDataset)
    assert isinstance(hdf5, Collating) and not isinstance(indexed, Collating)
    sampler, chunks = hdf5.sampler(), hdf5.chunk_sampler(4)
    assert isinstance(sampler, ResumableSampler) and isinstance(sampler, RankSampler)
    assert isinstance(chunks, ResumableBatchSampler) and not isinstance(sampler, ResumableBatchSampler)
    assert isinstance(fd.Loader(tar), Resumable)
    plain = Plain()
    assert not isinstance(plain, Dataset) and not isinstance(plain, WorkerAware)


def test_a_dataset_that_batches_itself_is_read_unbatched_as_is(shards: list[str]) -> None:
    ds = fd.TarShardDataset(shards, batch_size=4)
    for batch_size in (None, 4):
        dl = build_dataloader(ds, ReadPlan(batch_size=batch_size))
        assert dl.batch_size is None and dl.collate_fn is as_is
    assert len(next(iter(dl))["__key__"]) == 4
    with pytest.raises(ConfigError, match=r"batch_size=5 differs from TarShardDataset\(batch_size=4\)"):
        build_dataloader(ds, ReadPlan(batch_size=5))
    with pytest.raises(ConfigError, match="pass no sampler"):
        build_dataloader(ds, ReadPlan(sampler=[0]))
    per_sample = build_dataloader(fd.TarShardDataset(shards), ReadPlan(batch_size=4))  # the DataLoader batches
    assert per_sample.batch_size == 4 and per_sample.collate_fn is checked_default_collate


def test_a_map_style_dataset_reads_through_its_sampler_and_collate(h5: list[str]) -> None:
    ds = fd.HDF5Dataset(h5, ("image", "key"), seed=3)
    dl = build_dataloader(ds, ReadPlan(batch_size=4, shuffle=True, remainder="pad"))
    assert isinstance(dl.sampler, EpochSampler) and dl.sampler.remainder == "pad"
    assert dl.collate_fn == ds.collate
    ds.set_epoch(2)
    assert dl.sampler.epoch == 2  # the sampler follows the dataset's epoch
    batched = build_dataloader(ds, ReadPlan(batch_sampler=ds.chunk_sampler(4)))
    assert isinstance(batched.batch_sampler, ChunkBatchSampler) and batched.collate_fn == ds.collate
    with pytest.raises(ConfigError, match="batch_sampler decides the batches"):
        build_dataloader(ds, ReadPlan(batch_size=4, batch_sampler=ds.chunk_sampler(4)))
    plain = build_dataloader(Plain(), ReadPlan(batch_size=2))  # not a fastdata dataset: torch shuffles it
    assert isinstance(plain.sampler, RandomSampler) and plain.collate_fn is checked_default_collate
    assert build_dataloader(Plain()).collate_fn is default_convert


def test_worker_init_start_method_and_hooks() -> None:
    def mine(worker_id: int) -> None:
        pass

    seen: list[Any] = []

    def wrap_collate(collate: Any, batched: bool) -> Any:
        seen.append((collate, batched))
        return collate

    dl = build_dataloader(
        Plain(),
        ReadPlan(batch_size=2),
        num_workers=2,
        worker_init_fn=mine,
        multiprocessing_context="spawn",
        wrap_collate=wrap_collate,
        wrap_worker_init=lambda init: ("wrapped", init),
    )
    kind, init = dl.worker_init_fn
    assert kind == "wrapped" and isinstance(init, WorkerInit) and init.then == (mine,)
    # the stock way hands batches on as plain dicts (PlainBatches), inside whatever wraps the collate
    ((collate, batched),) = seen
    assert isinstance(collate, PlainBatches) and collate.collate_fn is checked_default_collate and batched
    assert dl.multiprocessing_context is multiprocessing.get_context("spawn")
    # no workers, no start method (torch refuses one there)
    assert build_dataloader(Plain(), multiprocessing_context="spawn").multiprocessing_context is None


def test_the_loader_and_the_harness_build_the_same_dataloader(h5: list[str]) -> None:
    ds = fd.HDF5Dataset(h5, ("image", "key"), seed=3)
    ours = fd.Loader(ds, batch_size=4, num_workers=2, transport="stock").dataloader
    bench = make_loader(ds, Config(2, 2, False, False, 4))
    for dl in (ours, bench):
        # the stock way hands the batches on as plain dicts (PlainBatches): the dataset's collate inside
        stock = dl.collate_fn
        assert isinstance(stock, PlainBatches) and stock.collate_fn == ds.collate
        assert isinstance(dl.sampler, EpochSampler) and dl.batch_size == 4
        assert isinstance(dl.worker_init_fn, WorkerInit)
    # the Loader's default transport: the same collate function, inside reused slots
    slotted = fd.Loader(ds, batch_size=4, num_workers=2).dataloader.collate_fn
    assert isinstance(slotted, SlotCollate) and slotted.collate_fn == ds.collate
    # probed: the harness's probes wrap what the builder chose
    probed = make_loader(ds, Config(2, 2, False, False, 4), table=StageTable(3))
    assert isinstance(probed.collate_fn, ProbedCollate) and probed.collate_fn.collate_fn == PlainBatches(ds.collate)
    assert isinstance(probed.worker_init_fn, ProbeInit) and isinstance(probed.worker_init_fn.then, WorkerInit)


def test_probed_loader_reads_the_same_batches(h5: list[str]) -> None:
    ds = fd.HDF5Dataset(h5, ("image", "key"), seed=3)
    plain = [b["key"].tolist() for b in make_loader(ds, Config(0, None, False, False, 4))]
    probed = [p.batch["key"].tolist() for p in make_loader(ds, Config(0, None, False, False, 4), table=StageTable(1))]
    assert plain == probed and sorted(k for b in plain for k in b) == list(range(33))


def test_the_hybrid_reads_a_plain_torch_dataset() -> None:
    """threads_per_worker over a torch Dataset that is not fastdata's (no worker_world): every item once,
    in the DataLoader's order (before, fastdata's worker_init_fn asked the wrapper for a world it lacked)."""
    from fastdata.bench._synthetic import CheapDataset
    from fastdata.loading.threads._hybrid import ThreadedMap, ThreadedPlainMap, threaded

    ds = CheapDataset(n=48)
    assert isinstance(threaded(ds, 2), ThreadedPlainMap) and not isinstance(threaded(ds, 2), ThreadedMap)
    loader = build_dataloader(ds, ReadPlan(batch_size=4, shuffle=False), num_workers=2, threads_per_worker=2)
    items = [int(x) for batch in loader for x in batch]
    assert items == list(range(48))
