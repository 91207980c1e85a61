"""HDF5 read throughput: fastdata's HDF5Dataset against the usual patterns, side by side in one run.

On the same file (laid out as ``fastdata convert --format hdf5`` writes it), through real DataLoaders:

* ``fastdata``: :class:`fastdata.HDF5Dataset` with ``collate_fn=ds.collate``;
* ``fastdata_default_collate``: the same with torch's ``default_collate`` (sequential order only);
* ``open_per_item``: the common fork-safe pattern, ``with h5py.File(path) as f: return f[...][i]`` in
  every ``__getitem__``;
* ``h5py_lazy`` (optional): a file opened lazily once per worker, one ``ds[i]`` per field per item;
* ``raw``: the same rows' bytes read with ``os.preadv`` into a fresh buffer, and copied out of a memory
  map, batch by batch in one process (no HDF5, no DataLoader): the physical limit;

in ``sequential`` and ``random`` order and in batches from :meth:`HDF5Dataset.chunk_sampler` (``chunk``),
with ``num_workers`` 0, 1, 2 and 4. Three files: ``array`` (decoded 96x96 RGB images, uncompressed, as
``convert --decode`` writes them), ``jpeg`` (variable-length bytes, as ``convert`` writes them) and ``gzip``
(decoded images in gzip chunks: the case the chunk-aware sampler is for).

Every figure is a median over repeats interleaved with the other configurations, in samples/s, of a
steady-state pass (persistent workers started and files opened by a warm-up pass first). The machine is
shared, so single-process runs (``num_workers=0`` and ``raw``) also report samples per CPU-second of the
process (``cpu_samples_per_s``): on an idle machine the two agree, under load only the CPU figure holds.

Usage::

    PYTHONPATH=. python benchmarks/bench_hdf5.py --out bench_hdf5.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _readme as readme

import fastdata as fd
from fastdata.convert._hdf5 import CHUNK_BYTES, LABEL_CHUNK_ROWS, VLEN_CHUNK_ROWS

ORDERS = ("sequential", "random", "chunk")
SLOW = ("open_per_item", "h5py_lazy")


def make_file(path: Path, kind: str, n: int, hw: tuple[int, int], seed: int) -> None:
    """A file of ``n`` samples with fields ``image`` and ``label`` (see the module doc for ``kind``)."""
    rng = np.random.default_rng(seed)
    h, w = hw
    with h5py.File(path, "w") as f:
        f.create_dataset("label", data=rng.integers(0, 1000, n), chunks=(min(n, LABEL_CHUNK_ROWS),))
        if kind == "jpeg":
            image = f.create_dataset("image", (n,), dtype=h5py.vlen_dtype(np.uint8), chunks=(VLEN_CHUNK_ROWS,))
            for lo in range(0, n, 512):
                part = np.empty(min(512, n - lo), dtype=object)
                part[:] = [
                    rng.integers(0, 256, int(rng.integers(h * w // 2, h * w * 2)), dtype=np.uint8)
                    for _ in range(len(part))
                ]
                image[lo : lo + len(part)] = part
            return
        # decoded images: 1 MiB chunks as convert writes them; compressed: 8 rows (~220 KiB at 96x96),
        # near what h5py's automatic chunking picks, so that a random row does not inflate a whole MiB
        rows = max(1, CHUNK_BYTES // (h * w * 3)) if kind == "array" else 8
        gzip = {"compression": "gzip", "compression_opts": 1} if kind == "gzip" else {}
        image = f.create_dataset("image", (n, h, w, 3), dtype=np.uint8, chunks=(rows, h, w, 3), **gzip)
        ramp = np.linspace(0, 160, w, dtype=np.float32)[None, None, :, None]
        for lo in range(0, n, 512):
            m = min(512, n - lo)
            if kind == "array":
                image[lo : lo + m] = rng.integers(0, 256, (m, h, w, 3), dtype=np.uint8)
            else:  # smooth pictures with a little noise: compressible, as photographs are
                base = rng.integers(0, 96, (m, 1, 1, 3)).astype(np.float32)
                image[lo : lo + m] = (base + ramp + rng.integers(0, 8, (m, h, w, 3))).astype(np.uint8)


class OpenPerItem(Dataset[Any]):
    """The usual fork-safe workaround: open the file in every ``__getitem__``."""

    def __init__(self, path: str) -> None:
        self.path = path
        with h5py.File(path, "r") as f:
            self.n = f["label"].shape[0]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        with h5py.File(self.path, "r") as f:
            return {"image": _value(f["image"][i]), "label": f["label"][i]}


class H5pyLazy(OpenPerItem):
    """The file opened lazily once per process (re-opened when the pid changes), read item by item."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        if getattr(self, "_pid", None) != os.getpid():
            self._file = h5py.File(self.path, "r")
            self._pid = os.getpid()
        return {"image": _value(self._file["image"][i]), "label": self._file["label"][i]}

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "n": self.n}

    def close(self) -> None:
        if getattr(self, "_pid", None) == os.getpid():
            self._file.close()
            self._pid = None


def _value(v: Any) -> Any:
    return v.tobytes() if v.ndim == 1 and v.dtype == np.uint8 else v


class WarmThenAll:
    """A batch sampler that yields a few warm-up batches while ``warming``, else all of them."""

    def __init__(self, batches: list[list[int]], warm: int) -> None:
        self.batches, self.warm, self.warming = batches, warm, True

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches[: self.warm] if self.warming else self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def time_loader(
    dataset: Dataset[Any], batches: list[list[int]], workers: int, collate: Callable[..., Any], max_seconds: float
) -> tuple[float, float]:
    """``(samples/s, samples per CPU-second of this process)`` of a steady-state pass: a first pass of a few
    batches (two per worker, at least three) starts the (persistent) workers, opens the files and fills the
    readers' buffers; the second pass is timed from ``iter()`` to its end or, past ``max_seconds``, to the
    batch where it stops (at least ``workers + 2``)."""
    sampler = WarmThenAll(batches, max(3, 2 * workers))
    loader = DataLoader(
        dataset, batch_sampler=sampler, num_workers=workers, collate_fn=collate, persistent_workers=workers > 0
    )
    for batch in loader:
        del batch  # hold no warm-up batch into the timed pass
    sampler.warming = False
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    it = iter(loader)
    for count, batch in enumerate(it, 1):
        n += len(batch["label"])
        if count >= workers + 2 and time.perf_counter() - t0 > max_seconds:
            break
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    del it, loader  # stops the workers now
    return n / wall, n / max(cpu, 1e-9)


def raw_rates(path: Path, batches: list[np.ndarray]) -> dict[str, tuple[float, float]]:
    """``{method: (samples/s, samples per CPU-second)}`` reading the same rows' bytes (image and label)
    straight from the file, batch by batch, runs of adjacent rows in one read: with ``os.preadv`` into a
    fresh buffer, and as a copy out of a memory map. Each batch is held until the next one is read, as a
    training loop (and the DataLoader) holds it."""
    with h5py.File(path, "r") as f:
        fields = []
        for name in ("image", "label"):
            ds = f[name]
            row = ds.dtype.itemsize * int(np.prod(ds.shape[1:]))
            per = ds.chunks[0]
            addr = np.zeros(-(-ds.shape[0] // per), dtype=np.int64)
            ds.id.chunk_iter(lambda info, a=addr, c=per: a.__setitem__(info.chunk_offset[0] // c, info.byte_offset))
            fields.append((row, per, addr, ds.dtype, ds.shape[1:]))
    fd_ = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd_, 0, prot=mmap.PROT_READ)
    data = np.frombuffer(mm, dtype=np.uint8)
    out: dict[str, tuple[float, float]] = {}
    try:
        for method in ("preadv", "mmap"):
            n = 0
            held: list[torch.Tensor] = []
            t0, c0 = time.perf_counter(), time.process_time()
            for batch in batches[3:]:  # the first batches are the warm-up, as in time_loader
                # the previous batch stays alive until this one is read, as in a training loop
                previous, held = held, []
                for row, per, addr, dtype, shape in fields:
                    offs = addr[batch // per] + (batch % per) * row
                    buf = np.empty((len(batch), row), dtype=np.uint8)
                    k = 0
                    while k < len(batch):
                        j = k + 1
                        while j < len(batch) and offs[j] == offs[j - 1] + row:
                            j += 1
                        if method == "preadv":
                            os.preadv(fd_, [memoryview(buf[k:j]).cast("B")], int(offs[k]))
                        else:
                            buf[k:j].reshape(-1)[:] = data[int(offs[k]) : int(offs[k]) + (j - k) * row]
                        k = j
                    held.append(torch.from_numpy(buf.view(dtype).reshape(len(batch), *shape)))
                del previous
                n += len(batch)
            out[method] = (n / (time.perf_counter() - t0), n / max(time.process_time() - c0, 1e-9))
    finally:
        del data
        mm.close()
        os.close(fd_)
    return out


def configs_for(kind: str, main_kind: bool, args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """The (reader, order, workers) runs for one file: everything for the first kind; for the others what
    the chunk-aware sampler question needs (fastdata in every order, the peer in random order)."""
    workers = args.workers if main_kind else args.workers_other
    configs = [("raw", order, 0) for order in ORDERS] if kind == "array" else []
    for impl in args.impls:
        for order in ORDERS:
            if impl == "fastdata_default_collate" and (order != "sequential" or not main_kind):
                continue
            if impl in SLOW and (order not in args.peer_orders or (not main_kind and order != "random")):
                continue
            configs += [(impl, order, w) for w in workers]
    return configs


def run_kind(kind: str, main_kind: bool, folder: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    h, w = (int(x) for x in args.size.lower().split("x"))
    path = Path(folder) / f"{kind}.h5"
    make_file(path, kind, args.samples, (h, w), args.seed)
    b = args.batch_size
    rng = np.random.default_rng(args.seed)
    orders = {"sequential": np.arange(args.samples), "random": rng.permutation(args.samples)}
    batches: dict[str, list[np.ndarray]] = {
        o: [idx[i : i + b] for i in range(0, len(idx) - b + 1, b)] for o, idx in orders.items()
    }
    with fd.HDF5Dataset(str(path), ("image", "label"), seed=args.seed) as ds:
        batches["chunk"] = [np.asarray(x) for x in ds.chunk_sampler(b) if len(x) == b]
    # the per-item peers read smaller batches, so that a short run still holds many of them (their cost
    # is per item; a smaller batch only adds DataLoader overhead to their side)
    small = args.batch_size_slow
    slow_batches = {o: [x for batch in bs for x in np.split(batch, len(batch) // small)] for o, bs in batches.items()}
    configs = configs_for(kind, main_kind, args)
    runs: dict[tuple[str, str, int], list[Any]] = {c: [] for c in configs}

    def repeats(impl: str, workers: int) -> int:
        return args.repeats_fast if workers == 0 and impl not in SLOW else args.repeats

    # repeats interleaved, so that a burst of load elsewhere on the machine hits every configuration alike
    for r in range(max(args.repeats, args.repeats_fast)):
        for impl, order, workers in configs:
            if r >= repeats(impl, workers):
                continue
            t_run = time.perf_counter()
            if impl == "raw":
                runs[(impl, order, workers)].append(raw_rates(path, batches[order][: args.read // b + 3]))
                continue
            chosen = slow_batches[order] if impl in SLOW else batches[order][: args.read // b]
            dataset: Any
            collate: Callable[..., Any] = default_collate
            if impl.startswith("fastdata"):
                dataset = fd.HDF5Dataset(str(path), ("image", "label"), seed=args.seed)
                if impl == "fastdata":
                    collate = dataset.collate
            else:
                dataset = OpenPerItem(str(path)) if impl == "open_per_item" else H5pyLazy(str(path))
            runs[(impl, order, workers)].append(
                time_loader(dataset, [x.tolist() for x in chosen], workers, collate, args.max_seconds)
            )
            if hasattr(dataset, "close"):
                dataset.close()
            if os.environ.get("BENCH_DEBUG"):
                print(f"  {kind} {impl} {order} w={workers}: {time.perf_counter() - t_run:.1f} s", flush=True)
    results = []
    for (impl, order, workers), got in runs.items():
        per_method = {f"raw_{m}": [g[m] for g in got] for m in ("preadv", "mmap")} if impl == "raw" else {impl: got}
        for name, pairs in per_method.items():
            row: dict[str, Any] = {
                "kind": kind,
                "impl": name,
                "order": order,
                "workers": workers,
                "samples_per_s": statistics.median(p[0] for p in pairs),
                "runs": [round(p[0]) for p in pairs],
            }
            if workers == 0:
                row["cpu_samples_per_s"] = statistics.median(p[1] for p in pairs)
            results.append(row)
    results.append({"kind": kind, "impl": "file", "bytes": path.stat().st_size})
    path.unlink()
    return results


def _get(
    results: list[dict[str, Any]],
    kind: str,
    impl: str,
    order: str,
    workers: int | None = None,
    key: str = "samples_per_s",
) -> tuple[float, int]:
    """The best figure of (kind, impl, order), over worker counts or at ``workers``, and its worker count."""
    rows = [
        r
        for r in results
        if (r["kind"], r["impl"], r.get("order")) == (kind, impl, order)
        and key in r
        and (workers is None or r["workers"] == workers)
    ]
    if not rows:
        return 0.0, -1
    top = max(rows, key=lambda r: r[key])
    return top[key], top["workers"]


def summarise(results: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for impl in ("fastdata", "fastdata_default_collate", *SLOW):
        for order in ORDERS:
            rate, workers = _get(results, kind, impl, order)
            if workers >= 0:
                s[f"{impl}_{order}_best"] = {"samples_per_s": round(rate), "workers": workers}
    fr, fw = _get(results, kind, "fastdata", "random")
    pr, _ = _get(results, kind, "open_per_item", "random")
    if fr and pr:
        s["random_vs_open_per_item"] = round(fr / pr, 2)  # each at its best worker count
        same, _ = _get(results, kind, "open_per_item", "random", fw)
        if same:
            s["random_vs_open_per_item_same_workers"] = round(fr / same, 2)
    fc, _ = _get(results, kind, "fastdata", "chunk")
    if fr and fc:
        s["chunk_vs_random"] = round(fc / fr, 2)
    fs, _ = _get(results, kind, "fastdata", "sequential")
    for key, suffix in (("samples_per_s", ""), ("cpu_samples_per_s", "_cpu")):
        raw = max(_get(results, kind, f"raw_{m}", "sequential", 0, key)[0] for m in ("preadv", "mmap"))
        if not raw:
            continue
        s[f"raw_sequential{suffix}"] = round(raw)
        seq, _ = _get(results, kind, "fastdata", "sequential", 0, key)
        chunk, _ = _get(results, kind, "fastdata", "chunk", 0, key)
        if suffix:  # per CPU-second: single-process runs only
            s["sequential_vs_raw_cpu_w0"] = round(seq / raw, 2)
            s["chunk_vs_raw_cpu_w0"] = round(chunk / raw, 2)
        else:
            s["sequential_vs_raw"] = round(fs / raw, 2)
            s["chunk_vs_raw"] = round(fc / raw, 2)
    return s


KIND_WORDS = {"array": "decoded", "jpeg": "JPEG bytes", "gzip": "gzip"}


def readme_rows(summary: dict[str, Any], args: Any) -> list[dict[str, str]]:
    """This run's figures for README.md's table (tools/readme_figures.py)."""
    rows = []
    against = [
        f"{summary[k]['random_vs_open_per_item']:.1f}x {KIND_WORDS[k]}"
        for k in args.kinds
        if "random_vs_open_per_item" in summary.get(k, {})
    ]
    if against:
        rows.append(
            readme.row(
                "HDF5",
                f"random order vs opening the file in every `__getitem__` (best worker count), {args.samples:,} "
                f"samples of {args.size}",
                ", ".join(against),
                ">= 3x",
            )
        )
    first = summary.get(args.kinds[0], {})
    if "sequential_vs_raw" in first:
        cpu = (
            f" ({first['sequential_vs_raw_cpu_w0']:.2f} per CPU-second)" if "sequential_vs_raw_cpu_w0" in first else ""
        )
        rows.append(
            readme.row(
                "HDF5",
                f"sequential vs a raw read of the same bytes ({KIND_WORDS[args.kinds[0]]})",
                f"{first['sequential_vs_raw']:.2f}{cpu}",
                ">= 0.8",
            )
        )
    return rows


def markdown_table(results: list[dict[str, Any]]) -> str:
    """One row per (data, reader, order), one column per worker count (samples/s), and the CPU figure."""
    rows = [r for r in results if "workers" in r]
    workers = sorted({r["workers"] for r in rows})
    lines = [
        "| data | reader | order | " + " | ".join(f"w={w}" for w in workers) + " | w=0 per CPU-s |",
        "|---|---|---|" + "---:|" * (len(workers) + 1),
    ]
    for key in dict.fromkeys((r["kind"], r["impl"], r["order"]) for r in rows):
        cells, cpu = [], ""
        for w in workers:
            hit = [r for r in rows if (r["kind"], r["impl"], r["order"]) == key and r["workers"] == w]
            cells.append(f"{hit[0]['samples_per_s']:.0f}" if hit else "")
            if hit and "cpu_samples_per_s" in hit[0]:
                cpu = f"{hit[0]['cpu_samples_per_s']:.0f}"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + f" | {cpu} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=4096, help="samples in each file (default 4096)")
    p.add_argument("--size", default="96x96", help="image HxW (default 96x96: 27 KiB per decoded image)")
    p.add_argument("--kinds", nargs="+", default=["array", "jpeg", "gzip"], choices=["array", "jpeg", "gzip"])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batch-size-slow", type=int, default=32, help="batch size of the per-item peers (default 32)")
    p.add_argument("--read", type=int, default=4096, help="samples per timed pass of fastdata and raw (default 4096)")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=0.75,
        help="a timed pass stops after this long, once it has read workers+2 batches (default 0.75)",
    )
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4], help="for the first kind")
    p.add_argument(
        "--workers-other",
        type=int,
        nargs="+",
        default=[0, 2],
        help="for the other kinds (default 0 2: keeps the whole run near three minutes)",
    )
    p.add_argument(
        "--impls",
        nargs="+",
        default=["fastdata", "fastdata_default_collate", "open_per_item"],
        choices=["fastdata", "fastdata_default_collate", *SLOW],
    )
    p.add_argument(
        "--peer-orders",
        nargs="+",
        default=["sequential", "random"],
        choices=list(ORDERS),
        help="orders for the per-item peers",
    )
    p.add_argument("--repeats", type=int, default=3, help="repeats of runs with workers or per-item peers")
    p.add_argument("--repeats-fast", type=int, default=7, help="repeats of single-process fastdata and raw runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", default=None, help="folder for the files (default: a temporary folder)")
    p.add_argument("--out", default="bench_hdf5.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # collate in the main process must not fight the workers for the 2 cores
    # 4 workers on 2 cores is part of the sweep on purpose
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    started = time.perf_counter()
    load_before = os.getloadavg()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for kind in args.kinds:
            results += run_kind(kind, kind == args.kinds[0], folder, args)
    summary = {kind: summarise(results, kind) for kind in args.kinds}
    report = {
        "benchmark": "bench_hdf5",
        "args": vars(args),
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "numpy": np.__version__,
            "h5py": h5py.version.version,
            "hdf5": h5py.version.hdf5_version,
            "fastdata": fd.__version__,
        },
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "torch_threads": torch.get_num_threads(),
        },
        "seconds": round(time.perf_counter() - started, 1),
        "summary": summary,
        "results": results,
    }
    readme.stamp(report, readme_rows(summary, args), load_before)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(markdown_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
