"""The same video clips from local files and from S3 (through the node-local cache), in one run.

Videos (H.264 through PyAV, in class folders) are written once, and uploaded to a moto S3 server on
loopback (started here, in its own process). Every source reads the same clips in the same seeded order
through a DataLoader with ``--workers`` workers:

* ``local``     ``VideoClipDataset("videos/")``
* ``s3-cold``   ``VideoClipDataset("s3://bench/videos/", cache_dir=<empty folder>)``, its probe results
                known (``index_cache``): each worker downloads a video when it first reads one
* ``s3-warm``   the same dataset again, every video in the cache (the steady state of later epochs)
* ``shards``    ``VideoClipDataset("shards/shard-{...}.tar")`` over the shards ``fastdata convert`` made of
                the folder (each video read in place, a byte range of its shard)

Each source is timed over whole epochs (from ``iter(loader)`` to the last batch), ``--repeats`` times,
interleaved; the medians and their ratios against ``local`` are printed, and written as JSON. (Reading
from S3 here is from a server on the same machine: the ratio is the cost of the cache's path, not of a
network.) Also timed: building each dataset (``s3-probe``: a first build, which downloads every video into
the cache to probe it).

    PYTHONPATH=. python benchmarks/bench_video_sources.py            # writes bench-out/bench_video_sources.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.bench._local_s3 import CREDENTIALS, REGION, MotoServer


def write_videos(folder: Path, *, classes: int, per_class: int, frames: int, size: int, seed: int) -> list[Path]:
    """``classes * per_class`` H.264 videos (a keyframe a second at 25 fps), ``folder/cNN/vNN.mp4``."""
    import av

    rng = np.random.default_rng(seed)
    out = []
    for c in range(classes):
        (folder / f"c{c:02d}").mkdir(parents=True, exist_ok=True)
        for v in range(per_class):
            path = folder / f"c{c:02d}" / f"v{v:02d}.mp4"
            texture = rng.integers(0, 256, (size // 8, size // 4, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
            with av.open(str(path), "w") as container:
                stream = container.add_stream("libx264", rate=25)
                stream.width = stream.height = size
                stream.pix_fmt = "yuv420p"
                stream.codec_context.options = {"g": "25", "bf": "2", "preset": "ultrafast", "crf": "23"}
                for i in range(frames):
                    frame = np.ascontiguousarray(np.roll(texture, 2 * i, axis=1)[:, :size])
                    for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                        container.mux(packet)
                for packet in stream.encode():
                    container.mux(packet)
            out.append(path)
    return out


def epoch(ds: Any, args: argparse.Namespace) -> float:
    """Seconds to read every clip of ``ds`` once, in a seeded random order."""
    order = np.random.default_rng(args.seed).permutation(len(ds)).tolist()
    loader = DataLoader(
        ds,
        batch_size=args.batch_size,
        sampler=order,
        num_workers=args.workers,
        worker_init_fn=fd.worker_init_fn if args.workers else None,
        multiprocessing_context="fork" if args.workers else None,
    )
    t0 = time.perf_counter()
    n = sum(len(batch["clip"]) for batch in loader)
    assert n == len(ds), (n, len(ds))
    return time.perf_counter() - t0


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("torch", "numpy", "av", "moto", "boto3"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-out/bench_video_sources.json")
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--per-class", type=int, default=6)
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--size", type=int, default=128, help="frame height and width, pixels")
    parser.add_argument("--clip-len", type=int, default=8)
    parser.add_argument("--clips-per-video", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-video-sources-"))
    try:
        videos = write_videos(
            work / "videos", classes=args.classes, per_class=args.per_class, frames=args.frames, size=args.size, seed=0
        )
        megabytes = sum(p.stat().st_size for p in videos) / 1e6
        common = {"clip_len": args.clip_len, "clips_per_video": args.clips_per_video, "seed": args.seed}
        common["clip_sampling"] = "uniform"  # the same clips in every pass and source
        with MotoServer() as server:
            client = server.client()
            client.create_bucket(Bucket="bench")
            for p in videos:
                client.upload_file(str(p), "bench", f"videos/{p.relative_to(work / 'videos')}")
            options = {"endpoint_url": server.endpoint_url, "region_name": REGION, **CREDENTIALS}
            url = "s3://bench/videos/"
            index = work / "s3-index.json"

            t0 = time.perf_counter()
            local = fd.VideoClipDataset(str(work / "videos"), index_cache=work / "local-index.json", **common)
            build = {"local": time.perf_counter() - t0}
            t0 = time.perf_counter()
            fd.VideoClipDataset(
                url, storage_options=options, cache_dir=work / "probe-cache", index_cache=index, **common
            )
            build["s3-probe"] = time.perf_counter() - t0

            from fastdata.convert import convert

            made = convert(str(work / "videos"), str(work / "shards"), shard_count=4, progress=False, fsync=False)
            t0 = time.perf_counter()
            shards = fd.VideoClipDataset(
                str(work / "shards" / made["pattern"]), index_cache=work / "shard-index.json", **common
            )
            build["shards"] = time.perf_counter() - t0
            assert len(shards) == len(local)

            times: dict[str, list[float]] = {"local": [], "s3-cold": [], "s3-warm": [], "shards": []}
            for r in range(args.repeats):
                times["local"].append(epoch(local, args))
                cache = work / f"cache-{r}"  # empty: the workers download what they read
                t0 = time.perf_counter()
                cold = fd.VideoClipDataset(url, storage_options=options, cache_dir=cache, index_cache=index, **common)
                build["s3-known"] = time.perf_counter() - t0
                assert cold.index.probed == 0 and len(cold) == len(local)
                times["s3-cold"].append(epoch(cold, args))
                misses = cold.counters()["cache_misses"]
                times["s3-warm"].append(epoch(cold, args))
                assert cold.counters()["cache_misses"] == misses  # the warm epoch downloaded nothing
                times["shards"].append(epoch(shards, args))
                shutil.rmtree(cache)
        clips = len(local)
        medians = {k: statistics.median(v) for k, v in times.items()}
        summary = {
            name: {
                "clips_per_s": round(clips / t, 1),
                "vs_local": round(medians["local"] / t, 3),
                "epoch_s": [round(x, 3) for x in times[name]],
            }
            for name, t in medians.items()
        }
        report = {
            "args": vars(args),
            "videos": len(videos),
            "video_megabytes": round(megabytes, 2),
            "clips": clips,
            "build_s": {k: round(v, 3) for k, v in build.items()},
            "sources": summary,
            "versions": versions(),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(json.dumps({"clips": clips, "build_s": report["build_s"], "sources": summary}, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
