"""The handle bound: a worker never holds more than ``max_open`` shards open (file descriptors or
memory maps, counted from inside the worker), and a run over more shards than ``ulimit -n`` allows
reads every sample."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.process._handles import open_files
from tests.datagen import make_shards

ROOT = Path(__file__).resolve().parents[1]


def open_shards(folder: str) -> tuple[int, int]:
    """(file descriptors, memory maps) of the ``.tar`` files in ``folder`` open in this process now.

    Only this test's folder counts: a forked worker also inherits the maps of shards that other tests'
    datasets left open in the parent process, which are not this dataset's handles.
    """

    def ours(path: str) -> bool:
        return path.startswith(folder) and path.endswith(".tar")

    fds = sum(n for path, n in open_files(folder).items() if ours(path))
    with open("/proc/self/maps") as f:
        maps = {line.split(maxsplit=5)[-1].strip() for line in f if ours(line.split(maxsplit=5)[-1].strip())}
    return fds, len(maps)


def note_open_shards(sample: dict) -> tuple[str, int, int]:
    return (sample["__key__"], *open_shards(os.path.dirname(sample["__url__"])))


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("many"), shards=12, per_shard=5, seed=2)


@pytest.mark.parametrize("kind", ["iterable", "map"])
def test_a_worker_never_holds_more_than_max_open_shards(many: list[str], kind: str) -> None:
    max_open = 3
    if kind == "iterable":
        ds = fd.TarShardDataset(many, shuffle=True, shuffle_window=60, transform=note_open_shards, max_open=max_open)
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        seen = list(loader)
    else:
        ids = fd.IndexedTarDataset(many, transform=note_open_shards, max_open=max_open)
        loader = DataLoader(
            ids,
            batch_size=6,
            sampler=ids.sampler(shuffle=True),
            num_workers=2,
            multiprocessing_context="fork",
            collate_fn=list,
        )
        seen = [s for batch in loader for s in batch]
    assert len(seen) == 60
    most_fds = max(s[1] for s in seen)
    most_maps = max(s[2] for s in seen)
    # shuffled reads touch all 12 shards in each worker; the LRU keeps at most 3 of them open
    assert most_maps == max_open and most_fds <= max_open


@pytest.mark.slow
def test_more_shards_than_the_descriptor_limit(tmp_path: Path) -> None:
    shards = make_shards(tmp_path, shards=150, per_shard=2, seed=4)  # no manifest: every shard is scanned
    script = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        from torch.utils.data import DataLoader
        import fastdata as fd
        ds = fd.TarShardDataset({str(tmp_path)!r} + "/train-{{000000..000149}}.tar", shuffle=True)
        keys = [s["__key__"] for s in DataLoader(ds, batch_size=None, num_workers=2)]
        ids = fd.IndexedTarDataset({str(tmp_path)!r} + "/train-{{000000..000149}}.tar")
        batches = DataLoader(ids, batch_size=10, sampler=ids.sampler(), num_workers=2, collate_fn=list)
        print(len(keys), len(set(keys)), sum(len(b) for b in batches), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    """)
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["300", "300", "300", "64"] and len(shards) == 150 > 64
