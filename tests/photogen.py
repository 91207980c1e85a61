"""A folder of photos as users have them: JPEG and PNG files of many sizes (200-600 px a side by
default), a few grayscale, in one folder per class. Made by the tests, small and seeded.

The pixels are photo-like (a smooth gradient, a colour and a little noise), not static, so they encode
and decode at the speed real photos do, and fast enough to make in a test.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image


def photo(rng: np.random.Generator, width: int, height: int, *, gray: bool = False) -> Image.Image:
    """A photo-like image of ``width`` x ``height`` pixels."""
    ramp = (np.arange(width, dtype=np.uint16)[None, :] * 255 // max(width - 1, 1)).astype(np.uint8)
    ramp = ramp + (np.arange(height, dtype=np.uint16)[:, None] * 127 // max(height - 1, 1)).astype(np.uint8)
    pixels = (
        ramp[:, :, None]
        + rng.integers(0, 256, 3, dtype=np.uint8)
        + rng.integers(0, 12, (height, width, 3), dtype=np.uint8)
    )
    img = Image.fromarray(pixels.astype(np.uint8), "RGB")
    return img.convert("L") if gray else img


def make_photo_folder(
    root: str | os.PathLike[str],
    *,
    count: int = 12,
    classes: int = 3,
    sizes: tuple[int, int] = (200, 600),
    seed: int = 0,
    gray_every: int = 5,
    png_every: int = 4,
) -> list[tuple[str, int, tuple[int, int]]]:
    """An ImageFolder tree ``root/class_k/photo_NNNN.{jpg,png}`` of ``count`` photos, each of its own
    size (width and height drawn from ``sizes``, inclusive), every ``gray_every``-th grayscale and every
    ``png_every``-th a PNG. Returns ``(relative path, label, (height, width))`` per photo."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        label = i % classes
        width, height = (int(v) for v in rng.integers(sizes[0], sizes[1] + 1, 2))
        ext = "png" if i % png_every == png_every - 1 else "jpg"
        name = f"class_{label}/photo_{i:04d}.{ext}"
        path = Path(root) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        photo(rng, width, height, gray=i % gray_every == gray_every - 1).save(
            buf, format="PNG" if ext == "png" else "JPEG", quality=85
        )
        path.write_bytes(buf.getvalue())
        out.append((name, label, (height, width)))
    return out


def convert_photos(root: str | os.PathLike[str], out: str | os.PathLike[str], *, shards: int = 2, **photos: int) -> str:
    """A photo folder made by :func:`make_photo_folder` and converted to tar shards in ``out`` by
    ``fastdata convert`` (as a user would); returns ``out``."""
    from fastdata.convert import convert

    make_photo_folder(root, **photos)  # type: ignore[arg-type]
    convert(str(root), str(out), shard_count=shards, progress=False, fsync=False)
    return str(out)
