#!/usr/bin/env python3
"""Feeding a GPU: pinned slots' host-to-device copies against the stock ``pin_memory=True``, and the data
stall of a real training step (ResNet-50 forward and backward, batch 256) fed by ``fd.Loader``.

    python benchmarks/bench_gpu.py --out bench_gpu.json            # one command, < 5 minutes on a GPU machine
    python benchmarks/bench_gpu.py --quick                         # a small look (this 2-core CPU machine)

Parts (``--parts``):

* ``h2d``: uint8 224x224x3 images from an HDF5 file, batches of ``--batch``, through
  ``fd.Loader(pin_memory=True)`` with the stock transport (a fresh shared batch, pinned by the
  DataLoader's pin-memory thread per batch) and with slots (each slot page-locked once), each batch copied
  with ``.to(device, non_blocking=True)``: GB/s of the copies, checked equal to the host batch; and the
  bare ceiling, one pinned tensor copied over and over, and one pageable. Without CUDA the part runs the
  same loaders with ``pin_memory=False`` and says so (``"cuda": false``): CPU figures only.
* ``stall``: a training loop (SGD, bf16 autocast on CUDA, channels-last) over JPEG tar shards decoded by
  ``fd.Decoder("torch", size=(224, 224))`` in ``--workers`` worker processes, normalised on the device:
  per step the time spent waiting for the next batch (the data stall) and the whole step, against the
  same model on one batch kept on the device (the compute ceiling). ``--model resnet50`` (torchvision's
  where it loads, else the same architecture written here), ``small`` (a 4-layer CNN, for machines
  without a GPU), ``auto``: ResNet-50 on CUDA, ``small`` on CPU.

JSON out with versions, the device, the settings, per-part figures and ratios (``slots_vs_stock_gb_per_s``,
``stall_fraction``, ``steps_per_s_vs_compute_ceiling``). Fixed seed; the data is generated in a temporary
folder (``--tmp`` to keep it).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastdata as fd  # noqa: E402


# -- data ----------------------------------------------------------------------------------------------
def make_hdf5(path: Path, n: int, side: int, seed: int) -> None:
    import h5py

    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        f.create_dataset("label", data=rng.integers(0, 1000, n))
        image = f.create_dataset("image", (n, side, side, 3), dtype=np.uint8, chunks=(16, side, side, 3))
        for lo in range(0, n, 128):
            m = min(128, n - lo)
            image[lo : lo + m] = rng.integers(0, 256, (m, side, side, 3), dtype=np.uint8)


def make_jpeg_shards(folder: Path, n: int, side: int, shards: int, seed: int) -> list[str]:
    """``n`` photo-like ``side`` px JPEGs (smooth gradients and noise, ~20-40 KB) in ``shards`` tar shards."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side].astype(np.float32)
    pool = []
    for _ in range(min(n, 128)):  # a pool of distinct images, cycled: decoding cost is what matters
        f = rng.uniform(6, 40, 3)
        img = np.stack([128 + 100 * np.sin(x / f[0]), 128 + 90 * np.cos(y / f[1]), (x + y) / 3 % 256], -1)
        img += rng.normal(0, 8, img.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        pool.append(buf.getvalue())
    urls = []
    per = -(-n // shards)
    for s in range(shards):
        path = folder / f"train-{s:04d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(s * per, min(n, (s + 1) * per)):
                for ext, data in (("jpg", pool[i % len(pool)]), ("cls", str(i % 1000).encode())):
                    info = tarfile.TarInfo(f"{i:08d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        urls.append(str(path))
    return urls


# -- models --------------------------------------------------------------------------------------------
class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet50(classes: int = 1000) -> nn.Module:
    """ResNet-50 (He et al. 2015; torchvision's layout: stride on the 3x3 convolution), written out because
    torchvision's wheel does not load beside every torch build."""
    try:
        import torchvision

        return torchvision.models.resnet50(num_classes=classes)
    except Exception:  # noqa: BLE001 - ImportError, or torchvision's operators failing to register
        pass
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def small_cnn(classes: int = 1000) -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(3, 16), *block(16, 32), *block(32, 64), *block(64, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, classes),
    )  # fmt: skip


# -- parts ---------------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def h2d_part(path: Path, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    cuda = device.type == "cuda"
    ds = fd.HDF5Dataset(str(path), fields=("image", "label"))
    out: dict[str, Any] = {"cuda": cuda, "batch_bytes": args.batch * args.side * args.side * 3}
    if not cuda:
        out["note"] = "no CUDA here: the loaders run with pin_memory=False and nothing is copied to a device"
    if cuda:  # the bare ceiling: one batch-sized tensor, pinned and not, copied over and over
        host = torch.empty(out["batch_bytes"], dtype=torch.uint8)
        pinned = host.pin_memory()
        for name, src in (("ceiling_pinned", pinned), ("ceiling_pageable", host)):
            src.to(device, non_blocking=True)
            sync(device)
            start = time.perf_counter()
            for _ in range(20):
                src.to(device, non_blocking=True)
            sync(device)
            out[f"{name}_gb_per_s"] = 20 * src.numel() / (time.perf_counter() - start) / 1e9
    for transport in ("stock", "slots"):
        runs = []
        checks_ok = True
        with fd.Loader(
            ds, batch_size=args.batch, num_workers=args.workers, transport=transport, pin_memory=cuda,
            persistent_workers=True,
        ) as loader:  # fmt: skip
            for _ in loader:  # warm-up: workers started, slots made (and pinned)
                pass
            for _ in range(args.repeats):
                nbytes, checks = 0, []
                start = time.perf_counter()
                for batch in loader:
                    image = batch["image"].to(device, non_blocking=True)
                    nbytes += image.numel()
                    if len(checks) < 2:
                        checks.append((image, batch["image"]))  # compared after the clock stops
                    del batch
                sync(device)
                runs.append(nbytes / (time.perf_counter() - start) / 1e9)
                checks_ok &= all(torch.equal(d.cpu(), h) for d, h in checks)
        out[transport] = {"gb_per_s": statistics.median(runs), "repeats": runs, "copies_equal": checks_ok}
    out["slots_vs_stock_gb_per_s"] = out["slots"]["gb_per_s"] / out["stock"]["gb_per_s"]
    ds.close()
    return out


def stall_part(urls: list[str], args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    cuda = device.type == "cuda"
    name = args.model if args.model != "auto" else ("resnet50" if cuda else "small")
    model = (resnet50() if name == "resnet50" else small_cnn()).to(device)
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        x = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with autocast:
            loss = nn.functional.cross_entropy(model(x), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    # the compute ceiling: the same steps on one batch that stays on the device
    images = torch.randint(0, 256, (args.batch, 3, 224, 224), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 1000, (args.batch,), device=device)
    for _ in range(2):
        step(images, labels)
    sync(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        step(images, labels)
    sync(device)
    compute_s = (time.perf_counter() - start) / args.steps

    decoder = fd.Decoder("torch", size=(224, 224))
    ds = fd.TarShardDataset(urls, batch_size=args.batch, decode=decoder, shuffle=True, seed=args.seed)
    waits, steps = [], []
    with fd.Loader(ds, num_workers=args.workers, pin_memory=cuda, persistent_workers=True) as loader:
        it = iter(loader)
        batch = next(it)  # the workers' start-up is not a stall of the steady state
        for k in range(args.steps + 2):
            t0 = time.perf_counter()
            if k:
                try:
                    batch = next(it)
                except StopIteration:
                    it = iter(loader)
                    batch = next(it)
            t1 = time.perf_counter()
            step(batch["jpg"].to(device, non_blocking=True), batch["cls"].to(device, non_blocking=True))
            sync(device)
            if k >= 2:  # two warm-up steps (allocator, cuDNN's choice of algorithms)
                waits.append(t1 - t0)
                steps.append(time.perf_counter() - t0)
            del batch
    ds.close()
    step_s = statistics.median(steps)
    return {
        "model": name,
        "batch": args.batch,
        "workers": args.workers,
        "compute_ceiling_step_s": compute_s,
        "step_s_median": step_s,
        "data_wait_s_median": statistics.median(waits),
        "stall_fraction": sum(waits) / sum(steps),
        "images_per_s": args.batch / step_s,
        "steps_per_s_vs_compute_ceiling": compute_s / step_s,
    }


def versions() -> dict[str, str]:
    import PIL

    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    out |= {"pillow": PIL.__version__, "fastdata": fd.__version__}
    if torch.cuda.is_available():
        out["cuda"] = str(torch.version.cuda)
        out["device"] = torch.cuda.get_device_name()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="h2d,stall", help="comma list of: h2d, stall")
    ap.add_argument("--model", choices=["auto", "resnet50", "small"], default="auto")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20, help="timed training steps")
    ap.add_argument("--workers", type=int, default=max(1, min(16, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--images", type=int, default=4096, help="JPEGs in the shards of the stall part")
    ap.add_argument("--side", type=int, default=224, help="h2d: image side in pixels")
    ap.add_argument("--h2d-images", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a machine without a GPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tmp", default=None, help="folder for the generated data (default: a temporary one)")
    ap.add_argument("--out", default="bench_gpu.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.steps, args.images, args.h2d_images, args.repeats = 32, 4, 256, 256, 2
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {
        "benchmark": "bench_gpu",
        "args": vars(args),
        "versions": versions(),
        "machine": {"cpus": os.cpu_count(), "load_average_start": os.getloadavg()},
        "device": str(device),
    }
    if device.type != "cuda":
        result["note"] = "no CUDA device: CPU figures only; the GPU copies are skipped (h2d) and the model is small"
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        folder = Path(tmp)
        if "h2d" in parts:
            make_hdf5(folder / "u8.h5", args.h2d_images, args.side, args.seed)
            result["h2d"] = h2d_part(folder / "u8.h5", args, device)
            print("h2d", json.dumps({k: v for k, v in result["h2d"].items() if k not in ("stock", "slots")}))
        if "stall" in parts:
            urls = make_jpeg_shards(folder, args.images, 256, max(2, args.workers), args.seed)
            result["stall"] = stall_part(urls, args, device)
            print("stall", json.dumps(result["stall"]))
    result["machine"]["load_average_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
