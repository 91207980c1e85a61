"""S3 loading, side by side in one run against a local moto server (its own process, 127.0.0.1).

Small objects (~30 KB), through real DataLoaders with workers 0, 1, 2, 4:

* ``fastdata``: :class:`fastdata.S3Dataset` (one client per process, a batch fetched concurrently, the
  next batch fetched ahead);
* ``naive``: a new ``boto3.client`` in every ``__getitem__`` (the usual first attempt);
* ``per_worker``: one client per worker process, one GET at a time (the usual fix);
* ``s3torchconnector``: ``S3MapDataset`` (AWS's connector), when installed;
* ``ceiling``: the server's own limit: bare GETs from 16 threads in 1 process, 2 x 16 and 4 x 8 (so the
  clients' CPU and GIL are not the limit), with boto3 and, when s3torchconnector is installed, with the
  AWS CRT client it wraps (~1/3 of botocore's CPU per request), the best kept. Every figure is also a
  fraction of it.

Then the same with latency added to every request by the fault proxy (``--latency-ms``), tar shards
(``TarShardDataset`` on ``s3://`` vs ``webdataset`` streaming each shard with one boto3 GET), and a run
through 10% ``503 SlowDown`` and 10% bodies cut midway (throughput vs the fault-free run through the
same proxy, every object checked byte for byte).

Egress (``egress``): one epoch, then a second, of ``TarShardDataset`` on ``s3://`` shards (with their
``.idx`` sidecars and ``manifest.json``, as ``fastdata convert`` writes them), shuffled or not, per sample
or batched, with 0 and 2 workers (``--egress-workers``): bytes fetched and requests per epoch (from the
dataset's counters, summed over its workers) as multiples of the shards' bytes and of their number, and
whether the second epoch's order differs from the first.

Rates are medians of ``--repeats`` windows of ``--seconds`` (and at least 4 batches) each, the first
batch (start-up) excluded; the contenders take turns, round after round, so that a change in the load
of the (shared) machine reaches all of them. Figures are only comparable within one run.

    python benchmarks/bench_s3.py --json bench-out/s3.json
    python benchmarks/bench_s3.py --objects 600 --seconds 1 --repeats 1 --no-shards   # a quick look
    python benchmarks/bench_s3.py --only egress --json bench-out/s3-egress.json   # the egress figures
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import platform
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import _readme as readme  # noqa: E402

import fastdata as fd  # noqa: E402
from fastdata.loading._sampler import EpochSampler  # noqa: E402
from tests.datagen import write_tar  # noqa: E402
from tests.fault_proxy import FaultProxy  # noqa: E402
from tests.s3_server import CREDENTIALS, REGION, MotoServer  # noqa: E402

BUCKET = "bench"
SECTIONS = ("small", "latency", "shards", "faults", "egress")
FORK = multiprocessing.get_context("fork")


# -- the peers ---------------------------------------------------------------------------------------


def _boto3_client(endpoint: str, pool: int = 10) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=REGION, config=Config(max_pool_connections=pool), **CREDENTIALS
    )


def _split(url: str) -> tuple[str, str]:
    bucket, key = url[len("s3://") :].split("/", 1)
    return bucket, key


class Naive(Dataset[bytes]):
    """A new client for every item."""

    def __init__(self, urls: list[str], endpoint: str) -> None:
        self.urls, self.endpoint = urls, endpoint

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int) -> bytes:
        bucket, key = _split(self.urls[i])
        return _boto3_client(self.endpoint).get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]


class PerWorker(Naive):
    """One client per worker process (built lazily, rebuilt after a fork), one GET at a time."""

    _client: Any = None
    _pid = -1

    def __getitem__(self, i: int) -> bytes:
        if self._pid != os.getpid():
            self._client, self._pid = _boto3_client(self.endpoint), os.getpid()
        bucket, key = _split(self.urls[i])
        return self._client.get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]


class TorchConnector(Dataset[bytes]):
    def __init__(self, urls: list[str], endpoint: str) -> None:
        from s3torchconnector import S3ClientConfig, S3MapDataset

        self.inner = S3MapDataset.from_objects(
            urls, region=REGION, endpoint=endpoint, s3client_config=S3ClientConfig(force_path_style=True)
        )

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> bytes:
        return self.inner[i].read()  # type: ignore[no-any-return]


def payloads(batch: list[Any]) -> list[bytes]:
    """The object bytes of a batch from any of the datasets (fastdata gives sample dicts)."""
    return [b["bin"] if isinstance(b, dict) else b for b in batch]


def make_dataset(mode: str, urls: list[str], endpoint: str, args: argparse.Namespace) -> Any:
    if mode == "fastdata":
        return fd.S3Dataset(
            urls,
            endpoint_url=endpoint,
            region_name=REGION,
            concurrency=args.concurrency,
            lookahead=args.lookahead,
            **CREDENTIALS,
        )
    return {"naive": Naive, "per_worker": PerWorker, "s3torchconnector": TorchConnector}[mode](urls, endpoint)


def loader(ds: Any, workers: int, batch_size: int, seed: int = 0) -> DataLoader:
    sampler = ds.sampler(shuffle=True) if isinstance(ds, fd.S3Dataset) else EpochSampler(len(ds), seed=seed)
    return DataLoader(
        ds,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=payloads,
        multiprocessing_context=FORK if workers else None,
    )


# -- measuring -----------------------------------------------------------------------------------------

MIN_BATCHES = 4  # a window spans at least this many batches, however slow the machine is today


def window_rate(batches: Any, seconds: float) -> float:
    """Items per second over ``seconds`` (and at least ``MIN_BATCHES`` batches) of iteration, the first
    batch (start-up) excluded."""
    it = iter(batches)
    next(it)
    n, k, t0 = 0, 0, time.perf_counter()
    for batch in it:
        n, k = n + len(batch), k + 1
        if time.perf_counter() - t0 >= seconds and k >= MIN_BATCHES:
            break
    dt = time.perf_counter() - t0
    del it
    return n / dt if dt > 0 else 0.0


MEASURE_TIMEOUT_S = 600.0


def _isolated_child(queue: Any, fn: Callable[[], Any]) -> None:
    try:
        queue.put(("ok", fn()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        queue.put(("error", f"{type(e).__name__}: {e}"))


def isolated(fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a forked child: every contender starts from the same clean process (no client,
    thread pool or CRT event loop left by the one before; forking after those is what hangs), and a
    child that dies is an error, never a hang."""
    queue = FORK.Queue()
    child = FORK.Process(target=_isolated_child, args=(queue, fn))
    child.start()
    try:
        status, value = queue.get(timeout=MEASURE_TIMEOUT_S)
    except Exception as e:
        child.kill()
        raise RuntimeError(f"a measurement gave no result (exit code {child.exitcode})") from e
    finally:
        child.join(30)
    if status != "ok":
        raise RuntimeError(value)
    return value


def interleaved(repeats: int, runs: dict[str, Callable[[], float]]) -> dict[str, dict[str, Any]]:
    """Run every measurement once per round, ``repeats`` rounds, so that a change in the machine's load
    (it is shared) reaches every contender alike; the median of each is kept. Each in its own process."""
    got: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            got[name].append(isolated(run))
    return {name: {"median": statistics.median(v), "runs": [round(x, 1) for x in v]} for name, v in got.items()}


def _bare_gets(
    urls: list[str], endpoint: str, seconds: float, threads: int, first: int, step: int, client: str
) -> float:
    """GETs per second of ``threads`` threads sharing one client (boto3, or AWS CRT through
    s3torchconnector), over ``seconds``."""
    if client == "crt":
        crt = TorchConnector(urls, endpoint)

        def fetch(i: int) -> None:
            crt[i]
    else:
        boto = _boto3_client(endpoint, pool=threads + 4)

        def fetch(i: int) -> None:
            bucket, key = _split(urls[i])
            boto.get_object(Bucket=bucket, Key=key)["Body"].read()

    t0 = time.perf_counter()
    stop = t0 + seconds
    counts = [0] * threads

    def loop(t: int) -> None:
        i = first + t * step
        while time.perf_counter() < stop:
            fetch(i % len(urls))
            counts[t] += 1
            i += threads * step

    pool = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for w in pool:
        w.start()
    for w in pool:
        w.join()
    return sum(counts) / (time.perf_counter() - t0)


def _bare_gets_child(queue: Any, *args: Any) -> None:
    queue.put(_bare_gets(*args))


def ceiling(urls: list[str], endpoint: str, seconds: float, processes: int, threads: int, client: str) -> float:
    """GETs per second from ``processes`` processes of ``threads`` threads of bare GETs: the server's
    limit once the clients' own CPU (and GIL) is spread over processes."""
    queue = FORK.Queue()
    procs = [
        FORK.Process(target=_bare_gets_child, args=(queue, urls, endpoint, seconds, threads, p, processes, client))
        for p in range(processes)
    ]
    for proc in procs:
        proc.start()
    rate = sum(queue.get() for _ in procs)  # each measured its own window, after building its client
    for proc in procs:
        proc.join()
    return rate


def shard_ceiling(urls: list[str], endpoint: str, threads: int = 8) -> float:
    """Bytes per second of whole-shard GETs, ``threads`` at a time (each shard once)."""
    client = _boto3_client(endpoint, pool=threads + 4)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(
            pool.map(lambda u: len(client.get_object(Bucket=_split(u)[0], Key=_split(u)[1])["Body"].read()), urls)
        )
    return total / (time.perf_counter() - t0)


# -- scenarios -----------------------------------------------------------------------------------------


def small_objects(args: argparse.Namespace, urls: list[str], endpoint: str, modes: list[str]) -> dict[str, Any]:
    runs: dict[str, Callable[[], float]] = {}
    for client in ["boto3", "crt"] if "s3torchconnector" in modes else ["boto3"]:
        for procs, threads in ((1, 16), (2, 16), (4, 8)):
            runs[f"ceiling/{client}_{procs}x{threads}_threads"] = lambda p=procs, t=threads, c=client: ceiling(
                urls, endpoint, args.seconds, p, t, c
            )
    for mode in modes:
        for w in args.workers:

            def run(mode: str = mode, w: int = w) -> float:
                ds = make_dataset(mode, urls, endpoint, args)
                return window_rate(loader(ds, w, args.batch_size), args.seconds)

            runs[f"{mode}/{w}"] = run
    measured = interleaved(args.repeats, runs)
    out: dict[str, Any] = {"ceiling": {}}
    for name, r in measured.items():
        group, key = name.split("/")
        out.setdefault(group, {})[key] = r
    best_name = max(out["ceiling"], key=lambda k: out["ceiling"][k]["median"])
    best = out["ceiling"][best_name]["median"]
    out["ceiling"]["best"], out["ceiling"]["best_of"] = best, best_name
    print(f"  ceiling: {best:.1f} GETs/s ({best_name})", flush=True)
    for mode in modes:
        for w in args.workers:
            r = out[mode][str(w)]
            r["of_ceiling"] = round(r["median"] / best, 3)
            print(
                f"  {mode:>16} workers={w}: {r['median']:7.1f} items/s  ({r['of_ceiling']:.2f} of ceiling)", flush=True
            )
    return out


def _s3_open(url: str, mode: str = "rb", bufsize: int = 8192, **_: Any) -> Any:
    """webdataset's opener for s3:// URLs: one streaming GET per shard, a client per process."""
    global _wds_client, _wds_pid
    if _wds_pid != os.getpid():
        _wds_client, _wds_pid = _boto3_client(os.environ["AWS_ENDPOINT_URL"]), os.getpid()
    bucket, key = _split(url)
    return _wds_client.get_object(Bucket=bucket, Key=key)["Body"]


_wds_client: Any = None
_wds_pid = -1


def shards(args: argparse.Namespace, urls: list[str], endpoint: str, samples: int, nbytes: int) -> dict[str, Any]:
    import webdataset as wds

    sys.modules["webdataset.gopen"].gopen_schemes["s3"] = _s3_open  # the module, not its gopen function
    per_sample = nbytes / samples

    def epoch(make: Callable[[], Any], w: int) -> float:
        """Samples per second over one epoch, the first batch (start-up, shard opening) excluded."""
        it = iter(DataLoader(make(), batch_size=None, num_workers=w, multiprocessing_context=FORK if w else None))
        n = len(next(it))
        t0, first = time.perf_counter(), n
        for batch in it:
            n += len(batch)
        assert n == samples, f"read {n} samples of {samples}"
        return (n - first) / (time.perf_counter() - t0)

    spec = urls[0].rsplit("-", 1)[0] + f"-{{000000..{len(urls) - 1:06d}}}.tar"
    makers = {
        "fastdata": lambda: fd.TarShardDataset(spec, batch_size=args.batch_size, collate_fn=_keys),
        "webdataset": lambda: wds.WebDataset(urls, shardshuffle=False, empty_check=False).batched(
            args.batch_size, collation_fn=_keys, partial=True
        ),
    }
    runs: dict[str, Callable[[], float]] = {"ceiling/ceiling": lambda: shard_ceiling(urls, endpoint) / per_sample}
    for mode, make in makers.items():
        for w in args.workers:
            runs[f"{mode}/{w}"] = lambda make=make, w=w: epoch(make, w)
    out: dict[str, Any] = {}
    for name, r in interleaved(args.repeats, runs).items():
        group, key = name.split("/")
        out.setdefault(group, {})[key] = r
    out["ceiling"] = out["ceiling"]["ceiling"]
    for mode in makers:
        for w in args.workers:
            r = out[mode][str(w)]
            r["of_ceiling"] = round(r["median"] / out["ceiling"]["median"], 3)
            print(
                f"  shards {mode:>10} workers={w}: {r['median']:7.1f} samples/s ({r['of_ceiling']:.2f} of ceiling)",
                flush=True,
            )
    return out


def _keys(batch: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in batch]


def _fault_epoch(
    args: argparse.Namespace, urls: list[str], endpoint: str, expected: dict[str, str]
) -> tuple[float, dict[str, int]]:
    """One full epoch; every object checked once, byte for byte (sha1)."""
    ds = make_dataset("fastdata", urls, endpoint, args)
    t0, seen = time.perf_counter(), {}
    for batch in DataLoader(
        ds,
        batch_size=args.batch_size,
        sampler=ds.sampler(shuffle=True),
        num_workers=args.fault_workers,
        collate_fn=_as_list,
        multiprocessing_context=FORK if args.fault_workers else None,
    ):
        for sample in batch:
            assert sample["__url__"] not in seen, f"{sample['__url__']} read twice"
            seen[sample["__url__"]] = hashlib.sha1(sample["bin"]).hexdigest()
    rate = len(seen) / (time.perf_counter() - t0)
    assert seen == expected, "objects missing or different"
    return rate, ds.counters()


def _as_list(batch: list[Any]) -> list[Any]:
    return batch


def faults(args: argparse.Namespace, urls: list[str], proxy: FaultProxy, expected: dict[str, str]) -> dict[str, Any]:
    """Full epochs through the proxy, without and with faults; every object checked."""
    rounds: dict[str, list[tuple[float, dict[str, int], dict[str, int]]]] = {"fault_free": [], "faults": []}
    for r in range(args.repeats):  # alternated, so that the machine's load reaches both alike
        for name, faults_on in (("fault_free", {}), ("faults", {"slowdown": 0.1, "cut": 0.1})):
            proxy.configure(seed=args.seed + r, **faults_on)
            rate, counters = isolated(lambda: _fault_epoch(args, urls, proxy.endpoint_url, expected))
            rounds[name].append((rate, counters, proxy.stats()))
    out: dict[str, Any] = {}
    for name, got in rounds.items():
        out[name] = {
            "median": statistics.median(g[0] for g in got),
            "runs": [round(g[0], 1) for g in got],
            "intact": True,
            "counters": [g[1] for g in got],
            "injected": [g[2] for g in got],
        }
        print(
            f"  {name:>10} workers={args.fault_workers}: {out[name]['median']:7.1f} items/s, every object intact",
            flush=True,
        )
    out["ratio"] = round(out["faults"]["median"] / out["fault_free"]["median"], 3)
    proxy.reset()
    return out


def _egress_epochs(spec: str, shuffle: bool, batch_size: int | None, workers: int) -> dict[str, Any]:
    """Two epochs of one configuration: each epoch's requests, bytes and sample order."""
    ds = fd.TarShardDataset(spec, shuffle=shuffle, batch_size=batch_size)
    loader = DataLoader(
        ds,
        batch_size=None,
        collate_fn=fd.as_is if batch_size else None,
        num_workers=workers,
        multiprocessing_context=FORK if workers else None,
    )
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        before, t0 = ds.counters(), time.perf_counter()
        keys: list[str] = []
        for batch in loader:
            key = batch["__key__"]
            keys.extend(key if isinstance(key, list) else [key])
        after = ds.counters()
        epochs.append(
            {
                "requests": after["s3_requests"] - before["s3_requests"],
                "bytes": after["s3_bytes"] - before["s3_bytes"],
                "seconds": round(time.perf_counter() - t0, 3),
                "keys": keys,
            }
        )
    ds.close()
    return {"epochs": epochs, "window": getattr(ds, "window", None)}  # (None: fastdata before the bound)


def egress(args: argparse.Namespace, client: Any, rng: np.random.Generator) -> dict[str, Any]:
    """Bytes and requests per epoch of TarShardDataset on S3, against the shards' bytes and count."""
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-s3-egress-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    sized = argparse.Namespace(**{**vars(args), "shards": args.egress_shards})
    made = make_shards_sized(folder, sized, rng)
    upload(client, {f"egress/{name}": q for name, q in made.items()})
    tars = sorted(q for name, q in made.items() if name.endswith(".tar"))
    nbytes, count = sum(os.path.getsize(q) for q in tars), len(tars)
    samples = count * args.samples_per_shard
    spec = f"s3://{BUCKET}/egress/train-{{000000..{count - 1:06d}}}.tar"
    print(f"egress: {count} shards x {args.samples_per_shard} samples, {nbytes / 1e6:.1f} MB", flush=True)
    out: dict[str, Any] = {"shards": count, "shard_bytes": nbytes, "samples": samples, "runs": {}}
    for shuffle in (False, True):
        for batch_size in (None, args.batch_size):
            for w in args.egress_workers:
                name = f"shuffle={shuffle}/batch_size={batch_size}/workers={w}"
                got = isolated(lambda s=shuffle, b=batch_size, w=w: _egress_epochs(spec, s, b, w))
                first, second = got["epochs"]
                assert sorted(first["keys"]) == sorted(second["keys"]) and len(first["keys"]) == samples, name
                run = {
                    "bytes_vs_shards": [round(e["bytes"] / nbytes, 3) for e in got["epochs"]],
                    "requests_vs_shards": [round(e["requests"] / count, 2) for e in got["epochs"]],
                    "requests": [e["requests"] for e in got["epochs"]],
                    "bytes": [e["bytes"] for e in got["epochs"]],
                    "seconds": [e["seconds"] for e in got["epochs"]],
                    "order_differs_between_epochs": first["keys"] != second["keys"],
                    "window": got["window"],
                }
                out["runs"][name] = run
                print(
                    f"  {name:>44}: bytes {run['bytes_vs_shards'][0]:.2f}x, requests "
                    f"{run['requests'][0]} ({run['requests_vs_shards'][0]:.2f} per shard), new order "
                    f"{run['order_differs_between_epochs']}",
                    flush=True,
                )
    return out


# -- set-up and report -----------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "boto3", "botocore", "moto", "webdataset", "s3torchconnector", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
    }


def upload(client: Any, files: dict[str, bytes | str]) -> None:
    def put(item: tuple[str, bytes | str]) -> None:
        key, data = item
        if isinstance(data, bytes):
            client.put_object(Bucket=BUCKET, Key=key, Body=data)
        else:
            client.upload_file(data, BUCKET, key)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, files.items()))


def summarize(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    if "egress" in results:
        runs = results["egress"]["runs"]
        summary["egress_bytes_vs_shards"] = {k: r["bytes_vs_shards"][0] for k, r in runs.items()}
        summary["egress_requests_vs_shards"] = {k: r["requests_vs_shards"][0] for k, r in runs.items()}
    if "small" not in results:
        return summary
    small = results["small"]
    fast = {int(w): r["median"] for w, r in small["fastdata"].items()}
    best_w = max(fast, key=fast.__getitem__)
    summary["small_best_workers"] = best_w
    summary["small_fastdata_of_ceiling"] = round(fast[best_w] / small["ceiling"]["best"], 3)
    if "naive" in small:
        summary["small_fastdata_vs_naive"] = {
            w: round(fast[int(w)] / r["median"], 2) for w, r in small["naive"].items()
        }
    if "per_worker" in small:
        summary["small_fastdata_vs_per_worker"] = {
            w: round(fast[int(w)] / r["median"], 2) for w, r in small["per_worker"].items()
        }
    if "s3torchconnector" in small:
        summary["small_fastdata_vs_s3torchconnector"] = {
            w: round(fast[int(w)] / r["median"], 2) for w, r in small["s3torchconnector"].items()
        }
    if "latency" in results:
        lat = results["latency"]
        summary[f"latency_{args.latency_ms:g}ms_fastdata_vs_per_worker"] = {
            w: round(lat["fastdata"][w]["median"] / r["median"], 2) for w, r in lat["per_worker"].items()
        }
        summary[f"latency_{args.latency_ms:g}ms_fastdata_of_ceiling"] = {
            w: r["of_ceiling"] for w, r in lat["fastdata"].items()
        }
    if "shards" in results:
        sh = results["shards"]
        summary["shards_fastdata_vs_webdataset"] = {
            w: round(r["median"] / sh["webdataset"][w]["median"], 2) for w, r in sh["fastdata"].items()
        }
        summary["shards_fastdata_of_ceiling"] = {w: r["of_ceiling"] for w, r in sh["fastdata"].items()}
    if "faults" in results:
        summary["faults_throughput_vs_fault_free"] = results["faults"]["ratio"]
        summary["faults_every_object_intact"] = results["faults"]["faults"]["intact"]
    return summary


def readme_rows(summary: dict[str, Any], args: argparse.Namespace) -> list[dict[str, str]]:
    """This run's figures for README.md's table (tools/readme_figures.py)."""
    rows = []
    objects = f"{args.objects:,} objects of ~{args.object_kb:g} KB, moto on loopback"
    if "small_fastdata_of_ceiling" in summary:
        rows.append(
            readme.row(
                "S3",
                f"small objects vs the server's ceiling (best worker count: {summary['small_best_workers']}), "
                + objects,
                f"{summary['small_fastdata_of_ceiling']:.2f}",
                ">= 0.85",
            )
        )
    for key, peer, target in (
        ("small_fastdata_vs_naive", "a new boto3 client per item", ">= 3x"),
        ("small_fastdata_vs_s3torchconnector", "s3torchconnector's map-style dataset", ">= 1x"),
    ):
        if key in summary:
            counts = [int(w) for w in summary[key]]
            rows.append(
                readme.row(
                    "S3",
                    f"vs {peer} {readme.workers_label(counts)}",
                    readme.per_workers(summary[key], counts),
                    target,
                )
            )
    latency = f"latency_{args.latency_ms:g}ms_fastdata_vs_per_worker"
    if latency in summary:
        counts = [int(w) for w in summary[latency]]
        rows.append(
            readme.row(
                "S3",
                f"{args.latency_ms:g} ms latency per request, vs one client per worker without prefetch "
                + readme.workers_label(counts),
                readme.per_workers(summary[latency], counts),
                ">= 4x",
            )
        )
    if "faults_throughput_vs_fault_free" in summary:
        intact = "every object intact" if summary["faults_every_object_intact"] else "OBJECTS DAMAGED"
        rows.append(
            readme.row(
                "S3",
                "through 10% `503 SlowDown` + 10% bodies cut midway, vs fault-free",
                f"{summary['faults_throughput_vs_fault_free']:.2f}, {intact}",
                ">= 0.7",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--objects", type=int, default=1000, help="small objects (default 1000)")
    p.add_argument("--object-kb", type=float, default=30, help="mean small object size, KB (default 30)")
    p.add_argument("--workers", default="0,1,2,4", help="DataLoader worker counts (default 0,1,2,4)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="fastdata's threads per process (default: its own, 16 shared by the workers)",
    )
    p.add_argument("--lookahead", type=int, default=2, help="fastdata's batches fetched ahead (default 2)")
    p.add_argument("--seconds", type=float, default=1.5, help="length of one measured window (default 1.5)")
    p.add_argument("--repeats", type=int, default=3, help="windows per figure; the median is kept (default 3)")
    p.add_argument(
        "--latency-ms",
        type=float,
        default=20.0,
        help="latency per request for the latency runs; 0 skips them (default 20)",
    )
    p.add_argument("--shards", type=int, default=8, help="tar shards, 0 skips the shard runs (default 8)")
    p.add_argument("--samples-per-shard", type=int, default=250)
    p.add_argument("--fault-workers", type=int, default=2, help="workers for the fault runs (default 2)")
    p.add_argument("--no-faults", action="store_true", help="skip the fault runs")
    p.add_argument("--no-peers", action="store_true", help="only fastdata and the ceiling")
    p.add_argument("--egress-shards", type=int, default=8, help="tar shards of the egress runs (default 8)")
    p.add_argument("--egress-workers", default="0,2", help="worker counts of the egress runs (default 0,2)")
    p.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"the sections to run, of {','.join(SECTIONS)} (default: all)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    args.workers = [int(w) for w in args.workers.split(",")]
    args.egress_workers = [int(w) for w in args.egress_workers.split(",")]
    sections = {x.strip() for x in args.only.split(",") if x.strip()}
    if sections - set(SECTIONS):
        p.error(
            f"--only: unknown section(s) {', '.join(sorted(sections - set(SECTIONS)))}; known: {', '.join(SECTIONS)}"
        )
    torch.set_num_threads(1)  # collate stalls with 2 intra-op threads on a busy machine (docs/bench.md)
    rng = np.random.default_rng(args.seed)
    t_start = time.time()
    load_start = os.getloadavg()
    results: dict[str, Any] = {}
    with MotoServer() as server, FaultProxy(server.endpoint_url) as proxy:
        for name, value in server.env().items():
            os.environ[name] = value  # for TarShardDataset and webdataset, which take no S3 options
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        mean = args.object_kb * 1024
        files: dict[str, bytes | str] = {
            f"small/{i:06d}.bin": rng.bytes(int(rng.uniform(0.5 * mean, 1.5 * mean))) for i in range(args.objects)
        }
        expected = {f"s3://{BUCKET}/{k}": hashlib.sha1(v).hexdigest() for k, v in files.items() if isinstance(v, bytes)}
        if sections & {"small", "latency", "faults"}:
            print(f"uploading {args.objects} objects ...", flush=True)
            upload(client, files)
        urls = sorted(expected)
        modes = ["fastdata"] if args.no_peers else ["fastdata", "naive", "per_worker"]
        if not args.no_peers:
            try:
                import s3torchconnector  # noqa: F401

                modes.append("s3torchconnector")
            except ImportError:
                print("s3torchconnector is not installed: skipped", flush=True)
        if "small" in sections:
            print(f"small objects, direct to the server ({server.endpoint_url}):", flush=True)
            results["small"] = small_objects(args, urls, server.endpoint_url, modes)
        if args.latency_ms > 0 and "latency" in sections:
            proxy.configure(latency_ms=args.latency_ms)
            print(f"small objects, {args.latency_ms:g} ms added to every request:", flush=True)
            results["latency"] = small_objects(
                args, urls, proxy.endpoint_url, [m for m in modes if m in ("fastdata", "per_worker")]
            )
            proxy.reset()
        if args.shards > 0 and "shards" in sections:
            with_tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-s3-shards-{os.getpid()}"
            with_tmp.mkdir(parents=True, exist_ok=True)
            made = make_shards_sized(with_tmp, args, rng)
            upload(client, {f"shards/{name}": q for name, q in made.items()})
            paths = [q for name, q in made.items() if name.endswith(".tar")]
            nbytes = sum(os.path.getsize(q) for q in paths)
            print(f"tar shards ({args.shards} x {args.samples_per_shard} samples, {nbytes / 1e6:.0f} MB):", flush=True)
            results["shards"] = shards(
                args,
                [f"s3://{BUCKET}/shards/{os.path.basename(q)}" for q in paths],
                server.endpoint_url,
                args.shards * args.samples_per_shard,
                nbytes,
            )
        if not args.no_faults and "faults" in sections:
            print("through 10% 503 SlowDown and 10% bodies cut midway:", flush=True)
            results["faults"] = faults(args, urls, proxy, expected)
        if "egress" in sections:
            results["egress"] = egress(args, client, rng)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report = {
        "benchmark": "bench_s3",
        "args": settings,
        "versions": versions(),
        "machine": machine(),
        "seconds_total": round(time.time() - t_start, 1),
        "results": results,
        "summary": summarize(results, args),
    }
    readme.stamp(report, readme_rows(report["summary"], args), load_start)
    print(json.dumps(report["summary"], indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


def make_shards_sized(folder: Path, args: argparse.Namespace, rng: np.random.Generator) -> dict[str, str]:
    """Shards of ``--samples-per-shard`` samples of ~``--object-kb`` each, with the ``.idx`` sidecars and
    ``manifest.json`` that ``fastdata convert`` writes: ``{name: local path}``."""
    from fastdata.formats.tar._reader import scan
    from fastdata.storage._local import LocalReader

    mean = args.object_kb * 1024
    files: dict[str, str] = {}
    listed = []
    for s in range(args.shards):
        samples = [
            {
                "__key__": f"s{s * args.samples_per_shard + i:07d}",
                "bin": rng.bytes(int(rng.uniform(0.5 * mean, 1.5 * mean))),
                "cls": b"1",
            }
            for i in range(args.samples_per_shard)
        ]
        name = f"train-{s:06d}.tar"
        path = str(folder / name)
        write_tar(path, samples)
        with LocalReader(path) as reader:
            index = scan(reader)
        Path(path + ".idx").write_bytes(index.to_bytes())
        files[name], files[name + ".idx"] = path, path + ".idx"
        listed.append({"name": name, "samples": len(index), "bytes": os.path.getsize(path)})
    manifest = folder / "manifest.json"
    manifest.write_text(
        json.dumps({"format": "tar", "version": 1, "samples": sum(x["samples"] for x in listed), "shards": listed})
    )
    files["manifest.json"] = str(manifest)
    return files


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds the with blocks: the server and proxy are stopped


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop)
    main()
