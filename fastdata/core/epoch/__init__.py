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
    from fastdata.core.epoch._resume import ResumeState, Stop, load_state, next_layout
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
    from fastdata.core.epoch._world import World, acting_as_worker, current_rank, current_worker, worker_process

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Base": "._elastic",
        "layout": "._elastic",
        "rank_plan": "._elastic",
        "MixSequence": "._mixing",
        "apportion": "._mixing",
        "Warmable": "._protocol",
        "WorkerAware": "._protocol",
        "ResumeState": "._resume",
        "Stop": "._resume",
        "load_state": "._resume",
        "next_layout": "._resume",
        "RepeatedEpochWarning": "._seeding",
        "WorkerInit": "._seeding",
        "compose_worker_init": "._seeding",
        "derive_seed": "._seeding",
        "on_epoch": "._seeding",
        "on_pass": "._seeding",
        "pass_token": "._seeding",
        "stagger": "._seeding",
        "worker_init_fn": "._seeding",
        "EXACT_ORDER_MAX": "._sharding",
        "REMAINDERS": "._sharding",
        "Remainder": "._sharding",
        "WindowShuffle": "._sharding",
        "epoch_order": "._sharding",
        "locate": "._sharding",
        "order_at": "._sharding",
        "rank_index_blocks": "._sharding",
        "rank_indices": "._sharding",
        "rank_span": "._sharding",
        "split_counts": "._sharding",
        "worker_ranges": "._sharding",
        "World": "._world",
        "acting_as_worker": "._world",
        "current_rank": "._world",
        "current_worker": "._world",
        "worker_process": "._world",
    },
)

__all__ = [
    "EXACT_ORDER_MAX",
    "REMAINDERS",
    "Base",
    "MixSequence",
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
    "derive_seed",
    "epoch_order",
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
    "split_counts",
    "stagger",
    "worker_init_fn",
    "worker_process",
    "worker_ranges",
]
