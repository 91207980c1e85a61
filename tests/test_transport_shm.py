"""A small /dev/shm (Docker's default is 64 MB): the slot transport falls back to the stock way instead of
dying with torch's "unable to allocate shared memory ... No space left on device", and says why; and when
even the stock way's shared memory runs out, the batch's tensors come through the pipe as bytes (never a
batch dropped by the queue's feeder thread, with the main process waiting for it forever).

Real exhaustion, no mocks: the loader runs in a child process in a mount namespace of its own
(``unshare -m``, as root: the tests run as root here and in CI) whose /dev/shm is a fresh 24 MB tmpfs.
Batches of 8 samples of 1 MiB need ~10 MB slots: two workers' slots cannot all fit (each worker keeps
several), while the stock transport (bytes pickled through the pipe) reads the epoch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from tests.datagen import write_tar

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import fastdata as fd
    from fastdata.loading.transport import stats

    shards = sys.argv[3:]
    keys = []
    with fd.Loader(fd.TarShardDataset(shards, batch_size=8), num_workers=2, transport=sys.argv[2],
                   multiprocessing_context="fork") as loader:
        for batch in loader:
            assert all(len(v) == 1 << 20 for v in batch["bin"])
            keys += batch["__key__"]
            del batch
    print("KEYS", ",".join(keys))
    print("STATS", stats()["slots"], stats()["pipe"])
    """
)


# tensors of 1.25 MB, batches of 10 MB, every batch kept: slots, then tensors shared the stock way, fill
# a 64 MB /dev/shm, and the later batches have nowhere in shared memory to go
TENSOR_CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import torch
    import fastdata as fd
    from fastdata.loading.transport import stats

    def as_tensor(sample):
        return {"x": torch.frombuffer(bytearray(sample["bin"]), dtype=torch.uint8), "k": sample["__key__"]}

    kept = []
    dataset = fd.TarShardDataset(sys.argv[3:], batch_size=8, transform=as_tensor)
    with fd.Loader(dataset, num_workers=2, transport=sys.argv[2], multiprocessing_context="fork") as loader:
        for batch in loader:
            assert batch["x"].shape == (8, 1_250_000)
            assert all(int(row[0]) == int(k.split("-")[1]) for row, k in zip(batch["x"], batch["k"]))
            kept.append(batch)
    print("KEYS", ",".join(k for b in kept for k in b["k"]))
    print("STATS", stats()["slots"], stats()["pipe"])
    """
)


def _run_with_small_shm(
    tmp_path: Path, transport: str, shards: list[str], *, child_text: str = CHILD, size_mb: int = 24
) -> subprocess.CompletedProcess[str]:
    child = tmp_path / "child.py"
    child.write_text(child_text)
    inner = " ".join([sys.executable, str(child), str(ROOT), transport, *shards])
    script = f"mount -t tmpfs -o size={size_mb}m tmpfs /dev/shm && df -k /dev/shm >&2 && exec {inner}"
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_slots_fall_back_to_the_stock_way_when_dev_shm_is_small(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    shards = []
    for s in range(2):
        shards.append(str(tmp_path / f"big-{s}.tar"))
        write_tar(shards[-1], [{"__key__": f"{s}-{i:02d}", "bin": rng.bytes(1 << 20)} for i in range(32)])
    expected = sorted(f"{s}-{i:02d}" for s in range(2) for i in range(32))
    for transport in ("stock", "slots"):
        # 6 MB: no 8 MB batch fits, so the fallback is certain (at 24 MB, whether one did depended on how
        # many batches were in flight: every one went through slots in one CI run)
        done = _run_with_small_shm(tmp_path, transport, shards, size_mb=6)
        assert done.returncode == 0, (transport, done.stderr[-3000:])
        assert " 6144 " in done.stderr  # the child really had a 6 MB /dev/shm
        keys = next(line for line in done.stdout.splitlines() if line.startswith("KEYS ")).split(" ", 1)[1]
        assert sorted(keys.split(",")) == expected, transport  # every sample once
        if transport == "slots":
            through_slots, through_pipe = map(int, done.stdout.rsplit("STATS ", 1)[1].split())
            assert through_pipe > 0 and through_slots + through_pipe == 8
            # each worker says what happened and what to do, once
            assert "/dev/shm is too small" in done.stderr and "--shm-size" in done.stderr
            assert "transport='stock'" in done.stderr
            assert "unable to allocate shared memory" not in done.stderr


def test_slots_send_tensors_through_the_pipe_when_dev_shm_is_full(tmp_path: Path) -> None:
    shards = []
    for s in range(2):
        shards.append(str(tmp_path / f"t-{s}.tar"))
        write_tar(shards[-1], [{"__key__": f"{s}-{i:02d}", "bin": bytes([i]) * 1_250_000} for i in range(32)])
    expected = sorted(f"{s}-{i:02d}" for s in range(2) for i in range(32))
    # before: the queue's feeder thread printed torch's "No space left on device" and dropped the batch;
    # the main process lost it (or waited for it forever)
    done = _run_with_small_shm(tmp_path, "slots", shards, child_text=TENSOR_CHILD, size_mb=64)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " 65536 " in done.stderr  # the child really had a 64 MB /dev/shm
    keys = next(line for line in done.stdout.splitlines() if line.startswith("KEYS ")).split(" ", 1)[1]
    assert sorted(keys.split(",")) == expected  # every sample once
    through_slots, through_pipe = map(int, done.stdout.rsplit("STATS ", 1)[1].split())
    assert through_pipe > 0 and through_slots + through_pipe == 8
    assert "Traceback" not in done.stderr
    assert "through the pipe as bytes" in done.stderr and "/dev/shm (67 MB" in done.stderr
    assert "--shm-size" in done.stderr and "transport='stock'" in done.stderr
