"""The tar-shard backend of ``fastdata bench``: local WebDataset-format shards.

SPEC: a shard pattern (``data/train-{000000..000099}.tar``, ``data/*.tar``), one shard, or a folder
holding ``*.tar`` shards. Shards on S3 (``s3://b/train-{0..9}.tar``) are the ``s3`` backend's, which
takes the S3 options (endpoint, retries, read-ahead) too; ``--format tar`` still reads them, through
the AWS chain's settings. Options (``-o KEY=VALUE``): ``batch_size`` (the dataset batches itself, as the
README advises: ``fastdata bench`` passes ``--batch-size``, 64 by default; ``batch_size=null`` reads
sample by sample, batched by the DataLoader), ``decode`` ("raw", "pil", "numpy", "torch"; default
"torch": images decoded to tensors, as training reads them; "raw" keeps the bytes, and the report says
so), ``size`` (``HxW``, e.g. ``224x224``, or one int: images resized as they are decoded), ``indexed``
(true: the map-style :class:`~fastdata.IndexedTarDataset` with random access, batched by the DataLoader;
default false: the streaming :class:`~fastdata.TarShardDataset`), ``shuffle`` (default true),
``shuffle_window``, ``on_error``, ``fields`` (each field from alternatives, for shards storing some images as
``.jpg`` and others as ``.png``: ``-o 'fields={"image": "jpg;jpeg;png;webp", "label": "cls"}'``).

Images of different sizes (a folder of real photos) do not batch as they are stored: before the sweep,
:func:`prepare` looks at a few images' headers and, when their sizes differ and neither ``decode`` nor
``size`` was given, measures ``decode="torch"`` at ``size=(224, 224)``, saying so in the report (see
:mod:`fastdata.bench.backends`). A folder is read through its manifest, as the datasets read it.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from braceexpand import braceexpand

from fastdata.core.errors import ConfigError

NAME = "tar"
PRIORITY = 10  # ".tar" is specific: ask before the backends that take any s3:// prefix or folder
EXTRA = None
DEMO_BATCH_SIZE = 64
DATASET_BATCHES = True  # TarShardDataset(batch_size=...): whole batches made in the worker
DEFAULT_DECODE = "torch"  # as every shard source: fastdata.bench.backends._shards
# decode to tensors (the usual training input); a shuffle window of 512 samples, as the demo's epochs
# are short
DEMO_OPTIONS: dict[str, Any] = {"decode": "torch", "shuffle_window": 512}
DEMO_SHARDS = 4
DEMO_PER_SHARD = 1000
DEMO_SIZE = (128, 128)


def _first(spec: str) -> str:
    return next(iter(braceexpand(spec)), spec)


def detect(spec: str) -> bool:
    """A local name ending in ``.tar`` (after brace expansion), or a local folder with ``.tar`` files in
    it. Not a remote URL: ``s3://`` shards go to the ``s3`` backend."""
    if "://" in spec:
        return False
    if _first(spec).endswith(".tar"):
        return True
    return os.path.isdir(spec) and any(Path(spec).glob("*.tar"))


def _urls(spec: str) -> list[str]:
    """The shards of SPEC, a folder read through its manifest as the datasets read it."""
    from fastdata.datasets.tar import tar_urls

    return tar_urls(spec)


def _check(options: dict[str, Any]) -> None:
    from fastdata.bench.backends._shards import OPTIONS

    unknown = set(options) - OPTIONS
    if unknown:
        raise ConfigError(
            f"tar backend: unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(OPTIONS))}"
        )


def _peek(urls: list[str]) -> list[Any]:
    from fastdata.bench.backends._shards import peek
    from fastdata.bench.backends._sizing import PEEK

    return peek(urls, PEEK)[0]


def prepare(spec: str, options: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The options to sweep, ``decode`` chosen so that batches batch (see the module doc), which decode
    that is, in words, and what is read, for the report."""
    from fastdata.bench.backends._sizing import plan_decode

    _check(options)
    urls = _urls(spec)
    out, note = plan_decode(options, DEFAULT_DECODE, lambda: _peek(urls), batches=True)
    return out, note, {"source": f"local tar shards ({len(urls)})"}


def open(spec: str, **options: Any) -> Any:
    """A :class:`~fastdata.TarShardDataset` (or, with ``indexed=True``, an :class:`~fastdata.IndexedTarDataset`)."""
    from fastdata.bench.backends._shards import open_shards

    _check(options)
    return open_shards(_urls(spec), options)


class DemoImages:
    """Photo-like JPEGs made fast: a smooth gradient, a colour, and noise from a small pool (drawing
    fresh noise per image costs as much as encoding it). They decode like photos, not like static."""

    def __init__(self, rng: np.random.Generator, size: tuple[int, int], pool: int = 16) -> None:
        w, h = size
        self.rng = rng
        self.ramp = 2 * np.arange(w, dtype=np.uint8)[None, :, None] + np.arange(h, dtype=np.uint8)[:, None, None]
        self.noise = [rng.integers(0, 24, (h, w, 3), dtype=np.uint8) for _ in range(pool)]

    def jpeg(self) -> bytes:
        from PIL import Image

        noise = self.noise[int(self.rng.integers(0, len(self.noise)))]
        img = self.ramp + self.rng.integers(0, 256, 3, dtype=np.uint8) + noise  # uint8 wraps, as intended
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=85)
        return buf.getvalue()


def write_demo_shards(
    folder: Path,
    *,
    shards: int = DEMO_SHARDS,
    per_shard: int = DEMO_PER_SHARD,
    size: tuple[int, int] = DEMO_SIZE,
    seed: int = 0,
) -> str:
    """Shards of small JPEGs with class labels; returns their brace pattern."""
    rng = np.random.default_rng(seed)
    images = DemoImages(rng, size)
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        # plain ustar headers, as `tar cf` writes: webdataset's ShardWriter is ~5x slower to write
        with tarfile.open(folder / f"demo-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(per_shard):
                key = f"{s * per_shard + i:08d}"
                for ext, data in (("jpg", images.jpeg()), ("cls", str(int(rng.integers(0, 10))).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime = len(data), 1_700_000_000
                    tf.addfile(info, io.BytesIO(data))
    return str(folder / f"demo-{{{0:06d}..{shards - 1:06d}}}.tar")


@contextlib.contextmanager
def demo(folder: Path, scale: float = 1.0) -> Iterator[str]:
    """4 shards of 1000 JPEGs (128x128) and labels, about 25 MB (``scale`` times as many per shard),
    swept with ``decode="torch"``."""
    yield write_demo_shards(Path(folder), per_shard=max(16, round(DEMO_PER_SHARD * scale)))
