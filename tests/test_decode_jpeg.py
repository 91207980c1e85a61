"""The default image decoder (``image_backend="auto"``): JPEGs decoded by simplejpeg give exactly PIL's
pixels (every kind, colour layout, size and scale it takes on), the rest falls back to PIL; and GIF
members decode (their first frame) instead of staying bytes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import fastdata as fd
from fastdata.core.errors import DecodeFailed
from fastdata.formats._decode import Decoder
from fastdata.formats._images import fast_jpeg_array
from tests.datagen import write_tar


def _photo(h: int, w: int, seed: int = 0) -> Image.Image:
    """Smooth colour gradients, hard edges and noise, as photographs have."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / 9 + y / 23), 128 + 90 * np.cos(y / 7), (x + y) % 256], -1)
    img[(x - w / 2) ** 2 + (y - h / 3) ** 2 < (min(h, w) / 4) ** 2] = (250, 20, 60)
    img += rng.normal(0, 8, img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def _jpeg(img: Image.Image, **options: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=options.pop("quality", 90), **options)
    return buf.getvalue()


def jpegs() -> dict[str, bytes]:
    """The kinds of JPEG photo folders hold, at even and odd sizes (edge blocks, chroma rounding)."""
    out = {}
    for h, w in ((96, 128), (131, 257)):
        img = _photo(h, w)
        out[f"420-{h}x{w}"] = _jpeg(img)
        out[f"444-{h}x{w}"] = _jpeg(img, subsampling=0)
        out[f"422-{h}x{w}"] = _jpeg(img, subsampling=1)
        out[f"progressive-{h}x{w}"] = _jpeg(img, progressive=True)
        out[f"gray-{h}x{w}"] = _jpeg(img.convert("L"))
        out[f"q50-restarts-{h}x{w}"] = _jpeg(img, quality=50, restart_marker_blocks=4)
    return out


# (size, reduce): as stored; smaller, at reduced DCT scale and not; the shorter side; the stored size
SIZES: list[Any] = [(None, True), ((40, 56), True), ((40, 56), False), (40, True), ((96, 128), True)]


@pytest.mark.parametrize("color", ["rgb", "rgba", "gray"])
@pytest.mark.parametrize(("size", "reduce"), SIZES, ids=str)
def test_the_default_decoder_gives_pils_pixels(color: str, size: Any, reduce: bool) -> None:
    auto = Decoder("numpy", size=size, color=color, reduce=reduce)  # type: ignore[arg-type]
    pil = Decoder("numpy", "pil", size=size, color=color, reduce=reduce)  # type: ignore[arg-type]
    for name, data in jpegs().items():
        got, want = auto.image(data), pil.image(data)
        assert got.dtype == want.dtype == np.uint8 and got.shape == want.shape, (name, got.shape, want.shape)
        assert np.array_equal(got, want), (name, int(np.abs(got.astype(int) - want).max()))


def test_simplejpeg_decodes_what_it_matches_and_leaves_the_rest_to_pil() -> None:
    files = jpegs()
    for name in ("420-96x128", "444-131x257", "progressive-131x257", "gray-96x128"):
        assert fast_jpeg_array(files[name]) is not None, name
    assert fast_jpeg_array(files["gray-96x128"], "gray") is not None
    img = _photo(48, 64)
    cmyk = _jpeg(img.convert("CMYK"))
    png = io.BytesIO()
    img.save(png, format="PNG")
    # CMYK: libjpeg's conversion is 1 away from Pillow's; a colour file to gray: Pillow computes the luma
    # from the colours; "keep": PIL's modes; a PNG is no JPEG
    assert fast_jpeg_array(cmyk) is None
    assert fast_jpeg_array(files["420-96x128"], "gray") is None
    assert fast_jpeg_array(files["420-96x128"], "keep") is None
    assert fast_jpeg_array(png.getvalue()) is None
    for kind in ("torch", "numpy"):
        got = np.asarray(Decoder(kind).image(cmyk))  # type: ignore[arg-type]
        want = np.asarray(Decoder(kind, "pil").image(cmyk))  # type: ignore[arg-type]
        assert np.array_equal(got, want)


def test_damaged_jpegs_are_decoded_or_refused_as_pil_does() -> None:
    data = jpegs()["420-96x128"]
    # bytes between two markers: libjpeg warns ("extraneous bytes before marker"), PIL decodes anyway,
    # simplejpeg (strict) refuses: the default falls back to PIL and gives PIL's pixels
    sos = data.index(b"\xff\xda")
    padded = data[:sos] + b"\x00\x00\x00" + data[sos:]
    assert np.array_equal(Decoder("numpy").image(padded), Decoder("numpy", "pil").image(padded))
    # cut short: PIL refuses, and so does the default, naming the sample
    cut = {"__key__": "k", "__url__": "shard.tar", "jpg": data[: len(data) // 2]}
    with pytest.raises(DecodeFailed, match=r"shard.tar: sample 'k', member '.jpg'"):
        Decoder("numpy")(cut)
    with pytest.raises(DecodeFailed):
        Decoder("numpy", "pil")(dict(cut))


def _gif() -> tuple[bytes, np.ndarray]:
    """A two-frame GIF and its first frame's RGB pixels."""
    frames = [_photo(24, 32, seed).quantize(32) for seed in (1, 2)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    first = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    return buf.getvalue(), first


@pytest.mark.parametrize("backend", ["auto", "pil", "cv2"])
def test_gif_members_decode_to_their_first_frame(tmp_path: Path, backend: str) -> None:
    gif, first = _gif()
    shard = str(tmp_path / "gifs.tar")
    write_tar(shard, [{"__key__": f"s{i}", "gif": gif, "cls": b"1"} for i in range(3)])
    ds = fd.TarShardDataset(shard, decode=Decoder("numpy", backend), batch_size=3)  # type: ignore[arg-type]
    (batch,) = list(ds)
    assert batch["gif"].shape == (3, 24, 32, 3)  # decoded and batched, not a list of bytes
    for image in batch["gif"]:
        assert np.array_equal(np.asarray(image), first)
    ds.close()
