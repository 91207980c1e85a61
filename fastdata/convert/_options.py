"""A conversion's options, resolved once: :class:`ConversionPlan` is what :func:`fastdata.convert.convert`
builds from its arguments and what the local, Ray and ``s3://`` paths take. Every option is checked at
construction (a typo fails with the allowed values listed, before the corpus is listed), and the schemes
of the source and the output are read here once. Light on purpose: ``fastdata`` (and so every command's
``--help``) imports this module without the writer, numpy or rich."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastdata.core.errors import ConfigError, check_choice
from fastdata.storage import scheme

Engine = Literal["local", "ray"]
Format = Literal["tar", "hdf5"]
OnShard = Callable[[dict[str, Any]], None]
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_UNITS.update({p + s: 10 ** (3 * (i + 1)) for i, p in enumerate("kmgt") for s in ("", "b")})


def parse_size(text: str | int) -> int:
    """Bytes in ``"256MB"``, ``"1.5GB"``, ``"64MiB"``, ``"500k"`` or a plain number of bytes.

    Raises:
        ConfigError: the text is not a size, or is not positive.
    """
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _UNITS:
            raise ConfigError(f"shard size {text!r} is not a size; write it like 256MB, 1GB or 64MiB")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ConfigError(f"shard size {text!r} must be more than 0 bytes")
    return value


def check_prefix(prefix: str) -> None:
    if not prefix or "/" in prefix or prefix.startswith("."):
        raise ConfigError(f"prefix={prefix!r} must be a plain file name start, like 'train'")


@dataclass(frozen=True)
class ConversionPlan:
    """One conversion, resolved: the arguments of :func:`fastdata.convert.convert` (which documents
    them), checked and normalised. ``shard_size`` is in bytes (None with ``shard_count``);
    ``source_options`` defaults to ``storage_options`` when both ends are on S3.

    Attributes:
        src_scheme, out_scheme (str): ``"s3"`` or ``""`` (local) for the source and the output.

    Raises:
        ConfigError: a bad option, or options that do not go together (the message names them).
    """

    src: str
    out: str
    format: Format = "tar"
    shard_size: int | str | None = "256MB"
    shard_count: int | None = None
    workers: int = 1
    shuffle: bool = False
    seed: int = 0
    prefix: str = "shard"
    skip_bad: bool = False
    restart: bool = False
    fsync: bool = True
    decode: bool = False
    size: tuple[int, int] | None = None
    progress: bool = True
    staging: str | None = None
    storage_options: dict[str, Any] | None = None
    source_options: dict[str, Any] | None = None
    engine: Engine = "local"
    address: str | None = None
    on_shard: OnShard | None = None
    src_scheme: str = field(init=False)
    out_scheme: str = field(init=False)

    def __post_init__(self) -> None:
        put = object.__setattr__  # normalising a frozen record, once, here
        check_choice("format", self.format, Format)
        check_choice("engine", self.engine, Engine)
        src, out = os.fspath(self.src), os.fspath(self.out)
        put(self, "src", src)
        put(self, "out", out)
        put(self, "src_scheme", scheme(src))
        put(self, "out_scheme", scheme(out))
        if self.staging is not None:
            put(self, "staging", os.fspath(self.staging))
        size = None if self.shard_count is not None else parse_size(self.shard_size or "256MB")
        put(self, "shard_size", size)
        if not self.out_scheme and Path(out).exists() and not os.path.isdir(out):
            raise ConfigError(
                f"{out}: is a file, not a folder; fastdata convert writes shards, their indexes and a "
                "manifest into a folder: give a new or empty folder"
            )
        if self.engine != "ray" and self.address is not None:
            raise ConfigError("address applies to engine='ray' only")
        if self.src_scheme and self.source_options is None and self.out_scheme:
            put(self, "source_options", self.storage_options)
        self._check_format()
        if self.src_scheme not in ("", "s3"):
            raise ConfigError(
                f"{src}: fastdata convert reads local folders and s3:// prefixes, not {self.src_scheme}://"
            )
        if not self.src_scheme and self.source_options:
            raise ConfigError("source_options apply to an s3:// source only")
        if self.out_scheme not in ("", "s3"):
            raise ConfigError(
                f"{out}: fastdata convert writes to local folders and s3:// prefixes, not {self.out_scheme}://"
            )
        if self.workers < 1:
            raise ConfigError(f"workers={self.workers} must be >= 1")
        if self.shard_count is not None and self.shard_count < 1:
            raise ConfigError(f"shard_count={self.shard_count} must be >= 1")
        check_prefix(self.prefix)

    def _check_format(self) -> None:
        if self.format == "hdf5":
            if self.out_scheme or self.staging is not None or self.storage_options:
                raise ConfigError(
                    f"{self.out}: format='hdf5' writes local files; convert into a local folder, then "
                    "upload the files (fastdata.storage.s3.upload_file)"
                )
            if self.shuffle:
                raise ConfigError(
                    "shuffle applies to format='tar' only: HDF5 rows are always shuffled (seeded by seed)"
                )
            if self.engine != "local":
                raise ConfigError("engine='ray' converts to tar shards; use format='tar', or engine='local' for HDF5")
            if self.size is not None and not self.decode:
                raise ConfigError("size=(H, W) resizes decoded images: pass decode=True (--decode) with it")
            if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
                raise ConfigError(f"size={self.size!r} must be (height, width) of at least 1 pixel")
            if self.src_scheme:
                raise ConfigError(
                    f"{self.src}: format='hdf5' converts local folders; use format='tar' for s3:// sources"
                )
            if self.out.lower().endswith((".h5", ".hdf5")) and not os.path.isdir(self.out):
                raise ConfigError(
                    f"{self.out}: looks like a file name; the conversion writes several HDF5 files "
                    "(PREFIX-000000.h5 ...) and a manifest into a folder: give the folder"
                )
            return
        if self.decode or self.size is not None:
            raise ConfigError("decode and size apply to format='hdf5' only; tar shards keep the files' bytes")
        if not self.out_scheme and (self.staging is not None or self.storage_options):
            raise ConfigError("staging and storage_options apply to s3:// outputs only")

    @property
    def remote(self) -> bool:
        """Whether the output is an ``s3://`` prefix (shards staged locally, then uploaded)."""
        return self.out_scheme == "s3"


__all__ = ["ConversionPlan", "Engine", "Format", "OnShard", "parse_size"]
