"""Turning member bytes into values, chosen by the member's extension.

``decode="raw"`` keeps bytes (the default: the cheapest to move between processes). Otherwise images
(``jpg``, ``png``, ``gif`` (its first frame) ...) become a PIL image (``"pil"``), an ``HxWxC`` uint8 array
(``"numpy"``) or a ``CxHxW`` uint8 tensor (``"torch"``), decoded by PIL or OpenCV (JPEGs by simplejpeg where
it gives PIL's pixels); ``cls`` becomes an int, ``json`` a value, ``txt``
a str and ``npy`` an array. Anything else stays bytes. A decoder that rejects the bytes raises
:class:`~fastdata.core.errors.DecodeFailed` naming the sample and member.

Every image comes out in one colour layout, ``color="rgb"`` (3 channels, uint8) unless told otherwise, so
that a batch of real photos (grayscale, palette, CMYK, 16-bit, alpha) stacks; the layouts and how each
backend reaches them are in :mod:`fastdata.formats`.

``size=`` resizes images as they are decoded, and a JPEG larger than twice the target is decoded at
1/2, 1/4 or 1/8 scale first (libjpeg's DCT scaling, through PIL's ``Image.draft`` or OpenCV's
``IMREAD_REDUCED_*``), which skips most of the decoding work; see :class:`Decoder` for what it costs in
pixels.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fastdata.core.errors import ConfigError, DecodeFailed, check_choice
from fastdata.formats._images import (
    Color,
    ResizeMethod,
    Size,
    cv2_array,
    fast_jpeg_array,
    pil_array,
    pil_image,
)

DecodeMode = Literal["raw", "pil", "numpy", "torch"]
ImageBackend = Literal["auto", "pil", "cv2"]

IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "webp", "tif", "tiff", "gif"})
INT_EXTS = frozenset({"cls", "cls2", "index", "inx", "id"})
TEXT_EXTS = frozenset({"txt", "text", "transcript"})


@dataclass(frozen=True)
class Decoder:
    """Decodes a sample dict in place of its bytes, by extension.

    With ``size``, images come out resized, and a JPEG at least twice the target in both directions is
    decoded at 1/2, 1/4 or 1/8 scale first (``reduce=True``): the scale is the smallest that keeps the
    image at least as large as the target, so the final resize only ever shrinks. What it buys and costs,
    measured by ``benchmarks/bench_decode.py`` (512x512 JPEGs, quality 75 and 90, crops of a photograph and
    synthetic pictures, to 224x224, one thread, against full decode + the same resize): PIL bilinear
    1.6-1.7x the images/s, bicubic 1.6-2.2x; OpenCV area 1.7-1.9x. Most of the gain is the smaller resize:
    DCT scaling skips the inverse transform's work but not the entropy decoding, which is most of a 1/2-scale
    decode of a detailed JPEG. Pixels (uint8): mean absolute difference 0.7-1.1 (PIL) and 0.8-1.4 (OpenCV
    area), 99th percentile 4-12, max 32-63, on sharp edges, where the scaled transform is a low-pass filter
    of its own. OpenCV bilinear (no antialiasing) differs more: mean 1.2-2.6. Pass ``reduce=False`` for the
    full decode.

    Args:
        mode ("raw" | "pil" | "numpy" | "torch"): what images become. Defaults to ``"raw"``.
        image_backend ("auto" | "pil" | "cv2"): which library decodes images. ``"auto"``: JPEGs by
            ``simplejpeg`` where it gives exactly PIL's pixels (colour and grayscale JPEGs, baseline or
            progressive, to "rgb"/"rgba", and grayscale ones to "gray"; 1.3-1.8x PIL's images/s per core
            on 256-512 px photos, see docs/performance.md), everything else by PIL; ``"pil"``: PIL
            always; ``"cv2"``: OpenCV. GIFs are decoded by PIL (the first frame) with any backend.
            Defaults to ``"auto"``.
        size (int | tuple[int, int] | None): resize images to ``(height, width)``, or with an int, the
            shorter side to it, keeping the aspect ratio. Defaults to None (as stored).
        resize ("bilinear" | "bicubic" | "area" | "nearest" | "lanczos"): the resize filter. PIL's filters
            average over the source when shrinking; OpenCV's ``bilinear`` does not (aliasing), its
            ``area`` does. Defaults to ``"bilinear"``.
        reduce (bool): decode JPEGs at reduced scale when ``size`` allows. Defaults to True.
        color ("rgb" | "gray" | "rgba" | "keep"): the colour layout every image comes out in: 3, 1 or 4
            uint8 channels (as Pillow's ``convert("RGB")``, ``"L"``, ``"RGBA"``; 16-bit samples by their
            high byte), or ``"keep"``: as the file stores it (any channel count, uint16 for 16-bit).
            Defaults to ``"rgb"``, so that images of mixed kinds collate into one batch.

    Raises:
        ConfigError: an unknown mode, backend, filter or color, a size that is not positive, or ``size``
            with ``mode="raw"``.
    """

    mode: DecodeMode = "raw"
    image_backend: ImageBackend = "auto"
    size: int | Size | None = None
    resize: ResizeMethod = "bilinear"
    reduce: bool = True
    color: Color = "rgb"

    def __post_init__(self) -> None:
        check_choice("decode", self.mode, DecodeMode)
        check_choice("image_backend", self.image_backend, ImageBackend)
        check_choice("resize", self.resize, ResizeMethod)
        check_choice("color", self.color, Color)
        if self.mode == "pil" and self.image_backend == "cv2":
            raise ConfigError("decode='pil' gives PIL images; use image_backend='pil' (or 'auto') with it")
        if self.size is not None:
            size = self.size
            if isinstance(size, list):  # from a config file
                size = tuple(size)
                object.__setattr__(self, "size", size)
            ok = (isinstance(size, int) and not isinstance(size, bool) and size > 0) or (
                isinstance(size, tuple) and len(size) == 2 and all(type(v) is int and v > 0 for v in size)
            )
            if not ok:
                raise ConfigError(f"size={self.size!r} must be a positive int or a (height, width) pair of them")
            if self.mode == "raw":
                raise ConfigError("size= resizes decoded images; pass mode 'pil', 'numpy' or 'torch' with it")

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        if self.mode == "raw":
            return sample
        for ext, value in sample.items():
            if ext.startswith("__") or not isinstance(value, (bytes, bytearray, memoryview)):
                continue
            last = ext.rsplit(".", 1)[-1]
            try:
                sample[ext] = self.decode_member(last, value)
            except Exception as e:
                where = sample.get("__url__", "?")
                raise DecodeFailed(
                    f"{where}: sample {sample.get('__key__')!r}, member '.{ext}': cannot decode "
                    f"({type(e).__name__}: {e}); the file is corrupt, or pass decode='raw' to get bytes",
                    str(where),
                ) from e
        return sample

    def decode_member(self, ext: str, data: bytes | bytearray | memoryview) -> Any:
        """The value of one member with extension ``ext``."""
        data = bytes(data)  # no copy when it is bytes already
        if ext in IMAGE_EXTS:
            return self.image(data)
        if ext in INT_EXTS:
            return int(data)
        if ext == "json":
            return json.loads(data)
        if ext in TEXT_EXTS:
            return data.decode("utf-8")
        if ext == "npy":
            return np.load(io.BytesIO(data), allow_pickle=False)
        return data

    def image(self, data: bytes) -> Any:
        """Decode image bytes to the configured form."""
        how = (self.color, self.size, self.resize, self.reduce)
        if self.mode == "pil":
            return pil_image(data, *how)
        if self.image_backend == "cv2":
            arr = cv2_array(data, *how)
        else:
            fast = fast_jpeg_array(data, *how) if self.image_backend == "auto" else None
            arr = pil_array(data, *how) if fast is None else fast
        if self.mode == "torch":
            import torch

            chw = np.ascontiguousarray(arr.transpose(2, 0, 1))
            if not chw.flags.writeable:  # one channel: a view of PIL's read-only buffer, no copy made above
                chw = chw.copy()
            return torch.from_numpy(chw)
        return arr


def make_decoder(
    decode: DecodeMode | Decoder | Callable[[dict[str, Any]], dict[str, Any]] | None,
) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """A decoder from a mode name, a :class:`Decoder`, or the user's own callable; None for raw."""
    if decode is None or decode == "raw":
        return None
    if isinstance(decode, str):
        return Decoder(decode)
    return decode


__all__ = ["IMAGE_EXTS", "INT_EXTS", "TEXT_EXTS", "DecodeMode", "Decoder", "ImageBackend", "make_decoder"]
