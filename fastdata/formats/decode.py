"""Turning member bytes into values, chosen by the member's extension.

``decode="raw"`` keeps bytes (the default: the cheapest to move between processes). Otherwise images
(``jpg``, ``png`` ...) become a PIL image (``"pil"``), an ``HxWxC`` uint8 array (``"numpy"``) or a ``CxHxW``
uint8 tensor (``"torch"``), decoded by PIL or OpenCV; ``cls`` becomes an int, ``json`` a value, ``txt``
a str and ``npy`` an array. Anything else stays bytes. A decoder that rejects the bytes raises
:class:`~fastdata.core.errors.DecodeFailed` naming the sample and member.

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

DecodeMode = Literal["raw", "pil", "numpy", "torch"]
ImageBackend = Literal["pil", "cv2"]
ResizeMethod = Literal["bilinear", "bicubic", "area", "nearest", "lanczos"]
Size = tuple[int, int]

IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "webp", "tif", "tiff"})
INT_EXTS = frozenset({"cls", "cls2", "index", "inx", "id"})
TEXT_EXTS = frozenset({"txt", "text", "transcript"})


def _pil_resample(method: ResizeMethod) -> Any:
    from PIL import Image

    R = Image.Resampling
    return {"bilinear": R.BILINEAR, "bicubic": R.BICUBIC, "area": R.BOX, "nearest": R.NEAREST, "lanczos": R.LANCZOS}[
        method
    ]


def _cv2_interpolation(method: ResizeMethod) -> int:
    import cv2

    return {
        "bilinear": cv2.INTER_LINEAR,
        "bicubic": cv2.INTER_CUBIC,
        "area": cv2.INTER_AREA,
        "nearest": cv2.INTER_NEAREST,
        "lanczos": cv2.INTER_LANCZOS4,
    }[method]


def target_size(width: int, height: int, size: int | Size) -> tuple[int, int]:
    """The ``(width, height)`` an image of ``width x height`` is resized to: ``size=(h, w)`` exactly, or
    ``size=s`` with the shorter side ``s`` and the aspect ratio kept (as ``torchvision``'s ``Resize(s)``)."""
    if isinstance(size, tuple):
        return size[1], size[0]
    if width <= height:
        return size, max(1, int(size * height / width))
    return max(1, int(size * width / height)), size


def reduction(width: int, height: int, target: tuple[int, int]) -> int:
    """The largest DCT scale-down factor (8, 4, 2 or 1) that keeps the decoded image at least ``target``
    (width, height) in both directions, so that the final resize never enlarges."""
    for f in (8, 4, 2):
        if -(-width // f) >= target[0] and -(-height // f) >= target[1]:
            return f
    return 1


def _is_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff"


def _image_pil(
    data: bytes, size: int | Size | None = None, method: ResizeMethod = "bilinear", reduce: bool = True
) -> Any:
    from PIL import Image

    img: Image.Image = Image.open(io.BytesIO(data))
    target = None if size is None else target_size(*img.size, size)
    if target is not None and reduce and img.format == "JPEG":
        img.draft(None, target)  # decode at the smallest DCT scale that is still >= target
    img.load()
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")
    if target is not None and img.size != target:
        img = img.resize(target, _pil_resample(method))
    return img


def _array_pil(
    data: bytes, size: int | Size | None = None, method: ResizeMethod = "bilinear", reduce: bool = True
) -> np.ndarray:
    arr = np.asarray(_image_pil(data, size, method, reduce))
    return arr[:, :, None] if arr.ndim == 2 else arr


def _array_cv2(
    data: bytes, size: int | Size | None = None, method: ResizeMethod = "bilinear", reduce: bool = True
) -> np.ndarray:
    import cv2

    flag, target = cv2.IMREAD_COLOR, None
    if size is not None:
        from PIL import Image  # reads the header only: the size, to choose the scale

        width, height = Image.open(io.BytesIO(data)).size
        target = target_size(width, height, size)
        if reduce and _is_jpeg(data):
            f = reduction(width, height, target)
            flag = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4}.get(
                f, cv2.IMREAD_REDUCED_COLOR_8
            )
    arr = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if arr is None:
        raise ValueError("OpenCV could not decode the image")
    if target is not None and (arr.shape[1], arr.shape[0]) != target:
        arr = cv2.resize(arr, target, interpolation=_cv2_interpolation(method))
    return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)


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
        image_backend ("pil" | "cv2"): which library decodes images. Defaults to ``"pil"``.
        size (int | tuple[int, int] | None): resize images to ``(height, width)``, or with an int, the
            shorter side to it, keeping the aspect ratio. Defaults to None (as stored).
        resize ("bilinear" | "bicubic" | "area" | "nearest" | "lanczos"): the resize filter. PIL's filters
            average over the source when shrinking; OpenCV's ``bilinear`` does not (aliasing), its
            ``area`` does. Defaults to ``"bilinear"``.
        reduce (bool): decode JPEGs at reduced scale when ``size`` allows. Defaults to True.

    Raises:
        ConfigError: an unknown mode, backend or filter, a size that is not positive, or ``size`` with
            ``mode="raw"``.
    """

    mode: DecodeMode = "raw"
    image_backend: ImageBackend = "pil"
    size: int | Size | None = None
    resize: ResizeMethod = "bilinear"
    reduce: bool = True

    def __post_init__(self) -> None:
        check_choice("decode", self.mode, DecodeMode)
        check_choice("image_backend", self.image_backend, ImageBackend)
        check_choice("resize", self.resize, ResizeMethod)
        if self.mode == "pil" and self.image_backend != "pil":
            raise ConfigError("decode='pil' gives PIL images; use image_backend='pil' with it")
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
        how = (self.size, self.resize, self.reduce)
        if self.mode == "pil":
            return _image_pil(data, *how)
        arr = _array_cv2(data, *how) if self.image_backend == "cv2" else _array_pil(data, *how)
        if self.mode == "torch":
            import torch

            return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))
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
