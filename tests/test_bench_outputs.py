"""``fastdata bench``'s output paths (``--json``, ``--plot``, ``--profile``) are checked before any work:
a path that cannot be written fails at once with one line naming it, never after the whole sweep."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from fastdata.bench._command import check_outputs
from fastdata.cli import main

MARK = "FASTDATA_TEST_BENCH_FACTORY_MARK"
SPEC = "tests.test_bench_outputs:recording_dataset"
FAST = ["--workers", "0", "--seconds", "0.2", "--batch-size", "8"]


def recording_dataset() -> TensorDataset:
    """The factory the CLI is given: it leaves a mark, so a test sees whether any work started."""
    Path(os.environ[MARK]).touch()
    return TensorDataset(torch.zeros(32, 2))


@pytest.fixture
def mark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "factory-was-called"
    monkeypatch.setenv(MARK, str(path))
    return path


def bad_paths(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (an output path that cannot be written, what the message must say)."""
    regular = tmp_path / "a-file"
    regular.write_text("not a folder")
    return {
        "in a file": (str(regular / "out.json"), r"a-file is a file, not a folder"),
        "under a file": (str(regular / "deeper" / "out.json"), r"Not a directory"),
        "under /proc": ("/proc/fastdata-nowhere/out.json", r"cannot create or write the folder /proc/fastdata-nowhere"),
    }


@pytest.mark.parametrize("where", ["in a file", "under a file", "under /proc"])
@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_an_unwritable_output_fails_before_the_dataset_is_made(
    flag: str, where: str, tmp_path: Path, mark: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, said = bad_paths(tmp_path)[where]
    assert main(["bench", SPEC, *FAST, flag, path]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fastdata bench: error: {flag} {path}: ") and "\n" not in err
    assert re.search(said, err), err
    assert not mark.exists()  # the factory was never called: nothing was opened, no worker started


def test_a_profile_folder_that_cannot_be_made_fails_first(
    tmp_path: Path, mark: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = "/proc/fastdata-nowhere/prof"
    assert main(["bench", SPEC, *FAST, "--profile", folder]) == 2
    err = capsys.readouterr().err
    assert f"--profile {folder}: cannot create or write the folder {folder}" in err
    assert not mark.exists()


def test_an_existing_folder_given_as_the_json_file(
    tmp_path: Path, mark: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", SPEC, *FAST, "--json", str(tmp_path)]) == 2
    assert f"--json {tmp_path}: is a folder; give a file name in it" in capsys.readouterr().err
    assert not mark.exists()


def test_the_demo_checks_its_outputs_before_building_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep = tmp_path / "demo-data"
    bad = bad_paths(tmp_path)["under a file"][0]
    assert main(["bench", "--demo", "--quick", "--keep", str(keep), "--plot", bad]) == 2
    assert f"--plot {bad}: cannot create or write the folder" in capsys.readouterr().err
    assert not keep.exists()  # no backend's data was built


def test_missing_output_folders_are_created_before_the_sweep(tmp_path: Path) -> None:
    json_file = tmp_path / "new" / "deeper" / "b.json"
    profile = tmp_path / "prof"
    check_outputs(argparse.Namespace(json=str(json_file), plot=None, profile=str(profile)))
    assert json_file.parent.is_dir() and not json_file.exists() and not list(json_file.parent.iterdir())
    assert profile.is_dir() and not list(profile.iterdir())  # the write check leaves nothing behind
