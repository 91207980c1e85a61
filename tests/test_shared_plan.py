"""SharedPlan: one epoch's order, published once by a sampler, looked up by the workers; never used for
another epoch or for a batch that is not a run of it."""

from __future__ import annotations

import pickle

import numpy as np
import torch

from fastdata.core.process._shared import SharedPlan, SharedState
from fastdata.loading._sampler import EpochSampler


def test_following_runs_come_from_the_published_order() -> None:
    plan = SharedPlan(10)
    order = np.array([7, 3, 9, 0, 1, 8, 2, 6, 5, 4])
    assert plan.epoch == -1 and plan.following(0, [7, 3], 2, 2) == []  # nothing published yet
    plan.publish(0, order)
    assert plan.epoch == 0
    # a worker given [7, 3], dealt every other batch of 2: its next two batches start 4 and 8 further on
    assert plan.following(0, [7, 3], 4, 2) == [1, 8, 5, 4]
    assert plan.following(0, [9, 0], 2, 3) == [1, 8, 2, 6, 5, 4]
    assert plan.following(0, [2, 6], 4, 2) == []  # past the end: cut short
    assert plan.following(0, [8, 2], 4, 1) == [4]  # the last, shorter run


def test_another_epoch_or_another_order_is_never_guessed_for() -> None:
    plan = SharedPlan(10)
    plan.publish(3, np.arange(10))
    assert plan.following(2, [0, 1], 2, 1) == []  # a stale plan for the epoch the worker reads
    assert plan.following(3, [0, 2], 2, 1) == []  # not a run of the order (another sampler)
    assert plan.following(3, [0, 1], 2, 1) == [2, 3]
    plan.publish(4, np.arange(10)[::-1])
    assert plan.following(3, [0, 1], 2, 1) == [] and plan.following(4, [9, 8], 2, 1) == [7, 6]


def test_one_small_shared_tensor_that_workers_see_written_later() -> None:
    plan = SharedPlan(1000)
    assert plan._tensor.dtype == torch.int32 and plan._tensor.is_shared()
    assert plan._tensor.numel() == 3 + 2 * 1000  # stamp, order, positions: nothing else
    # how a DataLoader sends it to a spawn worker: the same memory, so a later publish reaches the worker
    from multiprocessing.reduction import ForkingPickler

    worker_copy = pickle.loads(ForkingPickler.dumps(plan))
    plan.publish(1, np.arange(999, -1, -1))
    assert worker_copy.following(1, [999, 998], 2, 1) == [997, 996]


def test_an_epoch_sampler_publishes_each_iteration_s_whole_order() -> None:
    shared = SharedState(())
    plan = SharedPlan(20)
    sampler = EpochSampler(20, shuffle=True, seed=5, rank=1, world_size=2, shared=shared, publish=plan.publish)
    first = list(sampler)
    assert plan.epoch == 0 and plan.following(0, first[:2], 2, 4) == first[2:10]
    shared.epoch = 1
    sampler.load_state_dict({**sampler.state_dict(consumed=4), "epoch": 1})  # a resumed epoch still publishes all of it
    rest = list(sampler)
    assert (
        plan.epoch == 1 and plan.following(1, sampler.indices()[:2].tolist(), 2, 1) == sampler.indices()[2:4].tolist()
    )
    assert rest == sampler.indices()[4:].tolist()
