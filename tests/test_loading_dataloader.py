"""FastDataLoader: torch's DataLoader less the profiler's marker per batch while no profiler runs. The same
batches as a DataLoader (map-style and iterable, in the main process and in workers), and under a
profiler the marker is there as torch writes it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from fastdata.loading._dataloader import FastDataLoader


class Squares(Dataset[int]):
    def __len__(self) -> int:
        return 37

    def __getitem__(self, i: int) -> int:
        return i * i


class Counting(IterableDataset[int]):
    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        return iter(range(worker, 40, workers))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("dataset", [Squares(), Counting()], ids=["map-style", "iterable"])
def test_the_same_batches_as_a_dataloader(dataset: Any, workers: int) -> None:
    kw: dict[str, Any] = {"batch_size": 4, "num_workers": workers}
    if workers:
        kw["multiprocessing_context"] = "fork"
    ours = [b.tolist() for b in FastDataLoader(dataset, **kw)]
    assert ours == [b.tolist() for b in DataLoader(dataset, **kw)] and ours
    loader = FastDataLoader(dataset, persistent_workers=bool(workers), **kw)
    assert [b.tolist() for b in loader] == ours == [b.tolist() for b in loader]  # a second pass too


def test_under_a_profiler_the_marker_is_kept() -> None:
    loader = FastDataLoader(Squares(), batch_size=8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        batches = [b.tolist() for b in loader]
    assert len(batches) == 5
    names = {e.name for e in prof.events()}
    assert any(n.startswith("enumerate(DataLoader)#") for n in names), sorted(names)[:20]
