"""EpochSampler (fastdata.loading._sampler): follows the epoch, per rank, resumable for one pass."""

from __future__ import annotations

import pytest

from fastdata.core.errors import ConfigError
from fastdata.loading import EpochSampler


def test_epoch_sampler_follows_epoch_and_resumes() -> None:
    sampler = EpochSampler(10, shuffle=True, seed=1, rank=1, world_size=3)
    assert len(sampler) == 3
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert first != second
    state = sampler.state_dict(consumed=2)
    resumed = EpochSampler(10, shuffle=True, seed=1, rank=1, world_size=3)
    resumed.load_state_dict(state)
    assert list(resumed) == second[2:]
    assert list(resumed) == second, "resuming applies to one pass only"
    with pytest.raises(ConfigError, match="outside"):
        resumed.load_state_dict({**state, "epoch": 0, "position": 4})
