"""Where a random decord clip's time goes, and so how much faster any decord path could be.

One process, no DataLoader, the videos of ``bench_video.py`` (made by it, reused): the same random clips
(``clip_len`` frames at ``stride``) read by plain decord in three ways, interleaved ``--repeats`` times:

* ``open``            ``decord.VideoReader(path)`` alone (what a fresh reader per clip pays beyond decoding)
* ``fresh``           a new reader per clip + ``get_batch`` (the best plain use of decord measured)
* ``kept``            one reader per video kept open, ``get_batch`` (what a reader cache would do)
* ``kept_parked``     the same, parked with ``seek(0)`` after each clip (fastdata's decord reader)
* ``pyav_fastdata``   ``VideoClipDataset(decoder="pyav")[i]`` over the same clips, for scale

The bound printed: even with a free open, a fresh-reader path is at most ``fresh / (fresh - open)`` times
faster; keeping readers open is slower in decord itself (its helper thread decodes ahead after every
``get_batch``), so there is no cheaper decord call to build on. Figures: ms of wall time and ms of CPU (all
threads: decord's helper thread included) per clip, medians; with every core busy (a DataLoader with a
worker per core), the CPU figure is what sets the rate.

    PYTHONPATH=. python benchmarks/bench_decord_parts.py        # writes bench-out/bench_decord_parts.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench_video import make_videos

import fastdata as fd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="bench-out/video-data", help="folder of the generated videos (reused)")
    p.add_argument("--videos", type=int, default=16)
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--clips", type=int, default=200)
    p.add_argument("--clip-len", type=int, default=8)
    p.add_argument("--stride", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="bench-out/bench_decord_parts.json")
    args = p.parse_args(argv)
    import decord

    paths = make_videos(
        Path(args.data), count=args.videos, frames=args.frames, size=args.size, fps=30, codec="mp4v", seed=0
    )
    # random clips of VideoClipDataset (every start), read by each way: the same frames of the same videos
    ds = fd.VideoClipDataset(paths, clip_len=args.clip_len, frame_stride=args.stride, clips_per_video="all")
    rng = random.Random(0)
    indices = [rng.randrange(len(ds)) for _ in range(args.clips)]
    clips = [ds.frames_of(i) for i in indices]
    frames = [f for _, f in clips]
    readers = {k: decord.VideoReader(paths[k], num_threads=1) for k in range(len(paths))}

    def open_only() -> None:
        for k, _ in clips:
            decord.VideoReader(paths[k], num_threads=1)

    def fresh() -> None:
        for (k, _), f in zip(clips, frames):
            decord.VideoReader(paths[k], num_threads=1).get_batch(f).asnumpy()

    def kept() -> None:
        for (k, _), f in zip(clips, frames):
            readers[k].get_batch(f).asnumpy()

    def kept_parked() -> None:
        for (k, _), f in zip(clips, frames):
            readers[k].get_batch(f).asnumpy()
            readers[k].seek(0)

    dd = fd.VideoClipDataset(
        paths, clip_len=args.clip_len, frame_stride=args.stride, clips_per_video="all", decoder="decord"
    )

    def decord_fastdata() -> None:
        for i in indices:
            dd[i]

    def pyav_fastdata() -> None:
        for i in indices:
            ds[i]

    runs: dict[str, Callable[[], None]] = {
        "open": open_only,
        "fresh": fresh,
        "kept": kept,
        "kept_parked": kept_parked,
        "decord_fastdata": decord_fastdata,
        "pyav_fastdata": pyav_fastdata,
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            run()
            # CPU of every thread of the process: decord's helper thread decodes beside the caller, on
            # another core here, and on a loaded machine (every worker busy) that core is not free
            time.sleep(0.2)  # what the helper threads still do after the last call counts too
            cpu[name].append((time.process_time() - c0) / len(clips) * 1e3)
            times[name].append((time.perf_counter() - t0 - 0.2) / len(clips) * 1e3)
    ms = {name: round(statistics.median(v), 3) for name, v in times.items()}
    cpu_ms = {name: round(statistics.median(v), 3) for name, v in cpu.items()}
    result = {
        "benchmark": "bench_decord_parts",
        "args": vars(args),
        "ms_per_clip": ms,
        "cpu_ms_per_clip": cpu_ms,
        "kept_parked_vs_fresh_cpu": round(cpu_ms["kept_parked"] / cpu_ms["fresh"], 2),
        "best_possible_cpu_speedup_over_fresh_with_a_free_open": round(
            cpu_ms["fresh"] / (cpu_ms["fresh"] - cpu_ms["open"]), 2
        ),
        "open_share_of_fresh": round(ms["open"] / ms["fresh"], 3),
        "best_possible_speedup_over_fresh_with_a_free_open": round(ms["fresh"] / (ms["fresh"] - ms["open"]), 2),
        "kept_vs_fresh_time": round(ms["kept"] / ms["fresh"], 2),
        "kept_parked_vs_fresh_time": round(ms["kept_parked"] / ms["fresh"], 2),
        "pyav_fastdata_speedup_over_fresh": round(ms["fresh"] / ms["pyav_fastdata"], 2),
    }
    print(json.dumps(result, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
