"""Decode less: JPEGs decoded at reduced DCT scale before the resize, against full decode + resize.

For 512x512 JPEGs (quality 90) resized to 224x224 through :class:`fastdata.formats._decode.Decoder`
(``mode="numpy"``), per backend and filter: images/s of ``reduce=False`` (full decode, then resize) and of
``reduce=True`` (1/2-scale decode, then resize), measured in one process and one thread (decoding is
per-core work), interleaved over ``--repeats`` and reported as medians and their ratio; and the pixel
difference between the two outputs (mean and max absolute difference of uint8 values, over all images).

Images: crops of the photograph that matplotlib ships (``grace_hopper.jpg``) at several scales, resized
to 512x512, plus synthetic pictures (smooth shapes, gradients, texture and noise). ``--images DIR`` uses
your own JPEGs instead (resized to 512x512 first).

Usage::

    PYTHONPATH=. python benchmarks/bench_decode.py --out bench_decode.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fastdata.formats._decode import Decoder

CONFIGS = [("pil", "bilinear"), ("pil", "bicubic"), ("cv2", "area"), ("cv2", "bilinear")]


def photo_crops(n: int, side: int, rng: np.random.Generator) -> list[Image.Image]:
    try:
        import matplotlib

        path = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
        photo = Image.open(path).convert("RGB")
    except (ImportError, OSError):
        return []
    out = []
    w, h = photo.size
    for _ in range(n):
        c = int(rng.integers(min(w, h) // 3, min(w, h) + 1))
        x, y = int(rng.integers(0, w - c + 1)), int(rng.integers(0, h - c + 1))
        out.append(photo.crop((x, y, x + c, y + c)).resize((side, side), Image.Resampling.LANCZOS))
    return out


def synthetic(n: int, side: int, rng: np.random.Generator) -> list[Image.Image]:
    out = []
    y, x = np.mgrid[0:side, 0:side].astype(np.float32)
    for _ in range(n):
        f = rng.uniform(5, 40, 3)
        img = np.stack([128 + 100 * np.sin(x / f[0] + y / f[1]), 128 + 90 * np.cos(y / f[2]), (x + y) / 4], -1)
        for _ in range(4):  # hard-edged shapes: where DCT scaling differs most
            cx, cy = rng.uniform(0, side, 2).tolist()
            r = float(rng.uniform(10, side / 4))
            img[(x - cx) ** 2 + (y - cy) ** 2 < r**2] = rng.uniform(0, 255, 3)
        img += rng.normal(0, 6, img.shape)
        out.append(Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)))
    return out


def jpegs(images: list[Image.Image], quality: int) -> list[bytes]:
    out = []
    for img in images:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def rate(decoder: Decoder, data: list[bytes], seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while True:
        for d in data:
            decoder.image(d)
        n += len(data)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed


def cpu_rate(decoder: Decoder, data: list[bytes], seconds: float) -> tuple[float, float]:
    """(images per wall second, images per CPU second of this process)."""
    c0, w0 = time.process_time(), time.perf_counter()
    wall = rate(decoder, data, seconds)
    cpu = time.process_time() - c0
    return wall, wall * (time.perf_counter() - w0) / max(cpu, 1e-9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=int, default=32)
    ap.add_argument("--synthetic", type=int, default=32)
    ap.add_argument("--side", type=int, default=512)
    ap.add_argument("--target", type=int, default=224)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0, help="per timed repeat")
    ap.add_argument("--images", default=None, help="a folder of your own JPEGs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench_decode.json")
    args = ap.parse_args(argv)
    import cv2

    cv2.setNumThreads(1)
    rng = np.random.default_rng(args.seed)
    sets: dict[str, list[bytes]] = {}
    if args.images:
        files = sorted(p for p in Path(args.images).iterdir() if p.suffix.lower() in (".jpg", ".jpeg"))
        imgs = [Image.open(p).convert("RGB").resize((args.side, args.side)) for p in files]
        sets["own"] = jpegs(imgs, args.quality)
    else:
        photos = photo_crops(args.photos, args.side, rng)
        if photos:
            sets["photo_crops"] = jpegs(photos, args.quality)
        sets["synthetic"] = jpegs(synthetic(args.synthetic, args.side, rng), args.quality)
    size = (args.target, args.target)
    result: dict[str, Any] = {
        "args": vars(args),
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "pillow": Image.__version__,
            "opencv": cv2.__version__,
        },
        "machine": {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()},
        "results": {},
    }
    for backend, method in CONFIGS:
        full = Decoder("numpy", backend, size=size, resize=method, reduce=False)  # type: ignore[arg-type]
        less = Decoder("numpy", backend, size=size, resize=method, reduce=True)  # type: ignore[arg-type]
        for name, data in sets.items():
            diffs = [np.abs(full.image(d).astype(np.int16) - less.image(d).astype(np.int16)) for d in data]
            runs: dict[str, list[tuple[float, float]]] = {"full": [], "reduced": []}
            for _ in range(args.repeats):
                runs["full"].append(cpu_rate(full, data, args.seconds))
                runs["reduced"].append(cpu_rate(less, data, args.seconds))
            med = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
            med_cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
            result["results"][f"{backend}_{method}_{name}"] = {
                "full_images_per_s": med["full"],
                "reduced_images_per_s": med["reduced"],
                "speedup": med["reduced"] / med["full"],
                "speedup_per_cpu_second": med_cpu["reduced"] / med_cpu["full"],
                "mean_abs_diff": float(np.mean([d.mean() for d in diffs])),
                "max_abs_diff": int(max(d.max() for d in diffs)),
                "p99_abs_diff": float(np.percentile(np.concatenate([d.ravel() for d in diffs]), 99)),
                "images": len(data),
                "mean_jpeg_bytes": int(np.mean([len(d) for d in data])),
            }
            print(backend, method, name, json.dumps(result["results"][f"{backend}_{method}_{name}"]), file=sys.stderr)
    result["machine"]["loadavg_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
