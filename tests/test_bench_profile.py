"""``fastdata bench --profile``: py-spy records the main process and its workers; stacks grouped by stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastdata.bench._profile import parse_raw, record, stage_of, summarise
from fastdata.bench._result import Config
from fastdata.bench._synthetic import CPUDataset
from fastdata.core.errors import ConfigError

RAW = (
    'process 10:"python train.py";thread (10): MainThread;<module> (train.py:9);'
    "_MultiProcessingDataLoaderIter._next_data (torch/utils/data/dataloader.py:1505);"
    "Queue.get (multiprocessing/queues.py:103) 70\n"
    'process 10:"python train.py";thread (10): MainThread;<module> (train.py:9);'
    "rebuild_storage_fd (torch/multiprocessing/reductions.py:507) 30\n"
    'process 11:"python train.py";thread (11): MainThread;_worker_loop (torch/utils/data/_utils/worker.py:349);'
    "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:52);__getitem__ (data.py:12);"
    "Image.load (PIL/ImageFile.py:300) 90\n"
    'process 11:"python train.py";thread (11): MainThread;_worker_loop (torch/utils/data/_utils/worker.py:349);'
    "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:52);__getitem__ (data.py:12);"
    "S3Reader.read (fastdata/storage/s3/_reader.py:88) 10\n"
)


def test_stacks_are_grouped_by_process_and_stage() -> None:
    stacks = parse_raw(RAW)
    assert [s.pid for s in stacks] == [10, 10, 11, 11]
    main, workers = summarise(stacks, main_pid=10)
    assert main.stages == {"queue.get": 70, "unpickle": 30}
    # the DataLoader's own fetcher is plumbing: the stage is where the dataset's time goes
    assert workers.stages == {"decode": 90, "fetch": 10}
    assert stage_of(["_worker_loop (torch/utils/data/_utils/worker.py:349)"]) == "other"
    assert stage_of(["<module> (x.py:1)", "record (fastdata/bench/_profile.py:241)"]) == "step"
    assert "decode 90%" in workers.lines()[0]


@pytest.mark.slow
def test_a_profile_records_the_workers_and_writes_a_flame_graph(tmp_path: Path) -> None:
    prof = record(lambda: CPUDataset(n=10_000, iterations=20_000), Config(1, 2, False, False, 8), tmp_path, seconds=2)
    assert prof.workers.samples > 50 and prof.main.samples > 50
    # pure-Python work, which no stage names: "other" (under load the workers also wait in queue.get)
    assert prof.workers.stages["other"] > 0.1 * prof.workers.samples
    assert any("spin" in frame for frame in prof.workers.leaves)  # the dataset's own loop is the top frame
    assert prof.main.stages["queue.get"] > 0  # the main process waits for the worker
    svg = prof.svg.read_text()
    assert svg.startswith("<svg") and "spin" in svg


def test_a_missing_py_spy_is_said_with_the_install_hint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"pip install 'fastdata\[profile\]'"):
        record(lambda: CPUDataset(n=10), Config(0, batch_size=2), tmp_path, py_spy=str(tmp_path / "no-py-spy"))


def test_profile_without_py_spy_fails_before_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fastdata.cli import main
    from tests.datagen import make_shards

    shards = make_shards(tmp_path / "shards", shards=2, per_shard=8, jpeg=True)
    # no py-spy beside this Python, none on PATH: as in an environment without fastdata[profile]
    monkeypatch.setattr("sys.executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    out = tmp_path / "out.json"
    argv = ["bench", shards[0], "--workers", "0", "--quick", "--json", str(out), "--profile", str(tmp_path / "p")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--profile needs py-spy, which is not installed: pip install 'fastdata[profile]'" in err
    assert not out.exists()  # nothing was measured
    assert main(["bench", "--demo", "--profile", str(tmp_path / "p")]) == 2
    assert "give a SPEC, not --demo" in capsys.readouterr().err
