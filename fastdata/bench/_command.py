"""``fastdata bench SPEC`` and ``fastdata bench --demo``: sweep DataLoader settings, recommend, explain.

Heavy imports (torch, rich, matplotlib) happen inside :func:`run`, so ``fastdata --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from fastdata.core.errors import ConfigError, FastdataError

EPILOG = """examples:
  fastdata bench --demo                        build small data for every backend, sweep each, summarise
  fastdata bench 'data/train-{000000..000099}.tar' --workers 0,2,4,8 --json out.json --plot out.png
  fastdata bench data/ --step-ms 40            with a 40 ms training step: the smallest loader that keeps up
  fastdata bench data/ --modes processes,threads,hybrid
                                               worker processes, loader threads and the hybrid, compared
  fastdata bench data/ -o decode=numpy         backend options (see docs/bench.md)
  fastdata bench mypkg.data:make_dataset       the dataset you train with: a function returning it
                                               (or a dataset and its DataLoader keyword arguments)
  fastdata bench data/ --procs-per-node 8      per-GPU advice for 8 DDP ranks on this node
  fastdata bench data/ --profile prof/         also record py-spy at the recommended setting
"""

# ``package.module:function``: a Python name, not a path (no slash, no "://")
FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, like 0,1,2,4") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers >= 0, like 0,1,2,4")
    return values


def _choices(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [v for v in values if v not in allowed]
    if unknown or not values:
        bad = ", ".join(map(repr, unknown)) if unknown else repr(text)
        raise argparse.ArgumentTypeError(
            f"{bad}: not a {what}; expected a comma-separated list of {', '.join(allowed)} (e.g. {','.join(allowed)})"
        )
    return list(dict.fromkeys(values))


def _modes(text: str) -> list[str]:
    return _choices(text, ("processes", "threads", "hybrid"), "mode")


def _transports(text: str) -> list[str]:
    return _choices(text, ("stock", "slots"), "transport")


def _counts(text: str) -> list[int]:
    values = _ints(text)
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected thread counts >= 1, like 1,2,4")
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
        "spec",
        nargs="?",
        metavar="SPEC",
        help="a shard pattern, an HDF5 file, a folder of videos, an s3:// prefix, or package.module:function "
        "(a function returning the dataset you train with, or (dataset, DataLoader keyword arguments))",
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
    p.add_argument(
        "--modes",
        type=_modes,
        default=["processes"],
        metavar="MODE,...",
        help="who reads, each measured and compared: processes (DataLoader workers), threads (loader threads "
        "of the training process, fd.Loader(workers='threads')), hybrid (workers with --threads-per-worker "
        "threads each) (default processes; each mode more takes about as long again)",
    )
    p.add_argument(
        "--threads",
        type=_counts,
        default=None,
        metavar="N,N,...",
        help="loader-thread counts for --modes threads (default: the worker counts above 0)",
    )
    p.add_argument(
        "--threads-per-worker",
        type=int,
        default=2,
        metavar="T",
        help="threads in each worker process for --modes hybrid (default 2)",
    )
    p.add_argument(
        "--transport",
        type=_transports,
        default=None,
        metavar="KIND,...",
        help="how worker processes hand batches over: stock (the DataLoader's own way), slots (fastdata's "
        "reused shared-memory slots, fd.Loader's default), or stock,slots to measure both (default: "
        "fd.Loader's, slots: the sweep predicts the loader the recommendation prints)",
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
        help="the training step to simulate after each batch, in ms: a wait, as a step the GPU runs "
        "(default 0: the loader's top speed)",
    )
    p.add_argument(
        "--step-cpu-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="CPU work in the simulated step, in ms, on the training process's torch threads: for training on "
        "the CPU (or heavy host-side work in the step), which takes cores from the workers; before --step-ms's "
        "wait (default 0)",
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
        default=None,
        metavar="N",
        help="training processes (GPUs) per machine (DDP): adds per-rank advice within the physical cores "
        "(default: torchrun's LOCAL_WORLD_SIZE where set, else 1)",
    )
    p.add_argument(
        "--start-method",
        choices=("fork", "spawn", "forkserver"),
        default=None,
        help="how DataLoader workers start (default: the platform's, fork on Linux)",
    )
    p.add_argument(
        "--memory-gb",
        type=float,
        default=None,
        metavar="GB",
        help="memory the loader may use, in GiB (default: the cgroup limit or the machine's RAM)",
    )
    p.add_argument(
        "--profile",
        nargs="?",
        const="fastdata-profile",
        default=None,
        metavar="DIR",
        help="after the sweep, record py-spy (--subprocesses) for a few seconds at the recommended setting: "
        "a flame graph in DIR (default fastdata-profile/) and the top frames by stage (pip install "
        "'fastdata[profile]')",
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
        help="1 s per configuration (with --demo, also a quarter of the data): a first look in well under "
        "a minute; rougher figures",
    )
    p.set_defaults(run=run)


def check_plot_support(args: argparse.Namespace) -> None:
    """Fail before measuring, not after, when --plot cannot be written."""
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot needs matplotlib; install it with pip install 'fastdata[plot]'") from None


def check_profile_support(args: argparse.Namespace) -> None:
    """Fail before measuring, not after the whole sweep, when ``--profile`` cannot record: py-spy is not
    installed, or it is asked for with ``--demo`` (which profiles nothing)."""
    if not args.profile:
        return
    if args.demo:
        raise ConfigError("--profile records one SPEC at its recommended setting: give a SPEC, not --demo")
    from fastdata.bench._profile import INSTALL, py_spy_path

    if py_spy_path() is None:
        raise ConfigError(f"--profile needs py-spy, which is not installed: {INSTALL}")


def check_outputs(args: argparse.Namespace) -> None:
    """Fail before measuring, not after, when an output cannot be written: the folders that ``--json`` and
    ``--plot`` write into, and the ``--profile`` folder, are created now when missing and must take a file
    (a test file is made there and removed).

    Raises:
        ConfigError: one line naming the option, the path and why (a file in the way, a folder that cannot
            be created or written).
    """
    for flag, value, is_folder in (
        ("--json", args.json, False),
        ("--plot", args.plot, False),
        ("--profile", args.profile, True),
    ):
        if value:
            _check_output(flag, Path(value), is_folder=is_folder)


def _check_output(flag: str, path: Path, *, is_folder: bool) -> None:
    folder = path if is_folder else path.parent
    if not is_folder and path.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give a file name in it, like {path / 'bench'}")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{flag} {path}: {folder} is a file, not a folder; choose a path in a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".fastdata-bench-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as e:
        why = f"{e.strerror}: {e.filename}" if e.strerror and e.filename else str(e)
        raise ConfigError(
            f"{flag} {path}: cannot create or write the folder {folder} ({why}); choose a folder you can write to"
        ) from None


def run(args: argparse.Namespace) -> int:
    check_plot_support(args)
    check_profile_support(args)
    if args.demo:
        if args.spec:
            raise ConfigError("pass either SPEC or --demo, not both")
    elif args.keep or args.backends:
        raise ConfigError("--keep and --backends go with --demo")
    if not args.demo and not args.spec:
        raise ConfigError(
            "give a SPEC to benchmark (a shard pattern, an HDF5 file, a folder of videos, an s3:// prefix), or --demo"
        )
    check_outputs(args)  # before any data is built, opened or measured
    if args.demo:
        from fastdata.bench._demo import run_demo

        return run_demo(args)
    return run_spec(args)


# DataLoader keyword arguments a factory may return that the sweep takes as they are; the ones it
# sweeps (num_workers, prefetch_factor, persistent_workers, pin_memory) are its to choose
_PASSED = {"batch_size", "collate_fn", "worker_init_fn", "multiprocessing_context", "shuffle"}
_SWEPT = {"num_workers", "prefetch_factor", "persistent_workers", "pin_memory"}


class Factory:
    """``package.module:function`` from the command line: called afresh for every point of the sweep.

    The function returns the dataset, or ``(dataset, kwargs)`` with the ``DataLoader`` keyword
    arguments the user trains with (``batch_size``, ``collate_fn``, ``worker_init_fn``,
    ``multiprocessing_context``, ``shuffle``; the swept ones are ignored, with a note).
    """

    def __init__(self, spec: str) -> None:
        module, _, name = spec.partition(":")
        if "" not in sys.path:
            sys.path.insert(0, "")  # as `python -m` does: a module in the current folder is found
        try:
            target: Any = importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"{spec}: cannot import {module!r} ({e}); is it on PYTHONPATH?") from e
        for part in name.split("."):
            if not hasattr(target, part):
                raise ConfigError(f"{spec}: {module} has no {name!r}; name a function that returns a dataset")
            target = getattr(target, part)
        if not callable(target):
            raise ConfigError(f"{spec}: {name} is not callable; name a function that returns a dataset")
        self.spec, self.fn = spec, target
        self.kwargs: dict[str, Any] = {}
        self.ignored: list[str] = []
        first = self()
        close = getattr(first, "close", None)
        if callable(close):
            close()

    def __call__(self) -> Any:
        out = self.fn()
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
            ds, kwargs = out
            unknown = set(kwargs) - _PASSED - _SWEPT
            if unknown:
                raise ConfigError(
                    f"{self.spec}: DataLoader keyword argument(s) {', '.join(sorted(unknown))} are not taken; "
                    f"known: {', '.join(sorted(_PASSED | _SWEPT))}"
                )
            self.kwargs = {k: v for k, v in kwargs.items() if k in _PASSED}
            self.ignored = sorted(set(kwargs) & _SWEPT)
            return ds
        return out


def _batches_itself(ds: Any) -> bool:
    from torch.utils.data import IterableDataset

    return isinstance(ds, IterableDataset) and getattr(ds, "batch_size", None) is not None


def run_spec(args: argparse.Namespace) -> int:
    from fastdata.bench._options import skips_said_once

    with skips_said_once(), contextlib.ExitStack() as run_scope:
        return _run_spec(args, run_scope)


def fetch_cache(options: dict[str, Any], run_scope: contextlib.ExitStack) -> str:
    """Give a remote source's sweep its fetch cache, and say which in words: every point of the sweep builds
    its own dataset, so without one each point fetched the data again (54x the stored bytes in one default
    run). The user's ``-o cache_dir=DIR`` is used as given (and kept), ``-o cache_dir=false`` measures
    uncached reads; else a temporary folder, removed when the run ends (also after an error)."""
    given = options.get("cache_dir")
    if given is False:
        return "none (-o cache_dir=false: uncached reads, as asked)"
    if given is not None:
        return f"{given} (-o cache_dir)"
    folder = run_scope.enter_context(tempfile.TemporaryDirectory(prefix="fastdata-bench-fetch-"))
    options["cache_dir"] = folder
    return (
        "a temporary folder, removed after the run; the points read its copies, as training with cache_dir= does "
        "after its first epoch; -o cache_dir=false reads from the store"
    )


def _run_spec(args: argparse.Namespace, run_scope: contextlib.ExitStack) -> int:
    from rich.console import Console

    import fastdata.bench as fb
    from fastdata.bench import _report as report
    from fastdata.bench import backends
    from fastdata.bench._options import as_options, bench_error, grid_size, progress_bar, sweep_args
    from fastdata.bench.backends import public_options
    from fastdata.bench.backends._shards import fetched_bytes
    from fastdata.formats import missing_local
    from fastdata.loading import as_is

    kwargs = sweep_args(args, batch_size=64, seconds=1.0 if args.quick else 6.0)
    if args.quick:
        kwargs.setdefault("window", 0.25)
        kwargs.setdefault("warmup", 0.25)
    options = dict(args.option)
    factory: Any
    fetched_before = 0  # bytes fetched from a remote store before the sweep (a peek, the probe's build)
    if FACTORY.match(args.spec) and not args.fmt:
        if options:
            raise ConfigError("-o options go to a backend's dataset; a package.module:function SPEC takes none")
        made = Factory(args.spec)
        factory, name = made, args.spec
        kwargs.update({k: v for k, v in made.kwargs.items() if k != "batch_size" or not args.batch_size})
        probe_ds = made()
        settings: dict[str, Any] = {"spec": args.spec, "format": "factory", "options": {}, "source": args.spec}
        if made.ignored:
            settings["ignored_kwargs"] = made.ignored
    else:
        missing = missing_local(args.spec)  # "no such file or folder", not "cannot tell its format"
        if missing is not None:
            raise missing
        backend = backends.get(args.fmt) if args.fmt else backends.detect(args.spec)
        if "batch_size" not in options and backend.batches_in_dataset(args.spec, options):
            options["batch_size"] = args.batch_size or 64  # the dataset-batched path, as the README advises
        cache_words = fetch_cache(options, run_scope) if backend.fetch_cache else None
        # the decode measured (images of different sizes resized, so that batches batch), chosen once
        swept, decode_note, facts = backend.prepare(args.spec, options)
        if facts.get("loader_batch_size") is not None:
            kwargs["batch_size"] = facts["loader_batch_size"]  # one sample per item: the DataLoader batches
        # open once here, so a bad SPEC or option fails before any worker starts
        try:
            probe_ds = backend.open(args.spec, **swept)
        except FastdataError as e:
            error = bench_error(e, swept)
            if error is e:
                raise
            raise error from e
        factory, name = (lambda: backend.open(args.spec, **swept)), backend.name
        settings = {"spec": args.spec, "format": backend.name, "options": public_options(swept)}
        settings["source"] = facts.get("source") or f"{backend.name} ({args.spec})"
        if cache_words is not None:
            settings["fetch_cache"] = cache_words
        if "stored_bytes" in facts:
            settings["stored_bytes"] = facts["stored_bytes"]
        fetched_before += int(facts.get("fetched_bytes") or 0)
        decoded = swept.get("decode", backend.default_decode)
        if decoded is not None:
            settings["decoded"] = decoded != "raw"
        if decode_note is not None:
            settings["decode"] = decode_note
    if _batches_itself(probe_ds):
        kwargs["batch_size"] = None  # the dataset yields whole batches
        kwargs.setdefault("collate_fn", as_is)
        settings["dataset_batch_size"] = probe_ds.batch_size
    fetched_before += fetched_bytes(probe_ds)
    close = getattr(probe_ds, "close", None)
    if callable(close):
        close()
    if args.start_method:
        kwargs["multiprocessing_context"] = args.start_method
    if args.memory_gb:
        kwargs["memory"] = args.memory_gb * 2**30
    console = Console(stderr=True)
    out = Console()
    points = grid_size(kwargs)
    with progress_bar(console, points, name) as bar:
        task = bar.add_task(f"{name}: sweeping", total=points)
        result = fb.sweep(factory, progress=lambda d, t, p: bar.update(task, completed=d, total=t), **kwargs)
    for point in result.points:  # the datasets' advice, as this command takes it
        if point.error:
            point.error = as_options(point.error)
    settings["fetched_bytes"] = fetched_before + int(result.settings.get("fetched_bytes") or 0)
    result.settings.update(settings)
    rec = fb.recommend(result, procs_per_node=args.procs_per_node)
    report.print_report(
        result,
        rec,
        None if not out.is_terminal else out,
        title=f"fastdata bench {name}" + (f": {args.spec}" if args.spec != name else ""),
    )
    if settings.get("decode"):
        out.print(f"measured: {settings['decode']}")
    if settings.get("ignored_kwargs"):
        out.print(f"(the factory's {', '.join(settings['ignored_kwargs'])} were ignored: the sweep chooses them)")
    if args.json:
        report.write_json(args.json, report.to_json(result, rec))
        out.print(f"JSON: {args.json}")
    if args.plot:
        report.write_plot(args.plot, result, rec, title=f"{name}: {args.spec}")
        out.print(f"plot: {args.plot}")
    if args.profile and rec.config is not None:
        from fastdata.bench._profile import profile_and_report

        profile_and_report(factory, rec.config, args.profile, out, sweep_kwargs=kwargs)
    return 0 if rec.config is not None else 1
