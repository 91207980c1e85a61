#!/usr/bin/env python3
"""The cost of checking that a local shard is still the file mapped (one ``fstat`` per read, see
``fastdata.storage``'s local reader), in one run: an epoch of ``TarShardDataset`` (raw bytes, 0 workers,
page cache hot, per-sample and batched) with the check as shipped against the same reads with the check
replaced by a bare look at the map. Passes alternate; figures are medians; the ratio is the figure to read.

    python benchmarks/bench_local_reads.py --json bench-out/local_reads.json
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import sys
import tarfile
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import fastdata as fd  # noqa: E402
from fastdata.storage import open_reader  # noqa: E402


def write_shards(folder: Path, shards: int, samples: int, size: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    urls = []
    for s in range(shards):
        url = str(folder / f"s-{s:03d}.tar")
        with tarfile.open(url, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(samples):
                for ext, data in (("bin", rng.bytes(size)), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{s}-{i:05d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        urls.append(url)
    return urls


def epoch(urls: list[str], batch_size: int | None) -> float:
    ds = fd.TarShardDataset(urls, batch_size=batch_size)
    start = time.perf_counter()
    for _ in ds:
        pass
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--samples", type=int, default=4000, help="per shard")
    p.add_argument("--size", type=int, default=4000, help="bytes per sample's payload")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    with tempfile.NamedTemporaryFile() as probe:  # the local reader's class, through the public face
        probe.write(b"x")
        probe.flush()
        LocalReader = type(open_reader(probe.name))
    checked = LocalReader._check

    def unchecked(self: Any) -> Any:
        if self._map is None:
            raise ValueError("read after close")
        return self._map

    out: dict[str, Any] = {"args": vars(args), "python": platform.python_version(), "torch": version("torch")}
    with tempfile.TemporaryDirectory() as tmp:
        urls = write_shards(Path(tmp), args.shards, args.samples, args.size, args.seed)
        for mode, batch_size in (("per_sample", None), ("batched", 64)):
            times: dict[str, list[float]] = {"checked": [], "unchecked": []}
            epoch(urls, batch_size)  # warm the page cache
            pair = [("checked", checked), ("unchecked", unchecked)]
            for r in range(args.repeats):
                for name, fn in pair if r % 2 else pair[::-1]:  # each goes first in half the passes
                    LocalReader._check = fn  # type: ignore[method-assign]
                    times[name].append(epoch(urls, batch_size))
            LocalReader._check = checked  # type: ignore[method-assign]
            c, u = statistics.median(times["checked"]), statistics.median(times["unchecked"])
            out[mode] = {"checked_s": c, "unchecked_s": u, "ratio": c / u}
            print(f"{mode}: checked {c:.4f} s, unchecked {u:.4f} s, ratio {c / u:.3f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
