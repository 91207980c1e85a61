"""What ``fastdata bench`` and the monitor say, next to what a plain loop measures by hand, in one run (issue 35's
"done when"): for each configuration the bench's label, its recommended setting and the samples/s it predicts;
the monitor's label and advice inside a training loop at that setting; and a hand-timed loop over ``fd.Loader``
at the same setting (samples/s, and with a step the share of the time the loop waited for data).

Cases (small, seeded, made by the script in a temporary folder):

* ``hdf5``: a page-cached local gzip HDF5 file (64x64x3 images, chunks of 8 rows) read through
  ``fd.HDF5Dataset``: must not be labelled storage;
* ``video``: fastdata's demo videos (``fastdata bench --demo``'s, made with PyAV) read as 8-frame clips through
  ``fd.VideoClipDataset``;
* ``restarts``: the HDF5 file in a training loop with a 20 ms step and short epochs, in a process holding a
  model's worth of memory (``--parent-gb``, 1 GiB), workers started at every epoch (the default), then the same
  with ``persistent_workers=True``: the stall each way by hand, the monitor's
  label and whether it names persistent_workers=True, and the saving it claims against the saving measured.

    PYTHONPATH=. python benchmarks/advice_vs_hand.py --json benchmarks/results/advice_vs_hand.json

Add ``--busy-core`` to keep one core busy meanwhile (another program's load, as in the known-answer tests).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout: the tests' data makers

import torch

import fastdata as fd
from fastdata.loading.observe import Monitor
from tests.known_answers import busy_core, gzip_hdf5, videos

LOADER_KEYS = ("batch_size", "num_workers", "prefetch_factor", "persistent_workers", "pin_memory")


def setting(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The recommended DataLoader keyword arguments fd.Loader takes (no prefetch/persistence without workers)."""
    out = {k: kwargs[k] for k in LOADER_KEYS if k in kwargs}
    if not out.get("num_workers"):
        out.pop("prefetch_factor", None)
        out.pop("persistent_workers", None)
    return out


def hand(factory: Callable[[], Any], kw: dict[str, Any], *, epochs: int, step: float, seconds: float) -> dict[str, Any]:
    """A plain loop over fd.Loader: samples/s over the run, the share of it waiting in next(), epochs' first waits."""
    loader = fd.Loader(factory(), **kw)
    samples, wait, firsts, ends = 0, 0.0, [], []
    start = time.perf_counter()
    try:
        epoch = 0
        while epoch < epochs or (not epochs and time.perf_counter() - start < seconds):
            epoch += 1
            it = iter(loader)
            first = True
            while True:
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    ends.append(time.perf_counter() - t0)  # the pass's end: non-persistent workers shut down here
                    wait += ends[-1]
                    break
                dt = time.perf_counter() - t0
                wait += dt
                if first:
                    firsts.append(dt)
                    first = False
                samples += _count(batch)
                if step:
                    time.sleep(step)  # the training step (a GPU's): the workload
                if not epochs and time.perf_counter() - start >= seconds:
                    break
            del it
    finally:
        loader.close()
    total = time.perf_counter() - start
    return {
        "samples_per_s": samples / total,
        "stall": wait / total,
        "seconds": total,
        "wait_s": wait,
        "first_wait_s": sum(firsts),
        "end_wait_s": sum(ends),
        "epochs": len(firsts),
    }


def monitored(factory: Callable[[], Any], kw: dict[str, Any], *, epochs: int, step: float, seconds: float) -> dict:
    """The same loop under the monitor: its label, evidence and advice over the run."""
    loader = fd.Loader(factory(), monitor=Monitor(to=lambda s: None, seconds=3600), **kw)
    start = time.perf_counter()
    try:
        epoch = 0
        while epoch < epochs or (not epochs and time.perf_counter() - start < seconds):
            epoch += 1
            for _batch in loader:
                if step:
                    time.sleep(step)
                if not epochs and time.perf_counter() - start >= seconds:
                    break
        stats = loader.stats(since="start")
    finally:
        loader.close()
    assert stats is not None
    return {
        "label": stats.label,
        "evidence": stats.evidence,
        "advice": stats.advice,
        "stall": stats.window.stall,
        "wait_s": stats.window.wait_s,
        "seconds": stats.window.seconds,
        "samples_per_s": stats.window.samples_per_s,
        "names_persistent": any("persistent_workers=True" in a for a in stats.advice),
    }


def _count(batch: Any) -> int:
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    if isinstance(batch, (list, tuple)):
        batch = batch[0]
    return int(batch.shape[0]) if isinstance(batch, torch.Tensor) else 1


def bench(factory: Callable[[], Any], **grid: Any) -> dict[str, Any]:
    rec = fd.bench.recommend(fd.bench.sweep(factory, **grid))
    return {
        "label": rec.bottleneck,
        "kwargs": rec.kwargs,
        "predicted_samples_per_s": rec.point.samples_per_s if rec.point else None,
        "predicted_stall": rec.point.stall if rec.point else None,
        "diagnosis": rec.diagnosis,
    }


def run(folder: Path, seconds: float, parent_gb: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    h5 = gzip_hdf5(folder / "h5")
    root = videos(folder / "videos")
    index = str(folder / "video-index.json")
    timing = {"seconds": seconds, "window": 0.5, "warmup": 0.5}
    cases: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
        "hdf5": (lambda: fd.HDF5Dataset(h5), {"workers": [0, 1, 2], "batch_size": 32}),
        "video": (
            lambda: fd.VideoClipDataset(root, clip_len=8, frame_stride=2, clips_per_video=16, index_cache=index),
            {"workers": [0, 1, 2], "batch_size": 8},
        ),
    }
    for name, (factory, grid) in cases.items():
        b = bench(factory, **grid, **timing)
        kw = setting(b["kwargs"])
        out[name] = {
            "bench": b,
            "hand": hand(factory, kw, epochs=0, step=0.0, seconds=seconds),
            "monitor": monitored(factory, kw, epochs=0, step=0.0, seconds=seconds),
            "setting": kw,
        }
    # per-epoch restarts: the HDF5 file in epochs of 64 batches of 32, a 20 ms step, in a training process that
    # holds a model's worth of memory (fork copies its page tables at every epoch's start)
    model = bytearray(int(parent_gb * 2**30))
    model[::4096] = b"\x01" * len(model[::4096])  # touched: resident, as a model's weights are
    factory = cases["hdf5"][0]
    b = bench(factory, workers=[2], batch_size=32, step_time=0.02, persistent_workers=[False, True], **timing)
    restarts: dict[str, Any] = {"bench": b}
    for persistent in (False, True):
        kw = {"batch_size": 32, "num_workers": 2, "persistent_workers": persistent}
        key = "persistent" if persistent else "restarted"
        restarts[key] = {
            "hand": hand(factory, kw, epochs=4, step=0.02, seconds=0),
            "monitor": monitored(factory, kw, epochs=4, step=0.02, seconds=0),
        }
    del model
    restarts["wait_saved_s"] = restarts["restarted"]["hand"]["wait_s"] - restarts["persistent"]["hand"]["wait_s"]
    restarts["parent_gb"] = parent_gb
    out["restarts"] = restarts
    return out


def table(res: dict[str, Any]) -> str:
    rows = ["case | bench: label, setting, samples/s | monitor: label | by hand: samples/s, stall"]
    for name in ("hdf5", "video"):
        r = res[name]
        b, m, h = r["bench"], r["monitor"], r["hand"]
        rows.append(
            f"{name} | {b['label']}, {r['setting']}, {b['predicted_samples_per_s']:,.0f} | {m['label']} "
            f"({m['samples_per_s']:,.0f}/s) | {h['samples_per_s']:,.0f}/s"
        )
    r = res["restarts"]
    b = r["bench"]
    rows.append(
        f"restarts | bench {b['label']}, {setting(b['kwargs'])}, stall {b['predicted_stall'] or 0:.0%} | "
        f"monitor {r['restarted']['monitor']['label']}, names persistent_workers=True: "
        f"{r['restarted']['monitor']['names_persistent']} | by hand stall {r['restarted']['hand']['stall']:.0%} "
        f"restarted, {r['persistent']['hand']['stall']:.0%} persistent; first waits "
        f"{r['restarted']['hand']['first_wait_s']:.2f} s vs {r['persistent']['hand']['first_wait_s']:.2f} s over 4 "
        "epochs"
    )
    hr, hp = r["restarted"]["hand"], r["persistent"]["hand"]
    rows.append(
        f"by hand, persistent workers saved {r['wait_saved_s']:.2f} s of waiting over 4 epochs "
        f"({r['wait_saved_s'] / 3:.2f} s a restart): first batches {hr['first_wait_s']:.2f} -> "
        f"{hp['first_wait_s']:.2f} s, passes' ends {hr['end_wait_s']:.2f} -> {hp['end_wait_s']:.2f} s"
    )
    mr, mp = r["restarted"]["monitor"], r["persistent"]["monitor"]
    rows.append(
        f"under the monitor: stall {mr['stall']:.0%} restarted, {mp['stall']:.0%} persistent; waits "
        f"{mr['wait_s']:.2f} -> {mp['wait_s']:.2f} s ({(mr['wait_s'] - mp['wait_s']) / 3:.2f} s a restart)"
    )
    advice = [a for a in r["restarted"]["monitor"]["advice"] if "persistent_workers=True" in a]
    rows.append("monitor's claim: " + (advice[0] if advice else "(none)"))
    rows.append(f"monitor, persistent: {r['persistent']['monitor']['label']}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.5, help="each sweep point's and each hand loop's seconds")
    ap.add_argument("--parent-gb", type=float, default=1.0, help="memory the training process holds (a model)")
    ap.add_argument("--busy-core", action="store_true", help="keep one core busy meanwhile")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp, busy_core() if args.busy_core else nullcontext():
        res = run(Path(tmp), args.seconds, args.parent_gb)
    print(table(res))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "machine": platform.node(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "fastdata": getattr(fd, "__version__", "?"),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "busy_core": args.busy_core,
        }
        args.json.write_text(json.dumps({"meta": meta, "results": res}, indent=2, default=str))


if __name__ == "__main__":
    main()
