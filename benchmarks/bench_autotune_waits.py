"""``num_workers="auto"`` and the sweep's recommendation past the core count, on items that wait, in one run.

Workloads (``--workloads``), each a fastdata map-style dataset of ``--items`` items, batches of 16:

* ``sleep``: each item sleeps 5 ms (a rate limit, a simulated latency);
* ``http``: each item is fetched from a loopback HTTP server (a subprocess: Python's ThreadingHTTPServer)
  that answers every request after 5 ms, one kept-alive connection per process;
* ``cpu``: each item costs ~1 ms of pure-Python work (CPU-bound: auto must not pass the cores).

For each: whole runs of ``fd.Loader`` (a fresh Loader each, one epoch, start-up, adjustments and restarts
included) for ``num_workers="auto"`` and for each fixed count of {0, 1, 2, 4, 8, 16}, rounds interleaved
(rotated); a fixed setting slower than ``--cutoff`` seconds stops early and counts its rate so far (the best
one always finishes). Figure: median samples/s of the rounds per setting; ratio: auto / the best fixed
(target >= 0.9). Then the sweep ``fastdata bench`` runs by default (its grid widened past the cores while the
workers wait) and its recommendation: the recommended setting's run rate / the best fixed (target >= 0.95),
both run again after the sweep in interleaved rounds (the runs before the sweep are reported beside). The
JSON records the load average before and after, library versions, every run.

    PYTHONPATH=. python benchmarks/bench_autotune_waits.py --out bench-out/autotune_waits.json
    PYTHONPATH=. python benchmarks/bench_autotune_waits.py --workloads sleep --rounds 1 --items 20000

How ours differs from tf.data's AUTOTUNE: tf.data models the pipeline in-process (each op's time per element,
measured inside its iterators) and climbs each knob's parallelism while the model predicts a shorter output
latency, within ``cpu_budget`` (by default the schedulable cores) and ``ram_budget`` (half the free RAM). Here
the workers are separate processes measured from outside (/proc): what each waits on is looked at directly,
so the count goes past the cores only for workers seen waiting off the CPU, and every step is a measured
trial kept only if the loader became faster.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

import fastdata as fd
from fastdata.bench._environment import describe
from fastdata.bench._synthetic import spin
from fastdata.datasets._base import MapDatasetBase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout: the tests' server
from tests.user_workloads import http_server

FIXED = (0, 1, 2, 4, 8, 16)
BATCH = 16


class Items(MapDatasetBase, Dataset[torch.Tensor]):
    """``n`` items of one workload (see the module doc)."""

    def __init__(self, kind: str, n: int, port: int = 0) -> None:
        self._init_base(seed=0, on_error="raise", rank=None, world_size=None)
        self.kind, self.n, self.port = kind, n, port
        self._conn: http.client.HTTPConnection | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_conn": None, "_pid": -1}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.kind == "sleep":
            time.sleep(0.005)
        elif self.kind == "cpu":
            spin(10_000)
        else:
            if self._pid != os.getpid():
                self._conn, self._pid = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10), os.getpid()
            assert self._conn is not None
            self._conn.request("GET", f"/item/{i}")
            self._conn.getresponse().read()
        return torch.full((16,), i)


@contextlib.contextmanager
def server(kind: str) -> Iterator[int]:
    """The loopback HTTP server of tests/user_workloads.py (5 ms per GET) for ``http``; port 0 otherwise."""
    if kind != "http":
        yield 0
        return
    with http_server() as port:
        yield port


def one_run(ds: Items, workers: Any, cutoff: float, threads: bool = False) -> dict[str, Any]:
    """One epoch of a fresh Loader (stopped at ``cutoff`` seconds); samples per second from its construction.
    ``threads``: loader threads (``workers="threads"``) instead of worker processes."""
    start = time.perf_counter()
    mode: Any = "threads" if threads else "processes"
    loader = fd.Loader(ds, batch_size=BATCH, num_workers=workers, workers=mode)
    samples, done = 0, True
    for batch in loader:
        samples += len(batch)
        if time.perf_counter() - start > cutoff:
            done = False
            break
    elapsed = time.perf_counter() - start
    changes = [c.to_dict() for c in loader.changes]
    loader.close()
    return {"rate": samples / elapsed, "seconds": elapsed, "samples": samples, "finished": done, "changes": changes}


def measure(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    grid: list[Any] = [*FIXED, "auto"]
    runs: dict[str, list[dict[str, Any]]] = {str(w): [] for w in grid}
    with server(kind) as port:
        n = args.items if kind != "cpu" else args.items // 4
        ds = Items(kind, n, port)
        one_run(Items(kind, 2 * BATCH * 4, port), 2, 60)  # imports, the server's first connections
        for rnd in range(args.rounds):
            k = rnd % len(grid)
            for w in grid[k:] + grid[:k]:
                r = one_run(ds, w, args.cutoff if w != "auto" else 1e9)
                runs[str(w)].append(r)
                moves = [c["to"]["workers"] for c in r["changes"]]
                print(f"{kind} round {rnd} workers {w}: {r['rate']:,.0f} samples/s {moves}", flush=True)
        medians = {k: statistics.median(r["rate"] for r in v) for k, v in runs.items()}
        fixed = {k: v for k, v in medians.items() if k != "auto"}
        best = max(fixed, key=fixed.__getitem__)
        # the sweep fastdata bench runs by default, and its recommendation
        started = time.perf_counter()
        result = fd.bench.sweep(Items(kind, n, port), batch_size=BATCH, seconds=args.sweep_seconds)
        rec = fd.bench.recommend(result)
        sweep_s = time.perf_counter() - started
        assert rec.config is not None
        key = str(rec.config.num_workers) if rec.config.mode == "processes" else f"{rec.config.num_workers}t"
        # the recommendation against the best fixed setting, measured again after the sweep in interleaved
        # rounds: compared with runs taken before the sweep, drift between the two (the machine, the
        # server's state) reads as the recommendation's fault or merit
        threads = rec.config.mode == "threads"
        pair = {key: (rec.config.num_workers, threads), f"{best} (again)": (int(best), False)}
        after: dict[str, list[dict[str, Any]]] = {k: [] for k in pair}
        for rnd in range(args.rounds):
            for k in list(pair)[rnd % 2 :] + list(pair)[: rnd % 2]:
                after[k].append(one_run(ds, pair[k][0], args.cutoff, pair[k][1]))
        after_medians = {k: statistics.median(r["rate"] for r in v) for k, v in after.items()}
        if key not in medians:
            runs[key], medians[key] = after[key], after_medians[key]
    return {
        "items": n,
        "runs": runs,
        "median_rate": medians,
        "best_fixed": best,
        "ratio_auto_to_best": medians["auto"] / fixed[best],
        "auto_settings": [[c["to"]["workers"] for c in r["changes"]] for r in runs["auto"]],
        "sweep": {
            "seconds": sweep_s,
            "points": {p.config.label(): p.samples_per_s for p in result.points},
            "widened": result.settings.get("widened"),
            "recommended": rec.config.label(),
            "bottleneck": rec.bottleneck,
            "diagnosis": rec.diagnosis[:2],
            "ratio_recommended_to_best_fixed": medians[key] / fixed[best],
            "after_sweep": {"runs": after, "median_rate": after_medians},
            # the target's figure: both measured after the sweep, rounds interleaved
            "ratio_recommended_to_best_fixed_interleaved": after_medians[key] / after_medians[f"{best} (again)"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workloads", default="sleep,http,cpu")
    p.add_argument("--items", type=int, default=60_000, help="items an epoch (a quarter of it for cpu)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cutoff", type=float, default=25.0, help="seconds after which a fixed setting's run stops")
    p.add_argument("--sweep-seconds", type=float, default=2.0, help="seconds per point of the sweep")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    out: dict[str, Any] = {"machine": describe(), "settings": vars(args), "load_before": os.getloadavg()}
    for kind in args.workloads.split(","):
        out[kind] = measure(kind, args)
        brief = {k: out[kind][k] for k in ("best_fixed", "ratio_auto_to_best", "auto_settings")}
        print(kind, json.dumps({**brief, "sweep": out[kind]["sweep"]}, default=str), flush=True)
    out["load_after"] = os.getloadavg()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
