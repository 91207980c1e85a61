"""World (fastdata.core.epoch._world): rank and world size from the environment, checked."""

from __future__ import annotations

from pathlib import Path

import pytest

import fastdata as fd
from fastdata.core.epoch._world import World, launch_rank
from fastdata.core.errors import ConfigError
from tests.hdf5_datagen import make_files


def test_world_detects_rank_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    world = World.detect(seed=1)
    assert (world.rank, world.world_size, world.worker, world.num_workers) == (2, 4, 0, 1)
    assert world.global_worker == 2 and world.total_workers == 4
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ConfigError, match="rank=4"):
        World.detect()


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, (1, 2)),  # Lightning's ddp child before its process group
        ({"LOCAL_RANK": "1", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}, (3, 4)),
        ({"LOCAL_RANK": "0", "NODE_RANK": "1", "LOCAL_WORLD_SIZE": "3", "WORLD_SIZE": "6"}, (3, 6)),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, (5, 8)),
        ({"LOCAL_RANK": "0"}, None),
    ],
)
def test_the_rank_comes_from_whichever_launch_variables_are_set(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], said: tuple[int, int] | None
) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert launch_rank() == said


@pytest.mark.parametrize(
    "env",
    [
        {"RANK": "1"},
        {"LOCAL_RANK": "0", "NODE_RANK": "1", "WORLD_SIZE": "4"},
        {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"},
        {"SLURM_PROCID": "8", "SLURM_NTASKS": "8"},
    ],
)
def test_an_inconsistent_launch_environment_is_refused(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match="environment"):
        launch_rank()


def test_a_dataset_takes_the_rank_said_where_it_reads_and_refuses_a_change_after_reading(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    make_files(tmp_path, (5, 4))
    ds = fd.HDF5Dataset(sorted(str(p) for p in tmp_path.glob("*.h5")), ("key",))
    assert (ds.rank, ds.world_size) == (0, 1)  # built before the ranks exist
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    sampler = ds.sampler(shuffle=False)
    assert len(sampler) == 3 and list(sampler) == [3, 4, 5]  # rank 1 of 3, learned where it is iterated
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match="read as rank 1 of 3, but this process is rank 2 of 3"):
        list(sampler)
