"""``num_workers="auto"`` against every fixed setting, and the monitor's cost, in one run.

Three parts (``--parts``), each a ratio of figures measured in the same run, rounds interleaved:

* ``targets``: on each backend's demo data (``fastdata.bench._demo``'s, built by the backends), with and
  without a simulated training step (``--steps``, ms per batch, a sleep): the throughput of whole runs of
  ``fd.Loader`` (a fresh dataset and Loader each, several epochs, the first included with every worker
  start-up, adjustment and restart) for ``num_workers="auto"`` and for each fixed count of the grid auto
  moves on (0, 1, 2, 4 ... up to the usable cores: the grid ``fastdata bench`` sweeps). Figure: median of the
  rounds per setting; ratio: auto / the best fixed setting.
* ``interference``: one long epoch of the tar demo (decoded JPEGs, CPU-bound), no step; after
  ``--hog-after`` seconds a CPU-bound program (one busy-loop process) starts and runs to the end. For auto:
  the seconds from its start to auto's first change; for every setting: the throughput over the rest of the
  epoch. Ratio: auto / the best fixed setting under the same interference.
* ``overhead``: the monitor's cost: the same runs with ``monitor=`` (a report every ``--monitor-seconds``,
  10 by default as ``monitor=True`` makes them, to a function)
  and without, at a fixed setting, on the tar demo (2 workers) and the HDF5 demo (no workers: the main
  process makes every batch, so the per-batch hook is on its critical path). Ratio: monitored / plain.
  On a shared machine that ratio moves by more than the 1% it is meant to show, so the monitor's parts are
  also timed on their own: the hook per batch (over a list of batches, no loader), a snapshot, a report,
  and in each monitored run the CPU of the D-state looks; ``main_share`` is their share of the run's time
  (hook x batches + report x reports + looks, over the run's seconds; the workers' probes not counted).

The machine is shared: compare ratios within one run (the JSON records the load average before and after).

Usage::

    PYTHONPATH=. python benchmarks/bench_autotune.py --out bench_autotune.json
    PYTHONPATH=. python benchmarks/bench_autotune.py --parts targets --backends tar,hdf5 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import fastdata as fd
from fastdata.bench import backends as registry
from fastdata.bench._environment import describe
from fastdata.core.system._machine import usable_cores
from fastdata.loading.observe import Monitor
from fastdata.loading.observe.tune import ladder

# per backend: (demo scale, epochs without a step); with a step, epochs make about --step-seconds of steps
RUNS = {"tar": (2.0, 3), "hdf5": (1.0, 90), "video": (1.0, 4), "s3": (1.0, 3)}
BUSY = "import time\nend = time.time() + 600\nwhile time.time() < end:\n    pass\n"


def _loader(backend: Any, data: Any, workers: Any, **options: Any) -> fd.Loader:
    kw = dict(data.options)
    if backend.dataset_batches:
        kw["batch_size"] = backend.demo_batch_size
        return fd.Loader(backend.open(data.spec, **kw), num_workers=workers, **options)
    return fd.Loader(backend.open(data.spec, **kw), batch_size=backend.demo_batch_size, num_workers=workers, **options)


def _run(backend: Any, data: Any, workers: Any, epochs: int, step: float, **options: Any) -> dict[str, Any]:
    """One run: a fresh Loader, ``epochs`` epochs; samples per second from its construction to the end."""
    start = time.perf_counter()
    loader = _loader(backend, data, workers, **options)
    samples = batches = seen = 0
    at: list[int] = []  # the batch (counted over all epochs) after which each change showed
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            samples += _samples(batch)
            batches += 1
            if len(loader.changes) != seen:
                at += [batches] * (len(loader.changes) - seen)
                seen = len(loader.changes)
            if step:
                time.sleep(step)
    elapsed = time.perf_counter() - start
    changes = [{**c.to_dict(), "batch": b} for c, b in zip(loader.changes, at, strict=False)]
    # the CPU-seconds of the monitor's D-state looks (a thread of the main process that counts its own)
    looks = loader._session.probe._sampler.cpu if loader._session is not None else 0.0
    loader.close()
    return {
        "samples": samples,
        "batches": batches,
        "seconds": elapsed,
        "rate": samples / elapsed,
        "changes": changes,
        "looks_cpu_s": looks,
        # auto settled after the batch of its last change (0: it never moved from its estimate)
        "settled_at_batch": at[-1] if at else 0,
    }


def _samples(batch: Any) -> int:
    from fastdata.loading.observe.measure import batch_samples

    return batch_samples(batch)


def _grid() -> list[Any]:
    return [*ladder(0, usable_cores()), "auto"]


def _rotate(items: list[Any], k: int) -> list[Any]:
    k %= len(items)
    return items[k:] + items[:k]


def _summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    medians = {k: statistics.median(r["rate"] for r in v) for k, v in runs.items()}
    fixed = {k: v for k, v in medians.items() if k != "auto"}
    best = max(fixed, key=fixed.__getitem__)
    return {
        "median_rate": medians,
        "best_fixed": best,
        "ratio_auto_to_best": medians["auto"] / fixed[best],
        "auto_settings": [[c["to"]["workers"] for c in r["changes"]] for r in runs["auto"]],
        "auto_settled_at_batch": [r["settled_at_batch"] for r in runs["auto"]],
        "auto_batches": [r["batches"] for r in runs["auto"]],
    }


@contextlib.contextmanager
def _demo(name: str, root: Path, scale: float) -> Iterator[tuple[Any, Any]]:
    backend = registry.get(name)
    with backend.demo(root / name, scale=scale) as data:
        yield backend, data


def targets(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in args.backends:
        scale, epochs = RUNS[name]
        with _demo(name, root, scale * args.scale) as (backend, data):
            per_epoch = len(_loader(backend, data, 0))
            for step_ms in args.steps:
                step = step_ms / 1000
                n = epochs if not step else max(2, round(args.step_seconds / (per_epoch * step)))
                runs: dict[str, list[dict[str, Any]]] = {str(w): [] for w in _grid()}
                _run(backend, data, 0, 1, 0.0)  # warm the page cache and the imports
                for rnd in range(args.rounds):
                    for w in _rotate(_grid(), rnd):
                        r = _run(backend, data, w, n, step)
                        runs[str(w)].append(r)
                        print(
                            f"{name} step {step_ms} ms round {rnd} workers {w}: {r['rate']:,.0f} samples/s", flush=True
                        )
                key = f"{name}/step{step_ms}"
                out[key] = {"epochs": n, "batches_per_epoch": per_epoch, "runs": runs, **_summary(runs)}
                print(f"{key}: auto / best fixed ({out[key]['best_fixed']}) = {out[key]['ratio_auto_to_best']:.2f}")
    return out


def _interfered(backend: Any, data: Any, workers: Any, hog_after: float) -> dict[str, Any]:
    """One epoch; a busy loop starts ``hog_after`` s in. Throughput after its start; auto's reaction."""
    loader = _loader(backend, data, workers)
    loader.set_epoch(0)
    hog = None
    samples_after = before = 0
    start = time.perf_counter()
    started = 0.0
    try:
        for batch in loader:
            now = time.perf_counter()
            if hog is None and now - start >= hog_after:
                hog = subprocess.Popen([sys.executable, "-c", BUSY])
                started = now
                before = len(loader.changes)
            elif hog is not None:
                samples_after += _samples(batch)
        end = time.perf_counter()
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    after = loader.changes[before:]
    reaction = None
    if after and loader._session is not None:
        # change times are the session's perf_counter readings, the clock used here
        reaction = after[0].t - started
    if hog is None:
        loader.close()
        raise SystemExit(
            f"interference: the epoch ended before --hog-after={hog_after} s ({end - start:.1f} s); "
            "raise --interference-scale or lower --hog-after"
        )
    out = {
        "rate_after": samples_after / (end - started),
        "seconds_after": end - started,
        "reaction_s": reaction,
        "changes": [c.to_dict() for c in loader.changes],
    }
    loader.close()
    return out


def interference(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    with _demo("tar", root, args.interference_scale) as (backend, data):
        _run(backend, data, 0, 1, 0.0)
        runs: dict[str, list[dict[str, Any]]] = {str(w): [] for w in _grid()}
        for rnd in range(args.rounds):
            for w in _rotate(_grid(), rnd):
                r = _interfered(backend, data, w, args.hog_after)
                runs[str(w)].append(r)
                print(
                    f"interference round {rnd} workers {w}: {r['rate_after']:,.0f} samples/s after the program "
                    f"started ({r['seconds_after']:.1f} s), reaction {r['reaction_s']}",
                    flush=True,
                )
    medians = {k: statistics.median(r["rate_after"] for r in v) for k, v in runs.items()}
    fixed = {k: v for k, v in medians.items() if k != "auto"}
    best = max(fixed, key=fixed.__getitem__)
    reactions = [r["reaction_s"] for r in runs["auto"]]
    return {
        "runs": runs,
        "median_rate_after": medians,
        "best_fixed": best,
        "ratio_auto_to_best": medians["auto"] / fixed[best],
        "reaction_s": reactions,
        "reacted_within_10s": sum(1 for x in reactions if x is not None and x <= 10),
    }


def _hook_cost(n: int = 200_000) -> dict[str, float]:
    """Seconds per batch of the session's hook alone, over a list of small batches; a snapshot; a report."""
    from fastdata.loading.observe._session import Session
    from fastdata.loading.observe.report import Monitor
    from fastdata.loading.observe.tune import Setting

    batches = [torch.zeros(4)] * n
    t = time.perf_counter()
    for _ in iter(batches):
        pass
    plain = (time.perf_counter() - t) / n
    session = Session(Monitor(to=lambda s: None, seconds=1e9), None, Setting(0), rows=1)
    session.pass_starts()
    t = time.perf_counter()
    for _ in session.run(iter(batches), 0, 0, n, None):
        pass
    hooked = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(200):
        session.probe.read()  # a reading of the probe (what each window's two ends cost)
    snapshot = (time.perf_counter() - t) / 200
    t = time.perf_counter()
    for _ in range(20):
        session.stats(since="start")  # a full report: a reading with memory, the evidence, the label
    made = (time.perf_counter() - t) / 20
    session.close()
    return {"plain_s": plain, "hook_s": hooked - plain, "snapshot_s": snapshot, "report_s": made}


def _report_share(hook: dict[str, float], seconds: float) -> float:
    """The share of the main process's time that making a report every ``seconds`` takes."""
    return hook["report_s"] / seconds


def overhead(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"hook": _hook_cost()}
    for name, workers in (("tar", 2), ("hdf5", 0)):
        scale, epochs = RUNS[name]
        with _demo(name, root, scale * args.scale) as (backend, data):
            _run(backend, data, workers, 1, 0.0)
            runs: dict[str, list[dict[str, Any]]] = {"plain": [], "monitored": []}
            for rnd in range(args.overhead_rounds):
                for kind in _rotate(["plain", "monitored"], rnd):
                    reports: list[Any] = []
                    options = {"monitor": Monitor(to=reports.append, seconds=args.monitor_seconds)}
                    if kind == "plain":
                        options = {}
                    # three times the targets' epochs: a run of ~10 s holds a report at the default interval
                    runs[kind].append(_run(backend, data, workers, 3 * epochs, 0.0, **options))
                    runs[kind][-1]["reports"] = len(reports)
            medians = {k: statistics.median(r["rate"] for r in v) for k, v in runs.items()}
            hook = out["hook"]
            # the main process's share of each run's time that the monitor's parts take, from their own
            # costs (robust to the machine's noise, which the ratio of rates is not): the hook on every
            # batch, the reports made, the D-state looks (the workers' probes are not counted here)
            parts = [
                (hook["hook_s"] * r["batches"] + hook["report_s"] * r["reports"] + r["looks_cpu_s"]) / r["seconds"]
                for r in runs["monitored"]
            ]
            out[name] = {
                "workers": workers,
                "runs": runs,
                "median_rate": medians,
                "ratio_monitored_to_plain": medians["monitored"] / medians["plain"],
                "main_share": statistics.median(parts),
            }
            print(f"overhead {name}: monitored / plain = {out[name]['ratio_monitored_to_plain']:.3f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--parts", default="targets,interference,overhead", help="which parts to run")
    p.add_argument("--backends", default="tar,hdf5", help="backends of the targets part (tar, hdf5, video, s3)")
    p.add_argument("--steps", default="0,20", help="simulated step times, ms per batch")
    p.add_argument("--step-seconds", type=float, default=8.0, help="seconds of steps per run with a step")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every setting (interleaved)")
    p.add_argument(
        "--monitor-seconds", type=float, default=10.0, help="seconds between reports, overhead part (monitor=True's)"
    )
    p.add_argument("--overhead-rounds", type=int, default=4, help="rounds of the overhead part")
    p.add_argument("--scale", type=float, default=1.0, help="times the demo data of the targets part")
    p.add_argument("--interference-scale", type=float, default=16.0, help="times the tar demo, interference part")
    p.add_argument("--hog-after", type=float, default=3.0, help="seconds into the epoch the busy loop starts")
    p.add_argument("--seed", type=int, default=0, help="seed of the datasets' orders")
    p.add_argument("--out", default=None, help="JSON file to write")
    args = p.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    args.steps = [float(s) for s in args.steps.split(",") if s]
    parts = [x for x in args.parts.split(",") if x]
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # the main process collates with one thread, as workers do (see docs/monitor.md)
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    result: dict[str, Any] = {
        "benchmark": "bench_autotune",
        "machine": describe(),
        "settings": {k: v for k, v in vars(args).items()},
        "load_before": os.getloadavg(),
        "grid": [str(w) for w in _grid()],
    }
    with tempfile.TemporaryDirectory(prefix="bench-autotune-") as tmp:
        root = Path(tmp)
        if "targets" in parts:
            result["targets"] = targets(args, root)
        if "interference" in parts:
            result["interference"] = interference(args, root)
        if "overhead" in parts:
            result["overhead"] = overhead(args, root)
    result["load_after"] = os.getloadavg()
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(json.dumps(_brief(result), indent=1))
    return 0


def _brief(result: dict[str, Any]) -> dict[str, Any]:
    brief: dict[str, Any] = {"load": [result["load_before"], result["load_after"]]}
    for key, t in result.get("targets", {}).items():
        brief[key] = {
            "best_fixed": t["best_fixed"],
            "ratio": round(t["ratio_auto_to_best"], 3),
            "medians": {k: round(v, 1) for k, v in t["median_rate"].items()},
            "auto_settings": t["auto_settings"],
            "auto_settled_at_batch": t["auto_settled_at_batch"],
            "of_batches": t["auto_batches"],
        }
    if "interference" in result:
        i = result["interference"]
        brief["interference"] = {
            "best_fixed": i["best_fixed"],
            "ratio": round(i["ratio_auto_to_best"], 3),
            "reaction_s": i["reaction_s"],
            "medians": i["median_rate_after"],
        }
    if "overhead" in result:
        o = result["overhead"]
        brief["overhead"] = {k: round(v["ratio_monitored_to_plain"], 4) for k, v in o.items() if k != "hook"}
        brief["overhead"].update({f"{k}_main_share": round(v["main_share"], 5) for k, v in o.items() if k != "hook"})
        brief["overhead"]["hook_us_per_batch"] = round(1e6 * o["hook"]["hook_s"], 2)
        brief["overhead"]["snapshot_ms"] = round(1e3 * o["hook"]["snapshot_s"], 3)
        brief["overhead"]["report_ms"] = round(1e3 * o["hook"]["report_s"], 2)
        brief["overhead"]["report_share"] = round(_report_share(o["hook"], result["settings"]["monitor_seconds"]), 5)
    return brief


if __name__ == "__main__":
    sys.exit(main())
