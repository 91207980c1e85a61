"""Usable cores and memory: CPU affinity, and cgroup v1/v2 limits read from a fake root folder."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from fastdata.core.system import _machine as cores


def make_root(tmp_path: Path, *, cgroup: str, mountinfo: str, files: dict[str, str]) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    (tmp_path / "proc/self/mountinfo").write_text(mountinfo)
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_cgroup_v2_quota_rounds_up_and_the_tightest_ancestor_wins(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        cgroup="0::/job.slice/task\n",
        mountinfo=V2_MOUNT,
        files={
            "sys/fs/cgroup/job.slice/task/cpu.max": "150000 100000\n",
            "sys/fs/cgroup/job.slice/cpu.max": "max 100000\n",
            "sys/fs/cgroup/job.slice/task/memory.max": "max\n",
            "sys/fs/cgroup/job.slice/memory.max": "4294967296\n",
        },
    )
    assert cores.cpu_quota(root) == pytest.approx(1.5)
    assert cores.usable_cores(root, affinity=8) == 2  # 1.5 CPUs still run two processes at once
    assert cores.usable_cores(root, affinity=1) == 1  # affinity is tighter
    assert cores.memory_limit(root) == 4 << 30

    (root / "sys/fs/cgroup/job.slice/cpu.max").write_text("100000 100000\n")
    assert cores.usable_cores(root, affinity=8) == 1


def test_cgroup_v2_without_limits_leaves_the_affinity(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        cgroup="0::/\n",
        mountinfo=V2_MOUNT,
        files={"sys/fs/cgroup/cpu.max": "max 100000\n", "sys/fs/cgroup/memory.max": "max\n"},
    )
    assert cores.cpu_quota(root) is None
    assert cores.memory_limit(root) is None
    assert cores.usable_cores(root, affinity=6) == 6


def test_cgroup_v1_in_a_container_reads_its_own_group_at_the_mount_point(tmp_path: Path) -> None:
    # docker: /proc/self/cgroup names the host's path; the mount's root is that same group
    mountinfo = (
        "40 31 0:37 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
        "41 31 0:38 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"
    )
    root = make_root(
        tmp_path,
        cgroup="4:cpu,cpuacct:/docker/abc\n9:memory:/docker/abc\n",
        mountinfo=mountinfo,
        files={
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            "sys/fs/cgroup/memory/memory.limit_in_bytes": "2147483648\n",
        },
    )
    assert cores.cpu_quota(root) == pytest.approx(2.0)
    assert cores.usable_cores(root, affinity=16) == 2
    assert cores.memory_limit(root) == 2 << 30


def test_cgroup_v1_host_view_walks_up_to_the_mount(tmp_path: Path) -> None:
    mountinfo = (
        "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    )
    root = make_root(
        tmp_path,
        cgroup="1:cpu:/batch/job7\n4:memory:/batch/job7\n",
        mountinfo=mountinfo,
        files={
            "sys/fs/cgroup/cpu/batch/job7/cpu.cfs_quota_us": "-1\n",  # no quota on the job itself ...
            "sys/fs/cgroup/cpu/batch/job7/cpu.cfs_period_us": "100000\n",
            "sys/fs/cgroup/cpu/batch/cpu.cfs_quota_us": "300000\n",  # ... but its parent has one
            "sys/fs/cgroup/cpu/batch/cpu.cfs_period_us": "100000\n",
            # v1 says "no limit" with a huge page-rounded number
            "sys/fs/cgroup/memory/batch/job7/memory.limit_in_bytes": "9223372036854771712\n",
        },
    )
    assert cores.cpu_quota(root) == pytest.approx(3.0)
    assert cores.usable_cores(root, affinity=64) == 3
    assert cores.memory_limit(root) is None


def test_missing_proc_files_mean_no_limits(tmp_path: Path) -> None:
    assert cores.cpu_quota(tmp_path) is None
    assert cores.memory_limit(tmp_path) is None
    assert cores.usable_cores(tmp_path, affinity=3) == 3


def test_this_machine_never_reports_more_than_its_affinity_or_memory() -> None:
    import psutil

    assert 1 <= cores.usable_cores() <= len(os.sched_getaffinity(0))
    assert 0 < cores.usable_memory() <= psutil.virtual_memory().total


def _cores_with_affinity(cpu: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    os.sched_setaffinity(0, {cpu})
    out.put(cores.usable_cores())


def test_a_process_pinned_to_one_cpu_has_one_usable_core() -> None:
    ctx = multiprocessing.get_context("fork")  # cheap: the child needs no fresh interpreter
    out = ctx.Queue()
    proc = ctx.Process(target=_cores_with_affinity, args=(min(os.sched_getaffinity(0)), out))
    proc.start()
    try:
        assert out.get(timeout=60) == 1
    finally:
        proc.join(timeout=60)
    assert proc.exitcode == 0


def test_smt_siblings_count_once(tmp_path: Path) -> None:
    from fastdata.core.system._machine import physical_cores

    # 8 CPUs: 4 cores with two hyperthreads each (cpu k and k+4 share a core)
    for cpu in range(8):
        topo = tmp_path / f"sys/devices/system/cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        topo.joinpath("thread_siblings_list").write_text(f"{cpu % 4},{cpu % 4 + 4}\n")
    assert physical_cores(list(range(8)), tmp_path) == 4
    assert physical_cores([0, 4], tmp_path) == 1  # one core's two hyperthreads
    assert physical_cores([0, 1, 2], tmp_path) == 3
    topo = tmp_path / "sys/devices/system/cpu/cpu9/topology"
    assert physical_cores([9], tmp_path) == 1  # no topology: each CPU is a core
    assert not topo.exists()
