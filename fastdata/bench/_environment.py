"""The machine and library versions a sweep ran on, recorded in every result so runs can be compared."""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import os
import platform
from typing import Any

from fastdata.core.system import affinity_cpus, cpu_quota, usable_cores, usable_memory, usable_physical_cores
from fastdata.core.system import cpu_model as procfs_cpu_model

LIBRARIES = (
    "fastdata",
    "torch",
    "numpy",
    "psutil",
    "pillow",
    "webdataset",
    "h5py",
    "decord",
    "opencv-python-headless",
    "boto3",
    "matplotlib",
    "rich",
)


def versions() -> dict[str, str]:
    """Installed versions of fastdata and the libraries that shape its speed (absent ones left out)."""
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def cpu_model() -> str:
    return procfs_cpu_model() or platform.processor() or platform.machine()


def start_method() -> str:
    """The start method DataLoader workers get by default, read without fixing it (a bare
    ``multiprocessing.get_start_method()`` would set it, and a later ``set_start_method`` would fail)."""
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def describe() -> dict[str, Any]:
    """Cores (machine, affinity, quota, usable), memory, CPU model, OS, torch threads, library versions."""
    import torch

    return {
        "usable_cores": usable_cores(),
        "physical_cores": usable_physical_cores(),
        "cpu_count": os.cpu_count(),
        "affinity_cpus": affinity_cpus(),
        "cpu_quota": cpu_quota(),
        "usable_memory": usable_memory(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "start_method": start_method(),
        "cuda": torch.cuda.is_available(),
        "versions": versions(),
    }


__all__ = ["cpu_model", "describe", "start_method", "versions"]
