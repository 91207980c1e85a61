"""The house's layout: private by default, a small sorted face, docs that name public paths only."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import fastdata as fd

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "fastdata").rglob("__init__.py"))


def _isort(names: list[str]) -> list[str]:
    """Sorted as ruff's RUF022 sorts ``__all__``: CONSTANTS, then Classes, then functions."""
    return sorted(names, key=lambda n: (0 if n.isupper() else 1 if n[:1].isupper() else 2, n))


def _modules() -> list[Path]:
    return [p for p in (ROOT / "fastdata").rglob("*.py") if "__pycache__" not in p.parts]


def test_most_modules_are_private() -> None:
    modules = _modules()
    private = [p for p in modules if p.name.startswith("_") and p.name != "__init__.py"]
    assert len(private) >= 0.4 * len(modules), f"{len(private)} of {len(modules)} modules private"


def test_the_face_is_small_sorted_and_every_name_resolves() -> None:
    assert fd.__all__ == _isort(fd.__all__) and len(fd.__all__) <= 26
    for name in fd.__all__:
        assert getattr(fd, name) is not None
    for gone in ("World", "WorkerInit", "compose_worker_init", "EpochSampler", "errors", "Monitor"):
        assert gone not in fd.__all__


@pytest.mark.parametrize("package", PACKAGES)
def test_each_sub_package_names_its_public_surface(package: str) -> None:
    mod = importlib.import_module(package)
    names = getattr(mod, "__all__", None)
    assert names is not None, f"{package}/__init__.py names no public surface (__all__)"
    assert names == _isort(names), f"{package}.__all__ is not sorted"
    for name in names:
        assert getattr(mod, name) is not None, f"{package}.{name}"


# a dotted fastdata path with a private part: fastdata.loading._loader, fastdata.core.epoch._world.World ...
_PRIVATE = re.compile(r"(?<![\w/.-])fastdata(?:\.\w+)*\._\w+")


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_docs_name_only_public_import_paths(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert not sorted(set(_PRIVATE.findall(text))), f"{page.name} names private modules"
