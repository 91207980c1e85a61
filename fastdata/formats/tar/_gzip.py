"""The gzip-only name of :mod:`fastdata.formats.tar._compressed` (which reads gzip, xz, bzip2 and zstd
shards), kept for the code that imports it from here."""

from __future__ import annotations

__all__ = []
