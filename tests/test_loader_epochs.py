"""``fd.Loader``'s epoch under every driver: the loop that calls ``loader.set_epoch``, the framework that
calls ``loader.sampler.set_epoch`` (Lightning, for iterable datasets too), and the loop that calls nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

import fastdata as fd
from tests.dist_backends import BACKENDS, batch_keys, make_loader


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in ("tar_shards", "hdf5"):
        out[name] = tmp_path_factory.mktemp(name)
        BACKENDS[name].prepare(out[name])
    return out


@pytest.mark.parametrize("name", ["tar_shards", "hdf5"])
def test_passes_nobody_set_the_epoch_for_read_the_next_epochs(folders: dict[str, Path], name: str) -> None:
    loader = make_loader(name, folders[name], num_workers=0, rank=0, world_size=1)
    first, second = batch_keys(name, loader), batch_keys(name, loader)
    assert loader.epoch == 1 and first != second
    assert sorted(k for b in first for k in b) == sorted(k for b in second for k in b)
    loader.set_epoch(1)  # set: the pass reads epoch 1 again, as asked
    assert batch_keys(name, loader) == second and loader.epoch == 1
    half = batch_keys(name, loader, 2)  # a pass left unfinished is no epoch read: the next pass restarts it
    assert loader.epoch == 2 and batch_keys(name, loader)[:2] == half
    loader.close()


@pytest.mark.parametrize("name", ["tar_shards", "hdf5"])
def test_loader_sampler_set_epoch_moves_the_loader(folders: dict[str, Path], name: str) -> None:
    loader = make_loader(name, folders[name], num_workers=0, rank=0, world_size=1)
    epochs = {}
    for epoch in (3, 4):
        loader.sampler.set_epoch(epoch)  # what Lightning calls
        assert loader.epoch == epoch
        epochs[epoch] = batch_keys(name, loader)
    reference = make_loader(name, folders[name], num_workers=0, rank=0, world_size=1)
    reference.set_epoch(4)
    assert epochs[3] != epochs[4] == batch_keys(name, reference)
    loader.close()
    reference.close()
    assert isinstance(loader, fd.Loader)
