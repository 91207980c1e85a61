"""Bytes <-> samples, one sub-package per format (:mod:`~fastdata.formats.tar`, :mod:`~fastdata.formats.hdf5`,
:mod:`~fastdata.formats.video`), and what they share: decoding members into arrays and images
(:class:`Decoder`), the manifest a conversion writes, and the source files a writer reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.formats._decode import DecodeMode, Decoder, ImageBackend, ResizeMethod
    from fastdata.formats._manifest import read_manifest

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Decoder": "._decode",
        "DecodeMode": "._decode",
        "ImageBackend": "._decode",
        "ResizeMethod": "._decode",
        "read_manifest": "._manifest",
    },
)

__all__ = ["DecodeMode", "Decoder", "ImageBackend", "ResizeMethod", "read_manifest"]
