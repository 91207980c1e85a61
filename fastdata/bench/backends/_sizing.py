"""Which decode a backend's sweep measures, so that its batches batch.

A folder of real photos holds images of many sizes; decoded as they are stored (``decode="torch"``, the
tar backend's default: what training reads), no two of them stack into one batch, and every point of the
sweep failed on it. Before sweeping, :func:`plan_decode` looks at the sizes of a few images spread over
the data (their headers only, through PIL) and, where they differ and the user left ``decode`` and
``size`` alone, measures ``fastdata.Decoder(decode, size=(224, 224))`` instead: the usual training
input, and what the report then says it measured. A ``size`` the user gives (``-o size=160x160``) is used
as given; a ``decode`` the user gives without one, on images of different sizes, fails at once with the
fix, as does ``decode="pil"`` on a dataset that batches (PIL images do not batch).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any

from fastdata.core.errors import ConfigError

DEFAULT_SIZE = (224, 224)
PEEK = 32  # samples looked at, spread over the data: their image headers only
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "tif", "tiff")


def parse_size(value: Any) -> int | tuple[int, int]:
    """``-o size=`` as ``Decoder(size=...)`` takes it: ``224``, ``[224, 224]`` or ``"224x224"`` (height x width)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and "x" in value:
        value = value.lower().split("x")
    if isinstance(value, (list, tuple)) and len(value) == 2:
        try:
            h, w = (int(v) for v in value)
        except (TypeError, ValueError):
            pass
        else:
            if h > 0 and w > 0:
                return h, w
    raise ConfigError(f"size={value!r}: give the decoded images' size as HxW (e.g. -o size=224x224) or one int")


def image_sizes(samples: Iterable[Any]) -> dict[tuple[int, int], str]:
    """``(width, height)`` of each image member of ``samples`` (raw sample dicts), with the key of the
    first sample of each size; members PIL cannot read are left to the decoder to report."""
    from PIL import Image

    sizes: dict[tuple[int, int], str] = {}
    for sample in samples:
        for ext, value in sample.items():
            if ext.startswith("__") or ext.rsplit(".", 1)[-1].lower() not in IMAGE_EXTS:
                continue
            try:
                size = Image.open(io.BytesIO(bytes(value))).size
            except Exception:  # noqa: BLE001 - a damaged image is the decoder's to report, in the sweep
                continue
            sizes.setdefault(size, str(sample.get("__key__", "?")))
    return sizes


def plan_decode(
    options: dict[str, Any], default: str, peek: Callable[[], list[Any]], *, batches: bool
) -> tuple[dict[str, Any], str]:
    """The dataset options to sweep, with ``decode`` chosen so that batches batch, and what that is in words.

    Args:
        options (dict): the user's ``-o`` options (``size`` taken out).
        default (str): the backend's decode when none is given.
        peek: returns a few raw samples spread over the data (called only when the sizes matter).
        batches (bool): the samples are batched (by the dataset or the DataLoader).

    Raises:
        ConfigError: an explicit ``decode`` that cannot batch these images (different sizes, or PIL).
    """
    import fastdata as fd

    out = dict(options)
    size = out.pop("size", None)
    decode = out.get("decode", default)
    given = "decode" in options
    if not isinstance(decode, str):  # a Decoder from Python: the user's choice, measured as it is
        return out, f"decode={decode!r}"
    if decode == "raw":
        if size is not None:
            raise ConfigError("-o size= resizes decoded images; pass it with -o decode=torch (or numpy)")
        return out, "decode='raw' (bytes, not decoded)"
    if decode == "pil" and batches:
        raise ConfigError(
            "-o decode=pil gives PIL images, which do not batch; measure -o decode=torch (or numpy), with "
            "-o size=HxW for images of different sizes"
        )
    if size is not None:
        out["decode"] = fd.Decoder(decode, size=parse_size(size))  # type: ignore[arg-type]  # checked by Decoder
        return out, f"decode={decode!r} at size={out['decode'].size} (-o size)"
    if not batches:
        return out, f"decode={decode!r}"
    sizes = image_sizes(peek())
    if len(sizes) <= 1:
        return out, f"decode={decode!r}"
    (w0, h0), (w1, h1) = list(sizes)[:2]
    k0, k1 = list(sizes.values())[:2]
    seen = f"{len(sizes)} sizes among the samples looked at, e.g. {h0}x{w0} ({k0!r}) and {h1}x{w1} ({k1!r})"
    if given:
        raise ConfigError(
            f"the images differ in size ({seen}), so -o decode={decode} cannot batch them; add -o size=HxW "
            f"(e.g. -o size={DEFAULT_SIZE[0]}x{DEFAULT_SIZE[1]}), which resizes them as they are decoded"
        )
    out["decode"] = fd.Decoder(decode, size=DEFAULT_SIZE)  # type: ignore[arg-type]  # checked by Decoder
    return out, (
        f"decode={decode!r} at size={DEFAULT_SIZE} (the images differ in size: {seen}; -o size=HxW for another size)"
    )


__all__ = ["DEFAULT_SIZE", "PEEK", "image_sizes", "parse_size", "plan_decode"]
