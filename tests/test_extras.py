"""``pip install 'fastdata[all]'`` holds what every documented feature needs: each extra that the README,
the docs, an install hint in the package, a benchmark or a tool names is part of ``all``."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
NOT_FEATURES = {"all", "test", "bench-s3"}  # bench-s3: a peer that only benchmarks/bench_s3.py measures


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _closure(name: str, extras: dict[str, list[str]]) -> set[str]:
    """The extras ``name`` installs, its own included (``fastdata[a,b]`` entries followed)."""
    out, todo = set(), [name]
    while todo:
        extra = todo.pop()
        if extra in out:
            continue
        out.add(extra)
        for requirement in extras[extra]:
            m = re.fullmatch(r"fastdata\[([\w,-]+)\]", requirement.strip())
            if m:
                todo.extend(m.group(1).split(","))
    return out


def test_all_holds_every_extra_the_docs_and_hints_name() -> None:
    extras = _extras()
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "fastdata").rglob("*.py")]
    files += [*(ROOT / "benchmarks").glob("*.py"), *(p for p in (ROOT / "tools").glob("*") if p.is_file())]
    named: dict[str, str] = {}
    for path in files:
        for m in re.finditer(r"fastdata\[([\w,-]+)\]", path.read_text(errors="replace")):
            for extra in m.group(1).split(","):
                named.setdefault(extra, str(path.relative_to(ROOT)))
    unknown = {e: where for e, where in named.items() if e not in extras}
    assert not unknown, f"extras named but not defined in pyproject.toml: {unknown}"
    missing = {e: where for e, where in named.items() if e not in NOT_FEATURES and e not in _closure("all", extras)}
    assert not missing, f"extras the docs name that 'all' leaves out: {missing}"
    assert {"profile", "ray", "torchcodec"} <= _closure("all", extras)
