"""Image bytes to pixels in one declared colour layout, by PIL or OpenCV (JPEGs by simplejpeg where it
gives PIL's pixels: :func:`fast_jpeg_array`), optionally resized.

Real photo collections mix grayscale, palette (with or without transparency), CMYK, 16-bit and alpha
files. Decoded as stored, they come back with 1, 2, 3 or 4 channels and two dtypes, and a batch of them
cannot be stacked. So every image is brought to one ``color`` (:data:`Color`), the same way by both
backends (as webdataset's ``rgb8``/``torchrgb`` do with PIL):

* ``"rgb"`` (the default): 3 channels, uint8, as Pillow's ``Image.convert("RGB")`` gives them (alpha
  dropped, not composited; palette entries looked up; CMYK converted by Pillow's formula).
* ``"gray"``: 1 channel, uint8, as ``Image.convert("L")`` (ITU-R 601-2 luma: 299/587/114).
* ``"rgba"``: 4 channels, uint8, as ``Image.convert("RGBA")`` (alpha 255 where the file has none; a
  palette's transparent entry gets alpha 0).
* ``"keep"``: as the backend decodes the file: any channel count, palette indices (PIL) or colours
  (OpenCV), 16-bit samples as uint16, 1-bit as bool (PIL). For when you convert yourself.

16-bit samples (16-bit PNG and TIFF) become 8-bit by their high byte (``v >> 8``, so 65535 -> 255), as
libpng's ``strip_16`` and OpenCV do; Pillow's own ``convert`` would clip every value above 255 to white.

OpenCV matches Pillow exactly for grayscale, 1-bit, palette, alpha and RGB files; CMYK JPEGs differ by
at most 2 (rounding of the two formulas), and ``"gray"`` by at most 1 (OpenCV's fixed-point weights; it
is computed from the decoded colours, not read from the JPEG's luma plane, which differs by up to 10).
OpenCV is told to ignore EXIF orientation (``IMREAD_IGNORE_ORIENTATION``), as PIL does: both give the
pixels as stored.

With a target size, a JPEG larger than twice the target is decoded at 1/2, 1/4 or 1/8 scale first
(libjpeg's DCT scaling, through PIL's ``Image.draft`` or OpenCV's ``IMREAD_REDUCED_*``); see
:class:`fastdata.formats.Decoder` for what that costs in pixels.
"""

from __future__ import annotations

import io
from typing import Any, Literal

import numpy as np

Color = Literal["rgb", "gray", "rgba", "keep"]
ResizeMethod = Literal["bilinear", "bicubic", "area", "nearest", "lanczos"]
Size = tuple[int, int]

_PIL_MODES = {"rgb": "RGB", "gray": "L", "rgba": "RGBA"}


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


def is_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff"


def _simplejpeg() -> Any:
    """The ``simplejpeg`` module, or None where it is not installed (PIL decodes then)."""
    global _SIMPLEJPEG
    if _SIMPLEJPEG is False:
        try:
            import simplejpeg
        except ImportError:
            simplejpeg = None
        _SIMPLEJPEG = simplejpeg
    return _SIMPLEJPEG


_SIMPLEJPEG: Any = False  # not looked for yet
_SJ_SPACES = {"rgb": "RGB", "rgba": "RGBA", "gray": "GRAY"}


def draft_scale(width: int, height: int, target: tuple[int, int]) -> int:
    """The DCT scale-down factor (8, 4, 2 or 1) PIL's ``Image.draft(None, target)`` picks: the largest
    that divides both sides at least that many times into the target."""
    scale = min(width // target[0], height // target[1])
    return next((f for f in (8, 4, 2) if scale >= f), 1)


def fast_jpeg_array(
    data: bytes,
    color: Color = "rgb",
    size: int | Size | None = None,
    method: ResizeMethod = "bilinear",
    reduce: bool = True,
) -> np.ndarray | None:
    """The pixels :func:`pil_array` gives for a JPEG, decoded by ``simplejpeg`` (libjpeg-turbo, the library
    Pillow decodes with, called without Pillow's per-image overhead); None where that could differ or
    does not apply, and the caller decodes with PIL.

    It applies to baseline and progressive JPEGs in YCbCr or grayscale, to ``color`` "rgb" and "rgba",
    and "gray" for grayscale files (Pillow computes the luma of a colour file from the decoded colours,
    libjpeg reads the luma plane: up to 10 apart). CMYK and YCCK files (libjpeg's CMYK conversion is 1
    away from Pillow's), ``color="keep"``, files simplejpeg rejects (it is strict about damage that PIL
    may tolerate) and a machine without simplejpeg go to PIL. With ``size``, the DCT scale is PIL's
    ``draft`` choice and the resize is PIL's, so the pixels stay PIL's exactly (the tests compare them).
    """
    sj = _simplejpeg()
    if sj is None or color not in _SJ_SPACES or not is_jpeg(data):
        return None
    try:
        height, width, space, _ = sj.decode_jpeg_header(data)
        if space not in ("YCbCr", "Gray") or (color == "gray" and space != "Gray"):
            return None
        target = None if size is None else target_size(width, height, size)
        f = draft_scale(width, height, target) if target is not None and reduce else 1
        if f > 1:
            shape = (-(-height // f), -(-width // f))
            arr = sj.decode_jpeg(data, _SJ_SPACES[color], min_height=shape[0], min_width=shape[1], min_factor=f)
            if arr.shape[:2] != shape:  # another scale than PIL's: PIL decides
                return None
        else:
            arr = sj.decode_jpeg(data, _SJ_SPACES[color])
    except ValueError:
        return None
    if target is not None and (arr.shape[1], arr.shape[0]) != target:
        from PIL import Image

        img = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
        arr = np.asarray(img.resize(target, _pil_resample(method)))
        if arr.ndim == 2:
            arr = arr[:, :, None]
    return arr


def _eight_bit(img: Any) -> Any:
    """A 16-bit grayscale PIL image (``I;16*``, or ``I`` from a PNG, whose samples are at most 16 bits)
    as 8-bit ``L`` by the high byte; any other image as it is."""
    from PIL import Image

    if img.mode.startswith("I;16") or (img.mode == "I" and img.format == "PNG"):
        high = np.asarray(img).astype(np.uint32) >> 8
        return Image.fromarray(np.minimum(high, 255).astype(np.uint8), "L")
    return img


def pil_image(
    data: bytes,
    color: Color = "rgb",
    size: int | Size | None = None,
    method: ResizeMethod = "bilinear",
    reduce: bool = True,
) -> Any:
    """The PIL image of ``data`` in ``color``, resized to ``size`` when given."""
    from PIL import Image

    img: Image.Image = Image.open(io.BytesIO(data))
    target = None if size is None else target_size(*img.size, size)
    if target is not None and reduce and img.format == "JPEG":
        img.draft(None, target)  # decode at the smallest DCT scale that is still >= target
    img.load()
    if color != "keep":
        img = _eight_bit(img)
        mode = _PIL_MODES[color]
        if img.mode != mode:
            img = img.convert(mode)
    if target is not None and img.size != target:
        img = img.resize(target, _pil_resample(method))
    return img


def pil_array(
    data: bytes,
    color: Color = "rgb",
    size: int | Size | None = None,
    method: ResizeMethod = "bilinear",
    reduce: bool = True,
) -> np.ndarray:
    """``HxWxC`` pixels of ``data`` decoded by PIL (C = 3, 1 or 4 for ``"rgb"``, ``"gray"``, ``"rgba"``)."""
    arr = np.asarray(pil_image(data, color, size, method, reduce))
    return arr[:, :, None] if arr.ndim == 2 else arr


def _cv2_flag(data: bytes, color: Color, size: int | Size | None, reduce: bool) -> tuple[int, Any]:
    """OpenCV's ``imdecode`` flag for ``data``, and the target ``(width, height)`` (None: as stored)."""
    import cv2

    # "gray" is computed from the decoded colours (Pillow's weights), not read from a JPEG's luma plane
    unchanged = color in ("rgba", "keep")
    flag, target, gray = (cv2.IMREAD_UNCHANGED if unchanged else cv2.IMREAD_COLOR), None, False
    if size is not None:
        from PIL import Image  # reads the header only: the size, to choose the scale

        head = Image.open(io.BytesIO(data))
        target = target_size(*head.size, size)
        gray = head.mode == "L"
        if reduce and is_jpeg(data):  # a JPEG has no alpha: the reduced colour (or gray) decode keeps all
            f = reduction(*head.size, target)
            if f > 1:
                flag = {
                    (2, False): cv2.IMREAD_REDUCED_COLOR_2,
                    (4, False): cv2.IMREAD_REDUCED_COLOR_4,
                    (8, False): cv2.IMREAD_REDUCED_COLOR_8,
                    (2, True): cv2.IMREAD_REDUCED_GRAYSCALE_2,
                    (4, True): cv2.IMREAD_REDUCED_GRAYSCALE_4,
                    (8, True): cv2.IMREAD_REDUCED_GRAYSCALE_8,
                }[f, gray and color == "keep"]
    if flag != cv2.IMREAD_UNCHANGED:  # which ignores EXIF orientation already (and is -1: no bits to add)
        flag |= cv2.IMREAD_IGNORE_ORIENTATION  # PIL leaves orientation alone; so must OpenCV, or shapes differ
    return flag, target


def is_gif(data: bytes) -> bool:
    return data[:6] in (b"GIF87a", b"GIF89a")


def cv2_array(
    data: bytes,
    color: Color = "rgb",
    size: int | Size | None = None,
    method: ResizeMethod = "bilinear",
    reduce: bool = True,
) -> np.ndarray:
    """``HxWxC`` pixels of ``data`` decoded by OpenCV, in RGB(A) channel order, in ``color``."""
    import cv2

    if is_gif(data):  # OpenCV's wheels may be built without a GIF decoder: PIL's first frame, as pil_array
        return pil_array(data, color, size, method, reduce)
    flag, target = _cv2_flag(data, color, size, reduce)
    arr: np.ndarray | None = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if arr is None:
        raise ValueError("OpenCV could not decode the image")
    if color != "keep" and arr.dtype != np.uint8:
        if arr.dtype == np.uint16:
            arr = np.right_shift(arr, 8).astype(np.uint8)  # the high byte, as IMREAD_COLOR does
        else:  # float TIFF/EXR: clipped to 0-255, as Pillow converts float images
            arr = np.clip(arr, 0, 255).astype(np.uint8)
    channels = 1 if arr.ndim == 2 else arr.shape[2]
    if color == "gray":
        arr = cv2.cvtColor(arr, cv2.COLOR_BGR2GRAY)
    elif color == "rgba" and channels != 4:
        arr = cv2.cvtColor(arr, cv2.COLOR_GRAY2BGRA if channels == 1 else cv2.COLOR_BGR2BGRA)
    if target is not None and (arr.shape[1], arr.shape[0]) != target:
        arr = cv2.resize(arr, target, interpolation=_cv2_interpolation(method))
    if arr.ndim == 2:
        return arr[:, :, None]
    if arr.shape[2] == 4:
        return cv2.cvtColor(arr, cv2.COLOR_BGRA2RGBA)
    return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)


__all__ = [
    "Color",
    "ResizeMethod",
    "Size",
    "cv2_array",
    "draft_scale",
    "fast_jpeg_array",
    "is_jpeg",
    "pil_array",
    "pil_image",
    "reduction",
    "target_size",
]
