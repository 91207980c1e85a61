#!/usr/bin/env python3
"""What ``fastdata bench s3://...`` says against what ``fd.Loader`` does by hand, in one run (issue 35,
"Done when", the S3 row):

1. webdataset-style shards of photo-like JPEGs (no sidecars, as ``tar`` and webdataset write them) are
   put on a local S3 server (moto, its own process, 127.0.0.1);
2. ``fastdata bench s3://BUCKET/train/`` runs as a user runs it (the command line, a child process, the
   AWS chain pointing at the server), and the same for the same shards on local disk;
3. a hand loop reads the S3 shards through ``fd.Loader`` at the recommended setting and at the other
   worker counts swept: ``TarShardDataset(decode="torch", batch_size=B, shuffle=True)`` read through a
   node-local cache, as the bench's sweep reads them; ``--epochs`` epochs after one to warm the cache,
   each epoch starting its workers as ``fd.Loader`` does by default; samples/s over all of them;
4. the same hand loop over the local shards at the setting the local bench recommends.

The bench's samples/s per setting is set beside the hand loop's at the same setting; the bytes the bench
fetched from the server beside the bytes stored. ``--repeats`` rounds, each the S3 bench, its hand loops,
the local bench, its hand loop, in turn (load from other programs shared among them); medians.

    python benchmarks/advice_s3.py --json benchmarks/results/advice_s3.json
    python benchmarks/advice_s3.py --seconds 1 --epochs 3 --repeats 1     # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUCKET = "advice-s3"
LOADER_KEYS = ("batch_size", "num_workers", "prefetch_factor", "persistent_workers", "transport", "pin_memory")


def bench(spec: str, args: argparse.Namespace, out: Path, env: dict[str, str]) -> dict[str, Any]:
    """``fastdata bench SPEC`` from the command line, as a user runs it; its JSON and its heading."""
    cmd = [
        sys.executable,
        "-m",
        "fastdata",
        "bench",
        spec,
        "--workers",
        args.workers,
        "--batch-size",
        str(args.batch),
        "--seconds",
        str(args.seconds),
        "--rounds",
        str(args.rounds),
        "--json",
        str(out),
    ]
    started = time.perf_counter()
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
    data = json.loads(out.read_text())
    points = {label(p["config"]): p["samples_per_s"] for p in data["result"]["points"] if p["error"] is None}
    rec = data["recommendation"]
    heading = next((line for line in run.stdout.splitlines() if line.startswith("measured:")), "")
    return {
        "command": " ".join(["fastdata", *cmd[3:]]),
        "seconds": took,
        "heading": heading,
        "measured": data["measured"],
        "recommended": rec["config"],
        "code": rec["code"],
        "kwargs": rec["kwargs"],
        "points": points,
    }


def label(config: dict[str, Any]) -> str:
    """A point's label as the bench's table writes it (``1w pf2 slots``)."""
    from fastdata.bench import Config

    return str(Config(**config).label())


def hand_loop(urls: list[str], kwargs: dict[str, Any], args: argparse.Namespace, **source: Any) -> dict[str, Any]:
    """``fd.Loader`` with ``kwargs`` over ``urls``: samples/s over ``--epochs`` epochs after a warm one."""
    import fastdata as fd

    ds = fd.TarShardDataset(urls, decode="torch", batch_size=args.batch, shuffle=True, seed=args.seed, **source)
    loader = fd.Loader(ds, **{k: v for k, v in kwargs.items() if k in LOADER_KEYS})
    try:
        for _ in loader:  # epoch 0: the cache filled, as the bench's preparation fills it
            pass
        samples, started = 0, time.perf_counter()
        for epoch in range(1, args.epochs + 1):
            loader.set_epoch(epoch)
            for batch in loader:
                samples += len(batch["__key__"])
        took = time.perf_counter() - started
        fetched = int(ds.counters().get("s3_bytes", 0))
    finally:
        loader.close()
        ds.close()
    return {"samples_per_s": samples / took, "samples": samples, "seconds": took, "fetched_bytes": fetched}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("fastdata", "torch", "numpy", "moto", "boto3"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--samples", type=int, default=100, help="JPEGs per shard (128x128, ~8 KB each)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", default="0,1,2", help="the bench's --workers; the hand loop runs each")
    p.add_argument("--seconds", type=float, default=2.0, help="the bench's --seconds per point")
    p.add_argument("--rounds", type=int, default=1, help="the bench's own --rounds, in each of --repeats")
    p.add_argument("--epochs", type=int, default=6, help="epochs timed per hand loop, after a warm one")
    p.add_argument("--repeats", type=int, default=3, help="rounds of bench and hand loops, in turn (medians)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    import fastdata as fd
    from fastdata.bench._local_s3 import MotoServer
    from fastdata.bench.backends._tar import write_demo_shards
    from fastdata.core.system import usable_cores
    from fastdata.storage.s3 import S3Config

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="advice-s3-") as tmp, MotoServer() as server:
        root = Path(tmp)
        pattern = write_demo_shards(root / "shards", shards=args.shards, per_shard=args.samples, seed=args.seed)
        local = sorted(str(p) for p in (root / "shards").glob("*.tar"))
        stored = sum(os.path.getsize(p) for p in local)
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        for path in local:
            client.upload_file(path, BUCKET, f"train/{os.path.basename(path)}")
        client.close()
        remote = [f"s3://{BUCKET}/train/{os.path.basename(p)}" for p in local]
        # the child bench finds the server through the AWS chain, as a user's run finds theirs; fastdata's
        # own cache folder (used by nothing here but said in a warning) kept in the temporary folder
        env = {**os.environ, **server.env(), "XDG_CACHE_HOME": str(root / "xdg"), "PYTHONPATH": str(ROOT)}
        os.environ["XDG_CACHE_HOME"] = env["XDG_CACHE_HOME"]
        print(f"{len(local)} shards, {len(local) * args.samples} JPEGs, {stored / 1e6:.1f} MB", flush=True)
        config = S3Config(**server.options())
        benches_s3: list[dict[str, Any]] = []
        benches_local: list[dict[str, Any]] = []
        settings: dict[str, dict[str, Any]] = {}
        hand: dict[str, list[dict[str, Any]]] = {}
        hand_local: list[dict[str, Any]] = []
        for r in range(args.repeats):  # each round: the bench, then the hand loops, S3 then local
            benches_s3.append(bench(f"s3://{BUCKET}/train/", args, root / f"bench-s3-{r}.json", env))
            print(f"round {r}: bench s3: {benches_s3[-1]['heading']}\n  {benches_s3[-1]['code']}", flush=True)
            if not settings:
                settings = _settings(benches_s3[0], args)
                hand = {name: [] for name in settings}
            for name, kwargs in settings.items():
                with tempfile.TemporaryDirectory(dir=tmp) as cache:
                    run = hand_loop(remote, kwargs, args, storage_options={"config": config}, cache_dir=cache)
                hand[name].append(run)
                print(f"  round {r}: hand s3 {name}: {run['samples_per_s']:,.0f} samples/s", flush=True)
            benches_local.append(bench(pattern, args, root / f"bench-local-{r}.json", env))
            print(f"round {r}: bench local: {benches_local[-1]['code']}", flush=True)
            run = hand_loop(local, benches_local[0]["kwargs"], args)
            hand_local.append(run)
            print(f"  round {r}: hand local {benches_local[0]['recommended']}: {run['samples_per_s']:,.0f}", flush=True)

    def median(runs: list[dict[str, Any]]) -> float:
        return statistics.median(r["samples_per_s"] for r in runs)

    def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
        """The first round's bench, its samples/s per setting the median over the rounds."""
        labels = {k for b in runs for k in b["points"]}
        points = {k: statistics.median(b["points"][k] for b in runs if k in b["points"]) for k in labels}
        said = [b["recommended"] for b in runs]
        # the setting recommended most often over the rounds (the first of equals)
        return runs[0] | {"points": points, "recommended_by_round": said, "recommended": max(said, key=said.count)}

    on_s3, on_disk = pooled(benches_s3), pooled(benches_local)
    rows = []
    for name in settings:
        said = on_s3["points"].get(name)
        done = median(hand[name])
        rows.append(
            {
                "setting": name,
                "recommended": name == on_s3["recommended"],
                "bench_samples_per_s": said,
                "hand_samples_per_s": done,
                "bench_over_hand": said / done if said else None,
                "bench_rounds": [b["points"].get(name) for b in benches_s3],
                "hand_rounds": [r["samples_per_s"] for r in hand[name]],
            }
        )
    fastest = max(rows, key=lambda r: r["hand_samples_per_s"])
    rec_row = next(r for r in rows if r["recommended"])
    local_label = benches_local[0]["recommended"]  # the setting the local hand loop ran
    said_local = on_disk["points"].get(local_label)
    out = {
        "benchmark": "advice_s3",
        "corpus": {"shards": len(local), "samples": len(local) * args.samples, "stored_bytes": stored},
        "args": vars(args) | {"json": str(args.json) if args.json else None},
        "s3": {"bench": on_s3, "hand": rows},
        "local": {
            "bench": on_disk,
            "hand_setting": local_label,
            "hand_samples_per_s": median(hand_local),
            "bench_over_hand": said_local / median(hand_local) if said_local else None,
        },
        "summary": {
            "fetched_over_stored": on_s3["measured"]["fetched_bytes"] / stored,
            "fetched_over_stored_by_round": [b["measured"]["fetched_bytes"] / stored for b in benches_s3],
            "recommended_over_fastest_by_hand": rec_row["hand_samples_per_s"] / fastest["hand_samples_per_s"],
        },
        # other programs' load moves every figure here: said with them
        "machine": {
            "usable_cores": usable_cores(),
            "platform": platform.platform(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "versions": versions(),
        "fastdata": fd.__file__,
    }
    print(f"\nload average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after ({usable_cores()} usable cores)")
    print("setting            bench says   hand measured   bench/hand")
    for r in rows:
        mark = "*" if r["recommended"] else " "
        said = f"{r['bench_samples_per_s']:,.0f}" if r["bench_samples_per_s"] else "-"
        ratio = f"{r['bench_over_hand']:.2f}" if r["bench_over_hand"] else "-"
        print(f"{mark} {r['setting']:<16} {said:>10}   {r['hand_samples_per_s']:>13,.0f}   {ratio:>10}")
    print(
        f"bytes fetched by the bench: {on_s3['measured']['fetched_bytes'] / 1e6:.2f} MB = "
        f"{out['summary']['fetched_over_stored']:.2f}x the {stored / 1e6:.2f} MB stored"
    )
    print(
        f"recommended setting, by hand: {out['summary']['recommended_over_fastest_by_hand']:.2f} of the fastest "
        f"measured by hand ({fastest['setting']})"
    )
    print(
        f"local: bench says {said_local or 0:,.0f} samples/s at {local_label} (recommended: "
        f"{', '.join(on_disk['recommended_by_round'])}); by hand "
        f"{median(hand_local):,.0f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
        print(f"JSON: {args.json}")


def _settings(on_s3: dict[str, Any], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The hand loop's settings: each worker count swept, with and without persistent workers (the bench
    measures the persistent variant where start-up costs), at the recommendation's other settings."""
    from fastdata.bench import Config

    rec = on_s3["kwargs"]
    out: dict[str, dict[str, Any]] = {}
    for w in (int(x) for x in args.workers.split(",")):
        for persist in (False, True) if w else (False,):
            config = Config(
                w,
                rec.get("prefetch_factor") or 2 if w else None,
                bool(rec.get("pin_memory")),
                persist,
                None,
                transport=rec.get("transport", "slots") if w else "stock",
            )
            out[config.label()] = config.loader_kwargs()
    return out


if __name__ == "__main__":
    main()
