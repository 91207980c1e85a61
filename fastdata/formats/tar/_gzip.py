"""The gzip-only name of :mod:`fastdata.formats.tar._compressed` (which reads gzip, xz, bzip2 and zstd
shards), kept for the code that imports it from here."""

from __future__ import annotations

from fastdata.formats.tar._compressed import MAX_BYTES, RESIDENT_BYTES, GzipShard, is_gzip, refusal

__all__ = ["MAX_BYTES", "RESIDENT_BYTES", "GzipShard", "is_gzip", "refusal"]
