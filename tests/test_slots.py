"""Reused batch slots (fastdata.loading.transport._slots, transport.SlotCollate) through real DataLoader workers:
batches equal default_collate's for every dtype and container, slots are reused once batches are dropped,
a kept batch is never overwritten (unless hold= says so), copy=True and bytes_as="packed", the CPU path
never touches CUDA, and a killed worker or an early stop neither hangs nor leaks /dev/shm."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from fastdata.loading import transport as slots
from fastdata.loading.transport import _slots
from fastdata.loading.transport._collate import SlotCollate, slot_dataloader
from fastdata.loading.transport._layout import PackedBytes

Pair = namedtuple("Pair", ["left", "right"])
ROOT = Path(__file__).resolve().parents[1]


class Rich(Dataset[Any]):
    """Samples whose every value is a function of the index, of many dtypes and containers."""

    def __init__(self, n: int = 48, image: tuple[int, ...] = (3, 16, 16)) -> None:
        self.n, self.image = n, image

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "image": torch.full(self.image, i % 251, dtype=torch.uint8),
            "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3)[:, ::2] + i,  # not contiguous
            "bf16": torch.full((4,), i, dtype=torch.bfloat16),
            "flag": torch.tensor(i % 2 == 0),  # 0-d bool
            "empty": torch.zeros((0, 3)),
            "np16": np.full(5, -i, np.int16),
            "blob": bytes([i % 256]) * (1500 + 10 * i),
            "tiny": b"x" * (i % 7),
            "key": f"s{i:04d}",
            "label": i,
            "pair": Pair(torch.tensor([i, i]), (f"a{i}", float(i))),
            "pid": os.getpid(),
        }


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and not isinstance(b, PackedBytes):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def expected(ds: Dataset[Any], indices: list[int]) -> Any:
    return {k: v for k, v in default_collate([ds[i] for i in indices]).items() if k != "pid"}


def load(ds: Dataset[Any], collate: Any, workers: int = 2, context: str = "fork", **kw: Any) -> DataLoader[Any]:
    return DataLoader(
        ds,
        batch_size=8,
        num_workers=workers,
        collate_fn=collate,
        multiprocessing_context=context if workers else None,
        **kw,
    )


def without_pid(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in batch.items() if k != "pid"}


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_batches_equal_default_collate_for_every_dtype_and_container(context: str) -> None:
    ds = Rich()
    slots.reset_counts()
    got = [without_pid(b) for b in load(ds, SlotCollate(), context=context)]
    want = [expected(ds, list(range(lo, lo + 8))) for lo in range(0, len(ds), 8)]
    assert len(got) == len(want) and all(same(w, g) for w, g in zip(want, got))
    assert slots.stats()["slots"] == len(want) and slots.stats()["pipe"] == 0


def test_the_main_process_collates_as_before() -> None:
    ds = Rich(16)
    got = list(load(ds, SlotCollate(), workers=0))
    assert all(same(expected(ds, list(range(lo, lo + 8))), without_pid(b)) for lo, b in zip((0, 8), got))


def test_slots_are_reused_once_batches_are_dropped() -> None:
    ds = Rich(400)
    slots.release(everything=True)
    slots.reset_counts()
    for count, batch in enumerate(load(ds, SlotCollate(slots=5), persistent_workers=False)):
        assert int(batch["label"][0]) == count * 8
    st = slots.stats()
    # 50 batches from 2 workers through at most 5 slots each: every slot was written over many times
    assert st["slots"] == 50 and st["pipe"] == 0 and st["mapped_slots"] <= 10


def test_a_kept_batch_is_never_overwritten() -> None:
    ds = Rich(240)
    slots.reset_counts()
    kept: list[tuple[int, dict[str, Any]]] = []
    for j, batch in enumerate(load(ds, SlotCollate(slots=3))):
        if j % 4 == 0:
            kept.append((j, batch))  # holds every view of the batch's slot
    for j, batch in kept:
        assert same(expected(ds, list(range(8 * j, 8 * j + 8))), without_pid(batch)), f"batch {j} changed"
    st = slots.stats()
    assert st["slots"] + st["pipe"] == 30 and st["slots"] > 6  # 2 x 3 slots, reused around the kept ones


def test_hold_frees_a_kept_batch_slot_after_that_many_batches() -> None:
    ds = Rich(160)
    slots.reset_counts()
    kept = list(load(ds, SlotCollate(slots=2, wait_s=0.01)))  # keeps every batch: slots run out
    assert slots.stats()["pipe"] > 0
    slots.reset_counts()
    kept = list(load(ds, SlotCollate(slots=4, hold=1)))  # documented: older batches may be overwritten
    assert slots.stats()["pipe"] == 0 and len(kept) == 20


def test_copy_hands_out_private_batches_and_frees_slots_at_once() -> None:
    ds = Rich(160)
    slots.reset_counts()
    kept = list(load(ds, SlotCollate(slots=2, copy=True)))
    assert slots.stats()["pipe"] == 0
    assert all(same(expected(ds, list(range(8 * j, 8 * j + 8))), without_pid(b)) for j, b in enumerate(kept))


@pytest.mark.parametrize("workers", [2, 0])
def test_packed_bytes_are_views_that_hold_their_slot(workers: int) -> None:
    ds = Rich(96)
    kept = []
    # 3 slots and 10 ms: under load some batches take the pipe, and must give PackedBytes all the same
    for j, batch in enumerate(load(ds, SlotCollate(slots=3, bytes_as="packed", wait_s=0.01), workers)):
        blob = batch["blob"]
        want = [ds[8 * j + k]["blob"] for k in range(8)]
        assert isinstance(blob, PackedBytes) and blob == want and blob.tolist() == want
        assert isinstance(blob[0], memoryview) and blob[0].readonly
        assert [len(v) for v in blob] == torch.diff(blob.offsets).tolist() == [len(v) for v in want]
        assert bytes(blob.data[int(blob.offsets[2]) : int(blob.offsets[3])].numpy()) == want[2]
        if j % 3 == 0:
            kept.append((j, blob))  # the bytes alone hold the slot
        del batch, blob
    for j, blob in kept:
        assert blob.tolist() == [ds[8 * j + k]["blob"] for k in range(8)]


def test_the_cpu_path_never_touches_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cuda(*args: Any) -> Any:
        raise AssertionError("CUDA touched on the CPU path")

    monkeypatch.setattr(torch.cuda, "is_available", no_cuda)
    monkeypatch.setattr(torch.cuda, "cudart", no_cuda)
    monkeypatch.setattr(torch.cuda, "Event", no_cuda)
    assert len(list(load(Rich(32), SlotCollate()))) == 4


def test_pin_registers_slots_where_cuda_is() -> None:
    slots.release(everything=True)
    ds = Rich(32)
    if torch.cuda.is_available():
        batches = list(slot_dataloader(ds, batch_size=8, num_workers=2, pin_memory=True))
        assert slots.stats()["pinned_bytes"] > 0 and all(b["image"].is_pinned() for b in batches)
    else:
        with pytest.warns(RuntimeWarning, match="CUDA is not available"):
            batches = list(load(ds, SlotCollate(pin=True)))
        assert slots.stats()["pinned_bytes"] == 0 and len(batches) == 4


def test_slot_dataloader_wraps_the_collate_and_passes_batches_through() -> None:
    ds = Rich(32)
    loader = slot_dataloader(ds, batch_size=8, num_workers=2, collate_fn=direct)  # a list of sample dicts
    assert isinstance(loader.collate_fn, SlotCollate) and loader.collate_fn.collate_fn is direct
    slots.reset_counts()
    got = list(loader)
    assert len(got) == 4 and slots.stats()["slots"] == 4
    assert torch.equal(got[1][0]["image"], ds[8]["image"]) and got[1][0]["blob"] == ds[8]["blob"]
    assert not isinstance(slot_dataloader(ds, batch_size=8).collate_fn, SlotCollate)  # no workers: plain


# A killed worker and an early stop, each in a fresh interpreter under a timeout: a hang fails the test
# instead of stalling the suite, and the interpreter's exit shows that nothing waits on the dead worker.
_SCRIPT = """
import os, signal, sys
sys.path.insert(0, {root!r})
from tests.test_slots import Rich, load, expected, without_pid, same
from fastdata.loading import transport as slots
from fastdata.loading.transport._collate import SlotCollate


def main(mode, context):
    ds = Rich(400, image=(3, 64, 64))
    it = iter(load(ds, SlotCollate(), context=context, timeout=60))
    first = next(it)
    pids = sorted({{int(p) for p in first["pid"]}} | {{w.pid for w in it._workers}}) + [os.getpid()]
    print("PIDS", *pids, flush=True)
    if mode == "kill":
        # without the DataLoader's SIGCHLD handler, which raises at any bytecode (even in an except
        # clause), it must find the dead worker by itself: its liveness check or the failed fd fetch
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.kill(pids[0], signal.SIGKILL)
        try:
            for batch in it:
                pass
            print("NO ERROR")
        except (RuntimeError, EOFError, OSError) as e:  # the DataLoader's, or torch's fd fetch from the dead
            print("WORKER ERROR", type(e).__name__, flush=True)
    else:
        next(it)
    del it  # stop early: the DataLoader shuts its workers down
    assert same(expected(ds, list(range(8))), without_pid(first)), "the batch received first changed"
    slots.release()
    print("RINGS", slots.stats()["rings"], flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
"""


@pytest.mark.parametrize(("mode", "context"), [("kill", "fork"), pytest.param("stop", "spawn", marks=pytest.mark.slow)])
def test_a_killed_worker_or_an_early_stop_neither_hangs_nor_leaks_shared_memory(
    mode: str, context: str, tmp_path: Path
) -> None:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(_SCRIPT.format(root=str(ROOT))))
    before = set(os.listdir("/dev/shm"))
    done = subprocess.run(
        [sys.executable, str(script), mode, context], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    pids = next(line.split()[1:] for line in lines if line.startswith("PIDS"))
    if mode == "kill":
        assert any(line.startswith("WORKER ERROR") for line in lines), done.stdout
    assert "RINGS 0" in lines, done.stdout  # the main process let go of the exited workers' slots
    # torch names shared memory after the creating process; none of ours may outlive the run
    left = [n for n in set(os.listdir("/dev/shm")) - before if any(f"_{p}_" in n for p in pids)]
    assert not left, left


class Columns(Dataset[Any]):
    """A dataset that reads whole batches into arrays from a pool, as HDF5Dataset does."""

    def __init__(self, pool: Any, n: int = 160) -> None:
        self.pool, self.n = pool, n

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        image = self.pool.empty((len(indices), 3, 32, 32), np.uint8)
        image[:] = np.asarray(indices, dtype=np.uint8)[:, None, None, None]
        label = self.pool.empty((len(indices),), np.int64)
        label[:] = indices
        ring = _slots._current  # whether the pool handed out memory of a reserved slot
        reserved = ring is not None and ring._arena is not None
        return {"image": torch.from_numpy(image), "label": torch.from_numpy(label), "reserved": reserved}


def direct(batch: dict[str, Any]) -> dict[str, Any]:
    return batch  # the batch is collated already (by __getitems__)


def test_a_slot_pool_lets_the_dataset_read_straight_into_the_next_slot() -> None:
    from fastdata.loading.transport._slots import SlotPool

    slots.reset_counts()
    ds = Columns(SlotPool())
    got = list(load(ds, SlotCollate(direct, slots=12), persistent_workers=False))  # 10 per worker, all kept
    assert len(got) == 20 and slots.stats()["slots"] == 20
    assert sum(b["reserved"] for b in got) == 18  # all but each worker's first batch, which sizes the slots
    for j, b in enumerate(got):  # all kept: the batches written in place were not overwritten
        want = torch.arange(8 * j, 8 * j + 8)
        assert torch.equal(b["label"], want) and torch.equal(b["image"][:, 0, 0, 0], want.to(torch.uint8))
    # in place: the worker's arrays lay in the slot, so packing wrote nothing for them
    from fastdata.loading.transport import _layout as slot_layout
    from fastdata.loading.transport._slots import WorkerRing

    ring = WorkerRing(2, 1 << 20)
    ring.pack({"x": torch.zeros(1000)}, 0.0, ("bytes", False, False, None))  # sizes the slots
    image = torch.from_numpy(np.frombuffer(ring.reserve(4000, 0.0), np.float32))  # type: ignore[arg-type]
    arena = ring._arena
    assert arena is not None
    p = slot_layout.plan({"x": image}, (arena[1].tensor.data_ptr(), arena[1].nbytes, arena[2]))
    assert p.writes == [] and p.skeleton["x"].offset == 0


def test_packed_bytes_also_come_from_batches_that_took_the_pipe() -> None:
    ds = Rich(64)
    slots.reset_counts()
    kept = list(load(ds, SlotCollate(slots=1, bytes_as="packed", wait_s=0.0)))  # all kept: 1 slot each
    assert slots.stats()["pipe"] >= 4
    for j, b in enumerate(kept):
        assert isinstance(b["blob"], PackedBytes) and b["blob"] == [ds[8 * j + k]["blob"] for k in range(8)]


def test_slot_collate_for_turns_default_collate_into_stacking_in_the_slot() -> None:
    from fastdata.loading.transport._collate import batch_as_is, slot_collate_for

    assert slot_collate_for(default_collate).collate_fn is None  # slot_default_collate in the worker
    assert slot_collate_for(None, prebatched=True).collate_fn is batch_as_is
    mine = SlotCollate(bytes_as="packed")
    assert slot_collate_for(mine) is mine
    assert slot_collate_for(mine, pin_memory=True).options.pin and not mine.options.pin
