"""Decoder(size=...): images come out at the asked size from PIL and OpenCV, JPEGs are decoded at reduced
scale first (close to, but not the same as, full decode + resize), other formats are not, and bad
options fail at construction."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastdata.core.errors import ConfigError
from fastdata.formats._decode import Decoder
from fastdata.formats._images import reduction, target_size


def picture(w: int, h: int, fmt: str = "JPEG", seed: int = 0) -> bytes:
    """Smooth shapes with a little noise, as photographs are (random noise would not survive any scaling)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / 23), 128 + 100 * np.cos(y / 17), (x + y) * 255 / (w + h)], -1)
    img[(x - w / 2) ** 2 + (y - h / 3) ** 2 < (h / 5) ** 2] = (250, 30, 30)
    img += rng.normal(0, 4, img.shape)
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format=fmt, quality=90)
    return buf.getvalue()


@pytest.mark.parametrize("backend", ["pil", "cv2"])
@pytest.mark.parametrize("mode", ["numpy", "torch", "pil"])
def test_images_come_out_at_the_asked_size(backend: str, mode: str) -> None:
    if mode == "pil" and backend == "cv2":
        return  # refused at construction, tested below
    data = picture(320, 240)
    exact = Decoder(mode, backend, size=(60, 100)).image(data)  # type: ignore[arg-type]
    short = Decoder(mode, backend, size=48).image(data)  # type: ignore[arg-type]
    if mode == "pil":
        assert exact.size == (100, 60) and short.size == (64, 48)
    elif mode == "torch":
        assert tuple(exact.shape) == (3, 60, 100) and tuple(short.shape) == (3, 48, 64)
    else:
        assert exact.shape == (60, 100, 3) and short.shape == (48, 64, 3) and exact.dtype == np.uint8


@pytest.mark.parametrize(("backend", "resize"), [("pil", "bilinear"), ("cv2", "area")])
def test_a_jpeg_is_decoded_at_reduced_scale_close_to_the_full_decode(backend: str, resize: str) -> None:
    data = picture(512, 512)
    full = Decoder("numpy", backend, size=(64, 64), resize=resize, reduce=False).image(data)  # type: ignore[arg-type]
    less = Decoder("numpy", backend, size=(64, 64), resize=resize).image(data)  # type: ignore[arg-type]
    diff = np.abs(full.astype(np.int16) - less.astype(np.int16))
    assert diff.any(), "the reduced decode gave the very same pixels: was the JPEG decoded at full scale?"
    assert diff.mean() < 3, diff.mean()


@pytest.mark.parametrize("backend", ["pil", "cv2"])
def test_other_formats_are_decoded_in_full(backend: str) -> None:
    data = picture(256, 256, fmt="PNG")
    full = Decoder("numpy", backend, size=(32, 32), reduce=False).image(data)  # type: ignore[arg-type]
    assert np.array_equal(full, Decoder("numpy", backend, size=(32, 32)).image(data))  # type: ignore[arg-type]


def test_the_scale_never_makes_the_image_smaller_than_the_target() -> None:
    assert reduction(512, 512, (224, 224)) == 2
    assert reduction(512, 512, (64, 64)) == 8
    assert reduction(446, 1000, (224, 224)) == 1  # 1/2 scale gives 223 columns, one short
    assert reduction(447, 1000, (224, 224)) == 2  # libjpeg rounds up: 224
    assert target_size(640, 480, 224) == (298, 224) and target_size(480, 640, (10, 20)) == (20, 10)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "numpy", "size": 0}, "positive"),
        ({"mode": "numpy", "size": (224,)}, "positive"),
        ({"mode": "numpy", "size": (224, 224.0)}, "positive"),
        ({"mode": "raw", "size": 224}, "decoded images"),
        ({"mode": "numpy", "size": 224, "resize": "fast"}, "resize='fast'"),
    ],
)
def test_bad_options_fail_at_construction(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Decoder(**kwargs)


def test_a_size_from_a_config_file_becomes_a_tuple() -> None:
    assert Decoder("numpy", size=[12, 16]).size == (12, 16)  # type: ignore[arg-type]
