"""The conformance suite every fastdata backend passes: one contract, the same test for every backend.

A backend's test module subclasses :class:`Conformance` and provides a ``backend`` fixture returning a
:class:`Backend`. The suite then checks, through real DataLoader worker processes under ``fork`` and
``spawn``: every sample exactly once for ``num_workers`` in {0, 2, 3} (2 under spawn); the same order for
the same seed and epoch and a new order for a new epoch; no handle left open after iteration (or after ``close()``);
and that a dataset touched in the parent before the workers start is still read correctly. Every way of
reading (:data:`MODES`: the stock transport, reused slots, loader threads, worker processes with threads)
gives every sample exactly once, in the order of ``num_workers=0``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from torch.utils.data import DataLoader, IterableDataset

from fastdata.core.process._handles import open_files
from fastdata.loading import transport as slots
from fastdata.loading._builder import build_dataloader
from fastdata.loading._plan import ReadPlan
from fastdata.loading.threads._loader import ThreadLoader

MODES = ("stock", "slots", "threads", "hybrid")
"""How the suite reads: worker processes with the stock transport or with reused slots, loader threads in
this process, or worker processes that each read in two threads."""


@dataclass
class Backend:
    """How the suite drives one backend.

    Attributes:
        make: builds a dataset; called with keyword arguments ``seed`` and ``shuffle``.
        expected: the identities of every sample in the data.
        keys_of: identities of the samples in one batch from the DataLoader.
        iterable: True for an IterableDataset (batched by the dataset: ``batch_size``), False for
            map-style (batched by the DataLoader through ``dataset.sampler()``); checked against the
            dataset, since the builder decides by the dataset itself.
        batch_size: the batch size to use.
    """

    make: Callable[..., Any]
    expected: list[Any]
    keys_of: Callable[[Any], list[Any]]
    iterable: bool
    batch_size: int = 4


def loader(
    backend: Backend, ds: Any, num_workers: int, context: str | None = None, mode: str = "stock"
) -> DataLoader | ThreadLoader:
    """The DataLoader fastdata builds for ``ds`` (the one :class:`fastdata.Loader` and the harness use), or
    the ThreadLoader with ``mode="threads"``."""
    assert isinstance(ds, IterableDataset) == backend.iterable, "Backend.iterable does not match the dataset"
    if mode == "threads":
        return ThreadLoader(
            ds, ReadPlan(batch_size=backend.batch_size, shuffle=ds_shuffle(ds)), num_threads=num_workers
        )
    return build_dataloader(
        ds,
        ReadPlan(batch_size=backend.batch_size, shuffle=ds_shuffle(ds)),
        num_workers=num_workers,
        multiprocessing_context=context,
        transport="slots" if mode == "slots" else "stock",
        threads_per_worker=2 if mode == "hybrid" else 1,
    )


def ds_shuffle(ds: Any) -> bool:
    return bool(getattr(ds, "_conformance_shuffle", False))


def make(backend: Backend, *, seed: int = 0, shuffle: bool = False) -> Any:
    ds = backend.make(seed=seed, shuffle=shuffle)
    ds._conformance_shuffle = shuffle
    return ds


def read_order(
    backend: Backend, ds: Any, num_workers: int = 0, context: str | None = None, mode: str = "stock"
) -> list[Any]:
    keys: list[Any] = []
    source = loader(backend, ds, num_workers, context, mode)
    try:
        for batch in source:
            keys.extend(backend.keys_of(batch))
    finally:
        if isinstance(source, ThreadLoader):
            source.close()
    return keys


class Conformance:
    """Subclass in a backend's tests and define the ``backend`` fixture."""

    # without workers the start method does not matter: read once in the main process. spawn once: what it
    # adds (the dataset pickled into fresh workers) does not depend on their number, which the fork cases
    # vary; each spawned worker imports torch anew (seconds: a 3-worker spawn case cost ~5 s a backend)
    @pytest.mark.parametrize(("num_workers", "context"), [(0, "fork"), (2, "fork"), (3, "fork"), (2, "spawn")])
    def test_every_sample_exactly_once(self, backend: Backend, num_workers: int, context: str) -> None:
        ds = make(backend, shuffle=True)
        keys = read_order(backend, ds, num_workers, context)
        counts = Counter(keys)
        assert not [k for k, c in counts.items() if c > 1], "samples read twice"
        assert sorted(counts) == sorted(backend.expected), "samples missing or unexpected"

    @pytest.mark.parametrize("mode", MODES[1:])
    def test_every_mode_reads_each_sample_once_in_order(self, backend: Backend, mode: str) -> None:
        ds = make(backend, seed=5, shuffle=True)
        want = read_order(backend, ds, 0)
        slots.reset_counts()
        # 3 workers (or threads), 2 for the hybrid (x 2 threads each): more readers than the 3 shards
        got = read_order(backend, ds, 2 if mode == "hybrid" else 3, "fork", mode)
        assert got == want, f"{mode}: another order, or samples missing or repeated"
        if mode == "slots":
            assert slots.stats()["slots"] > 0, "no batch came through a slot"

    def test_same_seed_and_epoch_same_order_new_epoch_new_order(self, backend: Backend) -> None:
        a, b = make(backend, seed=7, shuffle=True), make(backend, seed=7, shuffle=True)
        first = read_order(backend, a, num_workers=2, context="fork")
        assert read_order(backend, b, num_workers=2, context="fork") == first
        a.set_epoch(1)
        second = read_order(backend, a, num_workers=2, context="fork")
        assert sorted(second) == sorted(first) and second != first
        assert read_order(backend, make(backend, seed=8, shuffle=True)) != first

    def test_order_does_not_depend_on_num_workers(self, backend: Backend) -> None:
        ds = make(backend, seed=3, shuffle=True)
        assert read_order(backend, ds, 0) == read_order(backend, ds, 3, "fork")

    def test_no_handle_left_open(self, backend: Backend) -> None:
        ds = make(backend, shuffle=True)
        # paths only: the S3 backends' pooled connections (sockets) outlive a dataset by design
        before = open_files()
        read_order(backend, ds, 0)
        ds.close()
        # only what appeared counts: the garbage collector may close other tests' leftovers meanwhile
        left_open = open_files() - before
        assert not left_open, f"opened and not closed: {sorted(left_open.elements())}"
        ds.close()  # idempotent

    def test_touched_in_parent_then_forked_workers_read_correctly(self, backend: Backend) -> None:
        ds = make(backend, shuffle=False)
        read_order(backend, ds, 0)  # opens handles in the parent, as a user checking ds[0] would
        keys = read_order(backend, ds, 2, "fork")
        assert sorted(keys) == sorted(backend.expected)
        ds.close()
