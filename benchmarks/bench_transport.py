"""Worker -> main process transport: reused shared-memory slots against the stock DataLoader, in one run.

The same batches (batch 64, page cache hot, persistent workers) go through three loaders per backend:

* ``in_process``: ``num_workers=0``, the loader's own speed without any transfer;
* ``stock``: ``num_workers=W`` with the DataLoader's own transfer (a fresh shared tensor per batch,
  pickled bytes);
* ``slots``: ``num_workers=W`` with :class:`fastdata.loading.transport._collate.SlotCollate` (and, for tar,
  ``slots_packed``: ``bytes_as="packed"``, the bytes left in the slot as views; for HDF5,
  ``slots_direct``: the dataset reads its batches straight into the next slot through
  :class:`fastdata.loading.transport._slots.SlotPool`, so packing copies nothing).

Backends: ``hdf5`` (:class:`fastdata.HDF5Dataset`, decoded uint8 256x256x3 images, ``collate_fn=ds.collate``)
and ``tar`` (:class:`fastdata.TarShardDataset` with ``batch_size=64``, raw ~30 KB byte strings; and
``per_sample_plain_dataloader``: the dataset read per sample by a plain ``DataLoader(batch_size=64)`` with
its default collate, as a user sets it up).

The consumer touches every 4 KiB page of every tensor (one byte per page) and takes the length of every
byte string, as a training step reading its batch would; without that a transfer that never maps its
pages would look free. Per configuration it reports samples/s (median of ``--repeats`` interleaved
repeats of ``--epochs`` epochs each), minor page faults per batch in the main process and in the workers
(``getrusage`` and ``/proc/PID/stat``) next to the batch's size in pages (and, as ``transport``, those
beyond what the same reader faults at 0 workers), and the ratios: ``slots / in_process`` and
``slots / stock``. The load average before and after is in the JSON: the
machine is shared, so compare ratios within one run.

``--cuda`` (only where ``torch.cuda.is_available()``) adds host-to-device throughput of the HDF5 batches:
the stock loader with ``pin_memory=True`` against pinned slots (:func:`slot_dataloader` with
``pin_memory=True``), each batch copied with ``.to("cuda", non_blocking=True)``, and checks the copies.

``--loader BACKENDS`` measures what decides ``fd.Loader``'s default transport: the same loader through
``fd.Loader(transport="stock")`` and ``fd.Loader(transport="slots")`` (and ``num_workers=0``), on every
backend: ``tar_bytes`` (``TarShardDataset(batch_size=64)``, raw ~30 KB bytes), ``tar_decoded`` (the same
with 256x256 JPEGs decoded to uint8 arrays), ``hdf5_u8`` (decoded uint8 256x256x3), ``hdf5_jpeg`` (JPEG
bytes in a vlen field, raw), ``video`` (``VideoClipDataset``, 8-frame 224x224 clips, 1.2 MB, batch 8)
and ``s3`` (``S3Dataset``, 30 KB objects on a local moto server). ``loader_verdict`` says whether slots
were faster on every one.

Usage::

    PYTHONPATH=. python benchmarks/bench_transport.py --out bench_transport.json
    PYTHONPATH=. python benchmarks/bench_transport.py --backends none \
        --loader tar_bytes,tar_decoded,hdf5_u8,hdf5_jpeg,video,s3 --out bench_transport_loader.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastdata as fd  # noqa: E402
from fastdata.convert._hdf5 import CHUNK_BYTES  # noqa: E402
from fastdata.loading import transport as slots  # noqa: E402
from fastdata.loading.transport._collate import SlotCollate, batch_as_is, slot_dataloader  # noqa: E402
from fastdata.loading.transport._layout import PackedBytes  # noqa: E402
from fastdata.loading.transport._slots import SlotPool  # noqa: E402

PAGE = 4096


def make_hdf5(path: Path, n: int, hw: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = max(1, CHUNK_BYTES // (hw * hw * 3))
    with h5py.File(path, "w") as f:
        f.create_dataset("label", data=rng.integers(0, 1000, n))
        image = f.create_dataset("image", (n, hw, hw, 3), dtype=np.uint8, chunks=(rows, hw, hw, 3))
        for lo in range(0, n, 256):
            m = min(256, n - lo)
            image[lo : lo + m] = rng.integers(0, 256, (m, hw, hw, 3), dtype=np.uint8)


def make_tar(folder: Path, shards: int, per_shard: int, size: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    urls = []
    for s in range(shards):
        path = folder / f"shard-{s:04d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(per_shard):
                for ext, data in (
                    ("bin", rng.integers(0, 256, int(rng.integers(size // 2, size * 3 // 2)), dtype=np.uint8)),
                    ("cls", np.frombuffer(str(i % 1000).encode(), np.uint8)),
                ):
                    info = tarfile.TarInfo(f"s{s:04d}_{i:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data.tobytes()))
        urls.append(str(path))
    return urls


def warm(paths: list[str]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(16 << 20):
                pass


def consume(batch: Any) -> tuple[int, int]:
    """(samples, payload bytes) of a batch, touching one byte of every page of its tensors."""
    samples, nbytes = 0, 0
    for value in batch.values() if isinstance(batch, dict) else batch:
        if isinstance(value, torch.Tensor):
            flat = value.reshape(-1).view(torch.uint8)
            int(flat[::PAGE].sum())
            nbytes += flat.numel()
            samples = max(samples, value.shape[0] if value.ndim else 1)
        elif isinstance(value, PackedBytes):
            int(value.data[::PAGE].sum())
            nbytes += value.data.numel()
            samples = max(samples, len(value))
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            nbytes += sum(map(len, value))
            samples = max(samples, len(value))
    return samples, nbytes


def minflt(pid: int) -> int:
    if pid == os.getpid():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])  # field 10, minflt
    except (OSError, IndexError, ValueError):
        return 0


def workers_of(loader: DataLoader[Any]) -> list[int]:
    it = getattr(loader, "_iterator", None)
    return [w.pid for w in getattr(it, "_workers", [])] if it is not None else []


def _timed(loader: Any, pids: list[int], epochs: int) -> tuple[float, int, int, int, int, int]:
    """``(seconds, samples, bytes, batches, main faults, worker faults)`` of ``epochs`` passes over
    ``loader``, whose worker processes are ``pids``."""
    before_main, before_w = minflt(os.getpid()), sum(minflt(p) for p in pids)
    samples = nbytes = batches = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            s, b = consume(batch)
            samples, nbytes, batches = samples + s, nbytes + b, batches + 1
            del batch
    seconds = time.perf_counter() - start
    main_f, work_f = minflt(os.getpid()) - before_main, sum(minflt(p) for p in pids) - before_w
    return seconds, samples, nbytes, batches, main_f, work_f


def time_loader(loader: DataLoader[Any], epochs: int) -> dict[str, float]:
    """One repeat: ``epochs`` passes, timed, with page faults counted (after a warm-up pass, so that a
    persistent loader's workers exist)."""
    seconds, samples, nbytes, batches, main_f, work_f = _timed(loader, workers_of(loader), epochs)
    return {
        "samples_per_s": samples / seconds,
        "gb_per_s": nbytes / seconds / 1e9,
        "batches": batches,
        "batch_pages": nbytes / batches / PAGE,
        "main_faults_per_batch": main_f / batches,
        "worker_faults_per_batch": work_f / batches,
    }


def hdf5_loaders(path: str, workers: int) -> dict[str, Callable[[], DataLoader[Any]]]:
    ds = fd.HDF5Dataset(path, fields=("image", "label"))
    # the same, reading its batches straight into the next slot: HDF5Dataset takes its batch arrays from
    # ``_pool`` (a BufferPool); a SlotPool there is the wiring proposed for the dataset (not public yet)
    direct = fd.HDF5Dataset(path, fields=("image", "label"))
    direct._pool = SlotPool()
    common = {"batch_size": 64, "sampler": ds.sampler()}
    many = {"num_workers": workers, "persistent_workers": True, "multiprocessing_context": "fork"}
    return {
        "in_process": lambda: DataLoader(ds, collate_fn=ds.collate, **common),
        "stock": lambda: DataLoader(ds, collate_fn=ds.collate, **common, **many),
        "slots": lambda: DataLoader(ds, collate_fn=SlotCollate(ds.collate), **common, **many),
        "slots_direct": lambda: DataLoader(
            direct, collate_fn=SlotCollate(direct.collate), batch_size=64, sampler=direct.sampler(), **many
        ),
    }


def tar_loaders(urls: list[str], workers: int) -> dict[str, Callable[[], DataLoader[Any]]]:
    ds = fd.TarShardDataset(urls, batch_size=64)
    common = {"batch_size": None}
    many = {"num_workers": workers, "persistent_workers": True, "multiprocessing_context": "fork"}
    per_sample = fd.TarShardDataset(urls)  # batched by the DataLoader, its default collate: a plain user setup
    return {
        "in_process": lambda: DataLoader(ds, collate_fn=batch_as_is, **common),
        "per_sample_plain_dataloader": lambda: DataLoader(per_sample, batch_size=64, **many),
        "stock": lambda: DataLoader(ds, collate_fn=batch_as_is, **common, **many),
        "slots": lambda: DataLoader(ds, collate_fn=SlotCollate(prebatched=True), **common, **many),
        "slots_packed": lambda: DataLoader(
            ds, collate_fn=SlotCollate(prebatched=True, bytes_as="packed"), **common, **many
        ),
    }


def run_backend(name: str, loaders: dict[str, Callable[[], DataLoader[Any]]], args: argparse.Namespace) -> dict:
    built = {k: make() for k, make in loaders.items()}
    for loader in built.values():  # warm-up: workers started, files opened, slots made
        for _ in loader:
            pass
    reps: dict[str, list[dict[str, float]]] = {k: [] for k in built}
    slots.reset_counts()
    for _ in range(args.repeats):  # interleaved, so that a noisy neighbour hits every configuration
        for k, loader in built.items():
            reps[k].append(time_loader(loader, args.epochs))
    transfer = slots.stats()
    out: dict[str, Any] = {"configs": {}}
    for k, runs in reps.items():
        out["configs"][k] = {m: statistics.median(r[m] for r in runs) for m in runs[0] if m != "batches"} | {
            "repeats": [round(r["samples_per_s"]) for r in runs]
        }
    c = out["configs"]
    if "per_sample_plain_dataloader" in c:
        out["per_sample_plain_dataloader_vs_in_process"] = (
            c["per_sample_plain_dataloader"]["samples_per_s"] / c["in_process"]["samples_per_s"]
        )
    for k in c:
        if k.startswith("slots"):
            out[f"{k}_vs_in_process"] = c[k]["samples_per_s"] / c["in_process"]["samples_per_s"]
            out[f"{k}_vs_stock"] = c[k]["samples_per_s"] / c["stock"]["samples_per_s"]
            pages = c[k]["batch_pages"]
            # the reader's own faults (a tar shard's memory map, mapped anew in each process) show at 0
            # workers too; what the transport adds is the rest
            reader = c["in_process"]["main_faults_per_batch"]
            total = c[k]["main_faults_per_batch"] + c[k]["worker_faults_per_batch"]
            out[f"{k}_faults_per_batch_pct_of_pages"] = {
                "main": 100 * c[k]["main_faults_per_batch"] / pages,
                "workers": 100 * c[k]["worker_faults_per_batch"] / pages,
                "reader_at_0_workers": 100 * reader / pages,
                "transport": 100 * max(0.0, total - reader) / pages,
            }
    out["stock_vs_in_process"] = c["stock"]["samples_per_s"] / c["in_process"]["samples_per_s"]
    out["stock_faults_per_batch_pct_of_pages"] = (
        100 * (c["stock"]["main_faults_per_batch"] + c["stock"]["worker_faults_per_batch"]) / c["stock"]["batch_pages"]
    )
    out["batches_through"] = {"slots": transfer["slots"], "pipe": transfer["pipe"]}
    del built
    slots.release()
    print(name, json.dumps({k: v for k, v in out.items() if k != "configs"}, indent=1), file=sys.stderr)
    return out


# -- fd.Loader, every backend, stock against slots ----------------------------------------------------


def make_jpeg_tar(folder: Path, shards: int, per_shard: int, hw: int, seed: int) -> list[str]:
    """Shards of ``hw`` x ``hw`` JPEGs (smooth pictures with a little noise, ~15-25 KB, as photographs
    compress) and class labels."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 160, hw, dtype=np.float32)[None, :, None]
    urls = []
    for s in range(shards):
        path = folder / f"jpeg-{s:04d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(per_shard):
                pixels = (rng.integers(0, 96, (1, 1, 3)) + ramp + rng.integers(0, 24, (hw, hw, 3))).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
                for ext, data in (("jpg", buf.getvalue()), ("cls", str(i % 1000).encode())):
                    info = tarfile.TarInfo(f"s{s:04d}_{i:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        urls.append(str(path))
    return urls


def make_hdf5_jpeg(path: Path, n: int, hw: int, seed: int) -> None:
    """JPEG bytes (of the kind :func:`make_jpeg_tar` writes) in a vlen uint8 field ``jpg``, and labels."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 160, hw, dtype=np.float32)[None, :, None]
    with h5py.File(path, "w") as f:
        f.create_dataset("label", data=rng.integers(0, 1000, n))
        field = f.create_dataset("jpg", (n,), dtype=h5py.vlen_dtype(np.uint8), chunks=(64,))
        for lo in range(0, n, 256):
            part = np.empty(min(256, n - lo), dtype=object)
            for k in range(len(part)):
                pixels = (rng.integers(0, 96, (1, 1, 3)) + ramp + rng.integers(0, 24, (hw, hw, 3))).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
                part[k] = np.frombuffer(buf.getvalue(), np.uint8)
            field[lo : lo + len(part)] = part


def loader_datasets(name: str, folder: Path, args: argparse.Namespace, server: Any) -> tuple[Any, dict[str, Any]]:
    """``(dataset, fd.Loader keyword arguments)`` of one backend."""
    (folder / name).mkdir(parents=True, exist_ok=True)
    if name == "tar_bytes":
        urls = make_tar(folder / name, 8, args.tar_samples // 8, 30_000, args.seed)
        warm(urls)
        return fd.TarShardDataset(urls, batch_size=64), {}
    if name == "tar_decoded":
        urls = make_jpeg_tar(folder / name, 8, args.decoded_samples // 8, 256, args.seed)
        warm(urls)
        return fd.TarShardDataset(urls, batch_size=64, decode="numpy"), {}
    if name == "hdf5_u8":
        path = folder / "u8.h5"
        make_hdf5(path, args.hdf5_samples, 256, args.seed)
        warm([str(path)])
        return fd.HDF5Dataset(str(path), fields=("image", "label")), {"batch_size": 64}
    if name == "hdf5_jpeg":
        path = folder / "jpeg.h5"
        make_hdf5_jpeg(path, args.decoded_samples, 256, args.seed)
        warm([str(path)])
        return fd.HDF5Dataset(str(path), fields=("jpg", "label"), decode="raw"), {"batch_size": 64}
    if name == "video":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_video import make_videos

        paths = make_videos(folder / name, count=8, frames=240, size=224, fps=30, codec="mp4v", seed=args.seed)
        warm(paths)
        ds = fd.VideoClipDataset(paths, clip_len=8, frame_stride=2, clips_per_video=8, index_cache=False)
        return ds, {"batch_size": 8}
    if name == "s3":
        from tests.s3_server import CREDENTIALS, REGION, upload_files

        client = server.client()
        client.create_bucket(Bucket="transport")
        rng = np.random.default_rng(args.seed)
        files = {f"obj/{i:06d}.bin": rng.bytes(30_000) for i in range(args.s3_objects)}
        urls = upload_files(client, "transport", files)
        ds = fd.S3Dataset(urls, endpoint_url=server.endpoint_url, region_name=REGION, **CREDENTIALS)
        return ds, {"batch_size": 64}
    raise SystemExit(f"unknown --loader backend {name!r}")


def time_fd_loader(loader: fd.Loader, epochs: int) -> dict[str, float]:
    """One repeat over ``epochs`` epochs of an ``fd.Loader`` (see :func:`time_loader`)."""
    seconds, samples, nbytes, batches, main_f, work_f = _timed(loader, workers_of(loader.dataloader), epochs)
    return {
        "samples_per_s": samples / seconds,
        "gb_per_s": nbytes / seconds / 1e9,
        "batch_pages": nbytes / max(1, batches) / PAGE,
        "faults_per_batch": (main_f + work_f) / max(1, batches),
    }


def run_loader_backend(name: str, ds: Any, kwargs: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    many = {"num_workers": args.workers, "persistent_workers": True, "multiprocessing_context": "fork"}
    loaders = {
        "in_process": fd.Loader(ds, **kwargs),
        "stock": fd.Loader(ds, transport="stock", **kwargs, **many),
        "slots": fd.Loader(ds, transport="slots", **kwargs, **many),
    }
    for loader in loaders.values():  # warm-up: workers started, files opened, slots made
        for _ in loader:
            pass
    reps: dict[str, list[dict[str, float]]] = {k: [] for k in loaders}
    slots.reset_counts()
    for _ in range(args.repeats):  # interleaved: a noisy neighbour hits every configuration
        for k, loader in loaders.items():
            reps[k].append(time_fd_loader(loader, args.epochs))
    through = slots.stats()
    for loader in loaders.values():
        loader.close()
    out: dict[str, Any] = {"configs": {}}
    for k, runs in reps.items():
        out["configs"][k] = {m: statistics.median(r[m] for r in runs) for m in runs[0]} | {
            "repeats": [round(r["samples_per_s"], 1) for r in runs]
        }
    c = out["configs"]
    out["slots_vs_stock"] = c["slots"]["samples_per_s"] / c["stock"]["samples_per_s"]
    out["slots_vs_in_process"] = c["slots"]["samples_per_s"] / c["in_process"]["samples_per_s"]
    out["stock_vs_in_process"] = c["stock"]["samples_per_s"] / c["in_process"]["samples_per_s"]
    out["batches_through"] = {"slots": through["slots"], "pipe": through["pipe"]}
    print(name, json.dumps({k: v for k, v in out.items() if k != "configs"}), file=sys.stderr, flush=True)
    return out


def loader_section(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    names = args.loader.split(",")
    out: dict[str, Any] = {"backends": {}}
    server = None
    if "s3" in names:
        from tests.s3_server import MotoServer

        server = MotoServer().__enter__()
    try:
        for name in names:
            ds, kwargs = loader_datasets(name, folder, args, server)
            out["backends"][name] = run_loader_backend(name, ds, kwargs, args)
            ds.close()
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    ratios = {k: round(v["slots_vs_stock"], 3) for k, v in out["backends"].items()}
    out["slots_vs_stock"] = ratios
    out["loader_verdict"] = (
        "slots faster on every backend" if all(r > 1 for r in ratios.values()) else "slots not faster on every backend"
    )
    return out


def cuda_h2d(path: str, workers: int, epochs: int) -> dict[str, Any]:
    """Host-to-device throughput of the HDF5 batches: stock pin_memory=True against pinned slots."""
    ds = fd.HDF5Dataset(path, fields=("image", "label"))
    kw = {"batch_size": 64, "sampler": ds.sampler(), "num_workers": workers, "persistent_workers": True}
    loaders = {
        "stock_pin_memory": DataLoader(ds, collate_fn=ds.collate, pin_memory=True, **kw),
        "pinned_slots": slot_dataloader(ds, collate_fn=ds.collate, pin_memory=True, **kw),
    }
    out: dict[str, Any] = {"device": torch.cuda.get_device_name()}
    for name, loader in loaders.items():
        for _ in loader:  # warm-up
            pass
        checks, nbytes, start = [], 0, time.perf_counter()
        for _ in range(epochs):
            for batch in loader:
                image = batch["image"].to("cuda", non_blocking=True)
                nbytes += image.numel()
                if len(checks) < 4:
                    checks.append((int(image.sum()), int(batch["image"].sum())))
                del batch
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        out[name] = {
            "gb_per_s": nbytes / seconds / 1e9,
            "copies_match": all(a == b for a, b in checks),
        }
    out["pinned_slots_vs_stock"] = out["pinned_slots"]["gb_per_s"] / out["stock_pin_memory"]["gb_per_s"]
    out["slot_stats"] = slots.stats()
    return out


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "h5py": h5py.__version__,
        "fastdata": fd.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--hdf5-samples", type=int, default=2048)
    ap.add_argument("--tar-samples", type=int, default=8192)
    ap.add_argument("--epochs", type=int, default=3, help="epochs per timed repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backends", default="hdf5,tar", help="DataLoader-level backends: hdf5,tar (or none)")
    ap.add_argument("--loader", default="", help="fd.Loader backends: tar_bytes,tar_decoded,hdf5_u8,hdf5_jpeg,video,s3")
    ap.add_argument("--decoded-samples", type=int, default=2048, help="JPEGs for tar_decoded and hdf5_jpeg")
    ap.add_argument("--s3-objects", type=int, default=512)
    ap.add_argument("--cuda", action="store_true", help="also host-to-device (only where CUDA is)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench_transport.json")
    ap.add_argument("--tmp", default=None, help="folder for the data (default: a temporary one)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # collate's stack stalls on a shared 2-core machine otherwise
    result: dict[str, Any] = {
        "args": vars(args),
        "versions": versions(),
        "machine": {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()},
        "backends": {},
    }
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        folder = Path(tmp)
        backends = args.backends.split(",")
        h5 = str(folder / "u8.h5")
        if "hdf5" in backends or args.cuda:
            make_hdf5(Path(h5), args.hdf5_samples, 256, args.seed)
            warm([h5])
        if "hdf5" in backends:
            result["backends"]["hdf5_u8_256"] = run_backend("hdf5", hdf5_loaders(h5, args.workers), args)
        if "tar" in backends:
            urls = make_tar(folder, 8, args.tar_samples // 8, 30_000, args.seed)
            warm(urls)
            result["backends"]["tar_bytes_30k"] = run_backend("tar", tar_loaders(urls, args.workers), args)
        if args.loader:
            result["loader"] = loader_section(folder, args)
        if args.cuda:
            if torch.cuda.is_available():
                result["cuda"] = cuda_h2d(h5, args.workers, args.epochs)
            else:
                result["cuda"] = "skipped: torch.cuda.is_available() is False"
    result["machine"]["loadavg_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "args"}, indent=1, default=str)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
