"""What every other part of fastdata stands on, imported by none of them in reverse: the error tree
(:mod:`fastdata.core.errors`), the world (rank, world size, worker), sharding plans, per-process handles,
shared state, seeding and ``worker_init_fn``, stage timing (:mod:`fastdata.core.stages`, the hook a
dataset calls), the resume protocol, and the one reader of ``/proc`` (``_proc``).

``errors`` and ``stages`` are public modules; the rest is private, its public names listed here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.core._cache_dir import default_cache_dir
    from fastdata.core._digest import DIGESTS, FAST, DigestName, digest_of, entry_digest, new_digest
    from fastdata.core._lazy import lazy_exports
    from fastdata.core._pipeline import SKIP, SamplePipeline, describe_sample
    from fastdata.core._progress import Bar, progress_bar, tracked
    from fastdata.core._version import __version__
    from fastdata.core.epoch._resume import ResumeState
    from fastdata.core.epoch._seeding import RepeatedEpochWarning, WorkerInit, compose_worker_init, worker_init_fn
    from fastdata.core.epoch._world import World
    from fastdata.core.system._machine import usable_cores, usable_memory

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "DIGESTS",
    "FAST",
    "SKIP",
    "Bar",
    "DigestName",
    "RepeatedEpochWarning",
    "ResumeState",
    "SamplePipeline",
    "WorkerInit",
    "World",
    "__version__",
    "compose_worker_init",
    "default_cache_dir",
    "describe_sample",
    "digest_of",
    "entry_digest",
    "lazy_exports",
    "new_digest",
    "progress_bar",
    "tracked",
    "usable_cores",
    "usable_memory",
    "worker_init_fn",
]
