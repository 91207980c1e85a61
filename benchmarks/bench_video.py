"""Video clips through a DataLoader: fastdata vs the usual patterns, side by side in one run.

Loaders, all map-style, all reading the same clips in the same order from the same generated videos:

* ``fastdata``            VideoClipDataset, default decoder, default stagger
* ``fastdata-nostagger``  the same with ``stagger=(0, 0)``
* ``fastdata-decord``     VideoClipDataset with ``decoder="decord"`` (our decord path)
* ``fastdata-opencv``     VideoClipDataset with ``decoder="opencv"``
* ``fastdata-torchcodec`` VideoClipDataset with ``decoder="torchcodec"`` (when torchcodec imports)
* ``naive-opencv``        a new ``cv2.VideoCapture`` + seek + ``read()`` per clip (the usual pattern)
* ``decord-fresh``        a new ``decord.VideoReader`` + ``get_batch`` per clip (no reader cache)
* ``decord-kept``         one ``decord.VideoReader`` per video kept open per worker, ``get_batch``

Random clips (a seeded shuffle of all clips) and sequential clips (every clip of a video in order);
workers 0, 1, 2, 4. Per run: clips/s in steady state (after every worker has delivered a batch), CPU
milliseconds per clip (main process + workers), and the time from ``iter(loader)`` to the first batch.
Medians of ``--repeats`` runs, interleaved so that drift on a shared machine hits every loader alike.
Stagger is measured apart: ``fastdata`` with and without it, alternated ``--stagger-repeats`` times per
worker count. First of all, one pass per worker count with a probe that counts the video files each
fastdata worker holds open (the bound is ``max_open=8``; the data has 16 videos).

    PYTHONPATH=. python benchmarks/bench_video.py                    # writes bench-out/bench_video.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _readme as readme

import fastdata as fd
from fastdata.core.process._handles import open_files

LOADERS = [
    "fastdata",
    "fastdata-decord",
    "fastdata-opencv",
    "fastdata-torchcodec",
    "naive-opencv",
    "decord-fresh",
    "decord-kept",
]
DEFAULT_LOADERS = [n for n in LOADERS if n != "fastdata-opencv"]
# loaders measured with sequential clips too (the others only with random clips)
SEQUENTIAL = ["fastdata", "fastdata-decord", "fastdata-torchcodec", "naive-opencv", "decord-fresh"]


# -- data ------------------------------------------------------------------------------------------


def make_videos(folder: Path, *, count: int, frames: int, size: int, fps: int, codec: str, seed: int) -> list[str]:
    """Videos of a blurred random texture panning behind a moving disk: content that compresses like
    camera footage (mostly motion), not like noise. Reused when the folder already holds them."""
    import cv2

    spec = {"count": count, "frames": frames, "size": size, "fps": fps, "codec": codec, "seed": seed}
    marker = folder / "spec.json"
    paths = [str(folder / f"video{k:04d}.{'avi' if codec == 'MJPG' else 'mp4'}") for k in range(count)]
    if marker.exists() and json.loads(marker.read_text()) == spec and all(map(os.path.exists, paths)):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    for k, path in enumerate(paths):
        rng = np.random.default_rng([seed, k])
        texture = cv2.GaussianBlur(rng.integers(0, 256, (2 * size, 2 * size, 3), dtype=np.uint8), (0, 0), 3)
        phase = rng.uniform(0, 6.28, 2)
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*codec), fps, (size, size))
        for i in range(frames):
            dx, dy = int(i * 1.5) % size, int(i * 0.7) % size
            frame = texture[dy : dy + size, dx : dx + size].copy()
            x = int(size * (0.5 + 0.3 * np.sin(i / 20 + phase[0])))
            y = int(size * (0.5 + 0.3 * np.cos(i / 25 + phase[1])))
            cv2.circle(frame, (x, y), size // 7, (255, 80, 20), -1)
            writer.write(frame)
        writer.release()
    marker.write_text(json.dumps(spec))
    return paths


# -- the peers -------------------------------------------------------------------------------------


class ClipList(Dataset[dict[str, Any]]):
    """The clips every loader reads: clip ``i`` is ``(video, frame numbers)``."""

    def __init__(self, paths: list[str], clips: list[tuple[int, list[int]]]) -> None:
        self.paths, self.clips = paths, clips

    def __len__(self) -> int:
        return len(self.clips)

    def sample(self, i: int, clip: np.ndarray) -> dict[str, Any]:
        video, frames = self.clips[i]
        return {"clip": torch.from_numpy(clip), "video": video, "frames": torch.tensor(frames)}


class NaiveOpenCV(ClipList):
    """The usual pattern: open, seek, read every frame of the span, keep every stride-th."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        import cv2

        video, frames = self.clips[i]
        cap = cv2.VideoCapture(self.paths[video])
        cap.set(cv2.CAP_PROP_POS_FRAMES, frames[0])
        keep = set(frames)
        out = []
        for f in range(frames[0], frames[-1] + 1):
            ok, bgr = cap.read()
            if not ok:
                raise RuntimeError(f"{self.paths[video]}: frame {f} unreadable")
            if f in keep:
                out.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
        cap.release()
        return self.sample(i, np.stack(out))


class DecordFresh(ClipList):
    """decord without a reader cache: a new VideoReader per clip."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        import decord

        video, frames = self.clips[i]
        reader = decord.VideoReader(self.paths[video], num_threads=1)
        return self.sample(i, reader.get_batch(frames).asnumpy())


class DecordKept(ClipList):
    """decord with one reader per video kept open in each worker (opened in the worker)."""

    _readers: ClassVar[dict[str, Any]] = {}
    _pid = -1
    _inherited: ClassVar[list[Any]] = []

    def __getitem__(self, i: int) -> dict[str, Any]:
        import decord

        cls = type(self)
        if cls._pid != os.getpid():  # never touch a reader from another process (decord hangs)
            cls._inherited.append(cls._readers)
            cls._readers, cls._pid = {}, os.getpid()
        video, frames = self.clips[i]
        path = self.paths[video]
        reader = cls._readers.get(path)
        if reader is None:
            reader = cls._readers[path] = decord.VideoReader(path, num_threads=1)
        return self.sample(i, reader.get_batch(frames).asnumpy())


class CountOpen:
    """A transform recording how many video files the worker holds open right after each read."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        sample["open_files"] = open_files(self.folder).total()
        return sample


def build(
    name: str, paths: list[str], clips: list[tuple[int, list[int]]], args: argparse.Namespace, transform: Any = None
) -> Dataset[Any]:
    if not name.startswith("fastdata"):
        return {"naive-opencv": NaiveOpenCV, "decord-fresh": DecordFresh, "decord-kept": DecordKept}[name](paths, clips)
    decoder = name.split("-", 1)[1] if name.count("-") and name != "fastdata-nostagger" else None
    kwargs: dict[str, Any] = {} if decoder is None else {"decoder": decoder}
    if name == "fastdata-nostagger":
        kwargs["stagger"] = (0.0, 0.0)
    span = (args.clip_len - 1) * args.stride + 1
    return fd.VideoClipDataset(
        paths,
        clip_len=args.clip_len,
        frame_stride=args.stride,
        clips_per_video="all",
        clip_step=span,
        transform=transform,
        index_cache=Path(args.data) / f"index-{name}.json",
        **kwargs,
    )


# -- measuring -------------------------------------------------------------------------------------


def cpu_seconds() -> float:
    """CPU time of this process and its live children (the DataLoader workers)."""
    proc = psutil.Process()
    total = sum(proc.cpu_times()[:2])
    for child in proc.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def measure(
    ds: Dataset[Any], order: list[int], workers: int, args: argparse.Namespace, fastdata: bool
) -> dict[str, float]:
    loader = DataLoader(
        ds,
        batch_size=args.batch_size,
        sampler=order,
        num_workers=workers,
        worker_init_fn=fd.worker_init_fn if fastdata and workers else None,
        multiprocessing_context="fork" if workers else None,
    )
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    for _ in range(max(args.warmup, workers) - 1):  # every worker past its start-up (and its stagger)
        next(it)
    n = 0
    c0, t1 = cpu_seconds(), time.perf_counter()
    for batch in it:
        n += len(batch["clip"])
        if n >= args.clips or time.perf_counter() - t1 > args.max_seconds:
            break
    wall, cpu = time.perf_counter() - t1, cpu_seconds() - c0
    del it
    return {"clips_per_s": n / wall, "cpu_ms_per_clip": 1e3 * cpu / n, "first_batch_s": first, "clips": n}


def max_open_per_worker(
    paths: list[str], clips: list[tuple[int, list[int]]], order: list[int], workers: int, args: argparse.Namespace
) -> int:
    folder = str(Path(paths[0]).parent)
    ds = build("fastdata", paths, clips, args, transform=CountOpen(folder))
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=order, num_workers=workers)
    most = 0
    for batch in loader:
        most = max(most, int(max(batch["open_files"])))
    ds.close()  # type: ignore[attr-defined]
    return most


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("torch", "numpy", "av", "decord", "opencv-python-headless", "torchcodec"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def readme_rows(summary: dict[str, Any], args: Any, decoder: str | None) -> list[dict[str, str]]:
    """This run's figures for README.md's table (tools/readme_figures.py)."""
    rows = []
    counts = [w for w in args.workers if f"random workers={w}" in summary]
    data = f"{args.videos} videos of {args.frames} frames at {args.size}px ({args.codec}), clips of {args.clip_len}"
    for name, what, target in (
        ("fastdata", f"default decoder ({decoder})", ">= 2x"),
        ("fastdata-decord", "decord path", ">= 1.5x"),
    ):
        ratios = {w: summary[f"random workers={w}"].get(f"{name}/naive-opencv") for w in counts}
        if not counts or any(r is None for r in ratios.values()):
            continue
        rows.append(
            readme.row(
                "video",
                f"random clips, {what} vs a new `cv2.VideoCapture` + seek per clip {readme.workers_label(counts)}, "
                + data,
                readme.per_workers({w: float(r or 0) for w, r in ratios.items()}, counts),
                target,
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-out/bench_video.json")
    parser.add_argument(
        "--data",
        default=os.path.join(tempfile.gettempdir(), "fastdata-bench-video"),
        help="folder for the generated videos (reused by later runs)",
    )
    parser.add_argument("--videos", type=int, default=16)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--fps", type=int, default=30)
    parser.add_argument("--codec", default="mp4v", help="fourcc for OpenCV's writer: mp4v, MJPG, XVID")
    parser.add_argument("--clip-len", type=int, default=8)
    parser.add_argument("--stride", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--loaders", nargs="+", default=DEFAULT_LOADERS, choices=LOADERS)
    parser.add_argument("--access", nargs="+", default=["random", "sequential"], choices=["random", "sequential"])
    parser.add_argument("--clips", type=int, default=64, help="clips per measurement, after the warm-up")
    parser.add_argument("--warmup", type=int, default=2, help="batches read before measuring (at least one per worker)")
    parser.add_argument("--max-seconds", type=float, default=1.0, help="cap on one measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stagger-repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # collate's torch.stack stalls with 2 threads on a busy 2-core machine

    loaders = list(args.loaders)
    try:
        import torchcodec.decoders  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure to load means: not measured
        loaders = [n for n in loaders if n != "fastdata-torchcodec"]
    paths = make_videos(
        Path(args.data),
        count=args.videos,
        frames=args.frames,
        size=args.size,
        fps=args.fps,
        codec=args.codec,
        seed=args.seed,
    )
    span = (args.clip_len - 1) * args.stride + 1
    clips = [
        (v, list(range(s, s + span, args.stride)))
        for v in range(len(paths))
        for s in range(0, args.frames - span + 1, span)
    ]
    orders = {
        "random": np.random.default_rng(args.seed).permutation(len(clips)).tolist(),
        "sequential": list(range(len(clips))),
    }
    started = time.perf_counter()
    load_start = os.getloadavg()
    # first, while this process holds no reader of any loader: what each fastdata worker holds open
    open_files = {str(w): max_open_per_worker(paths, clips, orders["random"], w, args) for w in args.workers}
    if "fastdata" in loaders:
        loaders.insert(1, "fastdata-nostagger")
    datasets = {name: build(name, paths, clips, args) for name in loaders}  # probe (index) once, up front

    runs: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for rep in range(args.repeats):
        for access in args.access:
            for workers in args.workers:
                for name in loaders:
                    if name == "fastdata-nostagger" or (access == "sequential" and name not in SEQUENTIAL):
                        continue
                    r = measure(datasets[name], orders[access], workers, args, name.startswith("fastdata"))
                    runs.setdefault((name, access, workers), []).append(r)
                    print(
                        f"rep {rep} {access:10s} workers={workers} {name:20s} {r['clips_per_s']:7.1f} clips/s "
                        f"{r['cpu_ms_per_clip']:6.2f} ms CPU/clip  first batch {r['first_batch_s']:.3f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    if "fastdata" in loaders:
        for workers in [w for w in args.workers if w > 0]:
            for rep in range(args.stagger_repeats):
                for name in ("fastdata", "fastdata-nostagger"):
                    r = measure(datasets[name], orders["random"], workers, args, True)
                    runs.setdefault((f"stagger:{name}", "random", workers), []).append(r)
                    print(
                        f"stagger rep {rep} workers={workers} {name:20s} {r['clips_per_s']:7.1f} clips/s  "
                        f"first batch {r['first_batch_s']:.3f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    for ds in datasets.values():
        if hasattr(ds, "close"):
            ds.close()

    results = []
    for (name, access, workers), rs in runs.items():
        medians = {k: statistics.median(r[k] for r in rs) for k in ("clips_per_s", "cpu_ms_per_clip", "first_batch_s")}
        results.append({"loader": name, "access": access, "workers": workers, **medians, "repeats": len(rs)})

    def get(name: str, access: str, workers: int, key: str = "clips_per_s") -> float | None:
        for r in results:
            if (r["loader"], r["access"], r["workers"]) == (name, access, workers):
                return float(r[key])
        return None

    summary: dict[str, Any] = {}
    for access in args.access:
        for workers in args.workers:
            base = get("naive-opencv", access, workers)
            if not base:
                continue
            entry: dict[str, Any] = {}
            for name in loaders:
                value = get(name, access, workers)
                if value is not None and name != "naive-opencv":
                    entry[f"{name}/naive-opencv"] = round(value / base, 2)
            cpu_base = get("naive-opencv", access, workers, "cpu_ms_per_clip")
            for name in ("fastdata", "fastdata-decord"):
                cpu = get(name, access, workers, "cpu_ms_per_clip")
                if cpu and cpu_base:
                    entry[f"cpu: naive-opencv/{name}"] = round(cpu_base / cpu, 2)
            summary[f"{access} workers={workers}"] = entry
    for workers in args.workers:
        pair = ("stagger:fastdata", "stagger:fastdata-nostagger")
        with_, without = (get(n, "random", workers) for n in pair)
        if with_ and without:
            first = [get(n, "random", workers, "first_batch_s") for n in pair]
            summary[f"stagger workers={workers}"] = {
                "steady_state_cost_pct": round(100 * (1 - with_ / without), 1),
                "first_batch_s_with": round(first[0] or 0, 3),
                "first_batch_s_without": round(first[1] or 0, 3),
            }
    summary["max_open_video_files_per_worker"] = open_files
    summary["max_open"] = 8

    report = {
        "benchmark": "video clips through a DataLoader",
        "config": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "default_decoder": datasets["fastdata"].decoder if "fastdata" in datasets else None,  # type: ignore[attr-defined]
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "load_avg_at_end": os.getloadavg(),
        },
        "versions": versions(),
        "seconds": round(time.perf_counter() - started, 1),
        "results": results,
        "summary": summary,
    }
    readme.stamp(report, readme_rows(summary, args, report["default_decoder"]), load_start)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
