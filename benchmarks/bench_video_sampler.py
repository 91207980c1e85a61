"""Staggered, decoder-friendly clip access (``VideoClipDataset.clip_sampler``) against random clips, in one run.

16 generated videos (224x224, 240 frames, mp4v, a keyframe every 12 frames), 8 random 8-frame clips of
stride 2 per video (``clips_per_video=8``: 128 clips, 1.2 MB each), batches of 8, ``--workers`` worker
processes (fork, persistent), the consumer touching every page:

* ``decord_fresh``: a new ``decord.VideoReader`` per clip (the peer: no reader kept), random order;
* ``decord_random`` / ``decord_staggered``: ``VideoClipDataset(decoder="decord")`` with ``ds.sampler()``
  (random clips) or ``ds.clip_sampler(8, num_workers=W)`` (each worker its videos forward);
* ``decord_staggered_one_read_per_video``: a what-if, defined here: the dataset reading a batch's clips of
  one video in one decoder call (see :class:`OneReadPerVideo`);
* ``pyav_random_stock``: today's fastdata: PyAV, random clips, the stock transport;
* ``pyav_random`` / ``pyav_staggered``: PyAV with the Loader's default (slot) transport, random or staggered;
* ``pyav_staggered_threads``: the staggered sampler read by ``W`` loader threads instead of processes.

Each contender runs in its own forked process, the contenders taking turns for ``--repeats`` rounds
(medians kept); rates are clips per second over a window of ``--seconds`` after the first batch, and CPU
milliseconds per clip (all processes). ``videos_per_batch`` is what the staggered sampler's batches draw
from (mean and least, over all but the last ``W`` batches of an epoch), against the batch size. The
JSON also holds ``decord_cpu_ms_per_clip_one_process``: decord alone on the same clips (a fresh reader per
clip, a kept reader with a call per clip, one call per video). The targets: ``decord_staggered >= 2 x
decord_fresh``, ``pyav_staggered >= 1.5 x pyav_random_stock``, videos per
batch >= half the batch.

    PYTHONPATH=. python benchmarks/bench_video_sampler.py --out bench-out/video_sampler.json
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
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_s3 import isolated  # noqa: E402
from bench_video import DecordFresh, cpu_seconds, make_videos  # noqa: E402

import fastdata as fd  # noqa: E402

PAGE = 4096


def touch(batch: dict[str, Any]) -> int:
    clip = batch["clip"]
    int(clip.reshape(-1)[::PAGE].sum())
    return int(clip.shape[0])


def window(batches: Callable[[], Iterator[Any]], seconds: float) -> dict[str, float]:
    """Clips/s and CPU ms per clip over ``seconds`` of passes, the first batch excluded."""
    it = batches()
    touch(next(it))
    n, c0, t0 = 0, cpu_seconds(), time.perf_counter()
    while True:
        for batch in it:
            n += touch(batch)
            if time.perf_counter() - t0 >= seconds and n >= 32:
                wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
                return {"clips_per_s": n / wall, "cpu_ms_per_clip": 1e3 * cpu / n}
        it = batches()


class OneReadPerVideo(fd.VideoClipDataset):
    """What-if (not the library's code): a batch's clips of one video read in one decoder call (the
    union of their frames), then split. decord pays ~1 ms per ``get_batch`` call beyond the decoding
    itself; this shows what the staggered sampler gives decord once ``_read`` groups its calls."""

    def _read(self, indices: Any) -> list[Any]:
        self._begin()
        plan = [self.frames_of(i) for i in indices]
        by_video: dict[int, list[int]] = {}
        for k in sorted(range(len(plan)), key=lambda k: (plan[k][0], plan[k][1][0])):
            by_video.setdefault(plan[k][0], []).append(k)
        out: list[Any] = [None] * len(plan)
        for video, ks in by_video.items():
            frames = [f for k in ks for f in plan[k][1]]
            clips = self.pool.read(self.paths[video], frames).reshape(
                len(ks), len(plan[ks[0]][1]), *self.pool.size or (224, 224), 3
            )
            for k, clip in zip(ks, clips):
                out[k] = {"clip": torch.from_numpy(clip), "video": video, "frames": torch.tensor(plan[k][1])}
        return out


def dataset(paths: list[str], decoder: str) -> fd.VideoClipDataset:
    cls = OneReadPerVideo if decoder == "decord-grouped" else fd.VideoClipDataset
    return cls(
        paths,
        clip_len=8,
        frame_stride=2,
        clips_per_video=8,
        decoder=decoder.split("-")[0],  # type: ignore[arg-type]
        index_cache=False,
        seed=1,
    )


def fastdata_run(
    paths: list[str], decoder: str, sampler: str, n: int, seconds: float, **kw: Any
) -> Callable[[], dict[str, float]]:
    def run() -> dict[str, float]:
        torch.set_num_threads(1)
        ds = dataset(paths, decoder)
        if sampler == "staggered":
            kw["batch_sampler"] = ds.clip_sampler(8, num_workers=n)
        else:
            kw["batch_size"] = 8
        if kw.get("workers") != "threads":
            kw.update(persistent_workers=True, multiprocessing_context="fork")
        with fd.Loader(ds, num_workers=n, **kw) as loader:
            epochs = iter(range(1 << 30))

            def passes() -> Iterator[Any]:
                loader.set_epoch(next(epochs))
                return iter(loader)

            return window(passes, seconds)

    return run


def fresh_run(paths: list[str], workers: int, seconds: float) -> Callable[[], dict[str, float]]:
    def run() -> dict[str, float]:
        torch.set_num_threads(1)
        ds = dataset(paths, "pyav")
        clips = [ds.frames_of(i) for i in range(len(ds))]  # the same clips (epoch 0)
        peer = DecordFresh(paths, clips)
        loader = DataLoader(
            peer,
            batch_size=8,
            sampler=RandomSampler(peer, generator=torch.Generator().manual_seed(0)),
            num_workers=workers,
            persistent_workers=True,
            multiprocessing_context="fork",
        )
        return window(lambda: iter(loader), seconds)

    return run


def videos_per_batch(paths: list[str], workers: int) -> dict[str, float]:
    ds = dataset(paths, "pyav")
    sampler = ds.clip_sampler(8, num_workers=workers)
    counts = [len({ds.locate(i)[0] for i in b}) for b in list(sampler)[:-workers]]
    return {"mean": statistics.mean(counts), "least": min(counts), "batch_size": 8}


def decord_calls(paths: list[str]) -> dict[str, float]:
    """decord alone, in this process, on the same clips (8 random ones per video, sorted): CPU ms per clip
    with a fresh reader per clip, one reader per video with one ``get_batch`` per clip, and one reader
    per video with one ``get_batch`` for all its clips: what a call costs beyond the decoding."""
    import decord

    ds = dataset(paths, "pyav")
    clips: dict[int, list[list[int]]] = {}
    for i in range(len(ds)):
        video, frames = ds.frames_of(i)
        clips.setdefault(video, []).append(frames)
    for frames in clips.values():
        frames.sort()

    def fresh() -> None:
        for v, cs in clips.items():
            for f in cs:
                decord.VideoReader(paths[v], num_threads=1).get_batch(f).asnumpy()

    def per_clip() -> None:
        for v, cs in clips.items():
            reader = decord.VideoReader(paths[v], num_threads=1)
            for f in cs:
                reader.get_batch(f).asnumpy()

    def one_call() -> None:
        for v, cs in clips.items():
            decord.VideoReader(paths[v], num_threads=1).get_batch(sorted({i for f in cs for i in f})).asnumpy()

    out = {}
    for name, fn in (
        ("fresh_reader_per_clip", fresh),
        ("kept_reader_call_per_clip", per_clip),
        ("kept_reader_one_call", one_call),
    ):
        times = []
        for _ in range(3):
            c = time.process_time()
            fn()
            times.append(1e3 * (time.process_time() - c) / len(ds))
        out[name] = statistics.median(times)
    return out


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("torch", "numpy", "av", "decord", "fastdata"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--data", default=None, help="folder for the videos (default: a temporary one)")
    ap.add_argument("--out", default="bench-out/video_sampler.json")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {
        "args": vars(args),
        "versions": versions(),
        "machine": {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()},
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.data or tmp)
        paths = make_videos(folder, count=16, frames=240, size=224, fps=30, codec="mp4v", seed=0)
        w, s = args.workers, args.seconds
        runs: dict[str, Callable[[], dict[str, float]]] = {
            "decord_fresh": fresh_run(paths, w, s),
            "decord_random": fastdata_run(paths, "decord", "random", w, s),
            "decord_staggered": fastdata_run(paths, "decord", "staggered", w, s),
            "decord_staggered_one_read_per_video": fastdata_run(paths, "decord-grouped", "staggered", w, s),
            "pyav_random_stock": fastdata_run(paths, "pyav", "random", w, s, transport="stock"),
            "pyav_random": fastdata_run(paths, "pyav", "random", w, s),
            "pyav_staggered": fastdata_run(paths, "pyav", "staggered", w, s),
            "pyav_staggered_threads": fastdata_run(paths, "pyav", "staggered", w, s, workers="threads"),
        }
        got: dict[str, list[dict[str, float]]] = {k: [] for k in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                got[name].append(isolated(run))
                print(f"  {name}: {got[name][-1]['clips_per_s']:.1f} clips/s", file=sys.stderr, flush=True)
        med = {
            k: {m: statistics.median(r[m] for r in v) for m in v[0]} | {"runs": [round(r["clips_per_s"], 1) for r in v]}
            for k, v in got.items()
        }
        result["measured"] = med
        result["videos_per_batch"] = videos_per_batch(paths, w)
        result["decord_cpu_ms_per_clip_one_process"] = decord_calls(paths)
    rate = {k: v["clips_per_s"] for k, v in med.items()}
    result["ratios"] = {
        "decord_staggered_vs_decord_fresh": rate["decord_staggered"] / rate["decord_fresh"],
        "decord_staggered_vs_decord_random": rate["decord_staggered"] / rate["decord_random"],
        "decord_one_read_per_video_vs_decord_fresh": rate["decord_staggered_one_read_per_video"] / rate["decord_fresh"],
        "pyav_staggered_vs_pyav_random_stock": rate["pyav_staggered"] / rate["pyav_random_stock"],
        "pyav_staggered_vs_pyav_random": rate["pyav_staggered"] / rate["pyav_random"],
        "pyav_staggered_threads_vs_pyav_random_stock": rate["pyav_staggered_threads"] / rate["pyav_random_stock"],
    }
    vpb = result["videos_per_batch"]
    result["targets"] = {
        "decord_staggered_ge_2x_fresh": result["ratios"]["decord_staggered_vs_decord_fresh"] >= 2,
        "pyav_staggered_ge_1.5x_today": result["ratios"]["pyav_staggered_vs_pyav_random_stock"] >= 1.5,
        "videos_per_batch_ge_half": vpb["least"] >= vpb["batch_size"] / 2,
    }
    result["machine"]["loadavg_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "args"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
