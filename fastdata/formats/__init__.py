"""Bytes <-> samples, one sub-package per format (:mod:`~fastdata.formats.tar`, :mod:`~fastdata.formats.hdf5`,
:mod:`~fastdata.formats.video`), and what they share: decoding members into arrays and images
(:class:`Decoder`), the manifest a conversion writes, and the source files a writer reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.formats._decode import IMAGE_EXTS, DecodeMode, Decoder, ImageBackend, make_decoder
    from fastdata.formats._fields import Fields, FieldSpec, MissingField, with_fields
    from fastdata.formats._images import ResizeMethod
    from fastdata.formats._manifest import MANIFEST, missing_local, read_manifest, resolve_sources, shard_listing
    from fastdata.formats._suffixes import VIDEO_EXTENSIONS

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "IMAGE_EXTS",
    "MANIFEST",
    "VIDEO_EXTENSIONS",
    "DecodeMode",
    "Decoder",
    "FieldSpec",
    "Fields",
    "ImageBackend",
    "MissingField",
    "ResizeMethod",
    "make_decoder",
    "missing_local",
    "read_manifest",
    "resolve_sources",
    "shard_listing",
    "with_fields",
]
