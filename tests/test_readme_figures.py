"""README.md's benchmark table is generated from the benchmarks' committed JSON (``tools/readme_figures.py``):
the block in the README is what the command gives, a hand edit of it is caught, and each row names the
machine and date its JSON was measured on."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "tools" / "readme_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_what_the_committed_json_gives() -> None:
    figures = tool()
    readme = (ROOT / "README.md").read_text()
    lo, hi = figures.block(readme)
    assert readme[lo:hi] == figures.render(ROOT / "benchmarks" / "results") + "\n"
    assert figures.main(["--check"]) == 0


def test_a_hand_edit_of_the_table_is_caught_and_undone(tmp_path: Path) -> None:
    figures = tool()
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    lo, hi = figures.block(text)
    readme.write_text(text[:lo] + text[lo:hi].replace("x", "y", 1) + text[hi:])
    results = ROOT / "benchmarks" / "results"
    args = ["--readme", str(readme), "--results", str(results)]
    assert figures.main([*args, "--check"]) == 1
    assert figures.main(args) == 0
    assert readme.read_text() == text


def test_rows_come_from_each_json_with_its_machine_and_date(tmp_path: Path) -> None:
    figures = tool()
    results = tmp_path / "results"
    results.mkdir()
    row = {"backend": "tar", "comparison": "a | b", "figure": "2.0x", "target": ">= 3x", "command": "python b.py"}
    report = {"machine": "x86_64, 2 cores", "date": "2026-12-05", "readme_rows": [row]}
    (results / "b.json").write_text(json.dumps(report))
    (results / "a.json").write_text(json.dumps({"results": {}}))  # no rows: none in the table
    table = figures.render(results).splitlines()
    assert table[2:] == ["| tar | a \\| b | 2.0x | >= 3x | `python b.py` | x86_64, 2 cores, 2026-12-05 |"]


def test_where_a_report_says_where_it_ran_and_the_load_the_row_shows_it(tmp_path: Path) -> None:
    figures = tool()
    results = tmp_path / "results"
    results.mkdir()
    row = {"backend": "HDF5", "comparison": "c", "figure": "0.9", "target": ">= 0.8", "command": "python h.py"}
    report = {
        "machine": {"cpus": 2},  # a benchmark's own record of the machine: not a line for the table
        "measured_on": "x86_64, 2 cores, load 1.0 at start, 2.0 at end",
        "date": "2026-12-06",
        "readme_rows": [row],
    }
    (results / "h.json").write_text(json.dumps(report))
    assert (
        figures.render(results)
        .splitlines()[2]
        .endswith("| x86_64, 2 cores, load 1.0 at start, 2.0 at end, 2026-12-06 |")
    )


def test_every_figure_table_of_the_benchmarks_section_is_generated() -> None:
    figures = tool()
    readme = (ROOT / "README.md").read_text()
    lo, hi = figures.block(readme)
    rest = readme[:lo] + readme[hi:]  # the README without the generated table
    start = rest.index("\n## Benchmarks")
    section = rest[start : rest.index("\n## ", start + 1)]
    typed = [line for line in section.splitlines() if line.startswith("|")]
    assert typed == [], "a table typed by hand in README.md's Benchmarks section: make its benchmark write readme_rows"
