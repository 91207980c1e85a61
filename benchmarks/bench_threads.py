"""Thread mode and the hybrid against worker processes and SPDL, side by side in one run.

Two workloads, each measured in one run with the contenders taking turns (``--repeats`` rounds, the
median kept; each measurement in a freshly forked process, so that no client, pool or thread is left over
from the one before):

``s3``: ~30 KB objects on a local moto server (its own process, 127.0.0.1), ``S3Dataset`` batches of 64:

* ``ceiling``: bare boto3 GETs from 16 threads of one process (what ``benchmarks/bench_s3.py`` calls
  the server's ceiling from one process; moto is single-threaded);
* ``processes/W``: ``fd.Loader(ds, num_workers=W)`` (W = 0: in the training process);
* ``threads/N``: ``fd.Loader(ds, num_workers=N, workers="threads")``;
* ``hybrid/WxT``: ``fd.Loader(ds, num_workers=W, threads_per_worker=T)``.

``jpeg``: 256x256 JPEGs in tar shards, decoded to uint8 arrays and batched by 64:

* ``today/W``: ``fd.Loader(TarShardDataset(decode="numpy"), num_workers=W, transport="stock")``: what
  fastdata offered before thread mode and slots; its best over W is "today's best setting";
* ``slots/W``: the same with the slot transport (the Loader's default now);
* ``threads/N`` and ``hybrid/WxT``: as above;
* ``spdl_io/N``: SPDL's own pipeline (``spdl.pipeline``, ``spdl.io.iter_tarfile``, ``spdl.io`` decoding
  through FFmpeg, frames converted in one batch), ``N`` decode threads, as SPDL's image example writes it;
* ``spdl_pil/N``: ``spdl.pipeline`` with PIL decoding (what a user without FFmpeg would write).

The consumer touches every page of every batch. Rates are items per second over a window of
``--seconds`` (at least 4 batches) after the first batch; the JSON holds every repeat, the medians,
the load average before and after, and the ratios the targets are about.

Usage::

    PYTHONPATH=. python benchmarks/bench_threads.py --out bench-out/threads.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_s3 import ceiling, isolated  # noqa: E402
from bench_transport import make_jpeg_tar, warm  # noqa: E402

import fastdata as fd  # noqa: E402

PAGE = 4096
MIN_BATCHES = 4


def touch(batch: Any) -> int:
    """Samples in a batch (a dict of columns, or a tensor), touching one byte per page of its tensors."""
    n = 0
    values = batch.values() if isinstance(batch, dict) else [batch]
    for value in values:
        if isinstance(value, torch.Tensor):
            int(value.reshape(-1).view(torch.uint8)[::PAGE].sum())
            n = max(n, value.shape[0])
        elif isinstance(value, np.ndarray):
            int(value.reshape(-1).view(np.uint8)[::PAGE].sum())
            n = max(n, value.shape[0])
        elif isinstance(value, list):
            n = max(n, len(value))
    return n


def window_rate(batches: Iterable[Any], seconds: float) -> float:
    """Items per second over ``seconds`` (and at least ``MIN_BATCHES`` batches), the first batch excluded;
    passes over ``batches`` again if one ends first."""
    it = iter(batches)
    touch(next(it))
    n = k = 0
    t0 = time.perf_counter()
    while True:
        for batch in it:
            n, k = n + touch(batch), k + 1
            if time.perf_counter() - t0 >= seconds and k >= MIN_BATCHES:
                return n / (time.perf_counter() - t0)
        it = iter(batches)


def interleaved(repeats: int, runs: dict[str, Callable[[], float]]) -> dict[str, dict[str, Any]]:
    got: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            got[name].append(isolated(run))
            print(f"    {name}: {got[name][-1]:.1f}/s", file=sys.stderr, flush=True)
    return {name: {"median": statistics.median(v), "runs": [round(x, 1) for x in v]} for name, v in got.items()}


class Epochs:
    """An ``fd.Loader`` iterated epoch after epoch (a new order each)."""

    def __init__(self, loader: fd.Loader) -> None:
        self.loader, self.epoch = loader, 0

    def __iter__(self) -> Iterator[Any]:
        self.loader.set_epoch(self.epoch)
        self.epoch += 1
        return iter(self.loader)


def fastdata_run(make: Callable[[], Any], seconds: float, **loader_kw: Any) -> Callable[[], float]:
    def run() -> float:
        torch.set_num_threads(1)
        ds = make()
        kw = dict(loader_kw)
        if kw.get("num_workers") and kw.get("workers") != "threads":
            kw.update(persistent_workers=True, multiprocessing_context="fork")
        with fd.Loader(ds, **kw) as loader:
            return window_rate(Epochs(loader), seconds)

    return run


# -- S3 ------------------------------------------------------------------------------------------------


def s3_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.s3_server import CREDENTIALS, REGION, MotoServer, upload_files

    with MotoServer() as server:
        client = server.client()
        client.create_bucket(Bucket="threads")
        rng = np.random.default_rng(args.seed)
        urls = upload_files(client, "threads", {f"obj/{i:06d}.bin": rng.bytes(30_000) for i in range(args.objects)})
        endpoint = server.endpoint_url

        def make() -> fd.S3Dataset:
            return fd.S3Dataset(urls, endpoint_url=endpoint, region_name=REGION, **CREDENTIALS)

        runs: dict[str, Callable[[], float]] = {
            "ceiling": lambda: ceiling(urls, endpoint, args.seconds, 1, 16, "boto3"),
        }
        for w in (0, 2):
            runs[f"processes/{w}"] = fastdata_run(make, args.seconds, batch_size=64, num_workers=w)
        for n in args.threads:
            runs[f"threads/{n}"] = fastdata_run(make, args.seconds, batch_size=64, num_workers=n, workers="threads")
        runs["hybrid/2x2"] = fastdata_run(make, args.seconds, batch_size=64, num_workers=2, threads_per_worker=2)
        measured = interleaved(args.repeats, runs)
    best = measured["ceiling"]["median"]
    out: dict[str, Any] = {"measured": measured, "ceiling_1_process": best, "of_ceiling": {}}
    for name, r in measured.items():
        if name != "ceiling":
            out["of_ceiling"][name] = round(r["median"] / best, 3)
    threads = {k: v for k, v in out["of_ceiling"].items() if k.startswith("threads/")}
    out["threads_best_of_ceiling"] = max(threads.values())
    out["target_threads_ge_0.9_of_ceiling"] = out["threads_best_of_ceiling"] >= 0.9
    return out


# -- JPEG decode from tar ----------------------------------------------------------------------------


def _samples(urls: list[str]) -> Iterator[tuple[str, bytes]]:
    """(key, JPEG bytes) of every sample of the shards, read with SPDL's tar parser."""
    import spdl.io

    for url in urls:
        with open(url, "rb") as f:
            data = f.read()
        for name, member in spdl.io.iter_tarfile(data):
            if name.endswith(".jpg"):
                yield name, member


def spdl_run(urls: list[str], threads: int, seconds: float, decoder: str) -> Callable[[], float]:
    def run() -> float:
        import spdl.io
        from PIL import Image
        from spdl.pipeline import PipelineBuilder

        torch.set_num_threads(1)

        def decode_spdl(item: tuple[str, bytes]) -> Any:
            packets = spdl.io.demux_image(item[1])
            return spdl.io.decode_packets(packets, filter_desc=spdl.io.get_filter_desc(packets, pix_fmt="rgb24"))

        def batch_spdl(frames: list[Any]) -> torch.Tensor:
            return spdl.io.to_torch(spdl.io.convert_frames(frames))

        def decode_pil(item: tuple[str, bytes]) -> np.ndarray:
            with Image.open(io.BytesIO(item[1])) as im:
                return np.asarray(im.convert("RGB"))

        def batch_pil(arrays: list[np.ndarray]) -> torch.Tensor:
            return torch.from_numpy(np.stack(arrays))

        decode, batch = (decode_spdl, batch_spdl) if decoder == "spdl" else (decode_pil, batch_pil)

        class Passes:
            def __iter__(self) -> Iterator[Any]:
                pipeline = (
                    PipelineBuilder()
                    .add_source(_samples(urls))
                    .pipe(decode, concurrency=threads)
                    .aggregate(64)
                    .pipe(batch)
                    .add_sink(4)
                    .build(num_threads=threads)
                )
                with pipeline.auto_stop():
                    yield from pipeline

        return window_rate(Passes(), seconds)

    return run


def jpeg_section(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    urls = make_jpeg_tar(folder, 8, args.images // 8, 256, args.seed)
    warm(urls)

    def make() -> fd.TarShardDataset:
        return fd.TarShardDataset(urls, batch_size=64, shuffle=True, decode="numpy")

    runs: dict[str, Callable[[], float]] = {}
    for w in (0, 1, 2, 3, 4):
        runs[f"today/{w}"] = fastdata_run(make, args.seconds, num_workers=w, transport="stock" if w else None)
    for w in (2, 3):
        runs[f"slots/{w}"] = fastdata_run(make, args.seconds, num_workers=w, transport="slots")
    for n in args.threads:
        runs[f"threads/{n}"] = fastdata_run(make, args.seconds, num_workers=n, workers="threads")
    runs["hybrid/2x2"] = fastdata_run(make, args.seconds, num_workers=2, threads_per_worker=2)
    try:
        import spdl.io  # noqa: F401

        for n in args.threads:
            runs[f"spdl_io/{n}"] = spdl_run(urls, n, args.seconds, "spdl")
            runs[f"spdl_pil/{n}"] = spdl_run(urls, n, args.seconds, "pil")
    except ImportError:
        print("spdl is not installed: no SPDL peer", file=sys.stderr)
    measured = interleaved(args.repeats, runs)
    med = {k: v["median"] for k, v in measured.items()}
    today = max((v, k) for k, v in med.items() if k.startswith("today/"))
    out: dict[str, Any] = {"measured": measured, "today_best": {"setting": today[1], "items_per_s": today[0]}}
    ratios: dict[str, float] = {}
    for n in args.threads:
        t = med[f"threads/{n}"]
        ratios[f"threads/{n}_vs_today_best"] = round(t / today[0], 3)
        for peer in ("spdl_io", "spdl_pil"):
            if f"{peer}/{n}" in med:
                ratios[f"threads/{n}_vs_{peer}/{n}"] = round(t / med[f"{peer}/{n}"], 3)
    out["ratios"] = ratios
    # the same ratio round by round (each round's contenders run seconds apart): on a machine whose load
    # swings, the median of these is less at the mercy of which round a median lands in
    rounds = len(measured["today/0"]["runs"])
    for name in [f"threads/{n}" for n in args.threads] + ["hybrid/2x2", "slots/2", "slots/3"]:
        paired = [
            measured[name]["runs"][i] / max(measured[k]["runs"][i] for k in measured if k.startswith("today/"))
            for i in range(rounds)
        ]
        out.setdefault("paired_vs_today_best", {})[name] = {
            "median": round(statistics.median(paired), 3),
            "rounds": [round(x, 2) for x in paired],
        }
    best_threads = max(med[f"threads/{n}"] for n in args.threads)
    out["target_threads_ge_1.3x_today_best"] = best_threads / today[0] >= 1.3
    out["target_threads_ge_spdl_same_concurrency"] = all(v >= 1.0 for k, v in ratios.items() if "_vs_spdl" in k)
    return out


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for name in ("fastdata", "spdl", "boto3", "moto", "pillow"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default="s3,jpeg")
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 4], help="thread counts (also SPDL's)")
    ap.add_argument("--objects", type=int, default=1024, help="S3 objects of 30 KB")
    ap.add_argument("--images", type=int, default=1024, help="256x256 JPEGs in the shards")
    ap.add_argument("--seconds", type=float, default=2.0, help="window of one measurement")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-out/threads.json")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {
        "args": vars(args),
        "versions": versions(),
        "machine": {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()},
    }
    sections = args.sections.split(",")
    if "s3" in sections:
        result["s3"] = s3_section(args)
    if "jpeg" in sections:
        with tempfile.TemporaryDirectory() as tmp:
            result["jpeg"] = jpeg_section(args, Path(tmp))
    result["machine"]["loadavg_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("args",)}, indent=1)[:8000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
