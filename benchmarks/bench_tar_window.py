#!/usr/bin/env python3
"""TarShardDataset's shuffle window, per-sample mode against batched mode in one run: worker memory (PSS)
and the time to the first batch, decoding JPEGs to tensors through a DataLoader with workers.

* ``per_sample``: ``TarShardDataset(shuffle=True, decode="torch")``, the DataLoader batching
  (``batch_size=B``): the mode the harness uses, which decoded a whole shuffle window before yielding;
* ``batched``: ``TarShardDataset(shuffle=True, decode="torch", batch_size=B)`` read with
  ``batch_size=None``: the peer, which decodes one batch at a time.

The shards are the demo's (``fastdata.bench.backends._tar.write_demo_shards``: photo-like JPEGs with
labels), by default 4 x 1000 at 160x160. Each pass runs in a fresh forked process (its DataLoader's workers
forked from it); the workers' PSS is sampled after every batch and its peak kept (the largest worker).
Figures are medians of ``--repeats`` passes, the two modes taking turns; the ratio per_sample / batched is
the figure to read (both taken in one run).

    python benchmarks/bench_tar_window.py --json bench-out/tar_window.json
    python benchmarks/bench_tar_window.py --repeats 1 --batches 20   # a quick look
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import fastdata as fd  # noqa: E402
from fastdata.bench.backends._tar import write_demo_shards  # noqa: E402

FORK = multiprocessing.get_context("fork")


def pss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_full_info().pss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def one_pass(spec: str, mode: str, args: argparse.Namespace) -> dict[str, float]:
    """First-batch time and peak worker PSS of one pass (up to ``--batches`` batches)."""
    torch.set_num_threads(1)
    if mode == "batched":
        ds = fd.TarShardDataset(spec, shuffle=True, decode="torch", batch_size=args.batch_size, seed=args.seed)
        loader = DataLoader(ds, batch_size=None, collate_fn=fd.as_is, num_workers=args.workers)
    else:
        ds = fd.TarShardDataset(spec, shuffle=True, decode="torch", seed=args.seed)
        loader = DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    pids = [w.pid for w in it._workers]  # type: ignore[attr-defined]  # private, stable since torch 1.0
    peak = max(pss(p) for p in pids)
    n = 1
    for _ in it:
        peak = max(peak, *(pss(p) for p in pids))
        n += 1
        if n >= args.batches:
            break
    seconds = time.perf_counter() - t0
    del it
    return {"first_batch_s": first, "worker_pss_peak_mb": peak / 2**20, "batches": n, "seconds": seconds}


def _child(queue: Any, spec: str, mode: str, args: argparse.Namespace) -> None:
    try:
        queue.put(("ok", one_pass(spec, mode, args)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put(("error", f"{type(e).__name__}: {e}"))


def isolated(spec: str, mode: str, args: argparse.Namespace) -> dict[str, float]:
    queue = FORK.Queue()
    child = FORK.Process(target=_child, args=(queue, spec, mode, args))
    child.start()
    status, value = queue.get(timeout=600)
    child.join(30)
    if status != "ok":
        raise RuntimeError(value)
    return value  # type: ignore[no-any-return]


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "numpy", "pillow", "psutil"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--per-shard", type=int, default=1000)
    p.add_argument("--size", type=int, default=160, help="JPEG width and height, pixels (default 160)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=40, help="batches per pass (default 40)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, help="where the shards go (default: a temporary folder)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    folder = args.workdir or Path(tempfile.mkdtemp(prefix="bench-tar-window-"))
    spec = write_demo_shards(
        folder, shards=args.shards, per_shard=args.per_shard, size=(args.size, args.size), seed=args.seed
    )
    nbytes = sum(os.path.getsize(f) for f in folder.glob("*.tar"))
    window = getattr(fd.TarShardDataset(spec, shuffle=True), "window", 4096)
    print(
        f"{args.shards} shards x {args.per_shard} JPEGs {args.size}x{args.size}, {nbytes / 1e6:.1f} MB; window {window}"
    )
    runs: dict[str, list[dict[str, float]]] = {"per_sample": [], "batched": []}
    for _ in range(args.repeats):
        for mode in runs:
            runs[mode].append(isolated(spec, mode, args))
    results: dict[str, Any] = {}
    for mode, got in runs.items():
        results[mode] = {key: statistics.median(g[key] for g in got) for key in got[0]} | {"runs": got}
        r = results[mode]
        print(f"  {mode:>10}: first batch {r['first_batch_s']:.2f} s, worker PSS peak {r['worker_pss_peak_mb']:.0f} MB")
    summary = {
        "pss_per_sample_vs_batched": round(
            results["per_sample"]["worker_pss_peak_mb"] / results["batched"]["worker_pss_peak_mb"], 3
        ),
        "first_batch_per_sample_s": round(results["per_sample"]["first_batch_s"], 3),
        "first_batch_batched_s": round(results["batched"]["first_batch_s"], 3),
        "window": window,
    }
    print(json.dumps(summary, indent=2))
    report = {
        "benchmark": "bench_tar_window",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "versions": versions(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "shard_bytes": nbytes,
        "results": results,
        "summary": summary,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
