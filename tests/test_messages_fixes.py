"""Messages that name the right fix (issue 33, items 9 and 10): ``fastdata bench`` names ``-o on_error=skip``
for a video shorter than one clip and says each skip once per run, names ``-o fields=...`` for a missing
field; a ragged HDF5 field names ``collate_fn=ds.collate``; a warning of a sample skipped under
``on_error="skip"`` does not advise passing it. Real files, made here (H.264 through PyAV, h5py, tar)."""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

import fastdata as fd
from fastdata.cli import main
from fastdata.core.errors import BadSampleWarning, CannotBatch
from tests.datagen import make_shards
from tests.videogen import frames_for, write_h264

QUICK = ["--seconds", "0.2", "--rounds", "1", "-o", "index_cache=false", "-o", "clip_len=8"]


@pytest.fixture(scope="module")
def short_among_videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("videos")
    write_h264(folder / "a.mp4", frames_for(0, 24))
    write_h264(folder / "short.mp4", frames_for(1, 5))  # fewer frames than one clip of 8
    return folder


def test_bench_on_a_video_shorter_than_a_clip_names_dash_o_on_error_skip(
    short_among_videos: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", str(short_among_videos), "--workers", "0", *QUICK]) == 2
    err = capsys.readouterr().err
    assert "short.mp4: 5 frames" in err and "-o on_error=skip" in err


def test_bench_says_each_skip_once_per_run_not_once_per_point(
    short_among_videos: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rc = main(["bench", str(short_among_videos), "--workers", "0,1", *QUICK, "-o", "on_error=skip"])
    assert rc == 0, capsys.readouterr().err
    skips = [w for w in seen if issubclass(w.category, BadSampleWarning) and "short.mp4" in str(w.message)]
    assert len(skips) == 1, [str(w.message) for w in skips]  # 3 opens (the check, 2 points): said once


def test_bench_names_dash_o_fields_for_a_missing_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("obs", data=np.zeros((8, 4), np.float32))
        f.create_dataset("label", data=np.arange(8))
    assert main(["bench", str(tmp_path / "d.h5"), "--workers", "0", "--seconds", "0.2", "-o", "fields=obs,x"]) == 2
    err = capsys.readouterr().err
    assert "no field 'x'" in err and "-o fields=" in err
    # a tar sample without the field (read in the sweep): the point's error names -o 'fields={...}'
    shard = make_shards(tmp_path / "shards", shards=1, per_shard=8, jpeg=True)[0]
    fields = '{"image": "png", "label": "cls"}'
    assert main(["bench", shard, "--workers", "0", "--seconds", "0.2", "-o", f"fields={fields}"]) == 1
    out = " ".join(capsys.readouterr().out.split())  # as one line, wherever the console wrapped it
    assert "has none of .png for field 'image'" in out and '-o \'fields={"image": "png;..."}\'' in out


def test_a_ragged_hdf5_field_batched_by_torch_names_collate_fn_ds_collate(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from fastdata.loading.transport import checked_default_collate

    with h5py.File(tmp_path / "r.h5", "w") as f:
        rows = f.create_dataset("obs", (4,), dtype=h5py.vlen_dtype(np.float32))
        for i in range(4):
            rows[i] = np.arange(i + 1, dtype=np.float32)
        f.create_dataset("label", data=np.arange(4))
    ds = fd.HDF5Dataset(str(tmp_path / "r.h5"), fields=("obs", "label"))
    with pytest.raises(CannotBatch, match=r"key 'obs'.*variable-length field.*collate_fn=ds\.collate") as e:
        next(iter(DataLoader(ds, batch_size=4, collate_fn=checked_default_collate)))
    assert "images" not in str(e.value) and "decode=" not in str(e.value)
    batch = next(iter(DataLoader(ds, batch_size=4, collate_fn=ds.collate)))  # the fix it names works
    assert [len(r) for r in batch["obs"]] == [1, 2, 3, 4]


def test_a_skip_warning_does_not_advise_on_error_skip(tmp_path: Path) -> None:
    good = write_h264(tmp_path / "a.mp4", frames_for(0, 12))
    (tmp_path / "b.mp4").write_bytes(b"not a video at all" * 64)
    with pytest.warns(BadSampleWarning) as seen:
        ds = fd.VideoClipDataset([good, str(tmp_path / "b.mp4")], clip_len=4, on_error="skip", index_cache=False)
    assert ds.skipped == 1
    text = " ".join(str(w.message) for w in seen if issubclass(w.category, BadSampleWarning))
    assert "b.mp4" in text and "cannot open it as a video" in text and "check it with ffprobe" in text
    assert "pass on_error='skip'" not in text
