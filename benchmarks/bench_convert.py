#!/usr/bin/env python3
"""Conversion, side by side in one run: ``fastdata convert`` (1 and 2 workers, with and without fsync; from
the command line on a larger corpus, start-up included; the Ray engine on a local 2-CPU cluster) against
``tar cf``, ``tar cf`` then ``sha256sum`` (the same work as ours: an archive and its digest) and
webdataset's ``ShardWriter`` on the same corpus of small JPEG-sized files in the page cache.

    python benchmarks/bench_convert.py                          # ~10k ~35 KB JPEGs, 5 interleaved repeats
    python benchmarks/bench_convert.py --files 3000 --repeats 3 --parts local   # a quick look
    python benchmarks/bench_convert.py --parts copy             # readv + write vs copy_file_range here
    python benchmarks/bench_convert.py --parts local,cli        # the issue's targets: --workers 2 and the CLI
    python benchmarks/bench_convert.py --parts local --methods tar_cf,fastdata_workers2 --files 6000 --repeats 3

Every method runs once per repeat, interleaved (so a burst of load from elsewhere hits them alike), after
``os.sync()`` so none is throttled by another's dirty pages; figures are medians. MB/s counts the corpus's
file bytes. The disk's own write-and-fsync speed is measured too: the ceiling of every fsync figure.
Ray comes after the local figures (its daemons take CPU too), measured against the local engine again:
the cluster is started (and each worker warmed up by one conversion) before timing, as on a real cluster
that is up already; its start-up time is reported apart. The Ray shards' digests are checked
equal to the local ones'. Writes JSON (``--out``) with versions, the load average at start and end,
and the ratios the conversion issue targets.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _readme as readme
from bench_tar import corpus_files, make_corpus, warm

from fastdata.convert import convert
from fastdata.convert._options import parse_size
from fastdata.core import entry_digest

ROOT = Path(__file__).resolve().parents[1]
LOCAL_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # every Ray server on 127.0.0.1


def cpu_seconds() -> float:
    """CPU time of this process, its threads and its finished children (tar, conversion workers)."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def methods(src: Path, out: Path, shard_size: str, names: list[str]) -> dict[str, Callable[[], Any]]:
    import webdataset as wds

    files = corpus_files(src)

    def ours(workers: int, fsync: bool, engine: str = "local") -> Callable[[], Any]:
        def run() -> Any:
            return convert(
                src,
                out,
                shard_size=shard_size,
                workers=workers,
                progress=False,
                fsync=fsync,
                engine=engine,  # type: ignore[arg-type]
            )

        return run

    def tar_cf() -> None:
        out.mkdir()
        subprocess.run(["tar", "cf", str(out / "all.tar"), "-C", str(src), "."], check=True)

    def tar_sha256() -> None:  # the same work as ours: an archive and its digest (read back from the cache)
        tar_cf()
        subprocess.run(["sha256sum", str(out / "all.tar")], check=True, capture_output=True)

    def shardwriter() -> None:
        out.mkdir()
        with wds.ShardWriter(str(out / "w-%06d.tar"), maxsize=parse_size(shard_size), verbose=0) as sink:
            for path, label in files:
                with open(path, "rb") as f:
                    sink.write({"__key__": Path(path).stem, "jpg": f.read(), "cls": label})

    def cli(workers: int, fsync: bool) -> Callable[[], Any]:
        def run() -> None:  # as a user runs it: a new interpreter, its imports, the progress bar (to a pipe)
            command = [sys.executable, "-m", "fastdata", "convert", str(src), str(out), "--workers", str(workers)]
            command += ["--shard-size", shard_size] + ([] if fsync else ["--no-fsync"])
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        return run

    every = {
        "fastdata_cli_workers2": cli(2, False),
        "fastdata_cli_workers2_fsync": cli(2, True),
        "fastdata_workers1": ours(1, False),
        "fastdata_workers2": ours(2, False),
        "fastdata_workers1_fsync": ours(1, True),
        "fastdata_workers2_fsync": ours(2, True),
        "fastdata_ray2": ours(1, False, "ray"),
        "fastdata_ray2_fsync": ours(1, True, "ray"),
        "tar_cf": tar_cf,
        "tar_cf_then_sha256sum": tar_sha256,
        "webdataset_shardwriter": shardwriter,
    }
    return {n: every[n] for n in names}


def measure(
    src: Path, work: Path, shard_size: str, repeats: int, names: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(figures per method, shard digests per fastdata method from the last repeat)``."""
    out = work / "conv"
    runs = methods(src, out, shard_size, names)
    payload = sum(os.path.getsize(f) for f, _ in corpus_files(src))
    warm([f for f, _ in corpus_files(src)])
    times: dict[str, list[float]] = {m: [] for m in runs}
    cpu: dict[str, list[float]] = {m: [] for m in runs}
    digests: dict[str, Any] = {}
    for _ in range(repeats):
        for name, run in runs.items():
            shutil.rmtree(out, ignore_errors=True)
            os.sync()
            cpu0 = cpu_seconds()
            start = time.perf_counter()
            result = run()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(cpu_seconds() - cpu0)
            if isinstance(result, dict):
                digests[name] = [entry_digest(s) for s in result["shards"]]
    shutil.rmtree(out, ignore_errors=True)
    figures: dict[str, Any] = {}
    for name, ts in times.items():
        t = statistics.median(ts)
        figures[name] = {
            "seconds": t,
            "seconds_all": ts,
            "seconds_best": min(ts),  # the least disturbed repeat: an indication on a busy machine
            "mb_per_s": payload / t / 1e6,
            "files_per_s": len(corpus_files(src)) / t,
            "cpu_seconds": statistics.median(cpu[name]),  # Ray's workers are not children: not counted
        }
    if "tar_cf" in figures:
        for r in figures.values():
            r["vs_tar_cf"] = r["mb_per_s"] / figures["tar_cf"]["mb_per_s"]
            r["cpu_vs_tar_cf"] = r["cpu_seconds"] / figures["tar_cf"]["cpu_seconds"]
            r["best_vs_tar_cf"] = figures["tar_cf"]["seconds_best"] / r["seconds_best"]
    return figures, digests


def start_ray(src: Path, work: Path, shard_size: str) -> float:
    """Start a local 2-CPU cluster (servers on 127.0.0.1) and warm its workers; seconds it took."""
    os.environ.update(LOCAL_ONLY)
    import ray

    start = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), **LOCAL_ONLY}},
    )
    up = time.perf_counter() - start
    out = work / "warm"
    shutil.rmtree(out, ignore_errors=True)
    convert(src, out, shard_size=shard_size, engine="ray", progress=False, fsync=False)  # imports in each worker
    shutil.rmtree(out, ignore_errors=True)
    return up


def copy_probe(work: Path, files: int = 60, size: int = 4_000_000, repeats: int = 3) -> dict[str, float]:
    """MB/s copying big files into one output: ``readv`` + ``write`` (+ SHA-256 of the buffer) against
    ``os.copy_file_range`` (+ SHA-256 of the bytes read back), the measurement behind the tar writer."""
    import hashlib

    folder = work / "copy-probe"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(files):
        p = folder / f"f{i}.bin"
        if not p.exists() or p.stat().st_size != size:
            p.write_bytes(os.urandom(size))
        paths.append(str(p))
    out = str(work / "copy-probe.out")
    buf = memoryview(bytearray(4 << 20))

    def reads() -> None:
        h, fdo = hashlib.sha256(), os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            while n := os.readv(fd, [buf]):
                h.update(buf[:n])
                os.write(fdo, buf[:n])
            os.close(fd)
        os.close(fdo)

    def kernel() -> None:
        h, fdo, at = hashlib.sha256(), os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC), 0
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            done = 0
            while done < size:
                done += os.copy_file_range(fd, fdo, size - done, done, at + done)
            os.close(fd)
            done = 0
            while done < size:
                n = os.preadv(fdo, [buf[: min(len(buf), size - done)]], at + done)
                h.update(buf[:n])
                done += n
            at += size
        os.close(fdo)

    result = {}
    for name, fn in (("readv_write_mb_per_s", reads), ("copy_file_range_mb_per_s", kernel)):
        ts = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - start)
        result[name] = files * size / statistics.median(ts) / 1e6
    os.unlink(out)
    result["copy_file_range_vs_readv"] = result["copy_file_range_mb_per_s"] / result["readv_write_mb_per_s"]
    return result


def disk_probe(work: Path, nbytes: int, repeats: int = 3) -> float:
    """MB/s of writing ``nbytes`` of fresh data to one file and fsyncing it (what ``dd conv=fsync`` does):
    the ceiling of any conversion that makes its output durable, which ``tar cf`` does not."""
    path = work / "disk-probe.bin"
    block = os.urandom(4 << 20)
    ts = []
    for _ in range(repeats):
        os.sync()
        start = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(max(1, nbytes // len(block))):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        ts.append(time.perf_counter() - start)
        path.unlink()
    return max(1, nbytes // len(block)) * len(block) / statistics.median(ts) / 1e6


def versions() -> dict[str, str]:
    import numpy
    import webdataset

    import fastdata

    out = {
        "python": platform.python_version(),
        "fastdata": fastdata.__version__,
        "numpy": numpy.__version__,
        "webdataset": getattr(webdataset, "__version__", "?"),
        "tar": subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
    }
    try:
        import ray

        out["ray"] = ray.__version__
    except ModuleNotFoundError:
        pass
    return out


def filesystem(path: Path) -> str:
    found = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", str(path)], capture_output=True, text=True)
    return found.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="bench-out/convert", help="corpus, outputs and results go here")
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-size", default="32MB", help="small enough for more shards than workers")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--parts", default="local,cli,ray,copy", help="comma list of: local, cli, ray, copy")
    p.add_argument("--methods", default=None, help="local part: a comma list of methods instead of all (a quick look)")
    p.add_argument("--cli-files", type=int, default=20_000, help="files of the corpus the command line converts")
    p.add_argument("--out", default=None, help="JSON results (default: WORKDIR/bench_convert.json)")
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    src = work / "corpus"
    make_corpus(src, args.files, args.classes, args.seed)
    result: dict[str, Any] = {
        "benchmark": "bench_convert",
        "args": vars(args),
        "versions": versions(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "filesystem": filesystem(work),
            "load_average_start": os.getloadavg(),
        },
        "corpus": {"files": args.files, "bytes": sum(os.path.getsize(f) for f, _ in corpus_files(src))},
    }
    if "local" in parts:  # first, with no Ray cluster running beside it (its daemons take CPU too)
        names = ["tar_cf", "tar_cf_then_sha256sum", "webdataset_shardwriter", "fastdata_workers1", "fastdata_workers2"]
        names += ["fastdata_workers1_fsync", "fastdata_workers2_fsync"]
        names = args.methods.split(",") if args.methods else names
        result["convert"], _ = measure(src, work, args.shard_size, args.repeats, names)
    if "ray" in parts:  # then Ray against the local engine again, in the same conditions
        result["ray_start_seconds"] = start_ray(src, work, args.shard_size)
        names = ["fastdata_ray2", "fastdata_workers2", "fastdata_ray2_fsync", "fastdata_workers2_fsync"]
        figures, digests = measure(src, work, args.shard_size, args.repeats, names)
        result["ray"] = figures
        result["ray_sha256_equal_to_local"] = digests["fastdata_ray2"] == digests["fastdata_workers2"]
    if "cli" in parts:  # the command line on a larger corpus: start-up (imports) included
        cli_src = work / f"corpus-{args.cli_files}"
        make_corpus(cli_src, args.cli_files, args.classes, args.seed)
        names = ["tar_cf", "fastdata_cli_workers2", "fastdata_workers2", "fastdata_cli_workers2_fsync"]
        result["cli"], _ = measure(cli_src, work, args.shard_size, args.repeats, names)
        result["cli_corpus"] = {
            "files": args.cli_files,
            "bytes": sum(os.path.getsize(f) for f, _ in corpus_files(cli_src)),
        }
    if "copy" in parts:
        result["copy_probe"] = copy_probe(work)
    if "local" in parts:
        result["disk_fsync_mb_per_s"] = disk_probe(work, result["corpus"]["bytes"])
    result["machine"]["load_average_end"] = os.getloadavg()
    result["summary"] = summarize(result)
    readme.stamp(result, readme_rows(result), result["machine"]["load_average_start"])
    out = Path(args.out or work / "bench_convert.json")
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0


def readme_rows(result: dict[str, Any]) -> list[dict[str, str]]:
    """This run's figures for README.md's table (tools/readme_figures.py)."""
    s, rows = result["summary"], []
    cli = "cli_corpus_fastdata_cli_workers2_vs_tar_cf"
    if cli in s:
        corpus = result["cli_corpus"]
        fsync = s.get("cli_corpus_fastdata_cli_workers2_fsync_vs_tar_cf")
        inner = s.get("cli_corpus_fastdata_workers2_vs_tar_cf")  # the same corpus, in this process: no start-up
        rows.append(
            readme.row(
                "tar",
                f"conversion from the command line, `--workers 2 --no-fsync`, vs `tar cf` (MB/s), "
                f"{corpus['files']:,} files, {corpus['bytes'] / 1e9:.2f} GB, page cache hot, sync before each run",
                f"{s[cli]:.2f} median ({s[cli + '_best_repeats']:.2f} best repeats)"
                + (f"; {fsync:.2f} with fsync, the default" if fsync else "")
                + (f"; `convert(workers=2)` from Python {inner:.2f}" if inner else ""),
                ">= 0.8",
            )
        )
    local = "fastdata_workers2_vs_tar_cf"
    if local in s:
        rows.append(
            readme.row(
                "tar",
                f"conversion from Python, `workers=2`, vs `tar cf` (MB/s), {result['corpus']['files']:,} files",
                f"{s[local]:.2f} median ({s[local + '_best_repeats']:.2f} best repeats); vs webdataset's "
                f"ShardWriter {s.get('fastdata_workers2_vs_shardwriter', float('nan')):.1f}x",
                ">= 0.8",
            )
        )
    return rows


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The conversion issue's targets, as ratios measured in this run."""
    c, r, s = result.get("convert", {}), result.get("ray", {}), {}
    names = ("fastdata_workers1", "fastdata_workers2", "fastdata_workers1_fsync", "fastdata_workers2_fsync")
    for name in (*names, "webdataset_shardwriter", "tar_cf_then_sha256sum"):
        if name in c and "vs_tar_cf" in c[name]:
            s[f"{name}_vs_tar_cf"] = round(c[name]["vs_tar_cf"], 2)
            s[f"{name}_vs_tar_cf_best_repeats"] = round(c[name]["best_vs_tar_cf"], 2)
            s[f"{name}_tar_cf_cpu_over_ours"] = round(1 / c[name]["cpu_vs_tar_cf"], 2)
    if "fastdata_workers2" in c and "webdataset_shardwriter" in c:
        s["fastdata_workers2_vs_shardwriter"] = round(
            c["fastdata_workers2"]["mb_per_s"] / c["webdataset_shardwriter"]["mb_per_s"], 2
        )
    cli = result.get("cli", {})
    for name in ("fastdata_cli_workers2", "fastdata_cli_workers2_fsync", "fastdata_workers2"):
        if name in cli and "vs_tar_cf" in cli[name]:
            s[f"cli_corpus_{name}_vs_tar_cf"] = round(cli[name]["vs_tar_cf"], 2)
            s[f"cli_corpus_{name}_vs_tar_cf_best_repeats"] = round(cli[name]["best_vs_tar_cf"], 2)
    for ray, local in (("fastdata_ray2", "fastdata_workers2"), ("fastdata_ray2_fsync", "fastdata_workers2_fsync")):
        if ray in r and local in r:
            s[f"{ray}_vs_{local}"] = round(r[ray]["mb_per_s"] / r[local]["mb_per_s"], 2)
    if "ray_sha256_equal_to_local" in result:
        s["ray_sha256_equal_to_local"] = result["ray_sha256_equal_to_local"]
    if "disk_fsync_mb_per_s" in result and "tar_cf" in c:
        s["disk_fsync_ceiling_vs_tar_cf"] = round(result["disk_fsync_mb_per_s"] / c["tar_cf"]["mb_per_s"], 2)
    if "copy_probe" in result:
        s["copy_file_range_vs_readv"] = round(result["copy_probe"]["copy_file_range_vs_readv"], 2)
    s["load_average_start_end"] = [
        round(result["machine"]["load_average_start"][0], 2),
        round(result["machine"]["load_average_end"][0], 2),
    ]
    return s


if __name__ == "__main__":
    sys.exit(main())
