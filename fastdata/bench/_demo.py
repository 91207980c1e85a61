"""``fastdata bench --demo``: small synthetic data for every backend, a sweep of each, one summary.

Each backend builds its own data (:mod:`fastdata.bench.backends`) in a temporary folder, removed at the
end (``--keep DIR`` keeps it); the S3 backend also starts a local S3 server (moto) and stops it. Short
measurements (3 s per configuration) keep the whole demo within about two minutes on two cores
(``--quick``: a quarter of the data, 1 s per configuration); the figures are for showing the harness,
not for comparing backends.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from fastdata.bench._advise import Recommendation
from fastdata.bench._result import SweepResult
from fastdata.bench.backends import DemoUnavailable, public_options
from fastdata.core.errors import ConfigError

SECONDS = 3.0  # most seconds measured per configuration
QUICK_SECONDS = 1.0  # ... with --quick
QUICK_SCALE = 0.25  # the share of each backend's demo data built with --quick


def _plot_path(plot: str, backend: str) -> Path:
    p = Path(plot)
    return p.with_name(f"{p.stem}-{backend}{p.suffix or '.png'}")


def run_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    import fastdata.bench as fb
    from fastdata.bench import _report as report
    from fastdata.bench import backends
    from fastdata.bench._loop import one_line
    from fastdata.bench._options import grid_size, progress_bar, sweep_args
    from fastdata.loading import as_is

    everything = backends.backends()
    if args.backends:
        wanted = [n.strip() for n in args.backends.split(",") if n.strip()]
        unknown = set(wanted) - {b.name for b in everything}
        if unknown:
            raise ConfigError(
                f"--backends: unknown {', '.join(sorted(unknown))}; known: {', '.join(b.name for b in everything)}"
            )
        everything = [b for b in everything if b.name in wanted]
    chosen = [b for b in everything if b.available]
    rows: list[tuple[str, SweepResult | None, Recommendation | None, str]] = [
        (b.name, None, None, f"skipped: {b.error}") for b in everything if not b.available
    ]
    console, out = Console(stderr=True), Console()
    if args.keep:
        root = Path(args.keep)
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="fastdata-demo-"))
    saved: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        per_backend = []
        for b in chosen:
            kw = sweep_args(args, batch_size=b.demo_batch_size, seconds=QUICK_SECONDS if args.quick else SECONDS)
            kw.setdefault("window", 0.25 if args.quick else 0.5)
            kw.setdefault("warmup", 0.25 if args.quick else 0.5)
            n = grid_size(kw)
            per_backend.append((b, kw, n))
        total = sum(n for _, _, n in per_backend) + len(per_backend)  # + one step per data build
        with progress_bar(console, total, "demo") as bar:
            task = bar.add_task("demo", total=total)
            done = 0
            for b, kw, n in per_backend:
                base = done
                bar.update(task, description=f"{b.name}: building data")
                try:
                    with b.demo(root / b.name, scale=QUICK_SCALE if args.quick else 1.0) as data:
                        bar.update(task, completed=base + 1, description=f"{b.name}: sweeping")

                        def advance(done_here: int, _total: int, _point: Any, base: int = base, n: int = n) -> None:
                            bar.update(task, completed=base + 1 + min(done_here, n))  # confirmations: extra

                        options = dict(data.options)
                        if "batch_size" not in options and b.batches_in_dataset(data.spec, options):
                            # the dataset-batched path: whole batches made in the worker
                            options["batch_size"] = kw["batch_size"]
                            kw = {**kw, "batch_size": None, "collate_fn": as_is}
                        result = fb.sweep(functools.partial(b.open, data.spec, **options), progress=advance, **kw)
                    result.settings.update(
                        {"spec": data.spec, "format": b.name, "options": public_options(options), "demo": True}
                    )
                    rec = fb.recommend(result, procs_per_node=args.procs_per_node)
                    rows.append((b.name, result, rec, ""))
                    saved[b.name] = report.to_json(result, rec)
                    if args.plot:
                        report.write_plot(_plot_path(args.plot, b.name), result, rec, title=f"demo: {b.name}")
                except DemoUnavailable as e:
                    rows.append((b.name, None, None, f"skipped: {e}"))
                except Exception as e:  # noqa: BLE001 - one backend's failure (a server that will not start,
                    # a library error of any kind) must not hide the others' results; it is shown in the table
                    rows.append((b.name, None, None, f"failed: {one_line(e)}"))
                done = base + 1 + n
                bar.update(task, completed=done)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    elapsed = time.perf_counter() - started
    # the table says "skipped" or "failed"; the reasons (install hints, errors) follow it in full
    out.print(
        report.summary_table([(name, result, advice, note.split(":", 1)[0]) for name, result, advice, note in rows])
    )
    for name, _result, advice, note in rows:
        if advice is not None and advice.config is not None:
            out.print(f"[bold]{name}[/bold]: {advice.code()}")
            if advice.diagnosis:
                out.print("  " + advice.diagnosis[0], highlight=False)
        elif advice is not None and advice.diagnosis:  # every configuration failed: said once, in one line
            out.print(f"[bold]{name}[/bold]: {escape(advice.diagnosis[0])}", highlight=False)
        elif note:
            out.print(f"[bold]{name}[/bold]: {escape(note)}", highlight=False)
    out.print(
        f"demo took {elapsed:.0f} s. Run 'fastdata bench SPEC' on your own data for the full report "
        "(--json, --plot, --step-ms)."
    )
    if args.json:
        report.write_json(
            args.json,
            {
                "fastdata_bench_demo": 1,
                "backends": saved,
                "not_measured": {name: note for name, _, _, note in rows if note},
            },
        )
        out.print(f"JSON: {args.json}")
    return 0 if any(r is not None and r.config is not None for _, _, r, _ in rows) else 1


__all__ = ["run_demo"]
