"""Process plumbing: which process this is and what runs around a fork (``_pid``), per-process handles
(``_handles``), the state a dataset shares with its workers (``_shared``) and reused batch buffers
(``_bufferpool``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.core.process._bufferpool import BufferPool
    from fastdata.core.process._handles import HandleCache, ProcessLocal
    from fastdata.core.process._pid import abandon, at_fork, forked, pid
    from fastdata.core.process._shared import (
        DATASET_LOG,
        EGRESS_FLAG,
        REPEAT_FLAG,
        SAMPLER_LOG,
        SAMPLER_REPEAT_FLAG,
        SUBSTITUTE_FLAG,
        SharedEpoch,
        SharedPlan,
        SharedState,
    )

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "DATASET_LOG",
    "EGRESS_FLAG",
    "REPEAT_FLAG",
    "SAMPLER_LOG",
    "SAMPLER_REPEAT_FLAG",
    "SUBSTITUTE_FLAG",
    "BufferPool",
    "HandleCache",
    "ProcessLocal",
    "SharedEpoch",
    "SharedPlan",
    "SharedState",
    "abandon",
    "at_fork",
    "forked",
    "pid",
]
