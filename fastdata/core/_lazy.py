"""The public face of a sub-package, imported on first use.

Every sub-package keeps its code in private modules (``_reader.py``, ``_loader.py`` ...) and names its
public surface in its ``__init__``. Importing those modules there would make ``import fastdata.core.errors``
pay for torch, and ``fastdata convert`` for every decoder, so the ``__init__`` maps each public name to
the module that defines it and imports that module when the name is first asked for::

    __getattr__, __dir__ = lazy_exports(__name__, {"Loader": "._loader", "as_is": "._loader"})

(with the same names imported under ``typing.TYPE_CHECKING`` for type checkers, which do not run it).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, resolving each name of ``exports`` (name -> module,
    relative to the package when it starts with a dot, or ``module:attribute`` where the module calls it
    otherwise) on first use and keeping it on the package."""

    def __getattr__(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = where.partition(":")
        value = getattr(importlib.import_module(module, package), attribute or name)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
