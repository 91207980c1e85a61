"""The house's layout: private by default, a small sorted face, docs that name public paths only."""

from __future__ import annotations

import ast
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
    imports = re.findall(r"from fastdata[\w.]* import .*\b_[a-z]\w*", text)  # from fastdata.bench import _report
    assert not imports, f"{page.name} imports private modules: {imports}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top(module: str) -> str:
    """The top-level sub-package of a dotted name (``fastdata.core.epoch._world`` -> ``core``; the root -> "")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _private(dotted: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in dotted.split(".")[1:])


def _fastdata_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every absolute fastdata import in a file: the module, and for ``from m import
    n`` also ``m.n`` (so that ``from fastdata.core import _world`` counts as reaching into ``_world``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("fastdata"):
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("fastdata")]
    return out


def test_no_sub_package_reaches_into_another_ones_private_modules() -> None:
    offenders = []
    for path in _modules():
        here = _top(_module_name(path))
        for line, name in _fastdata_imports(path):
            if _top(name) != here and _private(name):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not offenders, "enter another sub-package through its __init__:\n" + "\n".join(offenders)


def test_the_check_catches_an_import_of_a_private_module(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from fastdata.core import _lazy\nfrom fastdata.formats.tar._reader import scan\n")
    names = [name for _, name in _fastdata_imports(probe)]
    assert names == ["fastdata.core._lazy", "fastdata.formats.tar._reader.scan"] and all(map(_private, names))
    assert _top("fastdata.formats.tar._reader.scan") != _top("fastdata.datasets.tar._shards")


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_a_private_module_exports_only_what_it_defines() -> None:
    offenders = []
    for path in _modules():
        if not path.name.startswith("_") or path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                listed = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}  # type: ignore[attr-defined]
                if listed - _defined(tree):
                    offenders.append(f"{path.relative_to(ROOT)}: {sorted(listed - _defined(tree))}")
    assert not offenders, "re-exported by a private module (import them from where they are defined):\n" + "\n".join(
        offenders
    )


def test_docstrings_and_messages_name_public_paths() -> None:
    """Docstrings may keep a few private paths where no public name fits (at most 20 in the whole library);
    a message a user reads (any other string with words) names none."""
    in_docs, in_messages = [], []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # docstrings, and the strings that document an attribute (a string statement)
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if id(node) not in docs and " " not in node.value:
                continue  # a module path the code imports by name (a lazy face, a registry of backends)
            found = _PRIVATE.findall(node.value)
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            (in_docs if id(node) in docs else in_messages).extend(f"{where} {p}" for p in found)
    assert not in_messages, "messages naming private paths:\n" + "\n".join(in_messages)
    assert len(in_docs) <= 20, f"{len(in_docs)} private paths in docstrings:\n" + "\n".join(in_docs)
