"""Bad input to HDF5Dataset: clear errors naming the file, field and index; on_error="skip" counts."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import BadSampleWarning, ConfigError, DecodeFailed, SourceNotFound, TooManyBadSamples
from fastdata.formats.hdf5._reader import BadLayout, CorruptHDF5, FileChanged
from tests.hdf5_datagen import make_h5, overwrite_in_place
from tests.stop_workers import stop_workers

FIELDS = ("image", "label", "key")


def test_missing_file(tmp_path: Path) -> None:
    good = str(tmp_path / "good.h5")
    make_h5(good, 6)
    missing = str(tmp_path / "missing.h5")
    with pytest.raises(SourceNotFound, match=r"missing\.h5: no such file"):
        fd.HDF5Dataset([good, missing], FIELDS)
    with pytest.warns(BadSampleWarning, match="missing.h5"):
        ds = fd.HDF5Dataset([missing, good], FIELDS, on_error="skip")
    assert len(ds) == 6 and ds.skipped == 1
    assert [ds[i]["key"] for i in range(6)] == list(range(6))


def test_no_file_matches_the_glob(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFound, match="matches no file"):
        fd.HDF5Dataset(str(tmp_path / "*.h5"))


def test_missing_field_names_file_field_and_what_exists(tmp_path: Path) -> None:
    path = str(tmp_path / "a.h5")
    make_h5(path, 4)
    with pytest.raises(SourceNotFound, match=r"a\.h5: no field 'images'; the file holds 'blob', 'image', 'key'"):
        fd.HDF5Dataset(path, ("images", "label"))


def test_fields_of_unequal_length(tmp_path: Path) -> None:
    path = str(tmp_path / "uneven.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("image", data=np.zeros((5, 2), np.uint8))
        f.create_dataset("label", data=np.zeros(4, np.int64))
    with pytest.raises(BadLayout, match=r"uneven\.h5: fields have unequal lengths \('image': 5, 'label': 4\)"):
        fd.HDF5Dataset(path)


def test_group_or_scalar_where_a_field_should_be(tmp_path: Path) -> None:
    path = str(tmp_path / "odd.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("data/image", data=np.zeros((3, 2), np.uint8))
        f.create_dataset("scale", data=2.0)
    with pytest.raises(BadLayout, match=r"field 'data' is a group, not a dataset; name a dataset inside it \('image"):
        fd.HDF5Dataset(path, ("data",))
    with pytest.raises(BadLayout, match="field 'scale' is a scalar"):
        fd.HDF5Dataset(path, ("scale",))
    assert fd.HDF5Dataset(path, ("data/image",))[2]["data/image"].shape == (2,)


def test_truncated_and_non_hdf5_files(tmp_path: Path) -> None:
    good, cut, junk = (str(tmp_path / n) for n in ("good.h5", "cut.h5", "junk.h5"))
    make_h5(good, 5)
    make_h5(cut, 50, chunks=None)
    with open(cut, "r+b") as f:
        f.truncate(os.path.getsize(cut) // 2)
    Path(junk).write_bytes(b"this is not HDF5" * 100)
    for bad in (cut, junk):
        with pytest.raises(CorruptHDF5, match=rf"{Path(bad).name}: HDF5 cannot open it .*truncated or not HDF5"):
            fd.HDF5Dataset([good, bad], FIELDS)
    with pytest.warns(BadSampleWarning):
        ds = fd.HDF5Dataset([cut, good, junk], FIELDS, on_error="skip")
    assert len(ds) == 5 and ds.skipped == 2


def test_rows_of_different_shape_in_another_file(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    make_h5(a, 3)
    with h5py.File(b, "w") as f:
        f.create_dataset("image", data=np.zeros((3, 8, 8, 3), np.uint8))
        f.create_dataset("label", data=np.zeros(3, np.int64))
    with pytest.raises(
        BadLayout,
        match=r"b\.h5: field 'image' has array rows \(8, 8, 3\) uint8, but .*a\.h5 has "
        r"array rows \(4, 5, 3\) uint8",
    ):
        fd.HDF5Dataset([a, b])


def test_index_out_of_range(tmp_path: Path) -> None:
    path = str(tmp_path / "a.h5")
    make_h5(path, 7)
    ds = fd.HDF5Dataset(path, FIELDS)
    with pytest.raises(IndexError, match=r"index 7 is out of range for 7 samples in 1 file\(s\) \(.*a\.h5\)"):
        ds[7]
    with pytest.raises(IndexError, match="index -8 is out of range"):
        ds.__getitems__([0, -8])


def damage_chunk(path: str, field: str, chunk: int) -> None:
    """Overwrite the stored bytes of one (compressed) chunk with garbage."""
    with h5py.File(path, "r") as f:
        info = f[field].id.get_chunk_info(chunk)
    with open(path, "r+b") as f:
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    # 12 rows in gzip chunks of 4: rows 4..7 (chunk 1) cannot be inflated
    path = str(tmp_path / "damaged.h5")
    data = make_h5(path, 12, chunks=4, compression="gzip")
    damage_chunk(path, "image", 1)
    return path, data


def test_damaged_chunk_names_file_field_row_and_index(damaged: tuple[str, dict[str, Any]]) -> None:
    path, data = damaged
    ds = fd.HDF5Dataset(path, FIELDS)
    np.testing.assert_array_equal(ds[3]["image"], data["image"][3])
    with pytest.raises(CorruptHDF5, match=r"damaged\.h5: field 'image', row 5 \(dataset index 5\): HDF5 cannot read"):
        ds[5]


def test_damaged_chunk_skipped_in_workers_and_counted_in_main_process(damaged: tuple[str, dict[str, Any]]) -> None:
    path, _ = damaged
    ds = fd.HDF5Dataset(path, FIELDS, on_error="skip")
    loader = DataLoader(ds, batch_size=3, sampler=ds.sampler(shuffle=True), num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadSampleWarning)  # warned in the workers
        keys = sorted(k for batch in loader for k in batch["key"].tolist())
    assert keys == [0, 1, 2, 3, 8, 9, 10, 11]
    assert ds.skipped == 4


def test_decode_failure_names_the_sample(tmp_path: Path) -> None:
    path = str(tmp_path / "notjpeg.h5")
    make_h5(path, 5)  # 'blob' rows are random bytes, not images
    ds = fd.HDF5Dataset(path, ("blob", "key"), decode="numpy")
    with pytest.raises(DecodeFailed, match=r"notjpeg\.h5: field 'blob', row 2 \(dataset index 2\): cannot decode"):
        ds[2]
    skipping = fd.HDF5Dataset(path, ("blob", "key"), decode="numpy", on_error="skip")
    # every row is bad: no substitute can stand in (counted once each, not again by the search)
    with pytest.warns(BadSampleWarning), pytest.raises(TooManyBadSamples, match=r"notjpeg\.h5"):
        skipping.__getitems__([0, 1])
    assert skipping.skipped == 2
    with pytest.raises(TooManyBadSamples, match=r"sample 3 was bad"):
        skipping[3]
    assert skipping.skipped == 3


def test_file_rewritten_after_the_dataset_was_built(tmp_path: Path) -> None:
    path = str(tmp_path / "a.h5")
    make_h5(path, 6)
    ds = fd.HDF5Dataset(path, FIELDS)
    make_h5(path, 9, seed=3)  # a conversion rerun while a job reads it
    with pytest.raises(FileChanged, match=r"a\.h5: the file changed after the dataset was built"):
        ds[0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"on_error": "ignore"}, "on_error='ignore' is not one of 'raise', 'skip'"),
        ({"fields": ()}, "names no field"),
        ({"fields": ("image", "image")}, "names a field twice"),
        ({"decode": "jpeg"}, "decode='jpeg' is not one of"),
        ({"decode": 3}, "decode=3 is not one of"),
        ({"rdcc_w0": 1.5}, r"rdcc_w0=1.5 must lie in \[0, 1\]"),
        ({"rdcc_nslots": 0}, "rdcc_nslots=0 must be > 0"),
    ],
)
def test_bad_options_fail_at_construction(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    path = str(tmp_path / "a.h5")
    make_h5(path, 3)
    with pytest.raises(ConfigError, match=message):
        fd.HDF5Dataset(path, **kwargs)


def test_remote_urls_are_refused() -> None:
    with pytest.raises(ConfigError, match="reads local files only"):
        fd.HDF5Dataset("s3://bucket/data.h5")


# -- a file overwritten in place while it is open ---------------------------------------------------


def rewrite_with_other_rows(path: str, seed: int) -> dict[str, Any]:
    """Overwrite ``path`` in place (same inode) with a file of the same fields holding other rows."""
    written: dict[str, Any] = {}

    def write(f: Any) -> None:
        written.update(make_h5(os.path.join(os.path.dirname(path), f"other-{seed}.h5"), 14, seed=seed))
        with h5py.File(os.path.join(os.path.dirname(path), f"other-{seed}.h5"), "r") as other:
            for name in other:
                other.copy(other[name], f, name)

    overwrite_in_place(path, write)
    return written


@pytest.mark.parametrize("field", ["image", "blob"])  # read straight from the file / through HDF5
def test_file_overwritten_in_place_is_detected_when_the_next_epoch_starts(tmp_path: Path, field: str) -> None:
    path = str(tmp_path / "a.h5")
    data = make_h5(path, 12, chunks=4)
    ds = fd.HDF5Dataset(path, (field, "key"))
    batch = ds.__getitems__(list(range(12)))  # the file is open in this process now
    assert batch[5][field] == data[field][5] if field == "blob" else np.array_equal(batch[5][field], data[field][5])
    rewrite_with_other_rows(path, seed=9)
    ds.set_epoch(1)
    with pytest.raises(
        FileChanged, match=r"a\.h5: the file changed after the dataset was built .*build the dataset again"
    ):
        ds.__getitems__([3, 4])
    skipping = fd.HDF5Dataset([path], (field, "key"), on_error="skip")  # a dataset built on the new file
    assert len(skipping) == 14


def test_file_overwritten_in_place_under_persistent_workers(tmp_path: Path) -> None:
    path = str(tmp_path / "a.h5")
    make_h5(path, 12, chunks=4)
    ds = fd.HDF5Dataset(path, ("image", "blob", "key"))
    loader = DataLoader(
        ds,
        batch_size=4,
        sampler=ds.sampler(shuffle=True),
        num_workers=2,
        persistent_workers=True,
        collate_fn=ds.collate,
        timeout=60,
    )
    assert sorted(k for b in loader for k in b["key"].tolist()) == list(range(12))
    rewrite_with_other_rows(path, seed=9)
    ds.set_epoch(1)
    batches = iter(loader)  # the same persistent workers, for epoch 1
    with pytest.raises(FileChanged, match=r"a\.h5: the file changed after the dataset was built"):
        list(batches)
    stop_workers(batches)  # (a 10 s wait in a later test otherwise: see tests/stop_workers.py)


def test_file_overwritten_in_place_is_skipped_and_counted_under_skip(tmp_path: Path) -> None:
    good, changing = str(tmp_path / "good.h5"), str(tmp_path / "changing.h5")
    make_h5(good, 5, first_key=0)
    make_h5(changing, 6, first_key=5, seed=1)
    ds = fd.HDF5Dataset([good, changing], ("image", "key"), on_error="skip")
    assert [s["key"] for s in ds.__getitems__(list(range(11)))] == list(range(11))
    rewrite_with_other_rows(changing, seed=9)
    ds.set_epoch(1)
    with pytest.warns(BadSampleWarning, match=r"changing\.h5: the file changed"):
        keys = [s["key"] for s in ds.__getitems__(list(range(11)))]
    assert keys == list(range(5)) and ds.skipped == 6


def scribble(path: str, keep_identity: bool = False) -> None:
    """Overwrite all but the first 4 KiB of ``path`` with random bytes, in place (a copy or rewrite in
    progress); with ``keep_identity``, the modification time is put back too."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(np.random.default_rng(0).bytes(st.st_size - 4096))
    if keep_identity:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("fields", [("image", "key"), ("blob", "key")])
def test_h5py_errors_mid_read_name_file_field_row_and_fix(tmp_path: Path, fields: tuple[str, ...]) -> None:
    # the file is open, its chunk index not read yet; then its bytes change under it (within an epoch):
    # what h5py raises reading it (RuntimeError, OSError ...) comes out naming file, field, row and fix
    def opened(name: str, on_error: str = "raise") -> fd.HDF5Dataset:
        make_h5(tmp_path / name, 40, chunks=4)
        ds = fd.HDF5Dataset(str(tmp_path / name), fields, on_error=on_error)  # type: ignore[arg-type]
        ds.handle(0)
        return ds

    rewritten = opened("rewritten.h5")
    scribble(str(tmp_path / "rewritten.h5"))
    with pytest.raises(FileChanged, match=r"rewritten\.h5: field '\w+', row 5 \(dataset index 5\): .*the file changed"):
        rewritten.__getitems__([5, 6, 30])
    damaged = opened("damaged.h5")
    scribble(str(tmp_path / "damaged.h5"), keep_identity=True)  # nothing says it changed: damage, then
    with pytest.raises(
        CorruptHDF5, match=r"damaged\.h5: field '\w+', row 5 \(dataset index 5\): .*the file is damaged"
    ):
        damaged.__getitems__([5, 6, 30])
    skipping = opened("skipped.h5", on_error="skip")
    scribble(str(tmp_path / "skipped.h5"), keep_identity=True)
    # every row is bad now: no substitute can stand in for the batch (tests/test_substitute.py)
    with (
        pytest.warns(BadSampleWarning, match=r"skipped\.h5: field"),
        pytest.raises(TooManyBadSamples, match=r"skipped\.h5"),
    ):
        skipping.__getitems__([5, 6, 30])
    assert skipping.skipped == 3
