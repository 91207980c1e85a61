"""Decoder(color=...): real photos of every kind (grayscale, palette with transparency, CMYK, 16-bit, alpha,
1-bit) come out in one colour layout, so a batch of them collates, through DataLoader workers, from tar
shards and HDF5, by PIL and OpenCV, at full and at reduced scale."""

from __future__ import annotations

import io
import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import ConfigError
from fastdata.formats._decode import Decoder
from tests.datagen import write_tar

H, W = 24, 32
# OpenCV's CMYK -> RGB formula rounds differently from Pillow's (measured: at most 2), and its luma weights
# are fixed-point (at most 1); everything else is exact
CV2_TOLERANCE = {"cmyk.jpg": 2}
CV2_GRAY_TOLERANCE = 1


def _pixels(channels: int, h: int, w: int, seed: int) -> np.ndarray:
    """Smooth gradients with a little noise, as photographs are: ``h x w x channels`` uint8."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 256 // w + y * 64 // h + 40 * k) % 256 for k in range(channels)], -1).astype(float)
    return np.clip(base + rng.normal(0, 5, base.shape), 0, 255).astype(np.uint8)


def _save(img: Image.Image, fmt: str, **options: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **options)
    return buf.getvalue()


def photos(h: int = H, w: int = W) -> dict[str, bytes]:
    """One file of each kind real photo folders hold, written by Pillow as a camera or an editor would."""
    gray = _pixels(1, h, w, 1)[..., 0]
    deep = gray.astype(np.uint16) * 257 + np.random.default_rng(2).integers(0, 257, (h, w)).astype(np.uint16)
    palette = Image.fromarray(_pixels(3, h, w, 3), "RGB").quantize(16)
    return {
        "rgb.jpg": _save(Image.fromarray(_pixels(3, h, w, 0), "RGB"), "JPEG", quality=90),
        "gray.jpg": _save(Image.fromarray(gray, "L"), "JPEG", quality=90),
        "gray.png": _save(Image.fromarray(gray, "L"), "PNG"),
        "gray-alpha.png": _save(Image.fromarray(_pixels(2, h, w, 4), "LA"), "PNG"),
        "palette-transparent.png": _save(palette, "PNG", transparency=3),
        "cmyk.jpg": _save(Image.fromarray(_pixels(4, h, w, 5), "CMYK"), "JPEG", quality=90),
        "16-bit.png": _save(Image.fromarray(deep), "PNG"),  # mode I;16
        "rgba.png": _save(Image.fromarray(_pixels(4, h, w, 6), "RGBA"), "PNG"),
        "1-bit.png": _save(Image.fromarray(gray > 128), "PNG"),
    }


def pillow(data: bytes, mode: str = "RGB") -> np.ndarray:
    """What Pillow's own ``convert(mode)`` gives, ``HxWxC``; 16-bit samples first reduced to their high
    byte (the documented scaling: Pillow's convert would clip every value above 255)."""
    img = Image.open(io.BytesIO(data))
    img.load()
    if img.mode.startswith("I;16"):
        img = Image.fromarray((np.asarray(img) >> 8).astype(np.uint8), "L")
    arr = np.asarray(img.convert(mode))
    return arr[..., None] if arr.ndim == 2 else arr


def assert_close(got: np.ndarray, name: str, expected: np.ndarray, backend: str, gray: bool = False) -> None:
    assert got.dtype == np.uint8 and got.shape == expected.shape, (name, got.shape, got.dtype)
    worst = int(np.abs(got.astype(np.int16) - expected).max())
    allowed = max(CV2_TOLERANCE.get(name, 0), CV2_GRAY_TOLERANCE if gray else 0) if backend == "cv2" else 0
    assert worst <= allowed, (name, worst)


DECODES: dict[str, Callable[[], Any]] = {"pil": lambda: "torch", "cv2": lambda: Decoder("torch", "cv2")}


@pytest.mark.parametrize("backend", ["pil", "cv2"])
def test_a_batch_of_mixed_photos_collates_through_tar_workers(tmp_path: Path, backend: str) -> None:
    files = photos()
    names = sorted(files)
    # one member name for every image, so that a batch has one key (the decoders read the format from
    # the bytes); two shards, so that each of the two workers reads a batch of every kind
    shards = []
    for s in range(2):
        shards.append(str(tmp_path / f"photos-{s}.tar"))
        write_tar(shards[-1], [{"__key__": f"{s}-{i}", "png": files[n]} for i, n in enumerate(names)])
    ds = fd.TarShardDataset(shards, decode=DECODES[backend](), batch_size=len(names))
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=multiprocessing.get_context("fork"))
    batches = list(loader)  # collated in the workers: fails if any image had another channel count
    assert len(batches) == 2
    for batch in batches:
        images = batch["png"]
        assert isinstance(images, torch.Tensor) and images.dtype == torch.uint8
        assert tuple(images.shape) == (len(names), 3, H, W)
        for key, image in zip(batch["__key__"], images):
            name = names[int(key.split("-")[1])]
            assert_close(image.permute(1, 2, 0).numpy(), name, pillow(files[name]), backend)


@pytest.mark.parametrize("backend", ["pil", "cv2"])
def test_mixed_photos_in_hdf5_collate_through_workers(tmp_path: Path, backend: str) -> None:
    files = photos()
    names = sorted(files)
    path = str(tmp_path / "photos.h5")
    with h5py.File(path, "w") as f:
        f["label"] = np.arange(len(names), dtype=np.int64)
        field = f.create_dataset("image", (len(names),), dtype=h5py.vlen_dtype(np.uint8))
        for i, n in enumerate(names):
            field[i] = np.frombuffer(files[n], dtype=np.uint8)
    ds = fd.HDF5Dataset(path, ("label", "image"), decode=Decoder("torch", backend))  # type: ignore[arg-type]
    loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context=multiprocessing.get_context("fork"))
    seen = 0
    for batch in loader:
        assert batch["image"].dtype == torch.uint8 and tuple(batch["image"].shape[1:]) == (3, H, W)
        for label, image in zip(batch["label"].tolist(), batch["image"]):
            assert_close(image.permute(1, 2, 0).numpy(), names[label], pillow(files[names[label]]), backend)
            seen += 1
    assert seen == len(names)


@pytest.mark.parametrize("backend", ["pil", "cv2"])
@pytest.mark.parametrize(("color", "mode", "channels"), [("gray", "L", 1), ("rgba", "RGBA", 4)])
def test_the_other_layouts(backend: str, color: str, mode: str, channels: int) -> None:
    for name, data in photos().items():
        got = Decoder("numpy", backend, color=color).image(data)  # type: ignore[arg-type]
        assert got.shape == (H, W, channels)
        assert_close(got, name, pillow(data, mode), backend, gray=color == "gray")


def test_keep_gives_the_file_as_stored() -> None:
    files = photos()
    keep = Decoder("numpy", color="keep")
    assert keep.image(files["16-bit.png"]).dtype == np.uint16
    assert np.array_equal(
        keep.image(files["16-bit.png"])[..., 0], np.asarray(Image.open(io.BytesIO(files["16-bit.png"])))
    )
    assert keep.image(files["cmyk.jpg"]).shape == (H, W, 4)
    assert keep.image(files["gray-alpha.png"]).shape == (H, W, 2)
    assert keep.image(files["gray.jpg"]).shape == (H, W, 1)
    assert Decoder("numpy", "cv2", color="keep").image(files["rgba.png"]).shape == (H, W, 4)
    assert Decoder("pil", color="keep").image(files["palette-transparent.png"]).mode == "P"
    assert Decoder("pil").image(files["palette-transparent.png"]).mode == "RGB"


@pytest.mark.parametrize("backend", ["pil", "cv2"])
def test_reduced_scale_decode_keeps_one_layout(backend: str) -> None:
    """Decoder(size=..., reduce=True): 1/4-scale JPEG decodes and resized PNGs, all 3 x 24 x 32 uint8; PIL's
    equal to Pillow's own draft, convert and resize; OpenCV's within 2 of them (with the 'area' filter)."""
    big = photos(4 * H, 4 * W)
    decoder = Decoder("torch", backend, size=(H, W), resize="area")  # type: ignore[arg-type]
    for name, data in big.items():
        got = decoder.image(data)
        assert tuple(got.shape) == (3, H, W) and got.dtype == torch.uint8, name
        img = Image.open(io.BytesIO(data))
        if img.format == "JPEG":
            img.draft(None, (W, H))
            assert img.size == (W, H)  # decoded at 1/4 scale: no resize left to do
        img.load()
        if img.mode.startswith("I;16"):
            img = Image.fromarray((np.asarray(img) >> 8).astype(np.uint8), "L")
        expected = np.asarray(img.convert("RGB").resize((W, H), Image.Resampling.BOX))
        worst = int(np.abs(got.permute(1, 2, 0).numpy().astype(np.int16) - expected).max())
        assert worst <= (2 if backend == "cv2" else 0), (name, worst)


def test_exif_orientation_is_left_alone_by_both_backends() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees to display": a phone held upright
    data = _save(Image.fromarray(_pixels(3, H, W, 7), "RGB"), "JPEG", quality=90, exif=exif.tobytes())
    pil, cv2 = Decoder("numpy").image(data), Decoder("numpy", "cv2").image(data)
    assert pil.shape == cv2.shape == (H, W, 3) and np.array_equal(pil, cv2)


def test_color_is_checked_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"color='RGB' is not one of 'rgb', 'gray', 'rgba', 'keep'"):
        Decoder("torch", color="RGB")  # type: ignore[arg-type]
