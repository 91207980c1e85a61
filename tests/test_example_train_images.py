"""``examples/train_images.py``, the complete training script users start from, runs on a tiny photo
folder (JPEG and PNG of many sizes, a few grayscale): converted, augmented in the workers, monitored,
trained, checkpointed; cut mid-epoch and rerun, it resumes at the exact batch, so that the two runs
together train on the same batches, in the same order, as one that was never stopped."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.photogen import make_photo_folder

ROOT = Path(__file__).resolve().parents[1]


def _example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("train_images", ROOT / "examples" / "train_images.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_images"] = module  # its Augment pickles by module name into the workers
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_training_script_trains_checkpoints_and_resumes_exactly(tmp_path: Path) -> None:
    example = _example()
    make_photo_folder(tmp_path / "photos", count=20, classes=3, sizes=(40, 90))
    args = ["--epochs", "2", "--size", "16", "--batch-size", "4", "--checkpoint-every", "2", "--workers", "2"]
    whole = example.main([str(tmp_path / "photos"), str(tmp_path / "whole"), *args])
    assert not whole["stopped"] and whole["step"] == 10  # 2 epochs of 5 batches
    assert (tmp_path / "whole" / "model.pt").exists() and (tmp_path / "whole" / "shards" / "manifest.json").exists()
    keys = [k for step in whole["history"] for k in step["keys"]]
    assert (
        len(keys) == 40 and len(set(keys[:20])) == 20 and set(keys[:20]) == set(keys[20:])
    )  # each photo once an epoch
    assert keys[:20] != keys[20:]  # a new order in the second epoch

    cut = example.main([str(tmp_path / "photos"), str(tmp_path / "cut"), *args, "--stop-after", "4"])
    assert cut["stopped"] and cut["step"] == 4  # mid-epoch, right after the checkpoint of step 4
    resumed = example.main([str(tmp_path / "photos"), str(tmp_path / "cut"), *args])
    assert resumed["step"] == 10
    assert [s["keys"] for s in resumed["history"]] == [s["keys"] for s in whole["history"]]
