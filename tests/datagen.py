"""Small, seeded test data made by the tests themselves: JPEG corpora and tar shards."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def jpeg_bytes(rng: np.random.Generator, size: tuple[int, int] = (32, 24), quality: int = 90) -> bytes:
    """A small random JPEG (width, height)."""
    w, h = size
    pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def make_image_folder(
    root: str | os.PathLike[str],
    *,
    classes: int = 3,
    per_class: int = 10,
    size: tuple[int, int] = (32, 24),
    seed: int = 0,
) -> list[tuple[str, int]]:
    """An ImageFolder tree ``root/class_k/img_NNNN.jpg``; returns ``(relative path, label)`` pairs."""
    rng = np.random.default_rng(seed)
    out = []
    for c in range(classes):
        folder = Path(root) / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            name = f"class_{c}/img_{i:04d}.jpg"
            (Path(root) / name).write_bytes(jpeg_bytes(rng, size))
            out.append((name, c))
    return out


def write_tar(
    path: str | os.PathLike[str], samples: list[dict[str, bytes]], *, fmt: int = tarfile.USTAR_FORMAT
) -> None:
    """A WebDataset-layout tar: each sample dict has ``__key__`` and ``ext: bytes`` members."""
    with tarfile.open(path, "w", format=fmt) as tf:
        for sample in samples:
            for ext, data in sample.items():
                if ext == "__key__":
                    continue
                info = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                info.size = len(data)
                info.mtime = 1_700_000_000
                tf.addfile(info, io.BytesIO(data))


def make_shards(
    folder: str | os.PathLike[str],
    *,
    shards: int = 4,
    per_shard: int = 25,
    seed: int = 0,
    jpeg: bool = False,
    prefix: str = "train",
) -> list[str]:
    """Tar shards ``folder/train-NNNNNN.tar`` with unique keys ``sNNNNNN`` and ``cls``/``bin`` (or ``jpg``)."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    paths = []
    for s in range(shards):
        samples = []
        for i in range(per_shard):
            n = s * per_shard + i
            payload = jpeg_bytes(rng) if jpeg else rng.bytes(int(rng.integers(10, 2000)))
            samples.append({"__key__": f"s{n:06d}", "cls": str(n % 7).encode(), ("jpg" if jpeg else "bin"): payload})
        path = os.path.join(folder, f"{prefix}-{s:06d}.tar")
        write_tar(path, samples)
        paths.append(path)
    return paths
