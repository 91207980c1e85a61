"""A user's own photos work the first time: a folder of JPEG/PNG files of many sizes (a few grayscale),
converted by ``fastdata convert``, batches when asked to resize (``fd.Decoder(..., size=...)``) and
otherwise stops at the first batch with :class:`~fastdata.core.errors.CannotBatch` naming the key, the
samples and the fixes, through the main process, worker processes and the shared-memory slots alike.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import CannotBatch
from tests.photogen import convert_photos

FIXES = ("size=(224, 224)", "transform=", "collate_fn=")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    """12 photos of 200-600 px (every 5th grayscale, every 4th a PNG) in 2 shards, manifest beside them."""
    root = tmp_path_factory.mktemp("photos")
    return convert_photos(root / "photos", root / "shards", shards=2, count=12)


def _all(loader: object) -> list[dict]:
    return list(loader)  # type: ignore[call-overload]


@pytest.mark.parametrize("workers", [0, 2])
def test_photos_of_different_sizes_stop_at_the_first_batch_with_the_fixes(shards: str, workers: int) -> None:
    ds = fd.TarShardDataset(shards, batch_size=4, decode="torch")
    with pytest.raises(CannotBatch) as caught, fd.Loader(ds, num_workers=workers) as loader:
        _all(loader)
    message = str(caught.value)
    assert "cannot batch key 'jpg'" in message and "shape [3, " in message
    assert "class_" in message and ".tar" in message  # the samples and the shard they come from
    assert all(fix in message for fix in FIXES), message


def test_resizing_as_they_are_decoded_batches_every_photo_once(shards: str) -> None:
    ds = fd.TarShardDataset(shards, batch_size=4, decode=fd.Decoder("torch", size=(48, 64)))
    with fd.Loader(ds, num_workers=2) as loader:
        batches = _all(loader)
    assert [tuple(b["jpg"].shape) for b in batches if "jpg" in b]  # JPEGs and PNGs come in their own keys
    images = [b[k] for b in batches for k in ("jpg", "png") if k in b]
    assert all(t.dtype == torch.uint8 and tuple(t.shape[1:]) == (3, 48, 64) for t in images)
    keys = [k for b in batches for k in b["__key__"]]
    assert len(keys) == len(set(keys)) == 12


@pytest.mark.parametrize("workers", [0, 2])
def test_map_style_photos_name_the_cause_in_the_main_process_and_through_worker_slots(
    shards: str, workers: int
) -> None:
    ds = fd.IndexedTarDataset(shards, decode="torch")
    with (
        pytest.raises(CannotBatch, match=r"cannot batch key '(jpg|png)'"),
        fd.Loader(ds, batch_size=4, num_workers=workers) as loader,
    ):
        _all(loader)
    # a plain DataLoader built the fastdata way says the same (torch's own default_collate would not)
    from fastdata.loading import ReadPlan, build_dataloader

    with pytest.raises(CannotBatch, match=r"cannot batch key '(jpg|png)'"):
        _all(build_dataloader(ds, ReadPlan(batch_size=4)))


def test_pil_images_do_not_batch_and_the_error_says_what_does(shards: str) -> None:
    ds = fd.TarShardDataset(shards, batch_size=4, decode="pil")
    with pytest.raises(CannotBatch, match=r"holds PIL images.*decode='torch'"):
        next(iter(DataLoader(ds, batch_size=None, collate_fn=fd.as_is)))


def test_a_collate_fn_of_the_users_batches_them_as_they_are(shards: str) -> None:
    ds = fd.TarShardDataset(shards, batch_size=4, decode="torch", collate_fn=list)
    sizes = {tuple(s["jpg"].shape) for b in ds for s in b if "jpg" in s}
    assert len(sizes) > 1  # really of different sizes


def test_numpy_decode_with_a_size_batches_without_torchs_read_only_warning(shards: str) -> None:
    # torch warns once per process: a fresh one, warnings as errors
    script = (
        "import fastdata as fd\n"
        f"ds = fd.TarShardDataset({shards!r}, batch_size=4, decode=fd.Decoder('numpy', size=(32, 32)))\n"
        "shapes = {tuple(b[k].shape) for b in fd.Loader(ds) for k in ('jpg', 'png') if k in b}\n"
        "with fd.Loader(ds, num_workers=2) as loader:\n"
        "    shapes |= {tuple(b[k].shape) for b in loader for k in ('jpg', 'png') if k in b}\n"
        "print(sorted(shapes))\n"
    )
    run = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "not writable" not in run.stderr
    assert "32, 32, 3)" in run.stdout


def test_the_readme_example_runs_on_a_photo_folder_with_size(shards: str, tmp_path: Path) -> None:
    # README "A minute of use", on the converted folder as written there
    ds = fd.TarShardDataset(shards, shuffle=True, seed=0, batch_size=4, decode=fd.Decoder("torch", size=(224, 224)))
    loader = fd.Loader(ds, batch_size=4, num_workers=2)
    seen = 0
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            seen += len(batch["__key__"])
    loader.close()
    assert seen == 24


def test_bench_on_photo_shards_measures_a_pipeline_that_batches_and_says_which(
    shards: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from fastdata.cli import main

    out = tmp_path / "bench.json"
    argv = ["bench", shards, "--workers", "0", "--quick", "--batch-size", "4", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out.replace("\n", " ")
    assert "measured: decode='torch' at size=(224, 224) (the images differ in size" in printed
    result = json.loads(out.read_text())
    settings = result["result"]["settings"]
    assert settings["decode"].startswith("decode='torch' at size=(224, 224)")
    assert main([*argv[:-2], "-o", "decode=torch"]) == 2  # asked for as stored: cannot batch, said at once
    assert "the images differ in size" in capsys.readouterr().err
    assert main([*argv[:-2], "-o", "size=32x48"]) == 0
    assert "measured: decode='torch' at size=(32, 48) (-o size)" in capsys.readouterr().out.replace("\n", " ")
