"""``fd.Mix`` of a tar and an HDF5 source against each source read alone, and against LitData's
``CombinedStreamingDataset`` on the same samples, in one run.

The same samples (``--samples`` per source: a ``--hw`` x ``--hw`` x 3 uint8 image and a label; the tar source's
labels 0-999, the HDF5 source's 1000-1999, so a batch's labels say where each sample came from) are written
three ways: tar shards (``img.bin`` raw pixels, ``cls``), one chunked HDF5 file, and LitData's ``optimize``
format (one folder per source). Each loader yields batches of ``--batch`` dicts ``{"image", "label"}``:

* ``fd_tar``: ``fd.Loader(TarShardDataset(shuffle=True, batch_size=B, transform=...))``;
* ``fd_hdf5``: ``fd.Loader(HDF5Dataset(transform=...), batch_size=B)`` (its shuffled sampler);
* ``fd_mix``: ``fd.Loader(fd.Mix({"tar": ..., "hdf5": ...}, weights=[1, 1]), batch_size=B)``, an epoch of both;
* ``fd_mix_per_source``: the same with ``batches="per_source"`` (every batch of one source);
* ``litdata_mix``: LitData's ``StreamingDataLoader(CombinedStreamingDataset([tar-like, hdf5-like],
  weights=(0.5, 0.5), iterate_over_all=False))`` over the LitData copies (shuffled). Its epoch ends when one
  source runs out, so its length varies; its shares hold in expectation.

MosaicML Streaming's ``streams`` are not measured: ``mosaicml-streaming`` 0.13.0 does not import here (its
package imports ``streaming.vision``, which needs torchvision, whose wheels do not load beside torch
2.13.0+cpu, and ``streaming.base.dataloader`` needs ``transformers``); the JSON says so.

Per ``--workers`` count, every loader reads ``--epochs`` timed epochs after one untimed (persistent workers,
started), ``--repeats`` times, the loaders interleaved; the consumer touches every batch's image tensor.
Reported: samples/s (median of the repeats), each epoch's shares (samples per source), and the ratios
``fd_mix / min(fd_tar, fd_hdf5)`` (the target: >= 0.9), ``fd_mix`` against the harmonic mean of the two
sources alone (what a mix costing nothing reads: half its samples at each source's rate) and
``litdata_mix / fd_mix``. A mixed batch of 64 holds 32 of each source, so each source is read 32 at a time:
its fixed cost per read weighs twice as much as alone. The machine is shared:
compare ratios within one run; the load average before and after is in the JSON.

Usage::

    python benchmarks/bench_mix.py --out bench_mix.json
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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastdata as fd  # noqa: E402

HDF5_LABELS = 1000  # the HDF5 source's labels start here


def make_data(root: Path, n: int, hw: int, seed: int) -> dict[str, Any]:
    """The same kind of samples for every reader: images and labels of two sources."""
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (n, hw, hw, 3), dtype=np.uint8) for _ in range(2)]
    labels = [rng.integers(0, 1000, n), rng.integers(0, 1000, n) + HDF5_LABELS]
    tar_dir = root / "tar"
    tar_dir.mkdir(parents=True, exist_ok=True)
    urls, per_shard = [], 1000
    for s, lo in enumerate(range(0, n, per_shard)):
        path = tar_dir / f"shard-{s:04d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(lo, min(n, lo + per_shard)):
                for ext, data in (("img.bin", images[0][i].tobytes()), ("cls", str(int(labels[0][i])).encode())):
                    info = tarfile.TarInfo(f"s{i:07d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        urls.append(str(path))
    h5 = root / "data.h5"
    rows = max(1, (1 << 20) // (hw * hw * 3))
    with h5py.File(h5, "w") as f:
        f.create_dataset("image", data=images[1], chunks=(rows, hw, hw, 3))
        f.create_dataset("label", data=labels[1])
    return {"urls": urls, "h5": str(h5), "images": images, "labels": labels}


def litdata_copies(root: Path, data: dict[str, Any]) -> list[str] | str:
    """The two sources in LitData's format (one ``optimize`` run each), or why not."""
    try:
        import litdata
    except ImportError as e:
        return f"litdata not installed ({e}); pip install litdata"
    out = []
    for k in range(2):
        folder = root / f"litdata-{k}"
        images, labels = data["images"][k], data["labels"][k]
        litdata.optimize(
            fn=_Item(images, labels),
            inputs=list(range(len(labels))),
            output_dir=str(folder),
            chunk_bytes="16MB",
            mode="overwrite",  # a --data folder used before
            num_workers=1,
            verbose=False,
        )
        out.append(str(folder))
    return out


class _Item:
    """LitData's ``optimize`` function: sample ``i`` of one source (picklable for its worker)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __call__(self, i: int) -> dict[str, Any]:
        return {"image": self.images[i], "label": int(self.labels[i])}


class TarSample:
    def __init__(self, hw: int) -> None:
        self.hw = hw

    def __call__(self, s: dict[str, Any]) -> dict[str, Any]:
        return {"image": np.frombuffer(s["img.bin"], np.uint8).reshape(self.hw, self.hw, 3), "label": int(s["cls"])}


def hdf5_sample(s: dict[str, Any]) -> dict[str, Any]:
    return {"image": s["image"], "label": int(s["label"])}


def fd_loaders(data: dict[str, Any], args: argparse.Namespace, workers: int) -> dict[str, Callable[[], Any]]:
    def tar(batch_size: int | None) -> Any:
        return fd.TarShardDataset(
            data["urls"], shuffle=True, seed=args.seed, batch_size=batch_size, transform=TarSample(args.hw)
        )

    def hdf5() -> Any:
        return fd.HDF5Dataset(data["h5"], ("image", "label"), seed=args.seed, transform=hdf5_sample)

    kw: dict[str, Any] = {"num_workers": workers, "persistent_workers": workers > 0}
    return {
        "fd_tar": lambda: fd.Loader(tar(args.batch), **kw),
        "fd_hdf5": lambda: fd.Loader(hdf5(), batch_size=args.batch, **kw),
        "fd_mix": lambda: fd.Loader(
            fd.Mix({"tar": tar(None), "hdf5": hdf5()}, [1, 1], seed=args.seed), batch_size=args.batch, **kw
        ),
        "fd_mix_per_source": lambda: fd.Loader(
            fd.Mix(
                {"tar": tar(None), "hdf5": hdf5()}, [1, 1], seed=args.seed, batches="per_source", batch_size=args.batch
            ),
            batch_size=args.batch,
            **kw,
        ),
    }


def litdata_loader(folders: list[str], args: argparse.Namespace, workers: int) -> Callable[[], Any]:
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset

    def make() -> Any:
        sources = [StreamingDataset(f, shuffle=True, seed=args.seed) for f in folders]
        mixed = CombinedStreamingDataset(sources, seed=args.seed, weights=(0.5, 0.5), iterate_over_all=False)
        return StreamingDataLoader(mixed, batch_size=args.batch, num_workers=workers, persistent_workers=workers > 0)

    return make


def timed_epochs(loader: Any, epochs: Iterable[int]) -> tuple[float, int, list[dict[str, int]]]:
    """(seconds, samples, shares per epoch) of reading ``epochs``, touching every image tensor."""
    seconds, samples, shares = 0.0, 0, []
    for e in epochs:
        if hasattr(loader, "set_epoch") and isinstance(loader, fd.Loader):
            loader.set_epoch(e)
        tar = hdf5 = 0
        start = time.perf_counter()
        for batch in loader:
            image, label = batch["image"], batch["label"]
            torch.as_tensor(image).view(-1)[::4096].sum()  # touch a byte per page, as a step reading it would
            n = len(label)
            h = int((torch.as_tensor(label) >= HDF5_LABELS).sum())
            hdf5 += h
            tar += n - h
        seconds += time.perf_counter() - start
        samples += tar + hdf5
        shares.append({"tar": tar, "hdf5": hdf5})
    return seconds, samples, shares


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)  # docs: collate's stack stalls under two intra-op threads on a shared machine
    root = Path(args.data or tempfile.mkdtemp(prefix="bench-mix-"))
    data = make_data(root, args.samples, args.hw, args.seed)
    folders = litdata_copies(root, data)
    out: dict[str, Any] = {
        "benchmark": "bench_mix",
        "config": vars(args) | {"data": str(root)},
        "versions": versions(),
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "mosaicml_streaming": mosaic_status(),
        "litdata": folders if isinstance(folders, str) else "measured",
        "results": {},
    }
    for workers in args.workers:
        makers = fd_loaders(data, args, workers)
        if not isinstance(folders, str):
            makers["litdata_mix"] = litdata_loader(folders, args, workers)
        loaders = {name: make() for name, make in makers.items()}
        for loader in loaders.values():  # started, an untimed epoch
            timed_epochs(loader, [0])
        rates: dict[str, list[float]] = {name: [] for name in loaders}
        shares: dict[str, list[dict[str, int]]] = {name: [] for name in loaders}
        epoch = 1
        for r in range(args.repeats):
            order = list(loaders) if r % 2 == 0 else list(reversed(loaders))  # interleaved both ways
            for name in order:
                seconds, samples, got = timed_epochs(loaders[name], range(epoch, epoch + args.epochs))
                rates[name].append(samples / seconds)
                shares[name] += got
            epoch += args.epochs
        for loader in loaders.values():
            close = getattr(loader, "close", None)
            if callable(close):
                close()
        med = {name: statistics.median(v) for name, v in rates.items()}
        res: dict[str, Any] = {
            "samples_per_s": med,
            "repeats": rates,
            "shares_per_epoch": shares,
            "mix_vs_slower_source": med["fd_mix"] / min(med["fd_tar"], med["fd_hdf5"]),
            "per_source_mix_vs_slower_source": med["fd_mix_per_source"] / min(med["fd_tar"], med["fd_hdf5"]),
            # what a mix costing nothing would read: half its samples at each source's own rate
            "mix_vs_harmonic_mean_of_sources": med["fd_mix"] * (1 / med["fd_tar"] + 1 / med["fd_hdf5"]) / 2,
        }
        if "litdata_mix" in med:
            res["litdata_mix_vs_fd_mix"] = med["litdata_mix"] / med["fd_mix"]
        # the same ratios repeat by repeat (loaders measured side by side), then their median: steadier on a
        # machine whose load drifts
        slower = [min(t, h) for t, h in zip(rates["fd_tar"], rates["fd_hdf5"])]
        res["paired"] = {
            "mix_vs_slower_source": statistics.median(m / s for m, s in zip(rates["fd_mix"], slower)),
            "per_source_mix_vs_slower_source": statistics.median(
                m / s for m, s in zip(rates["fd_mix_per_source"], slower)
            ),
        }
        if "litdata_mix" in rates:
            res["paired"]["litdata_mix_vs_fd_mix"] = statistics.median(
                a / b for a, b in zip(rates["litdata_mix"], rates["fd_mix"])
            )
        out["results"][f"workers={workers}"] = res
        print(json.dumps({f"workers={workers}": {k: v for k, v in res.items() if k != "repeats"}}, default=str))
    out["loadavg_after"] = os.getloadavg()
    return out


def mosaic_status() -> str:
    try:
        import streaming  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure is the finding
        return f"not measured: import streaming failed ({type(e).__name__}: {e})"
    return "importable (not measured by this script)"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "fastdata": fd.__version__, "torch": torch.__version__}
    out.update(numpy=np.__version__, h5py=h5py.__version__)
    try:
        import litdata

        out["litdata"] = litdata.__version__
    except ImportError:
        pass
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=8000, help="samples per source (default 8000)")
    parser.add_argument("--hw", type=int, default=64, help="image height and width (default 64)")
    parser.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    parser.add_argument(
        "--workers", type=lambda s: [int(x) for x in s.split(",")], default=[0, 2], help="worker counts (0,2)"
    )
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per repeat (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", help="folder for the data (default: a new temporary folder)")
    parser.add_argument("--out", help="write the JSON here")
    args = parser.parse_args()
    result = run(args)
    text = json.dumps(result, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
