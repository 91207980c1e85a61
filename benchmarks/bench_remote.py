#!/usr/bin/env python3
"""Remote tar shards against the same shards on local disk, in one run: the bytes fetched from the store
per stored byte, the shard readers opened, and the time of a shuffled epoch, for each way fastdata reads
``s3://`` shards without sidecars (as webdataset writes them):

* ``local``: the shards on local disk (the reference of every ratio);
* ``cache_limit``: ``TarShardDataset(cache_dir=..., cache_limit=2x the shards)``;
* ``default_cache``: no ``cache_dir``: fastdata's own cache folder, which has a limit (half the free disk);
* ``no_cache``: ``cache_dir=False``, every byte read from the store;
* ``stream``: ``cache_dir=False, stream=True``: each shard fetched whole once per epoch, no scan to count;
* ``no_cache_batched`` / ``stream_batched``: the same two with ``batch_size=--batch`` (the dataset batches);
* ``mix_remote``: ``fd.Mix`` of two halves of the shards, each a remote ``TarShardDataset(cache_dir=False)``,
  read in batches of ``--batch`` through ``fd.Loader``, against ``mix_local`` (the same over local files)
  and ``half_remote`` (its slower source alone, per sample);
* ``mix_lanes``: the same ``fd.Mix`` with ``lanes=--workers, batch_size=--batch``: each worker's batches
  draw from blocks of their own.

Bytes are counted at a proxy in front of a moto server on 127.0.0.1 (never by a reader's own counters);
opens by the dataset's ``shard_opens`` counter. Each contender reads ``--epochs`` shuffled epochs with
``--workers`` DataLoader workers (per-sample, raw bytes); epoch 0 includes building the dataset (where
sidecar-less shards are indexed). Contenders take turns, ``--repeats`` rounds; times are medians.

    python benchmarks/bench_remote.py --json benchmarks/results/remote.json
    python benchmarks/bench_remote.py --shards 10 --samples 120 --repeats 1   # quick
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONTENDERS = (
    "local",
    "cache_limit",
    "default_cache",
    "no_cache",
    "stream",
    "no_cache_batched",
    "stream_batched",
    "mix_local",
    "half_remote",
    "mix_remote",
    "mix_lanes",
)
BATCHED = ("no_cache_batched", "stream_batched")
BUCKET = "bench-remote"


def make_shards(args: argparse.Namespace, folder: Path) -> dict[str, bytes]:
    import numpy as np
    import webdataset as wds

    shards = {}
    for s in range(args.shards):
        rng = np.random.default_rng([args.seed, s])
        buf = io.BytesIO()
        with wds.TarWriter(buf) as sink:
            for i in range(args.samples):
                sink.write({"__key__": f"s{s:04d}-{i:06d}", "bin": rng.bytes(args.payload), "cls": b"%d" % i})
        shards[f"shard-{s:04d}.tar"] = buf.getvalue()
        (folder / f"shard-{s:04d}.tar").write_bytes(buf.getvalue())
    return shards


def build(
    what: str,
    local: list[str],
    remote: list[str],
    options: dict[str, Any],
    work: Path,
    seed: int,
    batch: int,
    workers: int,
) -> Any:
    import fastdata as fd

    half = len(local) // 2
    tar = fd.TarShardDataset
    if what == "local":
        return tar(local, shuffle=True, seed=seed)
    if what == "cache_limit":
        total = sum(os.path.getsize(p) for p in local)
        return tar(
            remote, shuffle=True, seed=seed, storage_options=options, cache_dir=work / "c", cache_limit=2 * total
        )
    if what == "default_cache":
        return tar(remote, shuffle=True, seed=seed, storage_options=options)
    if what in ("no_cache", "stream", *BATCHED):
        return tar(
            remote,
            shuffle=True,
            seed=seed,
            storage_options=options,
            cache_dir=False,
            stream=what.startswith("stream"),
            batch_size=batch if what in BATCHED else None,
        )
    if what == "mix_local":
        return fd.Mix({"a": tar(local[:half], shuffle=True), "b": tar(local[half:], shuffle=True)}, seed=seed)
    if what == "half_remote":
        return tar(remote[half:], shuffle=True, seed=seed, storage_options=options, cache_dir=False)
    parts = {"a": remote[:half], "b": remote[half:]}
    lanes = {"lanes": workers, "batch_size": batch} if what == "mix_lanes" and workers > 1 else {}
    return fd.Mix(
        {k: tar(v, shuffle=True, storage_options=options, cache_dir=False) for k, v in parts.items()},
        seed=seed,
        **lanes,
    )


def shard_opens(ds: Any) -> int:
    """Shard readers opened so far by the dataset's processes (a Mix: its sources', ``NAME/shard_opens``)."""
    counters = ds.counters()
    return sum(v for k, v in counters.items() if k == "shard_opens" or k.endswith("/shard_opens"))


def run_one(what: str, args: argparse.Namespace, local: list[str], remote: list[str], proxy: Any, work: Path) -> dict:
    from torch.utils.data import DataLoader

    import fastdata as fd

    os.environ["XDG_CACHE_HOME"] = str(work / "xdg")  # a fresh default cache for each run
    stored = sum(os.path.getsize(p) for p in (local[len(local) // 2 :] if what == "half_remote" else local))
    proxy.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        ds = build(what, local, remote, dict(args.options), work, args.seed, args.batch, args.workers)
        built_s = time.perf_counter() - t0
    epochs = []
    for epoch in range(args.epochs):
        ds.set_epoch(epoch)
        opens0 = shard_opens(ds)
        context = "fork" if args.workers else None
        if isinstance(ds, fd.Mix):  # read as a Mix is: batches of fd.Loader (its workers deal them in turn)
            loader: Any = fd.Loader(ds, batch_size=args.batch, num_workers=args.workers)
        else:
            loader = DataLoader(
                ds, batch_size=None, num_workers=args.workers, multiprocessing_context=context, collate_fn=fd.as_is
            )
        t = time.perf_counter()
        batched = isinstance(ds, fd.Mix) or what in BATCHED
        n = sum(len(b["__key__"]) if batched else 1 for b in loader)
        seconds = time.perf_counter() - t + (built_s if epoch == 0 else 0.0)
        fetched = proxy.stats().get("bytes", 0)
        proxy.reset()
        opens = shard_opens(ds) - opens0
        epochs.append({"samples": n, "seconds": seconds, "fetched_per_stored": fetched / stored, "shard_opens": opens})
    return {"epochs": epochs, "stored_bytes": stored}


def readme_rows(results: dict[str, Any], ratios: dict[str, float], args: argparse.Namespace) -> list[dict]:
    """This run's figures for README.md's table (see tools/readme_figures.py)."""
    rows = []
    last = args.epochs - 1
    shape = f"{args.shards} sidecar-less shards, shuffled, {args.workers} workers"
    named = {
        "cache_limit": "`cache_dir=` with `cache_limit=`",
        "default_cache": "no `cache_dir` (fastdata's own cache, limited)",
        "no_cache": "`cache_dir=False`",
        "stream": "`cache_dir=False, stream=True`",
        "no_cache_batched": f"`cache_dir=False, batch_size={args.batch}`",
        "stream_batched": f"`cache_dir=False, stream=True, batch_size={args.batch}`",
    }
    for c, how in named.items():
        if c not in results or "local" not in results:
            continue
        r = results[c]
        rows.append(
            {
                "backend": "S3 tar",
                "comparison": f"{how}, {shape}, vs the same shards local",
                "figure": f"fetched {r['epoch0_fetched_per_stored']:.2f}x the stored bytes in the first epoch "
                f"(building included), {r[f'epoch{last}_fetched_per_stored']:.2f}x in the next; "
                f"{r[f'epoch{last}_shard_opens']:.0f} shard opens per epoch; "
                f"time {ratios[f'{c}_time_vs_local']:.2f}x local",
                "target": "~1x bytes per epoch, opens <= shards x workers",
                "command": "python benchmarks/bench_remote.py",
            }
        )
    for m, how in (("mix_remote", ""), ("mix_lanes", f" with `lanes={args.workers}, batch_size={args.batch}`")):
        if m not in results:
            continue
        r = results[m]
        rows.append(
            {
                "backend": "S3 tar",
                "comparison": f"`fd.Mix` of two remote halves (`cache_dir=False`){how}, {args.workers} workers, vs its "
                "slower source alone",
                "figure": f"fetched {r[f'epoch{last}_fetched_per_stored']:.2f}x the stored bytes per epoch; "
                f"{ratios.get(f'{m}_speed_vs_slower_source_alone', float('nan')):.2f}x the speed",
                "target": "<= 1.05x bytes, >= 0.9x speed",
                "command": "python benchmarks/bench_remote.py",
            }
        )
    return rows


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("fastdata", "torch", "numpy", "moto", "webdataset"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=10)
    p.add_argument("--samples", type=int, default=120, help="samples per shard")
    p.add_argument("--payload", type=int, default=4000, help="bytes per sample")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32, help="batch size of the Mix contenders (fd.Loader)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    contenders = [c for c in args.contenders.split(",") if c]

    from tests.fault_proxy import FaultProxy
    from tests.s3_server import CREDENTIALS, REGION, MotoServer

    with tempfile.TemporaryDirectory() as tmp, MotoServer() as server, FaultProxy(server.endpoint_url) as proxy:
        work = Path(tmp)
        (work / "local").mkdir()
        shards = make_shards(args, work / "local")
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        for key, data in shards.items():
            client.put_object(Bucket=BUCKET, Key=key, Body=data)
        local = [str(work / "local" / k) for k in shards]
        remote = [f"s3://{BUCKET}/{k}" for k in shards]
        args.options = {"endpoint_url": proxy.endpoint_url, "region_name": REGION, **CREDENTIALS}
        runs: dict[str, list[dict]] = {c: [] for c in contenders}
        for r in range(args.repeats):
            for c in contenders:
                run = work / f"run-{c}-{r}"
                run.mkdir()
                runs[c].append(run_one(c, args, local, remote, proxy, run))
    results: dict[str, Any] = {}
    for c, rs in runs.items():
        out: dict[str, Any] = {}
        for e in range(args.epochs):
            per = [r["epochs"][e] for r in rs]
            out[f"epoch{e}_s"] = statistics.median(x["seconds"] for x in per)
            out[f"epoch{e}_fetched_per_stored"] = round(statistics.median(x["fetched_per_stored"] for x in per), 3)
            opens = [x["shard_opens"] for x in per if x["shard_opens"] is not None]
            out[f"epoch{e}_shard_opens"] = statistics.median(opens) if opens else None
            out[f"epoch{e}_samples"] = per[0]["samples"]
        results[c] = out
    last = args.epochs - 1
    ratios = {}
    for c in contenders:
        ref = "mix_local" if c.startswith("mix_") else "local"
        if ref in results:
            ratios[f"{c}_time_vs_{ref}"] = round(results[c][f"epoch{last}_s"] / results[ref][f"epoch{last}_s"], 2)
    for m in ("mix_remote", "mix_lanes"):
        if m in results and "half_remote" in results:
            # reads per second of the mix against its slower source alone (samples/s, the later epoch)
            mix = results[m][f"epoch{last}_samples"] / results[m][f"epoch{last}_s"]
            alone = results["half_remote"][f"epoch{last}_samples"] / results["half_remote"][f"epoch{last}_s"]
            ratios[f"{m}_speed_vs_slower_source_alone"] = round(mix / alone, 2)
    report = {
        "benchmark": "bench_remote",
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "args": {k: v for k, v in vars(args).items() if k not in ("options", "json")},
        "versions": versions(),
        "results": results,
        "ratios": ratios,
        "readme_rows": readme_rows(results, ratios, args),
    }
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
