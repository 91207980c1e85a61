"""The public face of a sub-package, imported on first use.

Every sub-package keeps its code in private modules (``_reader.py``, ``_loader.py`` ...) and names its
public surface in its ``__init__``. Importing those modules there would make ``import fastdata.core.errors``
pay for torch, and ``fastdata convert`` for every decoder, so the ``__init__`` lists its names once, as
imports under ``typing.TYPE_CHECKING`` (which type checkers read and Python skips), and hands them to
:func:`lazy_exports`, which imports a name's module when the name is first asked for::

    if TYPE_CHECKING:
        from fastdata.loading._loader import Loader
        from fastdata.loading.transport._collate import batch_as_is as as_is

    __getattr__, __dir__ = lazy_exports(__name__)

One list, read by both: a name added there is typed and importable, with nothing to keep in step.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def _type_checking_imports(package: str) -> dict[str, str]:
    """name -> ``module:attribute`` of the imports under ``if TYPE_CHECKING:`` in ``package``'s ``__init__``."""
    import ast  # on first use only: a face that is never asked for a lazy name never reads its source

    path = sys.modules[package].__file__
    assert path is not None
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom) and imp.module:
                    module = "." * imp.level + imp.module
                    found.update({a.asname or a.name: f"{module}:{a.name}" for a in imp.names})
    return found


def lazy_exports(
    package: str, exports: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, resolving each of its names on first use and keeping it on
    the package. The names are the package's ``TYPE_CHECKING`` imports, or ``exports`` (name -> module,
    relative to the package when it starts with a dot, or ``module:attribute`` where the module calls it
    otherwise)."""
    table: dict[str, str] | None = dict(exports) if exports is not None else None

    def names() -> dict[str, str]:
        nonlocal table
        if table is None:
            table = _type_checking_imports(package)
        return table

    def __getattr__(name: str) -> Any:
        where = names().get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = where.partition(":")
        value = getattr(importlib.import_module(module, package), attribute or name)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names()))

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
