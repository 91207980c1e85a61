"""``fastdata bench SPEC`` and ``fastdata bench --demo``: sweep DataLoader settings, recommend, explain.

Heavy imports (torch, rich, matplotlib) happen inside :func:`run`, so ``fastdata --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fastdata.core.errors import ConfigError

EPILOG = """examples:
  fastdata bench --demo                        build small data for every backend, sweep each, summarise
  fastdata bench 'data/train-{000000..000099}.tar' --workers 0,2,4,8 --json out.json --plot out.png
  fastdata bench data/ --step-ms 40            with a 40 ms training step: the smallest loader that keeps up
  fastdata bench data/ -o decode=numpy         backend options (see docs/bench.md)
"""


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, like 0,1,2,4") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers >= 0, like 0,1,2,4")
    return values


def parse_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` (from ``-o``) as ``(key, value)``, the value read as JSON when it parses, else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="measure DataLoader settings on your data and recommend the best",
        description="Sweep DataLoader settings (workers, prefetch, pinning) over real data, measure throughput, "
        "start-up and stall, say what limits the loader, and print DataLoader arguments to paste.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "spec", nargs="?", metavar="SPEC", help="a shard pattern, an HDF5 file, a folder of videos or an s3:// prefix"
    )
    p.add_argument(
        "--demo",
        action="store_true",
        help="build small synthetic data for every backend, sweep each, and print one summary",
    )
    p.add_argument(
        "--format",
        dest="fmt",
        metavar="FORMAT",
        help="the backend (tar, hdf5, video, s3 ...); detected from SPEC when left out",
    )
    p.add_argument(
        "--workers",
        type=_ints,
        metavar="N,N,...",
        help="worker counts to try (default: 0, 1, 2, 4 ... up to the usable cores)",
    )
    p.add_argument("--batch-size", type=int, default=None, metavar="N", help="samples per batch (default 64)")
    p.add_argument("--prefetch", type=_ints, default=[2], metavar="N,N,...", help="prefetch_factor values (default 2)")
    p.add_argument(
        "--pin",
        choices=("auto", "on", "off", "both"),
        default="auto",
        help="pin_memory: auto tries both where CUDA is present, else off (default auto)",
    )
    p.add_argument("--persistent", action="store_true", help="also try persistent_workers=True")
    p.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="the training step to simulate after each batch, in ms (default 0: the loader's top speed)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        metavar="S",
        help="most seconds measured per configuration (default 6; 3 with --demo, 1 with --quick)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="passes over the grid, pooled: steadier figures on a busy machine (default 1)",
    )
    p.add_argument(
        "--main-threads",
        type=int,
        default=None,
        metavar="N",
        help="torch threads in the main process while sweeping (default: as set; torch's default is one per core)",
    )
    p.add_argument(
        "--procs-per-node",
        type=int,
        default=1,
        metavar="N",
        help="training processes per machine (DDP): adds per-rank advice",
    )
    p.add_argument(
        "-o",
        "--option",
        type=parse_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option for the backend's dataset (repeatable), e.g. -o decode=numpy",
    )
    p.add_argument("--json", metavar="FILE", help="write the full results as JSON")
    p.add_argument("--plot", metavar="FILE", help="write a PNG plot (with --demo, one per backend: FILE-<backend>.png)")
    p.add_argument("--backends", metavar="NAME,...", help="with --demo: only these backends")
    p.add_argument("--keep", metavar="DIR", help="with --demo: build the data in DIR and keep it")
    p.add_argument(
        "--quick",
        action="store_true",
        help="with --demo: a quarter of the data and 1 s per configuration (a first look in well "
        "under a minute; rougher figures)",
    )
    p.set_defaults(run=run)


def check_plot_support(args: argparse.Namespace) -> None:
    """Fail before measuring, not after, when --plot cannot be written."""
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot needs matplotlib; install it with pip install 'fastdata[plot]'") from None


def run(args: argparse.Namespace) -> int:
    check_plot_support(args)
    if args.demo:
        if args.spec:
            raise ConfigError("pass either SPEC or --demo, not both")
    elif args.quick or args.keep or args.backends:
        raise ConfigError("--quick, --keep and --backends go with --demo")
    if args.demo:
        from fastdata.bench.demo import run_demo

        return run_demo(args)
    if not args.spec:
        raise ConfigError(
            "give a SPEC to benchmark (a shard pattern, an HDF5 file, a folder of videos, an s3:// prefix), or --demo"
        )
    return run_spec(args)


def run_spec(args: argparse.Namespace) -> int:
    from rich.console import Console

    import fastdata.bench as fb
    from fastdata.bench import backends, report
    from fastdata.bench.measure import default_workers, grid
    from fastdata.bench.options import progress_bar, sweep_args

    backend = backends.get(args.fmt) if args.fmt else backends.detect(args.spec)
    options = dict(args.option)
    kwargs = sweep_args(args, batch_size=64, seconds=6.0)
    # open once here, so a bad SPEC or option fails before any worker starts
    probe_ds = backend.open(args.spec, **options)
    close = getattr(probe_ds, "close", None)
    if callable(close):
        close()
    console = Console(stderr=True)
    out = Console()
    workers = kwargs["workers"] or default_workers()
    points = (
        len(
            grid(
                workers,
                kwargs["prefetch_factor"],
                kwargs["pin_memory"] or [False],
                kwargs["persistent_workers"],
                kwargs["batch_size"],
            )
        )
        * kwargs["rounds"]
    )
    with progress_bar(console, points, backend.name) as bar:
        task = bar.add_task(f"{backend.name}: sweeping", total=points)
        result = fb.sweep(
            lambda: backend.open(args.spec, **options),
            progress=lambda d, t, p: bar.update(task, completed=d, total=t),
            **kwargs,
        )
    result.settings["spec"], result.settings["format"], result.settings["options"] = args.spec, backend.name, options
    rec = fb.recommend(result, procs_per_node=args.procs_per_node)
    report.print_report(result, rec, out, title=f"fastdata bench {backend.name}: {args.spec}")
    if args.json:
        report.write_json(args.json, report.to_json(result, rec))
        out.print(f"JSON: {args.json}")
    if args.plot:
        report.write_plot(args.plot, result, rec, title=f"{backend.name}: {args.spec}")
        out.print(f"plot: {args.plot}")
    return 0 if rec.config is not None else 1
