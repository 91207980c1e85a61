"""JPEG decoding: the libraries side by side (``--parts libraries``), and decoding less (``reduce``):
JPEGs decoded at reduced DCT scale before the resize, against full decode + resize.

``libraries``: photos (crops of the photograph matplotlib ships) of ``--sides`` pixels as baseline
colour, grayscale, progressive and CMYK JPEGs, decoded in full to RGB uint8 by fastdata's default
decoder, fastdata's PIL decoder (the default before), PIL, OpenCV, simplejpeg, PyTurboJPEG (needs the
system's libturbojpeg 3 for PyTurboJPEG 2, or PyTurboJPEG 1.x for libturbojpeg 2) and imagecodecs,
each with 1 and 2 threads (medians of interleaved repeats), and the largest pixel difference from PIL.

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


# -- JPEG libraries, side by side --------------------------------------------------------------------
KINDS = ("rgb", "gray", "progressive", "cmyk")


def kind_jpegs(images: list[Image.Image], kind: str, quality: int) -> list[bytes]:
    """``images`` as JPEGs of one kind: baseline 4:2:0 colour, grayscale, progressive colour, or CMYK."""
    out = []
    for img in images:
        buf = io.BytesIO()
        if kind == "gray":
            img.convert("L").save(buf, format="JPEG", quality=quality)
        elif kind == "progressive":
            img.save(buf, format="JPEG", quality=quality, progressive=True)
        elif kind == "cmyk":
            img.convert("CMYK").save(buf, format="JPEG", quality=quality)
        else:
            img.save(buf, format="JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def libraries() -> dict[str, Any]:
    """Each installed library's full decode of JPEG bytes to ``HxWx3`` RGB uint8 (None where it refuses)."""
    import cv2

    libs: dict[str, Any] = {
        "fastdata_default": Decoder("numpy").image,
        "fastdata_pil": Decoder("numpy", "pil").image,  # the default before this benchmark chose one
        "pil": lambda d: np.asarray(Image.open(io.BytesIO(d)).convert("RGB")),
        "opencv": lambda d: cv2.cvtColor(
            cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION),
            cv2.COLOR_BGR2RGB,
        ),
    }
    try:
        import simplejpeg

        libs["simplejpeg"] = lambda d: simplejpeg.decode_jpeg(d, colorspace="RGB")
    except ImportError:
        pass
    try:
        import turbojpeg

        tj = turbojpeg.TurboJPEG()
        libs["pyturbojpeg"] = lambda d: tj.decode(d, pixel_format=turbojpeg.TJPF_RGB)
    except (ImportError, RuntimeError, OSError):  # RuntimeError/OSError: no libturbojpeg on the system
        pass
    try:
        import imagecodecs

        def ic(d: bytes) -> np.ndarray:
            a = imagecodecs.jpeg8_decode(d)
            return np.repeat(a[:, :, None], 3, 2) if a.ndim == 2 else a

        libs["imagecodecs"] = ic
    except ImportError:
        pass
    return libs


def threaded_rate(fn: Any, data: list[bytes], seconds: float, threads: int) -> float:
    """Images/s decoding ``data`` over and over with ``threads`` threads (one thread: in this one)."""
    if threads == 1:
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for d in data:
                fn(d)
            n += len(data)
        return n / (time.perf_counter() - start)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in pool.map(fn, data * threads):
                pass
            n += len(data) * threads
        return n / (time.perf_counter() - start)


def compare_libraries(images: dict[int, list[Image.Image]], args: argparse.Namespace) -> dict[str, Any]:
    """Per side, kind and library: images/s with 1 and 2 threads (medians of interleaved repeats) and
    the largest pixel difference from PIL's ``convert("RGB")``."""
    libs = libraries()
    out: dict[str, Any] = {}
    for side, imgs in images.items():
        for kind in KINDS:
            data = kind_jpegs(imgs, kind, args.quality)
            ref = [np.asarray(Image.open(io.BytesIO(d)).convert("RGB")).astype(np.int16) for d in data]
            usable: dict[str, Any] = {}
            row: dict[str, Any] = {}
            for name, fn in libs.items():
                try:
                    got = [np.asarray(fn(d)) for d in data]
                    diff = max(
                        int(np.abs(g.astype(np.int16) - r).max()) if g.shape == r.shape else 999
                        for g, r in zip(got, ref)
                    )
                except Exception as e:  # noqa: BLE001 - a library that refuses this kind is reported so
                    row[name] = {"refused": f"{type(e).__name__}: {e}"}
                    continue
                usable[name] = fn
                row[name] = {"max_abs_diff_vs_pil": diff}
            for threads in (1, 2):
                runs: dict[str, list[float]] = {n: [] for n in usable}
                for _ in range(args.repeats):
                    for name, fn in usable.items():
                        runs[name].append(threaded_rate(fn, data, args.seconds, threads))
                for name, r in runs.items():
                    row[name][f"images_per_s_{threads}_threads"] = statistics.median(r)
            base = row["fastdata_pil"]["images_per_s_1_threads"]
            for name in usable:
                row[name]["vs_fastdata_pil_1_thread"] = row[name]["images_per_s_1_threads"] / base
            out[f"{side}px_{kind}"] = row
            brief = {n: round(v.get("vs_fastdata_pil_1_thread", 0), 2) for n, v in row.items()}
            print(side, kind, json.dumps(brief), file=sys.stderr, flush=True)
    return out


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
    ap.add_argument("--parts", default="libraries,reduce", help="comma list of: libraries, reduce")
    ap.add_argument("--sides", default="256,512", help="libraries: image sides in pixels")
    args = ap.parse_args(argv)
    import cv2

    cv2.setNumThreads(1)
    rng = np.random.default_rng(args.seed)
    parts = set(args.parts.split(","))
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
    for name in ("simplejpeg", "turbojpeg", "imagecodecs"):
        try:
            module = __import__(name)
            result["versions"][name] = str(getattr(module, "__version__", "?"))
        except ImportError:
            pass
    if "libraries" in parts:
        sides = [int(v) for v in args.sides.split(",")]
        per_side = {}
        for side in sides:
            imgs = photo_crops(args.photos, side, rng) or synthetic(args.synthetic, side, rng)
            per_side[side] = imgs
        result["libraries"] = compare_libraries(per_side, args)
    for backend, method in CONFIGS if "reduce" in parts else []:
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
