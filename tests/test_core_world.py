"""World (fastdata.core.epoch._world): rank and world size from the environment, checked."""

from __future__ import annotations

import pytest

from fastdata.core.epoch._world import World
from fastdata.core.errors import ConfigError


def test_world_detects_rank_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    world = World.detect(seed=1)
    assert (world.rank, world.world_size, world.worker, world.num_workers) == (2, 4, 0, 1)
    assert world.global_worker == 2 and world.total_workers == 4
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ConfigError, match="rank=4"):
        World.detect()
