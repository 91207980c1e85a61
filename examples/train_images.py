"""Train a small image classifier from a folder of photos, end to end, with fastdata.

    python examples/train_images.py PHOTOS WORKDIR [--epochs 10] [--size 64] [--batch-size 64]

1. ``PHOTOS`` is an ImageFolder tree (one folder per class, JPEG/PNG files of any size). It is converted
   once into tar shards in ``WORKDIR/shards`` (``fastdata convert``; rerunning the script reuses them,
   and a conversion killed half-way resumes).
2. The shards are read by ``fd.TarShardDataset`` straight from the folder (through its manifest), each
   photo decoded and resized as it is read (``fd.Decoder("torch", size=...)``), then augmented in the
   worker by :func:`augment`: a random resized crop and a horizontal flip, written by hand with torch
   (the usual torchvision transforms do the same; use them where torchvision is installed).
3. ``fd.Loader(..., monitor=True)`` runs the workers, hands batches over through shared memory, and logs
   the data stall and where the time goes while the model trains (logger ``fastdata.monitor``).
4. A small CNN trains with SGD; a checkpoint (model, optimiser and the loader's position) is written
   after every ``--checkpoint-every`` batches and at the end of each epoch. Rerun the same command after
   a kill, and training resumes at the exact batch where the checkpoint was taken: the same batches, in
   the same order, as a run that was never stopped.

Everything runs on the CPU as well as on a GPU (``--device cuda``).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fastdata as fd
from fastdata.convert import convert

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)  # ImageNet's channel means and deviations
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def random_resized_crop(image: torch.Tensor, size: int, scale: tuple[float, float] = (0.5, 1.0)) -> torch.Tensor:
    """A crop of a random area (``scale`` of the image) and aspect ratio (3/4 to 4/3), resized to
    ``size`` x ``size``: the augmentation most image classifiers train with."""
    _, h, w = image.shape
    for _ in range(10):
        area = h * w * torch.empty(()).uniform_(*scale).item()
        ratio = math.exp(torch.empty(()).uniform_(math.log(3 / 4), math.log(4 / 3)).item())
        ch, cw = round(math.sqrt(area / ratio)), round(math.sqrt(area * ratio))
        if 0 < ch <= h and 0 < cw <= w:
            top = int(torch.randint(0, h - ch + 1, ()))
            left = int(torch.randint(0, w - cw + 1, ()))
            image = image[:, top : top + ch, left : left + cw]
            break
    resized = nn.functional.interpolate(image[None].float(), size=(size, size), mode="bilinear", antialias=True)
    return resized[0]


class Augment:
    """The per-sample transform (it runs in the DataLoader workers): crop, flip, normalise; the label as
    an int64. A class, not a lambda, so that it pickles into ``spawn`` workers too."""

    def __init__(self, size: int, train: bool = True) -> None:
        self.size, self.train = size, train

    def __call__(self, sample: dict[str, Any]) -> dict[str, torch.Tensor]:
        image = sample["jpg"]  # uint8 [3, H, W]: every photo, whatever its format, is stored as "jpg"
        if self.train:
            image = random_resized_crop(image, self.size)
            if torch.rand(()) < 0.5:
                image = image.flip(-1)
        else:
            image = image.float()
        image = (image / 255 - MEAN) / STD
        return {"image": image, "label": torch.tensor(sample["cls"], dtype=torch.int64), "key": sample["__key__"]}


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head: enough to learn a small photo folder, fast on a CPU."""

    def __init__(self, classes: int, width: int = 32) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

        self.features = nn.Sequential(block(3, width), block(width, 2 * width), block(2 * width, 4 * width))
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def shards_of(photos: str, workdir: Path, workers: int) -> tuple[Path, int]:
    """The shards of ``photos`` in ``workdir/shards`` (converted on first use, resumed if a conversion was
    killed), and the number of classes."""
    out = workdir / "shards"
    manifest = convert(photos, str(out), shard_count=max(2, workers), shuffle=True, seed=0, workers=1, progress=False)
    return out, len(manifest["classes"])


def save(path: Path, state: dict[str, Any]) -> None:
    """Write a checkpoint atomically: a run killed while saving keeps the previous one."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    shards, classes = shards_of(args.photos, workdir, args.workers)
    # decode at a little more than the crop, so that random crops keep most of the photo's detail
    decode = fd.Decoder("torch", size=(round(args.size * 1.15), round(args.size * 1.15)))
    ds = fd.TarShardDataset(
        shards, shuffle=True, seed=args.seed, batch_size=args.batch_size, decode=decode, transform=Augment(args.size)
    )
    loader = fd.Loader(ds, num_workers=args.workers, monitor=args.monitor or None)
    model = SmallCNN(classes).to(args.device)
    optimiser = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    checkpoint = workdir / "checkpoint.pt"
    step, history = 0, []
    if checkpoint.exists():  # resume: the model, the optimiser, and the loader at the exact batch
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimiser.load_state_dict(state["optimiser"])
        loader.load_state_dict(state["loader"])
        step, history = state["step"], state["history"]
        print(f"resumed at epoch {loader.epoch}, step {step}")
    loss_fn = nn.CrossEntropyLoss()
    try:
        for epoch in range(loader.epoch, args.epochs):
            loader.set_epoch(epoch)
            model.train()
            total, correct, seen = 0.0, 0, 0
            for batch in loader:
                images, labels = batch["image"].to(args.device), batch["label"].to(args.device)
                logits = model(images)
                loss = loss_fn(logits, labels)
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                step += 1
                total += loss.item() * len(labels)
                correct += int((logits.argmax(1) == labels).sum())
                seen += len(labels)
                history.append({"loss": round(loss.item(), 4), "keys": list(batch["key"])})
                if args.checkpoint_every and step % args.checkpoint_every == 0:
                    save(checkpoint, _state(model, optimiser, loader, step, history))
                if args.stop_after and step >= args.stop_after:  # for the tests: a run cut mid-epoch
                    return {"step": step, "history": history, "stopped": True}
            loader.set_epoch(epoch + 1)  # the checkpoint of a finished epoch resumes at the next one
            save(checkpoint, _state(model, optimiser, loader, step, history))
            print(
                f"epoch {epoch}: loss {total / max(seen, 1):.3f}, accuracy {correct / max(seen, 1):.2f} ({seen} photos)"
            )
    finally:
        loader.close()
    torch.save(model.state_dict(), workdir / "model.pt")
    return {"step": step, "history": history, "stopped": False}


def _state(model: nn.Module, optimiser: torch.optim.Optimizer, loader: Any, step: int, history: list[Any]) -> dict:
    return {
        "model": model.state_dict(),
        "optimiser": optimiser.state_dict(),
        "loader": loader.state_dict(),  # the epoch and the batches of it already trained on
        "step": step,
        "history": history,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("photos", help="an ImageFolder tree: one folder per class, JPEG/PNG files of any size")
    p.add_argument("workdir", help="where the shards, checkpoint and model go")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--size", type=int, default=64, help="training resolution, in pixels (default 64)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument(
        "--workers", type=int, default=min(2, os.cpu_count() or 1), help="DataLoader workers (default: up to 2)"
    )
    p.add_argument("--checkpoint-every", type=int, default=50, metavar="N", help="batches between checkpoints")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-monitor", dest="monitor", action="store_false", help="no fastdata.monitor log lines")
    p.add_argument("--stop-after", type=int, default=0, help=argparse.SUPPRESS)  # tests: stop mid-epoch
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return train(parse_args(argv))


if __name__ == "__main__":
    main()
