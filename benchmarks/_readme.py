"""What a benchmark adds to its JSON for README.md's generated table (``tools/readme_figures.py``): its rows,
the date, and the machine it ran on with the load around the run (this repository's figures come from a
2-core machine shared with other work: the load says how shared)."""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any


def row(backend: str, comparison: str, figure: str, target: str) -> dict[str, str]:
    """One row of the README's table (its command is the one that ran, added by :func:`stamp`)."""
    return {"backend": backend, "comparison": comparison, "figure": figure, "target": target}


def stamp(report: dict[str, Any], rows: list[dict[str, str]], load_start: tuple[float, ...]) -> None:
    """Add ``rows`` (each with the command that measured it: this run's), the date and where it was measured
    (``measured_on``) to ``report``."""
    end = os.getloadavg()
    script = Path(sys.argv[0]).resolve()
    shown = f"benchmarks/{script.name}" if script.parent.name == "benchmarks" else str(script)
    command = " ".join(["python", shown, *(shlex.quote(a) for a in sys.argv[1:])])
    report["readme_rows"] = [{**r, "command": command} for r in rows]
    report["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    report["measured_on"] = (
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"load {load_start[0]:.1f} at start, {end[0]:.1f} at end"
    )


def per_workers(ratios: dict[Any, float], workers: list[int]) -> str:
    """``1.9x / 1.4x / 2.3x`` for the worker counts measured."""
    return " / ".join(f"{ratios[str(w)] if str(w) in ratios else ratios[w]:.1f}x" for w in workers)


def workers_label(workers: list[int]) -> str:
    return "(" + " / ".join(str(w) for w in workers) + " workers)"
