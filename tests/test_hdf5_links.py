"""HDF5 files whose fields live in other files: external links (the "master file" layout of detector data)
and virtual datasets. HDF5Dataset must read what h5py reads through the same links, in any worker."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import SourceNotFound
from fastdata.formats.hdf5._reader import FileChanged
from tests.hdf5_datagen import assert_same_value, h5py_value, overwrite_in_place

N = 12
FIELDS = ("entry/data/frames", "entry/data/energy", "entry/data/gain", "entry/instrument/label", "vds")


def make_master(folder: Path, *, padding: int = 1 << 20) -> str:
    """A master file whose fields are external links (to a dataset, and through a linked group) into
    files in a subfolder, and a virtual dataset over two more files; ``padding`` bytes of its own data
    come first, so that the targets' byte offsets lie inside the master file too (reading the master's
    bytes at them gives wrong numbers, not an error)."""
    rng = np.random.default_rng(3)
    (folder / "raw").mkdir()
    with h5py.File(folder / "raw" / "data_000001.h5", "w") as f:
        f.create_dataset("frames", data=rng.integers(0, 4096, (N, 4, 6)).astype("<u2"), chunks=(4, 4, 6))
        f.create_dataset("energy", data=np.full(N, -10.0))  # contiguous float64: the -10.0 of the bug report
        f.create_dataset("gain", data=rng.normal(size=(N, 3)).astype("<f4"), chunks=(5, 3), compression="gzip")
    with h5py.File(folder / "raw" / "meta.h5", "w") as f:
        f.create_dataset("instrument/label", data=rng.integers(0, 100, N).astype("<i8"))
    layout = h5py.VirtualLayout(shape=(N,), dtype="<i4")
    for k, (lo, hi) in enumerate([(0, 5), (5, N)]):
        with h5py.File(folder / f"part{k}.h5", "w") as f:
            f["v"] = np.arange(lo, hi, dtype="<i4") * 7
        layout[lo:hi] = h5py.VirtualSource(str(folder / f"part{k}.h5"), "v", shape=(hi - lo,))
    master = str(folder / "master.h5")
    with h5py.File(master, "w") as f:
        f.create_dataset("padding", data=rng.integers(0, 256, padding).astype(np.uint8))
        f["entry/data/frames"] = h5py.ExternalLink("raw/data_000001.h5", "/frames")
        f["entry/data/energy"] = h5py.ExternalLink("raw/data_000001.h5", "/energy")
        f["entry/data/gain"] = h5py.ExternalLink("raw/data_000001.h5", "/gain")
        f["entry/instrument"] = h5py.ExternalLink("raw/meta.h5", "/instrument")  # a linked group
        f.create_virtual_dataset("vds", layout)
    return master


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_master(tmp_path_factory.mktemp("links"))


def expected(path: str) -> list[dict[str, Any]]:
    with h5py.File(path, "r") as f:
        return [{name: h5py_value(f[name], i) for name in FIELDS} for i in range(N)]


@pytest.mark.parametrize(
    ("workers", "context"), [(0, None), (2, "fork"), pytest.param(2, "spawn", marks=pytest.mark.slow)]
)
def test_linked_fields_read_as_h5py_reads_them(master: str, workers: int, context: str | None) -> None:
    ds = fd.HDF5Dataset(master, FIELDS)
    loader = DataLoader(
        ds,
        batch_size=5,
        sampler=ds.sampler(shuffle=True, remainder="uneven"),
        collate_fn=list,
        num_workers=workers,
        multiprocessing_context=context,
        timeout=60 if workers else 0,
    )
    want = expected(master)
    seen = []
    for batch in loader:
        for sample in batch:
            i = sample["__index__"]
            seen.append(i)
            for name in FIELDS:
                assert_same_value(sample[name], want[i][name], f"{name}[{i}]")
    assert sorted(seen) == list(range(N))


def test_direct_reads_go_to_the_file_that_holds_the_data(master: str) -> None:
    ds = fd.HDF5Dataset(master, FIELDS)
    info = {f.name: f for f in ds.infos[0].fields}  # type: ignore[union-attr]
    raw = os.path.join(os.path.dirname(master), "raw", "data_000001.h5")
    assert info["entry/data/frames"].direct and info["entry/data/frames"].source == raw
    assert info["entry/data/energy"].direct and info["entry/instrument/label"].source.endswith("meta.h5")  # type: ignore[union-attr]
    assert info["vds"].source is None and not info["vds"].direct  # HDF5 assembles virtual datasets
    rows = [11, 0, 4, 5, 6, 3]
    batch = ds.collate(ds.__getitems__(rows))
    assert batch["entry/data/energy"].tolist() == [-10.0] * len(rows)
    with h5py.File(master, "r") as f:
        assert batch["entry/data/frames"].numpy().tolist() == [f["entry/data/frames"][i].tolist() for i in rows]
        assert batch["vds"].tolist() == [int(f["vds"][i]) for i in rows]


def test_a_small_linking_file_is_not_called_truncated(tmp_path: Path) -> None:
    # no padding: the targets' offsets lie past the end of the master file
    master = make_master(tmp_path, padding=0)
    ds = fd.HDF5Dataset(master, FIELDS)
    assert ds[7]["entry/data/energy"] == -10.0


def test_a_broken_external_link_names_the_link_and_its_target(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "master.h5", "w") as f:
        f["label"] = np.arange(3)
        f["frames"] = h5py.ExternalLink("raw/missing.h5", "/frames")
        f["entry"] = h5py.ExternalLink("gone.h5", "/entry")
    with pytest.raises(
        SourceNotFound,
        match=r"master\.h5: field 'frames' is reached through an external link \('frames' -> raw/missing\.h5:/frames\)"
        r" that HDF5 cannot follow",
    ):
        fd.HDF5Dataset(str(tmp_path / "master.h5"), ("frames", "label"))
    with pytest.raises(SourceNotFound, match=r"field 'entry/data' is reached through an external link \('entry' ->"):
        fd.HDF5Dataset(str(tmp_path / "master.h5"), ("entry/data", "label"))


def test_a_linked_file_rewritten_after_construction_is_a_file_changed(tmp_path: Path) -> None:
    master = make_master(tmp_path)
    ds = fd.HDF5Dataset(master, FIELDS)
    ds[0]

    def shorter(f: Any) -> None:
        f["frames"] = np.zeros((N - 2, 4, 6), "<u2")
        f["energy"] = np.zeros(N - 2)
        f["gain"] = np.zeros((N - 2, 3), "<f4")

    overwrite_in_place(tmp_path / "raw" / "data_000001.h5", shorter)
    ds.set_epoch(1)
    with pytest.raises(
        FileChanged, match=r"master\.h5: the file \(the file its fields link to, .*data_000001\.h5\) changed"
    ):
        ds[1]
