"""HDF5Dataset: values, layouts, decoding, collation, handles per process, chunk cache settings."""

from __future__ import annotations

import gc
import io
import multiprocessing
import os
import pickle
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, default_collate

import fastdata as fd
from fastdata.core.process._handles import open_files
from fastdata.datasets.hdf5._batch import SampleBatch, collate
from fastdata.formats.hdf5._reader import DEFAULT_RDCC_NBYTES, DEFAULT_RDCC_NSLOTS, DEFAULT_RDCC_W0
from tests.datagen import jpeg_bytes
from tests.hdf5_datagen import make_files, make_h5

FIELDS = ("image", "label", "key", "blob")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, Any]]:
    return make_files(tmp_path_factory.mktemp("h5"), (11, 13, 9), seed=5)


def assert_sample(sample: dict[str, Any], every: dict[str, Any], i: int) -> None:
    assert sample["__index__"] == i
    np.testing.assert_array_equal(sample["image"], every["image"][i])
    assert sample["label"] == every["label"][i] and sample["key"] == every["key"][i]
    assert sample["blob"] == every["blob"][i] and isinstance(sample["blob"], bytes)


def test_values_in_any_order_across_files_and_layouts(files: tuple[list[str], dict[str, Any]]) -> None:
    paths, every = files
    ds = fd.HDF5Dataset(paths, FIELDS)
    n = len(ds)
    assert n == 33
    order = np.random.default_rng(0).permutation(n).tolist()
    for indices in (order, list(range(n)), [5, 5, 31, 0, 5], [-1, -33, 12, 11, 10, 9]):
        batch = ds.__getitems__(indices)
        assert len(batch) == len(indices)
        for sample, i in zip(batch, indices):
            assert_sample(sample, every, i % n)
    assert_sample(ds[17], every, 17)
    ds.close()


def test_glob_expands_in_order(files: tuple[list[str], dict[str, Any]]) -> None:
    paths, every = files
    ds = fd.HDF5Dataset(os.path.join(os.path.dirname(paths[0]), "part-*.h5"), ("key",))
    assert ds.paths == paths
    assert [ds[i]["key"] for i in range(len(ds))] == every["key"].tolist()


def test_rows_read_through_hdf5_match_rows_read_directly(tmp_path: Any) -> None:
    # the same values as a native little-endian field (read straight from the file) and as a big-endian
    # one (read through HDF5, which converts): the two paths must agree
    values = np.random.default_rng(1).integers(-1000, 1000, (40, 3)).astype("<i4")
    path = str(tmp_path / "endian.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("little", data=values, chunks=(7, 3))
        f.create_dataset("big", data=values.astype(">i4"), chunks=(7, 3))
    ds = fd.HDF5Dataset(path, ("little", "big"))
    info = {f.name: f for f in ds.infos[0].fields}  # type: ignore[union-attr]
    assert info["little"].direct and not info["big"].direct
    rows = [39, 0, 13, 14, 15, 2, 2]
    for s, i in zip(ds.__getitems__(rows), rows):
        np.testing.assert_array_equal(s["little"], values[i])
        np.testing.assert_array_equal(s["big"], values[i])


def test_direct_reads_follow_chunks_stored_out_of_order(tmp_path: Any) -> None:
    # chunks written last-first and interleaved with another field's: chunk addresses out of row order and
    # not aligned to each other; rows of 3 bytes (small: gathered from spans) and of 600 (copied in runs)
    rng = np.random.default_rng(7)
    small = rng.integers(0, 256, (50, 3), dtype=np.uint8)
    large = rng.integers(0, 256, (50, 600), dtype=np.uint8)
    path = str(tmp_path / "scrambled.h5")
    with h5py.File(path, "w") as f:
        a = f.create_dataset("small", (50, 3), dtype=np.uint8, chunks=(4, 3))
        b = f.create_dataset("large", (50, 600), dtype=np.uint8, chunks=(6, 600))
        for lo in range(48, -1, -4):
            a[lo : lo + 4] = small[lo : lo + 4]
            b[lo : lo + 4] = large[lo : lo + 4]
    ds = fd.HDF5Dataset(path, ("small", "large"))
    assert all(f.direct for f in ds.infos[0].fields)  # type: ignore[union-attr]
    for rows in (np.random.default_rng(1).permutation(50).tolist(), list(range(50)), [3, 4, 5, 9, 8, 7, 49, 0]):
        batch = ds.__getitems__(rows)
        np.testing.assert_array_equal(np.stack([s["small"] for s in batch]), small[rows])
        np.testing.assert_array_equal(np.stack([s["large"] for s in batch]), large[rows])


def test_strings_and_scalars(tmp_path: Any) -> None:
    path = str(tmp_path / "s.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("name", data=np.array(["ä", "b", "cc"], dtype=object), dtype=h5py.string_dtype())
        f.create_dataset("weight", data=np.array([0.5, 1.5, 2.5], dtype=np.float32))
    ds = fd.HDF5Dataset(path, ("name", "weight"))
    assert [s["name"] for s in ds.__getitems__([2, 0, 1])] == ["cc", "ä", "b"]
    assert ds[1]["weight"] == np.float32(1.5)


def test_collate_equals_default_collate_without_copying(files: tuple[list[str], dict[str, Any]]) -> None:
    paths, _ = files
    ds = fd.HDF5Dataset(paths, FIELDS)
    indices = [3, 20, 4, 5, 32]
    batch = ds.__getitems__(indices)
    assert isinstance(batch, SampleBatch) and batch.columns is not None
    ours, theirs = collate(batch), default_collate(list(batch))
    assert ours.keys() == theirs.keys()
    for key in ours:
        if isinstance(ours[key], torch.Tensor):
            assert torch.equal(ours[key], theirs[key]), key
        else:
            assert ours[key] == theirs[key], key
    # the tensor is the column the rows were read into: no second copy
    assert ours["image"].data_ptr() == batch.columns["image"].__array_interface__["data"][0]


def test_collate_returns_what_the_transform_made(tmp_path: Any) -> None:
    rng = np.random.default_rng(6)
    path = str(tmp_path / "labelled.h5")
    with h5py.File(path, "w") as f:
        f["label"] = np.arange(5, dtype=np.int64)
        jpg = f.create_dataset("jpg", (5,), dtype=h5py.vlen_dtype(np.uint8))
        for i in range(5):
            jpg[i] = np.frombuffer(jpeg_bytes(rng), dtype=np.uint8)
    ds = fd.HDF5Dataset(path, ("label", "jpg"), transform=lambda s: {**s, "label": s["label"] + 100})
    batch = ds.__getitems__([3, 1, 4])
    assert batch.columns is None  # the rows read are not what the samples hold any more
    assert collate(batch)["label"].tolist() == [103, 101, 104]
    decoded = fd.HDF5Dataset(path, ("label", "jpg"), decode="torch")  # decoding touches byte fields only
    batch = decoded.__getitems__([3, 1])
    assert batch.columns is not None and collate(batch)["jpg"].shape[0] == 2


def test_decode_turns_encoded_images_into_arrays(tmp_path: Any) -> None:
    rng = np.random.default_rng(2)
    blobs = [jpeg_bytes(rng) for _ in range(6)]
    path = str(tmp_path / "jpeg.h5")
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("jpg", (6,), dtype=h5py.vlen_dtype(np.uint8))
        for i, b in enumerate(blobs):
            ds[i] = np.frombuffer(b, dtype=np.uint8)
    expected = [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs]
    numpy_ds = fd.HDF5Dataset(path, ("jpg",), decode="numpy")
    for s, i in zip(numpy_ds.__getitems__([4, 1]), [4, 1]):
        np.testing.assert_array_equal(s["jpg"], expected[i])
    torch_ds = fd.HDF5Dataset(path, ("jpg",), decode="torch")
    assert torch_ds[0]["jpg"].shape == (3, *expected[0].shape[:2])
    raw = fd.HDF5Dataset(path, ("jpg",))
    assert raw[3]["jpg"] == blobs[3]
    custom = fd.HDF5Dataset(path, ("jpg",), decode=lambda s: {**s, "n": len(s["jpg"])})
    assert custom[2]["n"] == len(blobs[2])
    shaped = fd.HDF5Dataset(path, ("jpg",), decode="numpy", transform=lambda s: s["jpg"].shape)
    assert shaped[5] == expected[5].shape


def open_fds(paths: list[str]) -> int:
    """Descriptors of this process open on ``paths``."""
    now = open_files()
    return sum(now[os.path.realpath(p)] for p in paths)


def test_length_known_at_construction_with_every_file_closed(files: tuple[list[str], dict[str, Any]]) -> None:
    paths, _ = files
    gc.collect()  # datasets earlier tests dropped close their files now, not in the middle of the counts
    before = open_fds(paths)
    ds = fd.HDF5Dataset(paths, FIELDS)
    assert len(ds) == 33
    assert open_fds(paths) == before
    assert len(ds._handles) == 0  # nothing left open by the construction
    ds[0]
    assert len(ds._handles) == 1 and open_fds(paths) > before
    ds.close()
    assert open_fds(paths) == before


def test_pickling_drops_open_handles(files: tuple[list[str], dict[str, Any]]) -> None:
    paths, every = files
    ds = fd.HDF5Dataset(paths, FIELDS)
    ds[0], ds[20]
    assert len(ds._handles) == 2
    copy = pickle.loads(pickle.dumps(ds))
    assert len(copy._handles) == 0 and copy._handles.opened == 0
    assert_sample(copy[20], every, 20)
    ds.close()
    copy.close()


def test_chunk_cache_has_documented_defaults_and_takes_options(tmp_path: Any) -> None:
    paths = [str(tmp_path / "cache.h5")]
    make_h5(paths[0], 5)

    def cache_of(ds: fd.HDF5Dataset) -> tuple[int, int, float]:
        _, nslots, nbytes, w0 = ds.handle(0).file.id.get_access_plist().get_cache()
        return nslots, nbytes, w0

    # (closed in between: within one process HDF5 shares a file opened twice, with the first open's cache)
    with fd.HDF5Dataset(paths, FIELDS) as default:
        assert cache_of(default) == (DEFAULT_RDCC_NSLOTS, DEFAULT_RDCC_NBYTES, DEFAULT_RDCC_W0)
    assert (DEFAULT_RDCC_NSLOTS, DEFAULT_RDCC_NBYTES) == (10_007, 16 << 20)
    with fd.HDF5Dataset(paths, FIELDS, rdcc_nbytes=1 << 20, rdcc_nslots=521, rdcc_w0=1.0) as tuned:
        assert cache_of(tuned) == (521, 1 << 20, 1.0)


def test_handle_is_opened_read_only(files: tuple[list[str], dict[str, Any]]) -> None:
    paths, _ = files
    ds = fd.HDF5Dataset(paths, FIELDS)
    assert ds.handle(1).file.mode == "r"


# -- the regression test: a handle opened in the parent is never used by the workers ------------------


class ProbedHDF5Dataset(fd.HDF5Dataset):
    """Adds to every sample which process read it and through which open file."""

    def __getitems__(self, indices: Any) -> list[dict[str, Any]]:
        samples = list(super().__getitems__(indices))
        for s in samples:
            file = self.locate(s["__index__"])[0]
            handle = self.handle(file)
            s["probe"] = torch.tensor([os.getpid(), handle.pid, *handle.fileno, handle.driver == "stdio", file])
        return samples


def read_probes(ds: fd.HDF5Dataset, context: str, num_workers: int = 2) -> tuple[list[int], torch.Tensor]:
    loader = DataLoader(
        ds,
        batch_size=4,
        sampler=ds.sampler(shuffle=True),
        num_workers=num_workers,
        multiprocessing_context=multiprocessing.get_context(context),
    )
    keys, probes = [], []
    for batch in loader:
        keys += batch["key"].tolist()
        probes.append(batch["probe"])
    return keys, torch.cat(probes)


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_handle_opened_in_parent_is_not_used_by_workers(files: tuple[list[str], dict[str, Any]], context: str) -> None:
    paths, every = files
    ds = ProbedHDF5Dataset(paths, FIELDS)
    # the user looks at samples before training: every file is now open in the parent
    for i in (0, 12, 30):
        assert_sample(ds[i], every, i)
    parent = {k: (ds.handle(k).pid, ds.handle(k).fileno) for k in range(3)}
    keys, probes = read_probes(ds, context)
    assert sorted(keys) == every["key"].tolist()
    reader_pid, handle_pid = probes[:, 0], probes[:, 1]
    assert (reader_pid != os.getpid()).all(), "read in the main process, not in a worker"
    assert (handle_pid == reader_pid).all(), "a worker read through a handle another process opened"
    filenos = {(int(a), int(b)) for a, b in probes[:, 2:4].tolist()}
    assert not filenos & {fileno for _, fileno in parent.values()}, "a worker read through the parent's HDF5 file"
    assert not probes[:, 4].any()  # no foreign handle: the plain sec2 driver everywhere
    # the parent's handles are untouched and still read correctly
    assert {k: (ds.handle(k).pid, ds.handle(k).fileno) for k in range(3)} == parent
    assert_sample(ds[25], every, 25)
    ds.close()


@pytest.mark.parametrize("held", ["file", "dataset"])
def test_user_handle_held_in_parent_is_not_shared_with_forked_workers(
    files: tuple[list[str], dict[str, Any]], held: str
) -> None:
    # an h5py object the user keeps open in the parent (a File, or only a Dataset of it): HDF5 would give
    # a forked worker's own open of that file the parent's open file (descriptor and caches); the worker
    # must open it apart (through the stdio driver)
    paths, every = files
    ds = ProbedHDF5Dataset(paths, FIELDS)
    own = h5py.File(paths[1], "r")
    theirs = tuple(own.id.fileno)
    kept = own if held == "file" else own["key"]
    del own
    gc.collect()
    try:
        keys, probes = read_probes(ds, "fork")
        assert kept.file.id.fileno == theirs  # the user's object still works in the parent
    finally:
        kept.file.close()
    assert sorted(keys) == every["key"].tolist()
    from_second = probes[:, 5] == 1
    assert from_second.any() and (~from_second).any()
    assert probes[from_second, 4].all(), "the file held by the user was not opened apart"
    assert not probes[~from_second, 4].any(), "files nobody else holds open use the plain driver"
    assert theirs not in {(int(a), int(b)) for a, b in probes[:, 2:4].tolist()}


# -- what a worker returns must pickle, under any collate_fn ----------------------------------------


def keep_batch(batch: Any) -> Any:
    """``collate_fn=lambda b: b``, as a function spawn workers can be given."""
    return batch


@pytest.mark.parametrize(
    ("context", "collate_fn"),
    [
        ("fork", lambda b: b),  # the usual way to get lists of variable-length samples
        ("fork", list),
        # what a worker returns is pickled alike under fork and spawn: one spawn case shows the dataset
        # reaches spawned workers (which cannot be sent a lambda at all)
        pytest.param("spawn", keep_batch, marks=pytest.mark.slow),
    ],
)
def test_batches_come_back_under_any_collate_fn(
    files: tuple[list[str], dict[str, Any]], context: str, collate_fn: Any
) -> None:
    paths, every = files
    ds = fd.HDF5Dataset(paths, FIELDS)
    loader = DataLoader(
        ds,
        batch_size=4,
        sampler=ds.sampler(shuffle=True),
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=collate_fn,
        timeout=60,  # a batch that cannot cross to the main process hangs it: fail instead
    )
    seen = []
    for batch in loader:
        for sample in batch:
            assert_sample(sample, every, sample["__index__"])
            seen.append(sample["__index__"])
    assert sorted(seen) == list(range(33))


def test_sample_batches_pickle_built_or_not(files: tuple[list[str], dict[str, Any]], tmp_path: Any) -> None:
    paths, every = files
    ds = fd.HDF5Dataset(paths, FIELDS)
    lazy = ds.__getitems__([3, 20, 4])
    copy = pickle.loads(pickle.dumps(lazy))
    assert copy.columns is not None and collate(copy)["image"].shape == (3, 4, 5, 3)  # the rows, sent once
    for sample, i in zip(copy, [3, 20, 4]):
        assert_sample(sample, every, i)
    built = ds.__getitems__([7, 8])
    list(built)  # the sample dicts exist now
    again = pickle.loads(pickle.dumps(built))
    assert again.columns is None  # (the dicts carry the rows)
    for sample, i in zip(again, [7, 8]):
        assert_sample(sample, every, i)
    # a batch with skipped rows, one a transform made: they pickle too
    damaged = str(tmp_path / "damaged.h5")
    make_h5(damaged, 8, chunks=4, compression="gzip")
    with h5py.File(damaged, "r") as f:
        info = f["image"].id.get_chunk_info(1)
    with open(damaged, "r+b") as f:
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    skipping = fd.HDF5Dataset(damaged, ("image", "key"), on_error="skip")
    with pytest.warns(fd.BadSampleWarning):
        partial = skipping.__getitems__([0, 5, 1])
    assert [s["key"] for s in pickle.loads(pickle.dumps(partial))] == [0, 1]
    decoded = fd.HDF5Dataset(paths, ("label", "key"), transform=lambda s: {**s, "label": s["label"] + 1})
    assert [s["label"] for s in pickle.loads(pickle.dumps(decoded.__getitems__([1, 2])))] == [
        every["label"][1] + 1,
        every["label"][2] + 1,
    ]
