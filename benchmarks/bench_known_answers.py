"""How often is each known-answer case labelled right? The target of issues 15 and 22: at least 9 of 10 runs,
under a background load of one busy core, and --quick and the fuller run giving the same label; for users'
workloads (tests/user_workloads.py: plain torch datasets waiting on a loopback HTTP server, sleeps, a lock, the
disk with its page cache dropped; Python and JPEG decoding in loader threads) also live, under the monitor in a
training loop, with the same label offline and live.

Each run measures every case of tests/known_answers.py (one real loader per label: tar JPEG decode with
a 20 ms step, video decode on a helper thread at 0 workers, a shuffle window that fills the first
batch, a 2 GiB parent, a slow per-worker set-up, huge Python batches, cheap items, a 100 ms step,
workers over a memory budget, S3 behind a latency-injecting proxy; issue 35's page-cached gzip HDF5 file
read by workers and by loader threads, and a training loop whose workers restart every epoch) at the --quick
timing and at the fuller one (every case at both here, where the test suite runs the fuller one only where
it sees more), while a busy-loop subprocess holds one core. The S3 case starts a local moto server and
the fault proxy (tests/fault_proxy.py). JSON out with the counts, every run's labels, the load average
and library versions.

    PYTHONPATH=. python benchmarks/bench_known_answers.py --runs 10 --json known-answers.json
    PYTHONPATH=. python benchmarks/bench_known_answers.py --runs 10 --users --json users.json   # users' only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout: the tests' servers

from fastdata.bench._environment import describe
from tests.fault_proxy import FaultProxy
from tests.known_answers import CASES, FULL, QUICK, USERS, busy_core
from tests.s3_server import MotoServer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--cases", default="", help="comma-separated expected labels to run (default: all)")
    ap.add_argument("--timings", default="quick,full")
    ap.add_argument("--users", action="store_true", help="only the users' workloads (each offline and live)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    wanted = {c for c in args.cases.split(",") if c}
    cases = [c for c in (USERS if args.users else CASES) if not wanted or c.expected in wanted]
    timings = {"quick": QUICK, "full": FULL}
    chosen = [t for t in args.timings.split(",") if t]
    labels: dict[str, dict[str, list[str]]] = {c.name: {t: [] for t in chosen} for c in cases}
    live: dict[str, dict[str, list[str]]] = {c.name: {t: [] for t in chosen} for c in cases if c.live is not None}
    loads: list[float] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, MotoServer() as server, FaultProxy(server.endpoint_url) as proxy:
        client = server.client()
        client.create_bucket(Bucket="known")
        client.close()
        folder = Path(tmp)
        for run in range(args.runs):
            for case in cases:
                for t in chosen:
                    loads.append(os.getloadavg()[0])
                    with busy_core():
                        try:
                            rec = case.run(folder, timings[t], s3=(server, proxy, "known"))
                            got = rec.bottleneck
                        except Exception as e:  # noqa: BLE001 - a failed run counts as wrong, with its reason
                            got = f"error: {type(e).__name__}: {e}"
                        seen = ""
                        if case.live is not None:
                            try:
                                seen = case.live(folder, timings[t]).label
                            except Exception as e:  # noqa: BLE001 - a failed run counts as wrong, with its reason
                                seen = f"error: {type(e).__name__}: {e}"
                            live[case.name][t].append(seen)
                    proxy.reset()
                    labels[case.name][t].append(got)
                    also = f", live -> {seen}" if case.live is not None else ""
                    print(f"run {run + 1} {t:5s} {case.expected:12s} -> {got}{also}", flush=True)
    summary = {}
    for case in cases:
        row: dict[str, Any] = {"expected": case.expected}
        for t in chosen:
            row[t] = sum(label == case.expected for label in labels[case.name][t])
        if len(chosen) == 2:
            a, b = (labels[case.name][t] for t in chosen)
            row["quick_full_agree"] = sum(x == y for x, y in zip(a, b))
        if case.name in live:
            for t in chosen:
                row[f"live_{t}"] = sum(label == case.expected for label in live[case.name][t])
                pairs = zip(labels[case.name][t], live[case.name][t])
                row[f"offline_live_agree_{t}"] = sum(x == y for x, y in pairs)
        summary[case.name] = row
    out = {
        "runs": args.runs,
        "summary": summary,
        "labels": labels,
        "live_labels": live,
        "load_average": {"min": min(loads), "median": sorted(loads)[len(loads) // 2], "max": max(loads)},
        "seconds": time.perf_counter() - started,
        "machine": describe(),
    }
    print(json.dumps({"summary": summary, "load_average": out["load_average"]}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
