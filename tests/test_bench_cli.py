"""``fastdata bench`` on a tiny tar dataset, the backend registry, and ``fastdata bench --demo`` over every
backend (tar, HDF5, video, and S3 through the local server the demo starts and stops)."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from fastdata.bench import backends
from fastdata.bench._local_s3 import CREDENTIALS
from fastdata.cli import main
from tests.datagen import make_shards

FAST = ["--seconds", "0.5", "--batch-size", "8"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("shards"), shards=3, per_shard=40, jpeg=True)


def test_bench_a_shard_pattern_writes_json_and_plot(
    shards: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pattern = str(Path(shards[0]).parent / "train-{000000..000002}.tar")
    rc = main(
        [
            "bench",
            pattern,
            "--workers",
            "0,1",
            *FAST,
            "-o",
            "decode=torch",
            "--json",
            str(tmp_path / "b.json"),
            "--plot",
            str(tmp_path / "b.png"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    # the dataset-batched path by default (batches of --batch-size made in the worker), decoded
    assert "★" in out and "DataLoader(dataset, batch_size=None" in out and "collate_fn=fd.as_is" in out
    assert "batch_size=8) (decoded)" in out
    data = json.loads((tmp_path / "b.json").read_text())
    points = data["result"]["points"]
    # the grid; a start-up that cost 5% of an epoch adds its persistent variant (measured, not assumed)
    assert [p["config"]["num_workers"] for p in points if not p["config"]["persistent_workers"]] == [0, 1]
    assert all(p["error"] is None for p in points)
    # the tar backend reports its stages
    assert all(p["stage_ms"]["fetch"] is not None and p["stage_ms"]["decode"] is not None for p in points)
    assert data["result"]["settings"]["format"] == "tar"
    assert data["result"]["settings"]["options"] == {"decode": "torch", "batch_size": 8}
    assert data["result"]["settings"]["dataset_batch_size"] == 8
    assert data["recommendation"]["kwargs"]["batch_size"] is None
    assert data["recommendation"]["evidence"]
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_folder_of_shards_is_detected_as_tar(shards: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    folder = str(Path(shards[0]).parent)
    assert backends.detect(folder).name == "tar"
    assert main(["bench", folder, "--workers", "0", *FAST, "-o", "indexed=true", "--procs-per-node", "2"]) == 0
    out = capsys.readouterr().out
    assert "IndexedTarDataset" in out and "per rank" in out


def test_bad_invocations_fail_with_a_clear_message(
    shards: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench"]) == 2
    assert "give a SPEC" in capsys.readouterr().err
    assert main(["bench", str(tmp_path)]) == 2  # an empty folder: no format recognises it
    assert "holds no shards, HDF5 files or videos" in capsys.readouterr().err
    assert main(["bench", shards[0], "--format", "nosuch"]) == 2
    assert "'nosuch' is not one of" in capsys.readouterr().err
    assert main(["bench", shards[0], "-o", "bogus=1", *FAST]) == 2
    assert "unknown option(s) bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", shards[0], "--workers", "a,b"])
    assert "comma-separated integers" in capsys.readouterr().err


def test_the_registry_finds_every_backend_by_its_module() -> None:
    found = {b.name: b for b in backends.backends()}
    assert [b.name for b in backends.backends()] == ["tar", "hdf5", "video", "s3"]  # by detection priority
    for name, b in found.items():
        assert b.available and b.module == f"fastdata.bench.backends._{name}", b.error
    tar = found["tar"]
    assert tar.detect("data/train-{000000..000009}.tar") and tar.detect("x/*.tar")
    # shards on S3 are the s3 backend's (it takes the S3 options too)
    assert not tar.detect("s3://bucket/train-{000000..000009}.tar")
    assert not tar.detect("data/train.h5") and not tar.detect("s3://bucket/prefix/")


def test_demo_flags_need_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "data/x.tar", "--keep", "somewhere"]) == 2
    assert "go with --demo" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_builds_data_sweeps_and_summarises_every_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the README's command, with a quarter of the data, a small grid and short measurements
    rc = main(
        [
            "bench",
            "--demo",
            "--quick",
            "--workers",
            "0,1",
            "--seconds",
            "0.3",
            "--json",
            str(tmp_path / "demo.json"),
            "--keep",
            str(tmp_path / "data"),
        ]
    )
    captured = capsys.readouterr()
    out = captured.out
    assert rc == 0
    assert "recommended DataLoader settings per backend" in out
    data = json.loads((tmp_path / "demo.json").read_text())
    assert data["not_measured"] == {}
    assert set(data["backends"]) == {"tar", "hdf5", "video", "s3"}
    for name, batch in (("tar", None), ("hdf5", 256), ("video", 8), ("s3", 32)):
        # with workers, fd.Loader's code: the sweep measured its transport (slots), not the DataLoader's
        assert re.search(rf"{name}: (DataLoader|fd\.Loader)\(dataset, batch_size={batch}\b", " ".join(out.split())), out
        result = data["backends"][name]["result"]
        assert result["settings"]["transport"] == ["slots"]
        assert result["settings"]["demo"] is True and result["settings"]["format"] == name
        assert [p["config"]["num_workers"] for p in result["points"]][:2] == [0, 1]
        assert all(p["error"] is None for p in result["points"])
        assert all(p["stage_ms"]["fetch"] is not None for p in result["points"])  # every dataset reports fetch
    data_dir = tmp_path / "data"
    assert sorted(p.name for p in (data_dir / "tar").iterdir())[0] == "demo-000000.tar"
    assert (data_dir / "hdf5/demo.h5").is_file() and any((data_dir / "video/videos").glob("*.mp4"))
    # the S3 server's dummy credentials appear nowhere, and the server is gone
    assert CREDENTIALS["aws_secret_access_key"] not in out + captured.err + (tmp_path / "demo.json").read_text()
    config = data["backends"]["s3"]["result"]["settings"]["options"]["config"]
    port = int(re.search(r"endpoint_url='http://127\.0\.0\.1:(\d+)'", config).group(1))  # type: ignore[union-attr]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_raw_bytes_only_on_request_and_said(shards: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", shards[0], "--workers", "0", *FAST, "-o", "decode=raw", "-o", "batch_size=null"]) == 0
    out = capsys.readouterr().out
    assert "(raw bytes, not decoded: as asked)" in out
    assert "DataLoader(dataset, batch_size=8" in out  # per sample: the DataLoader batches


def test_off_a_terminal_the_table_is_not_cut_to_80_columns(
    shards: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", shards[0], "--workers", "0,1", *FAST]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) > 120
    assert "…" not in out  # no column squeezed into an ellipsis
    header = next(line for line in out.splitlines() if "samples/s" in line)
    assert "1st batch s" in header and "PSS MB main+w" in header


FACTORY_MODULE = """
import fastdata as fd

SHARDS = {shards!r}


def make():
    return fd.TarShardDataset(SHARDS, decode="numpy", batch_size=4), {{"num_workers": 7}}
"""


def test_a_module_factory_spec_benches_the_dataset_you_train_with(
    shards: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "my_training_data.py").write_text(FACTORY_MODULE.format(shards=shards))
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["bench", "my_training_data:make", "--workers", "0,1", "--seconds", "0.5", "--start-method", "spawn"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "TarShardDataset(3 shards" in out and "start method spawn" in out
    assert "num_workers were ignored" in out
    assert main(["bench", "my_training_data:nosuch"]) == 2
    assert "has no 'nosuch'" in capsys.readouterr().err


FAILING_MODULE = """
import torch
from torch.utils.data import Dataset


class Ragged(Dataset):
    # images of two sizes: the default collate cannot stack them
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.zeros(3, 8 + i % 2, 8)


def make():
    return Ragged()
"""


def test_a_configuration_that_fails_is_said_once_in_one_line_and_nothing_is_recommended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every configuration fails (in the main process and in workers, whose tracebacks torch puts in the
    error's message): one line per error below the table, the tracebacks in the JSON, no DataLoader(...)
    to paste, exit 1 (issue 23: ~30-line tracebacks inside the table's cells, 'DataLoader(dataset, )')."""
    (tmp_path / "ragged_data.py").write_text(FAILING_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["bench", "ragged_data:make", "--workers", "0,1", "--seconds", "0.5", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 1
    assert "Traceback" not in out and "DataLoader(dataset" not in out, out
    failed = [line for line in out.splitlines() if "failed:" in line]
    # each error once, in one line, with the configurations it stopped; a worker's error says where it happened,
    # however long its message (the batching error's advice is cut, the place is kept)
    assert any(line.startswith("0w failed: CannotBatch: cannot batch the samples") for line in failed), out
    assert any(
        line.startswith("1w pf2 slots failed: CannotBatch: cannot batch")
        and line.endswith("(in DataLoader worker process 0)")
        for line in failed
    ), out
    assert len(failed) == 2
    assert "Nothing is recommended" in out
    points = json.loads((tmp_path / "r.json").read_text())["result"]["points"]
    assert all(p["error"] and "\n" not in p["error"] for p in points)
    assert all("Traceback (most recent call last)" in p["traceback"] for p in points)
