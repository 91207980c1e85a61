"""Reports of a sweep: a terminal table (rich), JSON (to compare runs), a PNG plot (matplotlib)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastdata.bench.advise import Recommendation
from fastdata.bench.diagnose import label
from fastdata.bench.result import Point, SweepResult
from fastdata.core.stages import STAGES

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

JSON_VERSION = 1


def _ms(v: float | None) -> str:
    return "?" if v is None else f"{v:.2f}"


def _mb(n: float) -> str:
    return f"{n / 1e6:.0f}" if n else "-"


def point_table(result: SweepResult, rec: Recommendation | None = None, *, title: str | None = None) -> Table:
    """Every point as a row of a rich table; the recommended row starred."""
    from rich.table import Table

    stall = bool(result.step_time)
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("", width=1)
    table.add_column("config")
    table.add_column("1st batch s", justify="right")
    table.add_column("samples/s", justify="right")
    table.add_column("±", justify="right")
    table.add_column("MB/s", justify="right")
    if stall:
        table.add_column("stall", justify="right")
    table.add_column("main busy", justify="right")
    table.add_column("recv", justify="right")
    table.add_column("cores used/wanted", justify="right")
    table.add_column("ms/sample " + "/".join(s[:5] for s in STAGES), justify="right")
    table.add_column("PSS MB main+w", justify="right")
    table.add_column("fds", justify="right")
    table.add_column("limit")
    for p in result.points:
        mark = "★" if rec is not None and rec.point is p else ""
        if not p.ok:
            table.add_row(
                mark,
                p.config.label(),
                f"{p.startup_s:.2f}",
                "-",
                "",
                "",
                *([""] if stall else []),
                "",
                "",
                "",
                "",
                "",
                "",
                f"[red]failed: {p.error}[/red]",
            )
            continue
        stages = "/".join(_ms(p.stage_ms.get(s)) for s in STAGES)
        pss = _mb(p.pss_main) + (
            "+"
            + "+".join(_mb(x) for x in p.pss_workers[:1])
            + (f"x{len(p.pss_workers)}" if len(p.pss_workers) > 1 else "")
            if p.pss_workers
            else ""
        )
        row = [
            mark,
            p.config.label(),
            f"{p.startup_s:.2f}",
            f"{p.samples_per_s:,.0f}",
            f"{p.spread:.0%}",
            f"{p.mb_per_s:.1f}",
        ]
        if stall:
            row.append(f"{p.stall:.0%}" if p.stall is not None else "-")
        row += [
            f"{p.main_busy:.0%}",
            f"{p.unpickle + p.pin:.0%}",
            f"{p.total_cores:.1f}/{p.demand:.1f}",
            stages,
            pss,
            str(p.fds),
            label(p, result),
        ]
        table.add_row(*row, style="bold" if mark else None)
    return table


def print_report(
    result: SweepResult, rec: Recommendation, console: Console | None = None, *, title: str | None = None
) -> None:
    """The table of points, then the recommendation and its diagnosis."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    console = console or Console()
    machine = result.machine
    head = title or "fastdata bench"
    sub = (
        f"{result.dataset}\n{machine.get('usable_cores', '?')} usable cores, "
        f"batch_size={result.settings.get('batch_size')}, "
        f"step {result.settings.get('step_time') or 0} s, {result.settings.get('seconds')} s per point"
    )
    console.print(point_table(result, rec, title=f"{head}\n{sub}"))
    body = Text()
    body.append(rec.code() + "\n", style="bold green")
    if rec.point is not None and rec.best is not None:
        body.append(
            f"{rec.point.samples_per_s:,.0f} samples/s, {rec.ratio_to_best:.0%} of the best measured "
            f"({rec.best.samples_per_s:,.0f} at {rec.best.config.label()}). Bottleneck: {rec.bottleneck}.\n"
        )
    for sentence in rec.diagnosis:
        body.append("• " + sentence + "\n")
    if rec.per_rank:
        body.append("• " + rec.per_rank["advice"] + "\n")
    console.print(Panel(body, title="recommendation", title_align="left"))


def summary_table(rows: Sequence[tuple[str, SweepResult | None, Recommendation | None, str]]) -> Table:
    """One row per backend: (backend, result, recommendation, note)."""
    from rich.table import Table

    table = Table(
        title="fastdata bench --demo: recommended DataLoader settings per backend",
        title_justify="left",
        header_style="bold",
    )
    notes = any(note for *_, note in rows)
    for name, justify in (
        ("backend", "left"),
        ("best workers", "right"),
        ("samples/s", "right"),
        ("MB/s", "right"),
        ("1st batch s", "right"),
        ("bottleneck", "left"),
        *([("note", "left")] if notes else []),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for backend, _result, rec, note in rows:
        extra = [note] if notes else []
        if rec is None or rec.point is None or rec.config is None:
            table.add_row(backend, "-", "-", "-", "-", "-", *extra)
            continue
        p = rec.point
        table.add_row(
            backend,
            str(rec.config.num_workers),
            f"{p.samples_per_s:,.0f}",
            f"{p.mb_per_s:.1f}",
            f"{p.startup_s:.2f}",
            rec.bottleneck,
            *extra,
        )
    return table


def to_json(result: SweepResult, rec: Recommendation | None = None) -> dict[str, Any]:
    """The whole result (points, exact settings, machine, versions) and the recommendation."""
    out: dict[str, Any] = {"fastdata_bench": JSON_VERSION, "result": result.to_dict()}
    if rec is not None:
        out["recommendation"] = rec.to_dict()
    return out


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` (from :func:`to_json`, or a dict of them) as indented JSON; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    return path


def read_json(path: str | os.PathLike[str]) -> SweepResult:
    """The :class:`SweepResult` in a file written by :func:`write_json`."""
    data = json.loads(Path(path).read_text())
    return SweepResult.from_dict(data["result"])


def write_plot(
    path: str | os.PathLike[str], result: SweepResult, rec: Recommendation | None = None, *, title: str | None = None
) -> Path:
    """A PNG: samples/s against workers (and stall, with a step time, else time to first batch), one line
    per prefetch/pin/persistence setting, the recommended point starred."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("plots need matplotlib; install it with pip install 'fastdata[plot]'") from e

    series: dict[str, list[Point]] = {}
    for p in result.ok_points():
        series.setdefault(p.config.series(), []).append(p)
    stall = bool(result.step_time)
    # Figure + Agg canvas, not pyplot: no global backend switch, safe in any program that imports us
    fig = Figure(figsize=(7, 5.5), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for name, pts in sorted(series.items()):
        pts = sorted(pts, key=lambda p: p.config.num_workers)
        xs = [p.config.num_workers for p in pts]
        top.errorbar(
            xs,
            [p.samples_per_s for p in pts],
            yerr=[p.spread * p.samples_per_s / 2 for p in pts],
            marker="o",
            capsize=3,
            label=name,
        )
        lower = [100 * (p.stall or 0.0) for p in pts] if stall else [p.startup_s for p in pts]
        bottom.plot(xs, lower, marker="o", label=name)
    if rec is not None and rec.point is not None:
        p = rec.point
        top.plot(
            [p.config.num_workers],
            [p.samples_per_s],
            marker="*",
            markersize=18,
            color="gold",
            markeredgecolor="black",
            zorder=5,
            label="recommended",
        )
        top.annotate(
            f"{p.config.label()}\n{rec.bottleneck}-bound"
            if rec.bottleneck not in ("none", "unknown")
            else p.config.label(),
            (p.config.num_workers, p.samples_per_s),
            textcoords="offset points",
            xytext=(-12, -28),
            ha="right",
            fontsize=9,
        )
        lower_y = 100 * (p.stall or 0.0) if stall else p.startup_s
        bottom.plot(
            [p.config.num_workers],
            [lower_y],
            marker="*",
            markersize=14,
            color="gold",
            markeredgecolor="black",
            zorder=5,
        )
    top.margins(x=0.08)
    top.set_ylabel("samples/s")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    top.legend(fontsize=8)
    top.set_title(title or f"fastdata bench: {result.dataset}"[:90], fontsize=10)
    bottom.set_ylabel("stall %" if stall else "1st batch s")
    bottom.set_xlabel("num_workers")
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    workers = sorted({p.config.num_workers for p in result.points})
    bottom.set_xticks(workers)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


__all__ = ["point_table", "print_report", "read_json", "summary_table", "to_json", "write_json", "write_plot"]
