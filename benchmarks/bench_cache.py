#!/usr/bin/env python3
"""Remote data read once: fastdata's node-local cache against LitData (and MosaicML Streaming where it
imports), side by side in one run, on the same samples in one local moto server, bytes counted at the
proxy in front of it (never by a reader's own counters).

The samples (``--samples`` of ``--payload`` random bytes and a label, seeded) are written by each
contender's own writer:

* ``fastdata_cache``: ``fastdata convert`` shards (``.idx`` sidecars and ``manifest.json``) read by
  ``TarShardDataset(cache_dir=...)`` through ``fd.Loader``;
* ``fastdata_cache_unchecked``: ``fastdata_cache`` with the cache's block checks turned off (each block of
  a cached shard is checked against the CRC-32 recorded at download, once per process, before it is
  served): what the checks cost, as the ratio of the two in one run;
* ``fastdata_cache_build``: the same with ``cache_check="build"`` (a shard's version asked of the store
  once per node after the dataset is built, not once per epoch);
* ``fastdata_cache_wds``: the same samples in webdataset ``ShardWriter`` shards (no sidecar, no manifest),
  ``TarShardDataset(cache_dir=...)``: the index built from the bytes the samples are read from;
* ``fastdata_stream`` / ``fastdata_stream_wds``: the same two without a cache (how fastdata read S3
  before: every epoch from the store; sidecar-less shards scanned first);
* ``fastdata_local``: the ``convert`` shards on local disk (the reference for reading from the cache);
* ``litdata``: ``litdata.optimize`` chunks (``--shard-bytes``) read by ``StreamingDataset(cache_dir=...,
  max_cache_size=...)`` through ``StreamingDataLoader``;
* ``streaming``: MosaicML Streaming's ``MDSWriter`` shards and ``StreamingDataset(local=..., remote=...)``,
  when it imports beside this torch (reported as not run otherwise, with the reason).

Each contender runs in a fresh process of its own, with a fresh cache, reading ``--epochs`` shuffled
epochs with ``--workers`` persistent workers (``--fresh-workers``: started again every epoch) and batches
of ``--batch``: the time to the first batch (from building
the dataset), samples/s of each epoch, and the bytes and requests the proxy relayed in each epoch (the
first one includes building the dataset). Contenders take turns, round after round (``--repeats``),
so a change of the shared machine's load reaches all of them; figures are medians, and ratios are taken
within the run. Then ``--ranks`` processes (rank r of R, each with ``--workers`` workers, on one node)
read the same epochs through one cache: the bytes the node fetched.

    python benchmarks/bench_cache.py --json bench-out/cache.json
    python benchmarks/bench_cache.py --samples 600 --repeats 1 --contenders fastdata_cache,litdata   # quick
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONTENDERS = (
    "fastdata_cache",
    "fastdata_cache_unchecked",
    "fastdata_cache_build",
    "fastdata_cache_wds",
    "fastdata_stream",
    "fastdata_stream_wds",
    "fastdata_local",
    "litdata",
    "streaming",
)
BUCKET = "bench-cache"
PREFIX = {"fastdata": "fd", "wds": "wds", "litdata": "lit", "streaming": "mds"}


# -- the samples, written by each contender's writer --------------------------------------------------
def sample(i: int, payload: int, seed: int) -> tuple[bytes, int]:
    import numpy as np

    rng = np.random.default_rng([seed, i])
    return rng.bytes(payload + int(rng.integers(0, payload // 8))), i % 10


def write_all(args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """Every format's files of the same samples: {format: folder}."""
    import webdataset as wds

    from fastdata.convert import convert

    src = work / "src"
    for name in ("src", "fd", "wds", "lit", "mds"):
        shutil.rmtree(work / name, ignore_errors=True)  # a --workdir used before
    for i in range(args.samples):
        data, label = sample(i, args.payload, args.seed)
        folder = src / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"s{i:07d}.bin").write_bytes(data)
    shards = max(1, -(-args.samples * args.payload // args.shard_bytes))
    out = {"fastdata": work / "fd", "wds": work / "wds", "litdata": work / "lit", "streaming": work / "mds"}
    convert(src, out["fastdata"], shard_count=shards, progress=False, fsync=False)
    out["wds"].mkdir()
    with wds.ShardWriter(str(out["wds"] / "shard-%06d.tar"), maxsize=args.shard_bytes, verbose=0) as sink:
        for i in range(args.samples):
            data, label = sample(i, args.payload, args.seed)
            sink.write({"__key__": f"s{i:07d}", "bin": data, "cls": b"%d" % label})
    # LitData's and Streaming's writers in processes of their own: LitData's optimize sets the start method
    # of the process it runs in to spawn
    for fmt in ("litdata", "streaming"):
        if fmt in args.contenders:
            done = subprocess.run(
                [sys.executable, __file__, "--write", fmt, "--child-spec", json.dumps(_spec(args, work, fmt))],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                print(f"{fmt}: its writer failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return out


def _spec(args: argparse.Namespace, work: Path, what: str) -> dict[str, Any]:
    return {
        "what": what,
        "samples": args.samples,
        "payload": args.payload,
        "seed": args.seed,
        "shard_bytes": args.shard_bytes,
        "batch": args.batch,
        "workers": args.workers,
        "epochs": args.epochs,
        "persistent": not args.fresh_workers,
        "work": str(work),
    }


def _lit_item(i: int, payload: int, seed: int) -> dict[str, Any]:
    data, label = sample(i, payload, seed)
    return {"key": f"s{i:07d}", "bin": data, "cls": label}


def write_litdata(spec: dict[str, Any]) -> None:
    import litdata

    litdata.optimize(
        fn=functools.partial(_lit_item, payload=spec["payload"], seed=spec["seed"]),
        inputs=list(range(spec["samples"])),
        output_dir=str(Path(spec["work"]) / "lit"),
        chunk_bytes=spec["shard_bytes"],
        num_workers=1,
        mode="overwrite",
    )


def write_streaming(spec: dict[str, Any]) -> None:
    from streaming import MDSWriter

    columns = {"key": "str", "bin": "bytes", "cls": "int"}
    with MDSWriter(out=str(Path(spec["work"]) / "mds"), columns=columns, size_limit=spec["shard_bytes"]) as w:
        for i in range(spec["samples"]):
            data, label = sample(i, spec["payload"], spec["seed"])
            w.write({"key": f"s{i:07d}", "bin": data, "cls": label})


# -- one contender in a process of its own --------------------------------------------------------------
def proxy_stats(proxy: str) -> dict[str, int]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(proxy + "/__fault_proxy__/stats", timeout=30) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def s3_options(spec: dict[str, Any]) -> dict[str, Any]:
    from tests.s3_server import CREDENTIALS, REGION

    return {"endpoint_url": spec["proxy"], "region_name": REGION, **CREDENTIALS}


def keys_of(batch: Any) -> int:
    if isinstance(batch, dict):
        for name in ("__key__", "key"):
            if name in batch:
                return len(batch[name])
    return len(batch)


def fastdata_loader(spec: dict[str, Any]) -> Any:
    import fastdata as fd

    what = spec["what"]
    fmt = "wds" if what.endswith("_wds") else "fastdata"
    if what == "fastdata_local":
        urls: Any = sorted(str(p) for p in (Path(spec["work"]) / "fd").glob("*.tar"))
    else:
        urls = [f"s3://{BUCKET}/{key}" for key in spec["keys"][fmt] if key.endswith(".tar")]
    cache = str(Path(spec["run"]) / "cache") if "_cache" in what else False
    if what == "fastdata_cache_unchecked":
        from fastdata.storage.cache import _file

        _file.VERIFY = False  # measuring only: never turned off in use
    check = "build" if what.endswith("_build") else "epoch"
    ds = fd.TarShardDataset(
        urls,
        shuffle=True,
        seed=spec["seed"],
        batch_size=spec["batch"],
        storage_options=None if what == "fastdata_local" else s3_options(spec),
        cache_dir=cache,
        cache_check=check,
        rank=spec.get("rank"),
        world_size=spec.get("world_size"),
    )
    return fd.Loader(ds, num_workers=spec["workers"], persistent_workers=spec["persistent"] and spec["workers"] > 0)


def litdata_loader(spec: dict[str, Any]) -> Any:
    import litdata
    import litdata.streaming.downloader as downloader

    # LitData fetches chunks with obstore, which refuses plain http (moto on loopback) unless told; the
    # workers are forked from here, so they inherit this
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"  # type: ignore[index]
    options = s3_options(spec)
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": options["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": options["aws_secret_access_key"],
            "AWS_DEFAULT_REGION": options["region_name"],
        }
    )
    ds = litdata.StreamingDataset(
        f"s3://{BUCKET}/{PREFIX['litdata']}",
        cache_dir=str(Path(spec["run"]) / "cache"),
        max_cache_size="50GB",
        shuffle=True,
        seed=spec["seed"],
        storage_options={"endpoint_url": options["endpoint_url"]},
        transform=_bytes_of,
    )
    return litdata.StreamingDataLoader(
        ds,
        batch_size=spec["batch"],
        num_workers=spec["workers"],
        persistent_workers=spec["persistent"] and spec["workers"] > 0,
    )


def _bytes_of(item: dict[str, Any]) -> dict[str, Any]:
    item["bin"] = bytes(item["bin"])  # LitData hands out memoryviews, which its DataLoader cannot pickle
    return item


def streaming_loader(spec: dict[str, Any]) -> Any:
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    options = s3_options(spec)
    os.environ.update(
        {
            "S3_ENDPOINT_URL": options["endpoint_url"],
            "AWS_ACCESS_KEY_ID": options["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": options["aws_secret_access_key"],
        }
    )
    ds = StreamingDataset(
        remote=f"s3://{BUCKET}/{PREFIX['streaming']}",
        local=str(Path(spec["run"]) / "cache"),
        shuffle=True,
        shuffle_seed=spec["seed"],
        batch_size=spec["batch"],
        cache_limit="50gb",
    )
    return DataLoader(
        ds,
        batch_size=spec["batch"],
        num_workers=spec["workers"],
        persistent_workers=spec["persistent"] and spec["workers"] > 0,
    )


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # collate's stack stalls when another program holds a core
    what = spec["what"]
    remote = what != "fastdata_local"
    start = time.perf_counter()
    if what == "litdata":
        loader = litdata_loader(spec)
    elif what == "streaming":
        loader = streaming_loader(spec)
    else:
        loader = fastdata_loader(spec)
    epochs, first_batch = [], None
    before: dict[str, int] = {}  # the parent zeroed the proxy's counters: building the dataset counts in epoch 1
    for epoch in range(spec["epochs"]):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        t0, n = time.perf_counter(), 0
        for batch in loader:
            if first_batch is None:
                first_batch = time.perf_counter() - start
            n += keys_of(batch)
        seconds = time.perf_counter() - t0
        after = proxy_stats(spec["proxy"]) if remote else {}
        epochs.append(
            {
                "samples": n,
                "seconds": seconds,
                "samples_per_s": n / seconds,
                "bytes": after.get("bytes", 0) - before.get("bytes", 0),
                "requests": after.get("requests", 0) - before.get("requests", 0),
            }
        )
        before = after
    if hasattr(loader, "close"):
        loader.close()
    return {"what": what, "first_batch_s": first_batch, "epochs": epochs}


# -- the parent ----------------------------------------------------------------------------------------
def child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child-spec", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"what": spec["what"], "error": " | ".join(tail)}
    return json.loads(lines[-1][len("RESULT ") :])  # type: ignore[no-any-return]


def available(what: str) -> str | None:
    """Why ``what`` cannot run here, or None."""
    module = {"litdata": "litdata", "streaming": "streaming"}.get(what)
    if module is None:
        return None
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["?"])[-1]
    return None


def upload(server: Any, folders: dict[str, Path]) -> dict[str, list[str]]:
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    keys: dict[str, list[str]] = {}
    for fmt, folder in folders.items():
        if not folder.is_dir():
            continue
        keys[fmt] = []
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            key = f"{PREFIX[fmt]}/{path.relative_to(folder).as_posix()}"
            client.upload_file(str(path), BUCKET, key)
            keys[fmt].append(key)
    return keys


def stored_bytes(folder: Path, only_shards: bool = False) -> int:
    files = [p for p in folder.rglob("*") if p.is_file()]
    if only_shards:
        files = [p for p in files if p.suffix == ".tar"]
    return sum(p.stat().st_size for p in files)


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(args: argparse.Namespace, rounds: list[dict[str, Any]], stored: dict[str, int]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for what in args.contenders:
        runs = [r for r in rounds if r["what"] == what and "error" not in r]
        errors = [r["error"] for r in rounds if r["what"] == what and "error" in r]
        if not runs:
            table[what] = {"error": errors[0] if errors else "not run"}
            continue
        fmt = "wds" if what.endswith("_wds") else what if what in ("litdata", "streaming") else "fastdata"
        row: dict[str, Any] = {"first_batch_s": median([r["first_batch_s"] for r in runs]), "runs": len(runs)}
        for e in range(args.epochs):
            row[f"epoch{e + 1}_samples_per_s"] = median([r["epochs"][e]["samples_per_s"] for r in runs])
            row[f"epoch{e + 1}_bytes_x"] = median([r["epochs"][e]["bytes"] / stored[fmt] for r in runs])
            row[f"epoch{e + 1}_requests"] = median([r["epochs"][e]["requests"] for r in runs])
        row["bytes_x_all_epochs"] = median([sum(ep["bytes"] for ep in r["epochs"]) / stored[fmt] for r in runs])
        table[what] = row
    peer = table.get("litdata", {})
    for row in table.values():
        if "error" in row or "error" in peer or row is peer:
            continue
        row["vs_litdata"] = {
            k: (row[k] / peer[k] if peer.get(k) else None)
            for k in row
            if k.endswith("_samples_per_s") or k == "first_batch_s"
        }
    return table


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "numpy", "boto3", "moto", "webdataset", "litdata", "mosaicml-streaming", "obstore"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def ranks_section(args: argparse.Namespace, base: dict[str, Any], proxy: Any, work: Path) -> dict[str, Any]:
    """``--ranks`` processes on this node read the same epochs through one cache: bytes the node fetched."""
    out: dict[str, Any] = {}
    for what in ("fastdata_cache", "fastdata_cache_wds", "fastdata_stream_wds"):
        if what not in args.contenders:
            continue
        run = work / f"ranks-{what}"
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir()
        proxy.reset()
        specs = [
            {**base, "what": what, "run": str(run), "rank": r, "world_size": args.ranks} for r in range(args.ranks)
        ]
        with multiprocessing.get_context("spawn").Pool(args.ranks) as pool:
            results = pool.starmap(child, [(s, args.timeout) for s in specs])
        fmt = "wds" if what.endswith("_wds") else "fastdata"
        total = proxy.stats().get("bytes", 0)
        out[what] = {
            "ranks": args.ranks,
            "workers": args.workers,
            "epochs": args.epochs,
            "bytes_x": total / base["stored"][fmt],
            "samples": [[e["samples"] for e in r.get("epochs", [])] for r in results],
            "errors": [r["error"] for r in results if "error" in r],
        }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--payload", type=int, default=30_000, help="bytes per sample (plus up to 1/8 more)")
    p.add_argument("--shard-bytes", type=int, default=16 << 20, help="bytes per shard / chunk, every format")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument(
        "--fresh-workers",
        action="store_true",
        help="start the DataLoader's workers again every epoch (default: persistent workers, so that epoch 2 "
        "measures reading, not starting processes)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--ranks", type=int, default=2, help="processes on the node for the bytes-per-node section (0: skip)"
    )
    p.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma-separated, of {', '.join(CONTENDERS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600, help="seconds one contender's run may take")
    p.add_argument("--workdir", default=None, help="default: a temporary folder, deleted at the end")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--child-spec", default=None, help=argparse.SUPPRESS)
    p.add_argument("--write", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write:
        (write_litdata if args.write == "litdata" else write_streaming)(json.loads(args.child_spec))
        return {}
    if args.child_spec:
        print("RESULT " + json.dumps(run_child(json.loads(args.child_spec))), flush=True)
        return {}
    args.contenders = [c for c in args.contenders.split(",") if c]
    unknown = sorted(set(args.contenders) - set(CONTENDERS))
    if unknown:
        p.error(f"unknown contenders {unknown}; known: {', '.join(CONTENDERS)}")
    skipped = {}
    for what in list(args.contenders):
        why = available(what)
        if why is not None:
            skipped[what] = why
            args.contenders.remove(what)
            print(f"{what}: not run ({why})", file=sys.stderr)

    from tests.fault_proxy import FaultProxy
    from tests.s3_server import MotoServer

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    load = [os.getloadavg()]
    try:
        folders = write_all(args, work)
        stored = {
            "fastdata": stored_bytes(folders["fastdata"]),
            "wds": stored_bytes(folders["wds"]),
            "litdata": stored_bytes(folders["litdata"]) if folders["litdata"].is_dir() else 0,
            "streaming": stored_bytes(folders["streaming"]) if folders["streaming"].is_dir() else 0,
        }
        with MotoServer() as server, FaultProxy(server.endpoint_url) as proxy:
            keys = upload(server, folders)
            base = {**_spec(args, work, ""), "proxy": proxy.endpoint_url, "keys": keys, "stored": stored}
            rounds = []
            for r in range(args.repeats):
                for what in args.contenders:
                    run = work / f"run-{what}-{r}"
                    shutil.rmtree(run, ignore_errors=True)
                    run.mkdir()
                    proxy.reset()
                    result = child({**base, "what": what, "run": str(run)}, args.timeout)
                    shutil.rmtree(run, ignore_errors=True)
                    rounds.append(result)
                    print(json.dumps(result)[:300], file=sys.stderr, flush=True)
                load.append(os.getloadavg())
            ranks = ranks_section(args, base, proxy, work) if args.ranks > 1 else {}
            load.append(os.getloadavg())
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    results = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("child_spec", "write")},
        "versions": versions(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_average": load,
        "stored_bytes": stored,
        "not_run": skipped,
        "table": summarize(args, rounds, stored),
        "ranks": ranks,
        "rounds": rounds,
    }
    print(json.dumps({k: results[k] for k in ("table", "ranks", "not_run", "load_average")}, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
