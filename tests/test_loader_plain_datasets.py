"""``fd.Loader`` over a user's own torch datasets (not fastdata's): a plain map-style ``Dataset`` is shuffled,
split and resumed through an ``EpochSampler``; a plain ``IterableDataset`` is read as is. Both with worker
processes (fork and spawn), the monitor and ``num_workers="auto"``; every sample once."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import fastdata as fd
from fastdata.core.errors import ConfigError

N = 60


class Squares(Dataset):  # type: ignore[type-arg]
    """A plain map-style dataset: nothing of fastdata's protocol."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"i": torch.tensor(i), "x": torch.full((3,), float(i * i))}


class Stream(IterableDataset):  # type: ignore[type-arg]
    """A plain iterable dataset that splits itself over workers, as torch's documentation shows."""

    def __init__(self) -> None:
        self.epochs: list[int] = []
        self.closed = False

    def __len__(self) -> int:
        return N

    def __iter__(self) -> Any:
        info = get_worker_info()
        w, n = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(w, N, n):
            yield {"i": torch.tensor(i)}

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def close(self) -> None:
        self.closed = True


def _ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b["i"]]


@pytest.mark.parametrize("kind", ["map", "iterable"])
@pytest.mark.parametrize(("workers", "start"), [(0, None), (2, "fork"), (2, "spawn")])
def test_plain_dataset_reads_every_sample_once_with_the_monitor(kind: str, workers: int, start: str | None) -> None:
    ds = Squares() if kind == "map" else Stream()
    reports: list[Any] = []
    ctx = {"multiprocessing_context": start} if start else {}
    with fd.Loader(ds, batch_size=5, num_workers=workers, monitor=reports.append, **ctx) as loader:
        assert loader.dataset is ds and len(loader) == 12
        ids = _ids(loader)
        assert sorted(ids) == list(range(N))
        stats = loader.stats(since="start")
        assert stats is not None and stats.batches == 12
    if kind == "map":
        assert ids != list(range(N))  # shuffled by the Loader's EpochSampler
    else:
        assert ds.closed and ds.epochs[-1] == 0  # its own set_epoch and close were called


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_plain_dataset_under_num_workers_auto(kind: str) -> None:
    ds = Squares() if kind == "map" else Stream()
    with fd.Loader(ds, batch_size=5, num_workers="auto", multiprocessing_context="fork") as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sorted(_ids(loader)) == list(range(N))
        assert loader.stats(since="start") is not None


@pytest.mark.parametrize("workers", [0, 2])
def test_plain_map_dataset_resumes_mid_epoch(workers: int) -> None:
    whole = fd.Loader(Squares(), batch_size=4, num_workers=0)
    whole.set_epoch(3)
    expected = _ids(whole)
    first = fd.Loader(Squares(), batch_size=4, num_workers=workers, multiprocessing_context="fork")
    first.set_epoch(3)
    seen: list[int] = []
    for k, batch in enumerate(first, 1):
        seen += _ids([batch])
        if k == 5:
            state = first.state_dict()
            break
    first.close()
    resumed = fd.Loader(Squares(), batch_size=4, num_workers=workers, multiprocessing_context="fork")
    resumed.load_state_dict(state)
    assert resumed.epoch == 3
    assert seen + _ids(resumed) == expected  # the rest of the epoch, in order, nothing twice
    resumed.close()


def test_plain_iterable_refuses_a_resume_state_and_the_options_that_are_its_own() -> None:
    loader = fd.Loader(Stream(), batch_size=4)
    with pytest.raises(ConfigError, match="cannot name a point inside its epoch") as e:
        loader.state_dict()
    assert "fastdata.loading._" not in str(e.value)
    with pytest.raises(ConfigError, match="read as is"):
        fd.Loader(Stream(), batch_size=4, shuffle=True)
    with pytest.raises(ConfigError, match="would read all of Stream"):
        fd.Loader(Stream(), batch_size=4, num_workers=2, workers="threads")


def test_not_a_dataset_is_refused_naming_public_paths() -> None:
    with pytest.raises(ConfigError) as e:
        fd.Loader(object(), batch_size=4)
    message = str(e.value)
    assert "torch.utils.data.Dataset" in message and "fastdata.loading.Dataset" in message
    assert "._" not in message


class OddSample(UserWarning):
    """A warning of the user's own, raised in the workers."""


class Warns(Squares):
    def __getitem__(self, i: int) -> dict[str, Any]:
        import warnings

        warnings.warn(f"sample {i % 2} looks odd", OddSample, stacklevel=2)
        return super().__getitem__(i)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_warnings_of_the_workers_reach_the_training_process_once_each(start: str) -> None:
    import warnings

    with (
        pytest.warns(OddSample) as caught,
        fd.Loader(Warns(), batch_size=6, num_workers=2, multiprocessing_context=start) as loader,
    ):
        assert sorted(_ids(loader)) == list(range(N))
    odd = sorted(str(w.message) for w in caught if w.category is OddSample)
    assert odd == ["sample 0 looks odd", "sample 1 looks odd"]  # each distinct warning once, 60 raised
    with warnings.catch_warnings():
        warnings.simplefilter("error", OddSample)  # the training process's filters apply to them
        loader = fd.Loader(Warns(), batch_size=6, num_workers=2, multiprocessing_context="fork")
        with pytest.raises(OddSample):
            list(loader)
        loader.close()
