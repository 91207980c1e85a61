"""What the monitor's figures mean: cores *used* (CPU time over wall time of the loader's threads, never
above the machine) apart from cores *wanted* (running or waiting for a core), known from the dataset's own
work; and ``Stats`` as a table and a dict, in words checked here (plurals, defaults shown as values)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import torch
from torch.utils.data import Dataset

import fastdata as fd

SECONDS = 0.6  # of work per pass; the bounds below hold on a busy 2-core machine


class Sleeps(Dataset):  # type: ignore[type-arg]
    """Sleeps ~all of its time: uses ~0 cores."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> Any:
        time.sleep(SECONDS / 30)
        return torch.tensor(i)


class Spins(Dataset):  # type: ignore[type-arg]
    """Spins one thread: uses at most 1 core, and wants about 1 (running or waiting for a core)."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> Any:
        end = time.thread_time() + SECONDS / 30  # CPU time, so a busy machine lengthens it, never shortens it
        while time.thread_time() < end:
            pass
        return torch.tensor(i)


class OwnThread(Sleeps):
    """Sleeps in ``__getitem__`` while a decode thread of its own spins in the process that reads it."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __getitem__(self, i: int) -> Any:
        if self.thread is None:
            self.thread = threading.Thread(target=self._spin, name="own-decoder", daemon=True)
            self.thread.start()
        return super().__getitem__(i)

    def _spin(self) -> None:
        while not self.stop.is_set():
            pass


def _stats(ds: Any, workers: int) -> Any:
    with fd.Loader(ds, batch_size=3, num_workers=workers, monitor=True, multiprocessing_context="fork") as loader:
        for _ in loader:
            pass
        stats = loader.stats(since="start")
    assert stats is not None
    return stats


def test_a_sleeping_dataset_uses_almost_no_core() -> None:
    for workers in (0, 1):
        stats = _stats(Sleeps(), workers)
        assert stats.cores_used < 0.3, str(stats)
        assert stats.cores_wanted < 0.3, str(stats)


def test_a_spinning_dataset_uses_at_most_one_core_and_wants_about_one() -> None:
    for workers in (0, 1):
        stats = _stats(Spins(), workers)
        # one spinning thread is always running or runnable, and never on two cores at once; the loader's
        # other threads (main receiving, a worker's helpers) add a little
        assert stats.cores_wanted > 0.7, str(stats)
        assert stats.cores_used <= min(1.3, stats.usable_cores), str(stats)


def test_a_thread_the_dataset_owns_is_counted_where_it_runs() -> None:
    ds = OwnThread()
    try:
        stats = _stats(ds, 0)
    finally:
        ds.stop.set()
    # its thread in the main process is the loader's work: always running or runnable, on one core at most
    # (the dataset's own sleeps alone use ~0: test_a_sleeping_dataset_uses_almost_no_core)
    assert stats.cores_wanted > 0.7, str(stats)
    assert 0.2 < stats.cores_used <= min(1.3, stats.usable_cores), str(stats)
    assert stats.cores_wanted >= stats.cores_used


def test_stats_prints_a_short_table_and_gives_a_dict() -> None:
    stats = _stats(Sleeps(), 1)
    text = str(stats)
    lines = text.splitlines()
    assert lines[0].startswith("fastdata loader, epoch 0 batch 10") and len(lines) <= 12
    assert "1 worker, prefetch 2 (default)" in text and "1 workers" not in text and "None" not in text
    assert "10 batches in" in text and f"of {stats.usable_cores} core" in text
    assert "1 worker, prefetch 2 (default)" in stats.line()
    data = stats.to_dict()
    assert data["cores_used"] == stats.cores_used and data["setting"] == "1 worker, prefetch 2 (default)"
    assert json.loads(json.dumps(data))["batches"] == 10
