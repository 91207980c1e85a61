"""Turning member bytes into values, chosen by the member's extension.

``decode="raw"`` keeps bytes (the default: the cheapest to move between processes). Otherwise images
(``jpg``, ``png`` ...) become a PIL image (``"pil"``), an ``HxWxC`` uint8 array (``"numpy"``) or a ``CxHxW``
uint8 tensor (``"torch"``), decoded by PIL or OpenCV; ``cls`` becomes an int, ``json`` a value, ``txt``
a str and ``npy`` an array. Anything else stays bytes. A decoder that rejects the bytes raises
:class:`~fastdata.core.errors.DecodeFailed` naming the sample and member.
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

IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "webp", "tif", "tiff"})
INT_EXTS = frozenset({"cls", "cls2", "index", "inx", "id"})
TEXT_EXTS = frozenset({"txt", "text", "transcript"})


def _image_pil(data: bytes) -> Any:
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    img.load()
    return img.convert("RGB") if img.mode not in ("RGB", "L") else img


def _array_pil(data: bytes) -> np.ndarray:
    arr = np.asarray(_image_pil(data))
    return arr[:, :, None] if arr.ndim == 2 else arr


def _array_cv2(data: bytes) -> np.ndarray:
    import cv2

    arr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if arr is None:
        raise ValueError("OpenCV could not decode the image")
    return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)


@dataclass(frozen=True)
class Decoder:
    """Decodes a sample dict in place of its bytes, by extension.

    Args:
        mode ("raw" | "pil" | "numpy" | "torch"): what images become. Defaults to ``"raw"``.
        image_backend ("pil" | "cv2"): which library decodes images. Defaults to ``"pil"``.
    """

    mode: DecodeMode = "raw"
    image_backend: ImageBackend = "pil"

    def __post_init__(self) -> None:
        check_choice("decode", self.mode, DecodeMode)
        check_choice("image_backend", self.image_backend, ImageBackend)
        if self.mode == "pil" and self.image_backend != "pil":
            raise ConfigError("decode='pil' gives PIL images; use image_backend='pil' with it")

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
        if self.mode == "pil":
            return _image_pil(data)
        arr = _array_cv2(data) if self.image_backend == "cv2" else _array_pil(data)
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
