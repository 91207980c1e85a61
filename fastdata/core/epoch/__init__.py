"""Epoch arithmetic, pure and shared by every dataset: who reads (:class:`World`: rank, world size, worker),
which samples each (rank, worker) reads (sharding), an epoch resumed on another number of ranks (elastic),
which source each position of a mixed epoch draws from (mixing), the one resume protocol, and seeding."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.core.epoch._elastic import Base, layout, rank_plan
    from fastdata.core.epoch._mixing import MixSequence, apportion
    from fastdata.core.epoch._protocol import Warmable, WorkerAware
    from fastdata.core.epoch._resume import (
        PLAN_KEYS,
        ResumeState,
        Stop,
        data_digest,
        digest,
        ints_digest,
        load_state,
        next_layout,
    )
    from fastdata.core.epoch._seeding import (
        RepeatedEpochWarning,
        WorkerInit,
        compose_worker_init,
        derive_seed,
        on_epoch,
        on_pass,
        pass_token,
        stagger,
        worker_init_fn,
    )
    from fastdata.core.epoch._sharding import (
        EXACT_ORDER_MAX,
        REMAINDERS,
        Remainder,
        WindowShuffle,
        epoch_order,
        locate,
        order_at,
        rank_index_blocks,
        rank_indices,
        rank_span,
        split_counts,
        worker_ranges,
    )
    from fastdata.core.epoch._world import (
        RankFollower,
        World,
        acting_as_worker,
        current_rank,
        current_worker,
        launch_rank,
        refuse_second_split,
        said_rank,
        worker_process,
    )

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "EXACT_ORDER_MAX",
    "PLAN_KEYS",
    "REMAINDERS",
    "Base",
    "MixSequence",
    "RankFollower",
    "Remainder",
    "RepeatedEpochWarning",
    "ResumeState",
    "Stop",
    "Warmable",
    "WindowShuffle",
    "WorkerAware",
    "WorkerInit",
    "World",
    "acting_as_worker",
    "apportion",
    "compose_worker_init",
    "current_rank",
    "current_worker",
    "data_digest",
    "derive_seed",
    "digest",
    "epoch_order",
    "ints_digest",
    "launch_rank",
    "layout",
    "load_state",
    "locate",
    "next_layout",
    "on_epoch",
    "on_pass",
    "order_at",
    "pass_token",
    "rank_index_blocks",
    "rank_indices",
    "rank_plan",
    "rank_span",
    "refuse_second_split",
    "said_rank",
    "split_counts",
    "stagger",
    "worker_init_fn",
    "worker_process",
    "worker_ranges",
]
