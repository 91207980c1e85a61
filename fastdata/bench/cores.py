"""How many cores and how much memory this process may really use: :mod:`fastdata.core.machine`, where the
library's autotuner reads them too; the harness's names for them, kept here."""

from __future__ import annotations

from fastdata.core.machine import (
    Mount,
    affinity_cpus,
    cgroup_mounts,
    cpu_quota,
    memory_available,
    memory_limit,
    own_cgroups,
    physical_cores,
    usable_cores,
    usable_memory,
    usable_physical_cores,
)

__all__ = [
    "Mount",
    "affinity_cpus",
    "cgroup_mounts",
    "cpu_quota",
    "memory_available",
    "memory_limit",
    "own_cgroups",
    "physical_cores",
    "usable_cores",
    "usable_physical_cores",
    "usable_memory",
]
