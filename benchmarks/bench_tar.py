#!/usr/bin/env python3
"""Tar shards, side by side in one run: fastdata ``TarShardDataset`` vs ``webdataset.WebDataset`` on the
same shards vs the original small files read one by one vs a raw sequential read of the shard files
(the physical limit); each through a DataLoader with 0, 1, 2, 4 workers; raw bytes and JPEG decode;
page cache hot and cold. Plus conversion (fastdata with 1 and 2 workers, ``tar cf``, webdataset's
``ShardWriter``; ``benchmarks/bench_convert.py`` measures it, and has more), the cost of fastdata's
worker-safety core, and where the time goes with workers.

    python benchmarks/bench_tar.py                      # ~10k ~30 KB JPEGs, a few minutes
    python benchmarks/bench_tar.py --files 3000 --repeats 1 --workers 0,2   # a quick look

Writes JSON (``--out``) with versions and machine info, and a markdown table (``--markdown``).
Figures are medians of ``--repeats`` passes; compare the ratios, which are taken within one run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _readme as readme
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import fastdata as fd
from fastdata.convert import convert
from fastdata.datasets.tar._source import load_index
from fastdata.formats.tar._reader import read_samples
from fastdata.loading.transport._collate import batch_as_is as as_is
from fastdata.storage._local import LocalReader

CHUNK = 1 << 20


# -- the corpus ------------------------------------------------------------------------------------
def make_corpus(root: Path, files: int, classes: int, seed: int) -> dict[str, Any]:
    """An ImageFolder tree of ~30 KB JPEGs (320x240, smooth content plus noise). A pool of 256 distinct
    images is cycled: the bytes read are what matter here, and generating 10k images would take minutes."""
    from PIL import Image

    stamp = root / ".complete.json"
    spec = {"files": files, "classes": classes, "seed": seed}
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return spec
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(min(256, files)):
        low = rng.integers(0, 256, (42, 56, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(low).resize((320, 240), Image.BILINEAR)).astype(np.int16)
        img = (img + rng.integers(-12, 12, img.shape)).clip(0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        pool.append(buf.getvalue())
    for c in range(classes):
        (root / f"class_{c:03d}").mkdir(parents=True)
    for i in range(files):
        (root / f"class_{i % classes:03d}" / f"img_{i:06d}.jpg").write_bytes(pool[i % len(pool)])
    stamp.write_text(json.dumps(spec))
    return spec


def corpus_files(root: Path) -> list[tuple[str, int]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [(str(f), label) for label, c in enumerate(classes) for f in sorted((root / c).iterdir())]


# -- page cache --------------------------------------------------------------------------------------
def evict(paths: list[str]) -> None:
    """Drop the files from the page cache (they were synced after writing, so their pages are clean)."""
    for p in paths:
        fd_ = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd_, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd_)


def warm(paths: list[str]) -> None:
    buf = bytearray(CHUNK)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


# -- readers: each is a Dataset, a DataLoader drives it --------------------------------------------------
def decode_jpeg(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


class SmallFiles(Dataset[Any]):
    """The original corpus, one file per item, read with open().read() (what ImageFolder does)."""

    def __init__(self, files: list[tuple[str, int]], decode: bool) -> None:
        self.files, self.decode = files, decode

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        path, label = self.files[i]
        with open(path, "rb") as f:
            data = f.read()
        return {"jpg": decode_jpeg(data) if self.decode else data, "cls": label}


class RawSequential(IterableDataset[int]):
    """The physical limit: each worker reads its share of the shard files front to back in 1 MiB reads
    into one reused buffer, and sends only the byte counts (so the DataLoader's pipe is not measured)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        mine = self.urls if info is None else self.urls[info.id :: info.num_workers]
        buf = bytearray(CHUNK)
        total = 0
        for url in mine:
            with open(url, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    total += n
                    if total >= 8 * CHUNK:  # report every 8 MiB, so the steady state can be timed
                        yield total
                        total = 0
        if total:
            yield total


def count_items(item: Any) -> tuple[int, int]:
    """(samples, payload bytes) in one DataLoader item."""
    if isinstance(item, int):
        return 0, item
    if isinstance(item, list):
        n = b = 0
        for s in item:
            sn, sb = count_items(s)
            n, b = n + sn, b + sb
        return n, b
    payload = item.get("jpg")
    size = len(payload) if isinstance(payload, (bytes, bytearray)) else getattr(payload, "nbytes", 0)
    return 1, size


def run_pass(
    make: Callable[[], Any], workers: int, cold_paths: list[str] | None, limit: int | None = None
) -> dict[str, float]:
    """One pass over a reader: samples/s and payload MB/s, in the steady state: the clock starts when
    the first item arrives (so starting the workers is not counted; it is reported as ``startup_s``)."""
    if cold_paths is not None:
        evict(cold_paths)
    dataset = make()
    # every reader yields finished items: skip the DataLoader's default_convert walk for all of them alike
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        shuffle=False,
        collate_fn=as_is,
        multiprocessing_context="fork" if workers else None,
    )
    samples = nbytes = 0
    begin = time.perf_counter()
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    for item in it:
        n, b = count_items(item)
        samples, nbytes = samples + n, nbytes + b
        if limit is not None and samples >= limit:
            break
    elapsed = time.perf_counter() - start
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()  # stopped early: let the workers go now
    return {
        "seconds": elapsed,
        "startup_s": start - begin,
        "samples": samples,
        "samples_per_s": samples / elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
    }


def median_pass(
    make: Callable[[], Any], workers: int, cold_paths: list[str] | None, repeats: int, limit: int | None = None
) -> dict[str, float]:
    runs = [run_pass(make, workers, cold_paths, limit) for _ in range(repeats)]
    best = sorted(runs, key=lambda r: r["samples_per_s"] or r["mb_per_s"])[len(runs) // 2]
    best["spread"] = (max(r["mb_per_s"] for r in runs) / max(min(r["mb_per_s"] for r in runs), 1e-9)) - 1
    return best


def readers(
    urls: list[str], files: list[tuple[str, int]], mode: str, limit: int | None
) -> dict[str, Callable[[], Any]]:
    import webdataset as wds

    decode = mode == "decode"
    subset = files[:limit] if limit else files
    shard_subset = urls  # shard readers stop after `limit` samples (see run_pass)

    def ours() -> Any:
        return fd.TarShardDataset(shard_subset, decode="numpy" if decode else "raw")

    def ours_batched() -> Any:
        return fd.TarShardDataset(shard_subset, decode="numpy" if decode else "raw", batch_size=64, collate_fn=list)

    def webdataset() -> Any:
        ds = wds.WebDataset(shard_subset, shardshuffle=False, empty_check=False)
        return ds.decode("rgb8") if decode else ds

    def ours_batched_shm() -> Any:
        from fastdata.loading.transport import SlotCollate

        return fd.TarShardDataset(
            shard_subset, decode="numpy" if decode else "raw", batch_size=64, collate_fn=SlotCollate(list)
        )

    def webdataset_batched() -> Any:
        return webdataset().batched(64, collation_fn=None)

    def small() -> Any:
        return SmallFiles(subset, decode)

    out: dict[str, Callable[[], Any]] = {
        "fastdata": ours,
        "fastdata_batched64": ours_batched,
        "fastdata_batched64_shm": ours_batched_shm,
        "webdataset": webdataset,
        "webdataset_batched64": webdataset_batched,
        "small_files": small,
    }
    if decode:  # decoding dominates: the transport variants add nothing but time here
        for name in ("fastdata_batched64_shm", "webdataset_batched64"):
            del out[name]
    else:
        out["raw_sequential"] = lambda: RawSequential(urls)
    return out


# -- conversion ----------------------------------------------------------------------------------------
def bench_convert(src: Path, work: Path, shard_size: str, repeats: int, payload: int) -> dict[str, Any]:
    """The conversion figures of this run, measured by ``benchmarks/bench_convert.py`` (the conversion
    benchmark: also fsync with one worker, and the Ray engine)."""
    from bench_convert import measure

    names = ["fastdata_workers1", "fastdata_workers2", "fastdata_workers2_fsync", "tar_cf", "webdataset_shardwriter"]
    figures, _ = measure(src, work, shard_size, repeats, names)
    return figures


def cpu_seconds() -> float:
    """CPU time of this process, its threads and its finished children (tar, conversion workers)."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def fd_size(text: str) -> int:
    from fastdata.convert._options import parse_size

    return parse_size(text)


# -- the cost of the worker-safety core ------------------------------------------------------------------
def bare_reader(urls: list[str]) -> Iterator[dict[str, object]]:
    """The same index-and-slice reader without HandleCache, SharedState, ErrorPolicy or the epoch plan."""
    for url in urls:
        reader = LocalReader(url)
        index = load_index(url, reader)
        for lo in range(0, len(index), 256):
            yield from read_samples(reader, index, range(lo, min(lo + 256, len(index))))
        reader.close()


def bench_core_overhead(urls: list[str], repeats: int) -> dict[str, Any]:
    def with_core() -> int:
        return sum(1 for _ in fd.TarShardDataset(urls))

    def without_core() -> int:
        return sum(1 for _ in bare_reader(urls))

    times: dict[str, list[float]] = {"with_core": [], "without_core": []}
    for _ in range(max(5, 2 * repeats)):
        for name, fn in (("with_core", with_core), ("without_core", without_core)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    a, b = statistics.median(times["with_core"]), statistics.median(times["without_core"])
    return {"with_core_s": a, "without_core_s": b, "overhead": a / b - 1, "runs": len(times["with_core"])}


# -- where the time goes with workers ----------------------------------------------------------------------
def _pipe_child(conn: Any, payloads: list[bytes]) -> None:
    for p in payloads:
        conn.send_bytes(p)
    conn.close()


def bench_breakdown(urls: list[str], n: int = 3000) -> dict[str, Any]:
    """Microseconds per ~30 KB raw sample for each step of moving it from a worker to the main process."""
    import multiprocessing
    from multiprocessing.reduction import ForkingPickler

    samples = []
    start = time.perf_counter()
    for s in fd.TarShardDataset(urls):
        samples.append(s)
        if len(samples) == n:
            break
    read = time.perf_counter() - start
    start = time.perf_counter()
    pickled = [bytes(ForkingPickler.dumps(s)) for s in samples]
    dump = time.perf_counter() - start
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_pipe_child, args=(there, pickled))
    start = time.perf_counter()
    child.start()
    there.close()
    received = [here.recv_bytes() for _ in pickled]
    pipe = time.perf_counter() - start
    child.join()
    start = time.perf_counter()
    for p in received:
        pickle.loads(p)
    load = time.perf_counter() - start
    # the DataLoader's own cost per item, with items too small to matter: one worker, ints
    loader = DataLoader(range(n), batch_size=None, num_workers=1, multiprocessing_context="fork")
    start = time.perf_counter()
    for _ in loader:
        pass
    per_item = time.perf_counter() - start
    us = {"worker_read": read, "pickle": dump, "pipe_transfer": pipe, "unpickle": load, "dataloader_per_item": per_item}
    out = {k: v / n * 1e6 for k, v in us.items()}
    main_side = out["pipe_transfer"] + out["unpickle"] + out["dataloader_per_item"]
    out["implied_max_samples_per_s_one_worker"] = 1e6 / main_side
    return {"us_per_sample": out, "samples": n, "mean_bytes": sum(len(p) for p in pickled) / n}


# -- report ---------------------------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    import PIL
    import webdataset

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "webdataset": getattr(webdataset, "__version__", "?"),
        "pillow": PIL.__version__,
        "fastdata": fd.__version__,
        "tar": subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
    }


def machine() -> dict[str, Any]:
    import psutil

    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gb": psutil.virtual_memory().total / 1e9,
        "load_average_start": os.getloadavg(),
        "torch_threads_main": torch.get_num_threads(),
    }


def markdown(result: dict[str, Any]) -> str:
    lines = []
    reads = result["read"]
    workers = result["args"]["workers"]
    lines.append(
        f"Corpus: {result['corpus']['files']} JPEGs, mean {result['corpus']['mean_kb']:.1f} KB, "
        f"{result['corpus']['shards']} shards; {result['machine']['cpus']} cores; medians of "
        f"{result['args']['repeats']} passes (raw, hot) or {result['args']['repeats_other']} (others); "
        f"load average {result['machine']['load_average_start'][0]:.1f} at start. Samples/s in the steady "
        "state (ratio to webdataset at the same worker count; batched rows against webdataset batched "
        "the same way)."
    )
    lines.append("")
    lines.append("| reader | mode | cache | " + " | ".join(f"workers={w}" for w in workers) + " |")
    lines.append("|---|---|---|" + "---|" * len(workers))
    for key, row in reads.items():
        reader, mode, cache = key.split("/")
        cells = []
        for w in workers:
            r = row.get(str(w))
            if r is None:
                cells.append("")
                continue
            peer = "webdataset_batched64" if "batched64" in reader else "webdataset"
            wds_row = reads.get(f"{peer}/{mode}/{cache}", {}).get(str(w))
            if reader == "raw_sequential":
                cells.append(f"{r['mb_per_s']:,.0f} MB/s ({r['samples_equiv_per_s']:,.0f}/s)")
            elif wds_row and not reader.startswith("webdataset"):
                cells.append(f"{r['samples_per_s']:,.0f} ({r['samples_per_s'] / wds_row['samples_per_s']:.1f}x)")
            else:
                cells.append(f"{r['samples_per_s']:,.0f}")
        lines.append(f"| {reader} | {mode} | {cache} | " + " | ".join(cells) + " |")
    if "convert" in result:
        lines += [
            "",
            "| conversion | s | MB/s | files/s | MB/s vs tar cf | CPU s | CPU vs tar cf |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in result["convert"].items():
            lines.append(
                f"| {name} | {r['seconds']:.2f} | {r['mb_per_s']:,.0f} | {r['files_per_s']:,.0f} | "
                f"{r['vs_tar_cf']:.2f} | {r['cpu_seconds']:.2f} | {r['cpu_vs_tar_cf']:.2f} |"
            )
    if "core_overhead" in result:
        c = result["core_overhead"]
        lines += [
            "",
            f"Worker-safety core overhead (workers=0, raw): {100 * c['overhead']:+.1f}% "
            f"({c['with_core_s']:.3f} s vs {c['without_core_s']:.3f} s, median of {c['runs']}).",
        ]
    if "breakdown" in result:
        b = result["breakdown"]["us_per_sample"]
        lines += [
            "",
            "Per ~30 KB raw sample, µs: "
            + ", ".join(f"{k} {v:.1f}" for k, v in b.items() if not k.startswith("implied")),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="bench-out/tar", help="corpus, shards and results go here")
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-size", default="32MB", help="small enough for more shards than workers")
    p.add_argument("--workers", default="0,1,2,4")
    p.add_argument("--repeats", type=int, default=3, help="passes per figure, raw bytes with a hot cache")
    p.add_argument("--repeats-other", type=int, default=1, help="passes per figure, cold cache or decoding")
    p.add_argument("--modes", default="raw,decode")
    p.add_argument("--caches", default="hot,cold")
    p.add_argument("--decode-limit", type=int, default=1000, help="samples per decode pass (decoding is slow)")
    p.add_argument("--skip", default="", help="comma list of parts to skip: read,convert,overhead,breakdown")
    p.add_argument("--out", default=None, help="JSON results (default: WORKDIR/bench_tar.json)")
    p.add_argument("--markdown", default=None, help="markdown table (default: WORKDIR/bench_tar.md)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # collate's torch.stack stalls when another program holds a core (docs/bench.md)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers on 2 cores: on purpose
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    workers = [int(w) for w in args.workers.split(",")]
    src = work / "corpus"
    make_corpus(src, args.files, args.classes, args.seed)
    files = corpus_files(src)
    payload = sum(os.path.getsize(f) for f, _ in files)
    shards_dir = work / "shards"
    stamp = shards_dir / "manifest.json"
    if not stamp.exists() or json.loads(stamp.read_text())["samples"] != len(files):
        shutil.rmtree(shards_dir, ignore_errors=True)
        convert(src, shards_dir, shard_size=args.shard_size, workers=2, progress=False)
    manifest = json.loads(stamp.read_text())
    urls = [str(shards_dir / s["name"]) for s in manifest["shards"]]
    os.sync()  # clean pages can be evicted for the cold passes
    result: dict[str, Any] = {
        "benchmark": "bench_tar",
        "args": {**vars(args), "workers": workers},
        "versions": versions(),
        "machine": machine(),
        "corpus": {
            "files": len(files),
            "payload_bytes": payload,
            "mean_kb": payload / len(files) / 1e3,
            "shards": len(urls),
            "shard_bytes": manifest["bytes"],
        },
        "read": {},
    }
    mean_sample = manifest["bytes"] / len(files)
    if "read" not in skip:
        for mode in args.modes.split(","):
            for cache in args.caches.split(","):
                limit = args.decode_limit if mode == "decode" else None
                for name, make in readers(urls, files, mode, limit).items():
                    key = f"{name}/{mode}/{cache}"
                    row = result["read"].setdefault(key, {})
                    cold = None
                    if cache == "cold":
                        cold = [f for f, _ in files] if name == "small_files" else urls
                    else:
                        warm([f for f, _ in files] if name == "small_files" else urls)
                    repeats = args.repeats if (mode, cache) == ("raw", "hot") else args.repeats_other
                    for w in workers:
                        r = median_pass(make, w, cold, repeats, limit)
                        if name == "raw_sequential":
                            r["samples_equiv_per_s"] = r["mb_per_s"] * 1e6 / mean_sample
                        row[str(w)] = r
                        print(
                            f"{key:40s} workers={w}: {r['samples_per_s']:9,.0f} samples/s {r['mb_per_s']:8,.0f} MB/s",
                            file=sys.stderr,
                            flush=True,
                        )
    if "convert" not in skip:
        result["convert"] = bench_convert(src, work, args.shard_size, args.repeats, payload)
        print(json.dumps(result["convert"], indent=1), file=sys.stderr)
    if "overhead" not in skip:
        warm(urls)
        result["core_overhead"] = bench_core_overhead(urls, args.repeats)
        print(result["core_overhead"], file=sys.stderr)
    if "breakdown" not in skip:
        warm(urls)
        result["breakdown"] = bench_breakdown(urls)
        print(result["breakdown"], file=sys.stderr)
    result["summary"] = summarize(result, workers)
    result["machine"]["load_average_end"] = os.getloadavg()
    readme.stamp(result, readme_rows(result, workers), result["machine"]["load_average_start"])
    out = Path(args.out or work / "bench_tar.json")
    out.write_text(json.dumps(result, indent=1))
    md = Path(args.markdown or work / "bench_tar.md")
    md.write_text(markdown(result))
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {out} and {md}", file=sys.stderr)
    return 0


def readme_rows(result: dict[str, Any], workers: list[int]) -> list[dict[str, str]]:
    """This run's figures for README.md's table (tools/readme_figures.py)."""
    s, reads, rows = result["summary"], result["read"], []
    files = result["corpus"]["files"]
    where = f"{files:,} files of ~{result['corpus']['mean_kb']:.0f} KB"
    counts = readme.workers_label(workers)
    batched, single = s.get("fastdata_batched64_shm_vs_webdataset_raw_hot"), s.get("fastdata_vs_webdataset_raw_hot")
    if batched and single:
        rows.append(
            readme.row(
                "tar",
                f"raw bytes, hot cache, vs `webdataset.WebDataset`, same worker count {counts}, {where}",
                f"{readme.per_workers(batched, workers)} (batched, shared-memory transport; per sample "
                f"{readme.per_workers(single, workers)})",
                ">= 3x",
            )
        )
    raw = reads.get("raw_sequential/raw/hot")
    best = s.get("fastdata_batched64_shm_best_vs_raw_sequential_hot")
    if raw and best:
        ours = reads["fastdata_batched64_shm/raw/hot"][str(best["workers"])]["mb_per_s"]
        ceiling = max(r["mb_per_s"] for r in raw.values())
        rows.append(
            readme.row(
                "tar",
                "best raw-bytes rate vs a raw sequential read of the same shards",
                f"{best['ratio']:.2f} ({ours / 1e3:.2f} vs {ceiling / 1e3:.2f} GB/s, {best['workers']} workers)",
                ">= 0.3",
            )
        )
    cold = s.get("fastdata_batched64_shm_vs_small_files_raw_cold")
    if cold:
        rows.append(
            readme.row(
                "tar",
                f"cold cache vs the original small files one by one {counts}",
                f"{readme.per_workers(cold, workers)} (batched, shared-memory transport)",
                ">= 3x",
            )
        )
    if "core_overhead" in s:
        rows.append(
            readme.row(
                "tar",
                "worker-safety core vs the same reader without it",
                f"{100 * s['core_overhead']:+.1f}% ({result['core_overhead']['runs']} alternated runs)",
                "< 2%",
            )
        )
    return rows


def summarize(result: dict[str, Any], workers: list[int]) -> dict[str, Any]:
    """The issue's targets, as ratios measured in this run."""
    reads, s = result["read"], {}
    for name in ("fastdata", "fastdata_batched64", "fastdata_batched64_shm"):
        hot = reads.get(f"{name}/raw/hot")
        wds_hot = reads.get("webdataset_batched64/raw/hot" if "batched64" in name else "webdataset/raw/hot")
        if hot and wds_hot:
            s[f"{name}_vs_webdataset_raw_hot"] = {
                w: round(hot[str(w)]["samples_per_s"] / wds_hot[str(w)]["samples_per_s"], 2) for w in workers
            }
        raw = reads.get("raw_sequential/raw/hot")
        if hot and raw:
            best_w = max(workers, key=lambda w: hot[str(w)]["mb_per_s"])
            best_raw = max(raw[str(w)]["mb_per_s"] for w in workers)
            s[f"{name}_best_vs_raw_sequential_hot"] = {
                "workers": best_w,
                "ratio": round(hot[str(best_w)]["mb_per_s"] / best_raw, 3),
            }
        cold, small = reads.get(f"{name}/raw/cold"), reads.get("small_files/raw/cold")
        if cold and small:
            s[f"{name}_vs_small_files_raw_cold"] = {
                w: round(cold[str(w)]["samples_per_s"] / small[str(w)]["samples_per_s"], 2) for w in workers
            }
    if "convert" in result:
        s["convert_workers2_vs_tar_cf"] = round(result["convert"]["fastdata_workers2"]["vs_tar_cf"], 2)
        s["convert_workers2_fsync_vs_tar_cf"] = round(result["convert"]["fastdata_workers2_fsync"]["vs_tar_cf"], 2)
        s["shardwriter_vs_tar_cf"] = round(result["convert"]["webdataset_shardwriter"]["vs_tar_cf"], 2)
    if "core_overhead" in result:
        s["core_overhead"] = round(result["core_overhead"]["overhead"], 4)
    return s


if __name__ == "__main__":
    sys.exit(main())
