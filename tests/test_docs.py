"""The docs say only what is true of the code: every Python block runs (tests/docs_examples.py runs them)
or is a visibly marked fragment, every module path and file they name exists, and every flag of a
command they show is one the command takes."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from tests.docs_examples import ROOT, sybil

PAGES = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md")])
FRAGMENT = "python fragment"  # the info string of a block that is not run
FRAGMENT_LINE = "# fragment: "  # its first line, which the reader sees: why it cannot run as it stands


def fences(page: Path) -> list[tuple[int, str, str]]:
    """(line, info string, content) of every fenced block of the page."""
    tokens = MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))
    return [(t.map[0] + 1 if t.map else 0, t.info.strip(), t.content) for t in tokens if t.type == "fence"]


def python_blocks() -> list[tuple[str, int, str, str]]:
    return [
        (page.relative_to(ROOT).as_posix(), line, info, content)
        for page in PAGES
        for line, info, content in fences(page)
        if info.split()[:1] in (["python"], ["py"], ["python3"])
    ]


def test_every_python_block_runs_or_is_a_visible_fragment() -> None:
    blocks = python_blocks()
    wrong = []
    for page, line, info, content in blocks:
        first = content.lstrip("\n").split("\n", 1)[0]
        if info == "python" and first.startswith(FRAGMENT_LINE.strip()):
            wrong.append(f"{page}:{line}: says it is a fragment but is run: make its info string {FRAGMENT!r}")
        elif info == FRAGMENT and not first.startswith(FRAGMENT_LINE):
            wrong.append(f"{page}:{line}: a fragment must start with {FRAGMENT_LINE!r} and why, for the reader")
        elif info not in ("python", FRAGMENT):
            wrong.append(f"{page}:{line}: info string {info!r}: use 'python' (run) or {FRAGMENT!r}")
    assert not wrong, "\n".join(wrong)
    run = [b for b in blocks if b[2] == "python"]
    fragments = [b for b in blocks if b[2] == FRAGMENT]
    # the blocks run are exactly those Sybil collects
    collected = sum(len(list(sybil.parse(page).examples())) for page in PAGES)
    assert collected == len(run)
    # fragments stay the exception (torchrun, NCCL, a DDP model): most examples run as written
    assert len(fragments) * 4 <= len(run), [f"{p}:{n}" for p, n, _, _ in fragments]


_DOTTED = re.compile(r"(?<![\w/.-])fastdata(?:\.[A-Za-z_]\w*)+")
_PATH = re.compile(r"(?<![\w/.-])(?:fastdata|tests|benchmarks|tools|docs)/[\w.-]+(?:/[\w.-]+)*")


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_module_paths_and_files_named_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = sorted(
        {d for d in _DOTTED.findall(text) if not _resolves(d)}
        | {p for p in (m.rstrip(".") for m in _PATH.findall(text)) if not (ROOT / p).exists()}
    )
    assert not missing, f"{page.name} names what is not in the repository: {missing}"


def test_files_cite_only_documents_in_the_repository() -> None:
    # notes kept outside the repository (a design note, a list of measurements) mean nothing to a reader
    # of a clone: a docstring or comment states the fact, or cites a docs page or benchmark script
    sources = [*ROOT.glob("*.md"), *ROOT.glob("*.toml"), *ROOT.glob("*.py"), *ROOT.glob("docs/*.md")]
    for folder in ("fastdata", "benchmarks", "tools", "tests", ".ci"):
        sources += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".md", "")]
    cited = {
        (path.relative_to(ROOT).as_posix(), name)
        for path in sources
        for name in re.findall(r"(?<![\w/.-])[A-Z][A-Z_]+\.md\b", path.read_text(encoding="utf-8", errors="replace"))
    }
    missing = sorted(f"{where} cites {name}" for where, name in cited if not (ROOT / name).exists())
    assert not missing, missing


def _commands(page: Path) -> list[tuple[int, list[str]]]:
    """(line, words) of each command the page shows in a shell block or after a ``$`` prompt."""
    out = []
    for line, info, content in fences(page):
        if info.startswith("python"):
            continue
        text = content.replace("\\\n", " ")
        for k, raw in enumerate(text.splitlines()):
            cmd = raw.split(" #", 1)[0].strip()
            if info == "text":
                if not cmd.startswith("$ "):
                    continue
                cmd = cmd[2:]
            for part in cmd.split("&&"):
                try:
                    words = shlex.split(part)
                except ValueError:
                    continue
                while words and "=" in words[0]:  # PYTHONPATH=. python ...
                    words = words[1:]
                if words:
                    out.append((line + k + 1, words))
    return out


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from fastdata.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@functools.cache
def _script_flags(script: str) -> frozenset[str]:
    """The options a script's ``--help`` lists (run in this process: it exits before any work)."""
    out = io.StringIO()
    argv = sys.argv
    sys.argv = [script, "--help"]
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            runpy.run_path(str(ROOT / script), run_name="__main__")
    finally:
        sys.argv = argv
    return frozenset(re.findall(r"(?<![\w-])--?\w[\w-]*", out.getvalue()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_command_flags_shown_exist(page: Path) -> None:
    subcommands = _subcommands()
    wrong = []
    checked = 0
    for line, words in _commands(page):
        flags = [w.split("=", 1)[0] for w in words if w.startswith("-") and w != "-"]
        if words[0] == "fastdata" and len(words) > 1:
            parser = subcommands.get(words[1])
            if parser is None:
                wrong.append(f"line {line}: no command 'fastdata {words[1]}'")
                continue
            known = set(parser._option_string_actions)
            wrong += [f"line {line}: fastdata {words[1]} has no {f}" for f in flags if f not in known]
            checked += 1
        elif words[0] in ("python", "python3") and len(words) > 1 and words[1].endswith(".py"):
            script = ROOT / words[1]
            if not script.exists():
                wrong.append(f"line {line}: no script {words[1]}")
                continue
            known = _script_flags(words[1])
            wrong += [f"line {line}: {words[1]} has no {f}" for f in flags if f not in known]
            checked += 1
    assert not wrong, f"{page.name}: " + "; ".join(wrong)
    if page.name in ("README.md", "tar.md", "bench.md", "inspect.md", "hdf5.md"):
        assert checked, f"no command found in {page.name}: the parser of its blocks is broken"
