"""How many cores and how much memory this process may really use (and how much memory is free).

``os.cpu_count()`` counts the machine's CPUs. A process may be confined to fewer: by CPU affinity
(``taskset``, Slurm, ``docker --cpuset-cpus``) and by a CFS quota in its cgroup (``docker --cpus``,
Kubernetes CPU limits), which throttles it to ``quota / period`` CPUs whatever the affinity says.
Memory is the same story: the cgroup's limit, not ``MemTotal``, decides when the OOM killer comes.

The cgroup files are read below a ``root`` folder (``/`` normally) so tests can point it at a fake
tree. Python's standard library reads none of this (``os.process_cpu_count`` in 3.13 knows affinity
only) and psutil reads no cgroup files, so it is written here. It sits in ``core`` because both the
benchmark harness (``fastdata bench``) and the library's autotuner (:mod:`fastdata.loading.observe.tune`)
read it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mount:
    """One cgroup hierarchy mounted in this process's mount namespace.

    Attributes:
        root (str): the part of the hierarchy that is mounted (``/`` or, in a container, its own group).
        point (str): where it is mounted (``/sys/fs/cgroup/cpu``).
        version (int): 1 or 2.
        controllers (frozenset[str]): the v1 controllers of the mount (empty for v2).
    """

    root: str
    point: str
    version: int
    controllers: frozenset[str]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def cgroup_mounts(root: str | os.PathLike[str] = "/") -> list[Mount]:
    """The cgroup mounts listed in ``ROOT/proc/self/mountinfo``."""
    text = _read(Path(root, "proc/self/mountinfo")) or ""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or not tail:
            continue
        fstype = tail[0]
        if fstype == "cgroup2":
            mounts.append(Mount(_unescape(fields[3]), _unescape(fields[4]), 2, frozenset()))
        elif fstype == "cgroup" and len(tail) >= 3:
            options = set(tail[2].split(","))
            mounts.append(Mount(_unescape(fields[3]), _unescape(fields[4]), 1, frozenset(options)))
    return mounts


def own_cgroups(root: str | os.PathLike[str] = "/") -> dict[str, str]:
    """This process's groups from ``ROOT/proc/self/cgroup``: ``{controller: path}``, ``""`` for v2."""
    text = _read(Path(root, "proc/self/cgroup")) or ""
    groups: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            groups[""] = path
        for c in controllers.split(","):
            if c:
                groups[c] = path
    return groups


def _group_dirs(mount: Mount, path: str, root: str | os.PathLike[str]) -> list[Path]:
    """The folders of this process's group and each ancestor up to the mount, deepest first.

    A limit set on any ancestor applies too, so each level is read and the tightest kept.
    """
    rel = path
    if mount.root != "/" and (rel == mount.root or rel.startswith(mount.root.rstrip("/") + "/")):
        rel = rel[len(mount.root) :]  # the container sees its own group as the mount's root
    elif mount.root != "/":
        rel = "/"  # a group outside the mounted part (nested namespaces): only the mount's root is visible
    parts = [p for p in rel.split("/") if p]
    base = Path(root, mount.point.lstrip("/"))
    return [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def cpu_quota(root: str | os.PathLike[str] = "/") -> float | None:
    """The CPUs the cgroup CFS quota allows (``quota / period``; 1.5 means one and a half), or None."""
    groups, best = own_cgroups(root), None
    for mount in cgroup_mounts(root):
        if mount.version == 2 and "" in groups:
            for folder in _group_dirs(mount, groups[""], root):
                text = _read(folder / "cpu.max")
                if text is None:
                    continue
                quota, _, period = text.partition(" ")
                if quota != "max" and period:
                    cpus = int(quota) / int(period)
                    best = cpus if best is None else min(best, cpus)
        elif mount.version == 1 and "cpu" in mount.controllers and "cpu" in groups:
            for folder in _group_dirs(mount, groups["cpu"], root):
                quota_s, period_s = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
                if quota_s is None or period_s is None or int(quota_s) <= 0 or int(period_s) <= 0:
                    continue
                cpus = int(quota_s) / int(period_s)
                best = cpus if best is None else min(best, cpus)
    return best


def memory_limit(root: str | os.PathLike[str] = "/") -> int | None:
    """The cgroup's memory limit in bytes (``memory.max`` or ``memory.limit_in_bytes``), or None."""
    groups, best = own_cgroups(root), None
    for mount in cgroup_mounts(root):
        if mount.version == 2 and "" in groups:
            names, key = ("memory.max",), ""
        elif mount.version == 1 and "memory" in mount.controllers and "memory" in groups:
            names, key = ("memory.limit_in_bytes",), "memory"
        else:
            continue
        for folder in _group_dirs(mount, groups[key], root):
            for name in names:
                text = _read(folder / name)
                # v1 says "no limit" with a huge page-rounded number; treat >= 2**60 as none
                if text and text != "max" and text.isdigit() and int(text) < 1 << 60:
                    best = int(text) if best is None else min(best, int(text))
    return best


def memory_used(root: str | os.PathLike[str] = "/") -> int | None:
    """Bytes the tightest limited cgroup holds now (``memory.current`` or ``memory.usage_in_bytes`` of the
    group whose limit :func:`memory_limit` reports), or None where no limit is set."""
    groups, best, used = own_cgroups(root), None, None
    for mount in cgroup_mounts(root):
        if mount.version == 2 and "" in groups:
            limit_name, use_name, key = "memory.max", "memory.current", ""
        elif mount.version == 1 and "memory" in mount.controllers and "memory" in groups:
            limit_name, use_name, key = "memory.limit_in_bytes", "memory.usage_in_bytes", "memory"
        else:
            continue
        for folder in _group_dirs(mount, groups[key], root):
            text, current = _read(folder / limit_name), _read(folder / use_name)
            limit = int(text) if text and text.isdigit() else None  # "max": no limit at this level
            if (
                limit is not None
                and limit < 1 << 60
                and current
                and current.isdigit()
                and (best is None or limit < best)
            ):
                best, used = limit, int(current)
    return used


def memory_available(root: str | os.PathLike[str] = "/") -> int:
    """Bytes that can still be allocated: the machine's available memory (``MemAvailable``), or less
    where the cgroup's limit is nearer."""
    import psutil

    free = int(psutil.virtual_memory().available)
    limit, used = memory_limit(root), memory_used(root)
    if limit is not None and used is not None:
        free = min(free, max(0, limit - used))
    return free


def affinity_cpus() -> int:
    """CPUs this process may run on (its affinity mask), or ``os.cpu_count()`` where there is none."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cores(root: str | os.PathLike[str] = "/", *, affinity: int | None = None) -> int:
    """Cores this process can keep busy: the smaller of its affinity and its cgroup quota (rounded up).

    Args:
        root (str): where to find ``proc`` and ``sys``. Defaults to ``/``.
        affinity (int | None): CPUs in the affinity mask. Defaults to :func:`affinity_cpus`.
    """
    cpus = affinity if affinity is not None else affinity_cpus()
    quota = cpu_quota(root)
    if quota is not None:
        # a quota of 1.5 CPUs still lets two processes run at once, each throttled: round up, as Go does
        cpus = min(cpus, max(1, math.ceil(quota - 1e-9)))
    return max(1, cpus)


def _cpu_list(text: str) -> set[int]:
    """``0-3,8,10-11`` as a set of CPU numbers."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def physical_cores(cpus: list[int] | None = None, root: str | os.PathLike[str] = "/") -> int:
    """Physical cores among ``cpus`` (default: the affinity mask): SMT siblings (hyperthreads of one core,
    ``ROOT/sys/devices/system/cpu/cpuN/topology/thread_siblings_list``) counted once. Where the topology
    cannot be read, every CPU counts as a core."""
    if cpus is None:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = list(range(os.cpu_count() or 1))
    groups: set[frozenset[int]] = set()
    for cpu in cpus:
        text = _read(Path(root, f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"))
        try:
            siblings = _cpu_list(text) if text else {cpu}
        except ValueError:
            siblings = {cpu}
        groups.add(frozenset(siblings & set(cpus)) or frozenset({cpu}))
    return max(1, len(groups))


def usable_physical_cores(root: str | os.PathLike[str] = "/", *, cpus: list[int] | None = None) -> int:
    """Physical cores this process can keep busy: SMT siblings counted once, within the cgroup quota."""
    cores = physical_cores(cpus, root)
    quota = cpu_quota(root)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota - 1e-9)))
    return cores


def usable_memory(root: str | os.PathLike[str] = "/") -> int:
    """Bytes of memory this process's group may use: the cgroup limit or the machine's RAM."""
    import psutil

    total = int(psutil.virtual_memory().total)
    limit = memory_limit(root)
    return min(total, limit) if limit is not None else total


__all__ = [
    "Mount",
    "affinity_cpus",
    "cgroup_mounts",
    "cpu_quota",
    "memory_available",
    "memory_limit",
    "memory_used",
    "own_cgroups",
    "physical_cores",
    "usable_cores",
    "usable_memory",
    "usable_physical_cores",
]
