"""The option types of a conversion, in a module of their own: ``fastdata.convert`` (and so every
``fastdata`` command's ``--help``) imports them without the writer, numpy or tqdm."""

from __future__ import annotations

from typing import Literal

Engine = Literal["local", "ray"]
Format = Literal["tar", "hdf5"]

__all__ = ["Engine", "Format"]
