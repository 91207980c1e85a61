"""EpochSampler (fastdata.loading.sampler): follows the epoch, per rank, resumable for one pass."""

from __future__ import annotations

import pytest

import fastdata as fd
from fastdata.core.errors import ConfigError


def test_epoch_sampler_follows_epoch_and_resumes() -> None:
    sampler = fd.EpochSampler(10, shuffle=True, seed=1, rank=1, world_size=3)
    assert len(sampler) == 3
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert first != second
    state = sampler.state_dict(consumed=2)
    resumed = fd.EpochSampler(10, shuffle=True, seed=1, rank=1, world_size=3)
    resumed.load_state_dict(state)
    assert list(resumed) == second[2:]
    assert list(resumed) == second, "resuming applies to one pass only"
    with pytest.raises(ConfigError, match="outside"):
        resumed.load_state_dict({"epoch": 0, "consumed": 4})
