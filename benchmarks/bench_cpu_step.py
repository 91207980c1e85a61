"""Does the sweep predict the stall of a training loop that computes on the CPU? Sleep step against CPU step.

A real CPU training loop (a small CNN written here by hand, forward, backward and SGD on the training
process's torch threads: torchvision does not load beside this torch) reads decoded 64x64 JPEGs from tar
shards through ``fd.Loader`` with a fixed worker count; its stall is what the monitor measures over the run
(the loop's time in ``next()``). The sweep predicts that stall for the same loader and worker count from a
simulated step of the CNN step's length, measured alone (the fastest of several steps, as ``CPUStep``
calibrates): once as a wait (``step_time``: a GPU step, the cores free for the workers) and once as CPU work
(``step_cpu``: torch matrix products on the same threads). Target: the CPU step's prediction within 1.5x of
the real loop's stall (ratio predicted / real in [0.67, 1.5]); the wait's prediction is reported beside it.
Rounds interleaved (real, sleep, CPU), medians; the load average before and after; library versions.

    PYTHONPATH=. python benchmarks/bench_cpu_step.py --out bench-out/cpu_step.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fastdata as fd
from fastdata.bench._environment import describe
from fastdata.loading.observe import Monitor

BATCH = 32


class SmallCNN(nn.Module):
    """Two convolutions and a linear layer over 64x64 RGB images, ten classes."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * 16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Trainer:
    """One SGD step of the CNN on a batch of decoded images (uint8, HWC)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = SmallCNN()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.loss = nn.CrossEntropyLoss()

    def step(self, images: torch.Tensor) -> None:
        x = images.float().div_(255)  # decode='torch' gives uint8 NCHW
        y = torch.arange(len(x)) % 10
        self.opt.zero_grad()
        self.loss(self.model(x), y).backward()
        self.opt.step()


def images_of(batch: Any) -> torch.Tensor:
    return batch["jpg"] if isinstance(batch, dict) else batch


def step_alone(trainer: Trainer, sample: torch.Tensor, tries: int = 15) -> float:
    """Seconds one training step takes with no loader running: the fastest of ``tries`` (the least contended)."""
    trainer.step(sample)  # warm up
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        trainer.step(sample)
        times.append(time.perf_counter() - start)
    return min(times)


def dataset(pattern: str) -> fd.TarShardDataset:
    return fd.TarShardDataset(pattern, decode=fd.Decoder("torch", size=(64, 64)), shuffle=True, batch_size=BATCH)


def real_stall(pattern: str, workers: int, seconds: float) -> dict[str, float]:
    """The real CPU training loop for ``seconds``: the stall the monitor measured over it."""
    trainer = Trainer()
    loader = fd.Loader(dataset(pattern), num_workers=workers, monitor=Monitor(to=lambda s: None, seconds=3600))
    end = time.perf_counter() + seconds
    epoch = 0
    while time.perf_counter() < end:
        loader.set_epoch(epoch)
        for batch in loader:
            trainer.step(images_of(batch))
            if time.perf_counter() >= end:
                break
        epoch += 1
    stats = loader.stats(since="start")
    loader.close()
    assert stats is not None
    return {"stall": stats.stall, "samples_per_s": stats.samples_per_s, "label": stats.label}  # type: ignore[dict-item]


def predicted_stall(pattern: str, workers: int, step: float, kind: str, seconds: float) -> dict[str, Any]:
    """The sweep's stall for the same loader, with a simulated step of ``step`` seconds (a wait or CPU work)."""
    step_args = {"step_time": step} if kind == "sleep" else {"step_cpu": step}
    result = fd.bench.sweep(
        lambda: dataset(pattern),
        workers=[workers],
        batch_size=None,
        collate_fn=fd.as_is,
        persistent_workers=[False],
        transport=["slots"],  # the real loop's fd.Loader hands batches over through slots (the sweep's default: stock)
        seconds=seconds,
        confirm=False,
        **step_args,
    )
    point = result.points[0]
    if not point.ok:
        raise RuntimeError(point.error)
    return {"stall": point.stall, "samples_per_s": point.samples_per_s, "label": fd.bench.recommend(result).bottleneck}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workers", default="1,2", help="worker counts, each compared (default 1,2)")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds of each real run and each sweep point")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from fastdata.bench.backends._tar import write_demo_shards

    out: dict[str, Any] = {"machine": describe(), "settings": vars(args), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-step-") as tmp:
        write_demo_shards(Path(tmp), shards=4, per_shard=256, size=(256, 256))
        pattern = str(Path(tmp) / "demo-{000000..000003}.tar")
        for path in Path(tmp).glob("*.tar"):
            path.read_bytes()  # in the page cache
        sample = images_of(next(iter(dataset(pattern))))
        step = step_alone(Trainer(), sample)
        out["step_alone_s"] = step
        out["torch_threads"] = torch.get_num_threads()
        print(f"the CNN step alone: {1000 * step:.1f} ms ({torch.get_num_threads()} torch threads)", flush=True)
        for w in [int(x) for x in args.workers.split(",")]:
            runs: dict[str, list[dict[str, Any]]] = {"real": [], "sleep": [], "cpu": []}
            for rnd in range(args.rounds):
                order = ["real", "sleep", "cpu"]
                for kind in order[rnd % 3 :] + order[: rnd % 3]:
                    if kind == "real":
                        r = real_stall(pattern, w, args.seconds)
                    else:
                        r = predicted_stall(pattern, w, step, kind, args.seconds)
                    runs[kind].append(r)
                    print(f"{w} workers round {rnd} {kind}: stall {r['stall']:.1%} ({r['label']})", flush=True)
            med = {k: statistics.median(x["stall"] for x in v) for k, v in runs.items()}
            real = med["real"] or 1e-9
            out[f"{w}w"] = {
                "runs": runs,
                "median_stall": med,
                "ratio_cpu_step_to_real": med["cpu"] / real,
                "ratio_sleep_step_to_real": med["sleep"] / real,
                "met": 1 / 1.5 <= med["cpu"] / real <= 1.5,
            }
            print(f"{w}w: {json.dumps({k: v for k, v in out[f'{w}w'].items() if k != 'runs'})}", flush=True)
    out["load_after"] = os.getloadavg()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
