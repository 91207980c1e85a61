"""A local shard truncated or rewritten in place while it is read (``cp new.tar shard.tar`` over a shard in
use, ``rsync --inplace``, a writer on a full disk) raises ``SourceChanged`` naming the shard, at 0 workers
and in DataLoader workers, instead of killing the process with SIGBUS (its mapped pages gone).

The loader runs in a child process: before the fix the child died of SIGBUS, which would take pytest with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fastdata.core.errors import SourceChanged
from fastdata.storage import open_reader
from tests.datagen import write_tar

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[1])
    import fastdata as fd

    shard, workers = sys.argv[2], int(sys.argv[3])
    with fd.Loader(fd.TarShardDataset([shard], batch_size=8), num_workers=workers,
                   multiprocessing_context="fork") as loader:
        for i, batch in enumerate(loader):
            if i == 1:  # as `cp` does: truncate, then write the new (here shorter) file
                with open(shard, "r+b") as f:
                    f.truncate(0)
                    f.write(bytes(100_000))
    print("READ TO THE END")
    """
)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_truncated_while_read_raises_an_error_naming_it(tmp_path: Path, workers: int) -> None:
    shard = tmp_path / "shard-000.tar"
    write_tar(str(shard), [{"__key__": f"{i:04d}", "bin": bytes([i % 256]) * 20_000} for i in range(400)])
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    done = subprocess.run(
        [sys.executable, str(child), str(ROOT), str(shard), str(workers)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != -signal.SIGBUS, "the reader died of SIGBUS"
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("fastdata.core.errors.SourceChanged: " + str(shard)), done.stderr[-3000:]
    assert "shrank while it was being read" in last and "mv" in last


def test_a_file_rewritten_in_place_with_the_same_size_is_not_read_as_the_one_mapped(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(100))
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    with open_reader(str(path)) as reader:
        assert reader.read(0, 4) == bytes(4)
        path.write_bytes(b"x" * 100)  # in place: the same file, new bytes, a new mtime
        with pytest.raises(SourceChanged, match=r"f\.bin: the file was rewritten while it was being read"):
            reader.read_ranges([(0, 4)])
