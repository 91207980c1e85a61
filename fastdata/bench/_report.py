"""Reports of a sweep: a terminal table (rich), JSON (to compare runs), a PNG plot (matplotlib)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastdata.bench._advise import Recommendation
from fastdata.bench._diagnose import label, step_words
from fastdata.bench._result import Point, SweepResult
from fastdata.core.stages import STAGES
from fastdata.loading.observe.diagnose import WAITING_LABELS

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

JSON_VERSION = 1


def _ms(v: float | None) -> str:
    return "?" if v is None else f"{v:.2f}"


def _mb(n: float) -> str:
    return f"{n / 1e6:.0f}" if n else "-"


LOADER_THREAD = "fastdata-loader"  # the name of thread mode's threads (fastdata.loading.threads._gang.ThreadGang)


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
                "[red]failed (below)[/red]",
            )
            continue
        stages = "/".join(_ms(p.stage_ms.get(s)) for s in STAGES)
        pss = _mb(p.window.main.pss) + (
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
            f"{p.window.mb_per_s:.1f}",
        ]
        if stall:
            row.append(f"{p.stall:.0%}" if p.stall is not None else "-")
        row += [
            f"{p.window.main_busy:.0%}",
            f"{p.window.receiving[0] + p.window.pinning:.0%}",
            f"{p.window.cores_used:.1f}/{p.demand:.1f}",
            stages,
            pss,
            str(p.fds),
            label(p, result),
        ]
        table.add_row(*row, style="bold" if mark else None)
    return table


def process_table(result: SweepResult, points: Sequence[Point]) -> Table:
    """Per process, for the given points: CPU (every thread), busy, threads, context switches apart,
    D state, block-I/O delay, reads from the device against all reads, the busiest helper threads, and
    where the first batch's wait went."""
    from rich.table import Table

    table = Table(title="per process", title_justify="left", header_style="bold")
    for name in (
        "config",
        "process",
        "cores",
        "busy",
        "threads",
        "ctx/s vol",
        "ctx/s invol",
        "D state",
        "blk-I/O",
        "device/read MB/s",
        "busiest threads (cores)",
    ):
        table.add_column(name, justify="left" if name in ("config", "process", "busiest threads (cores)") else "right")
    cores = float(result.usable_cores)
    for p in points:
        if not p.ok:
            continue
        w = p.window
        blk = f"{w.blkio(p.config.producers):.0%}" if p.blkio_known else "off"
        io = f"{w.device_mb_s:.1f}/{w.read_mb_s:.1f}"
        helpers = ", ".join(f"{n} {c:.2f}" for n, c in list(w.main_threads.items())[:3])
        voluntary, involuntary = w.switches
        table.add_row(
            p.config.label(),
            "main",
            f"{min(w.main_cores, cores):.2f}",
            f"{min(w.main_process_busy, cores):.0%}",  # threads summed: never more cores than there are
            str(w.main.threads),
            f"{voluntary:,.0f}",
            f"{involuntary:,.0f}",
            f"{w.dstate:.0%}",
            blk,
            io,
            helpers,
        )
        if p.config.mode == "threads":
            # loader threads are threads of the main process (their CPU is in its row): each one's CPU, read
            # from /proc/self/task; how long each waited for a core is not read per thread
            own = {n: c for n, c in w.main_threads.items() if n.startswith(LOADER_THREAD)}
            table.add_row(
                "",
                f"loader threads x{p.config.num_workers}",
                f"{sum(own.values()):.2f}",
                "-",
                "",
                "",
                "",
                "",
                "",
                "",
                ", ".join(f"{n} {c:.2f}" for n, c in list(own.items())[:3]),
            )
        if p.config.processes:
            busy = w.per_worker_busy
            threads = ", ".join(f"{n} {c:.2f}" for n, c in list(w.worker_threads.items())[:3])
            table.add_row(
                "",
                f"workers x{p.config.num_workers}"
                + (f" ({p.config.threads_per_worker} threads each)" if p.config.mode == "hybrid" else ""),
                f"{sum(w.worker_cores):.2f}",
                f"{busy:.0%} each",
                str(max((x.threads for x in w.workers), default=0)),
                "",
                "",
                "",
                "",
                "",
                threads,
            )
    return table


def _split_text(split: dict[str, float]) -> str:
    if not split:
        return "-"
    parts = ", ".join(f"{k} {split.get(k, 0.0):.2f}" for k in ("launch", "init", "fill", "produce", "deliver"))
    read = f"; read {split.get('read', 0):.0f} samples for a first batch of {split.get('batch', 0):.0f}"
    return f"{split.get('total', 0.0):.2f} s: {parts}{read if split.get('read') else ''}"


def _console_for(console: Console | None, width: int) -> Console:
    """The given console; else stdout's, and when stdout is not a terminal (a pipe, a file, CI), one as
    wide as the table so nothing is cut to 80 columns (rich's default width off a terminal)."""
    from rich.console import Console

    if console is not None:
        return console
    out = Console()
    if not out.is_terminal:
        out = Console(width=max(width, 100), no_color=True, highlight=False, soft_wrap=True)
    return out


def _bytes(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def fetched_words(settings: dict[str, Any]) -> str | None:
    """The bytes the run fetched from a remote store against the bytes stored, and the fetch cache, in
    words (None for local data): "fetched 3.2 MB = 1.00x the 3.2 MB stored (fetch cache: ...)"."""
    fetched, stored, cache = settings.get("fetched_bytes"), settings.get("stored_bytes"), settings.get("fetch_cache")
    if cache is None and not fetched:
        return None
    text = f"fetched {_bytes(fetched or 0)}"
    if stored:
        text += f" = {(fetched or 0) / stored:.2f}x the {_bytes(stored)} stored"
    return text + (f" (fetch cache: {cache})" if cache else "")


def measured_words(settings: dict[str, Any]) -> str:
    """What the sweep measured, in words, for the report's heading: the source, decoded or raw (and how),
    batched in the dataset or by the DataLoader, the transport, and for remote data the bytes fetched."""
    from fastdata.loading import DEFAULT_TRANSPORT

    parts = [str(settings["source"])] if settings.get("source") else []
    decoded = settings.get("decoded")
    if decoded is False:
        parts.append("raw bytes, not decoded (as asked)")
    elif settings.get("decode"):
        parts.append(f"decoded, {settings['decode']}")
    elif decoded:
        parts.append("decoded")
    in_dataset = settings.get("dataset_batch_size")
    if in_dataset:
        parts.append(f"batched in the dataset ({in_dataset} per batch)")
    elif settings.get("batch_size"):
        parts.append(f"batched by the DataLoader ({settings['batch_size']} per batch)")
    else:
        parts.append("not batched")
    transport = list(settings.get("transport") or ["stock"])
    kinds = " and ".join(transport)
    default = " (fd.Loader's default)" if transport == [DEFAULT_TRANSPORT] else ""
    parts.append(f"transport {kinds}{default}" + (", each labelled" if len(transport) > 1 else ""))
    fetched = fetched_words(settings)
    if fetched:
        parts.append(fetched)
    return "; ".join(parts)


def print_report(
    result: SweepResult, rec: Recommendation, console: Console | None = None, *, title: str | None = None
) -> None:
    """The table of points, the per-process table, then the recommendation, its evidence and checks."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    machine = result.machine
    head = title or "fastdata bench"
    decoded = result.settings.get("decoded")
    what = "" if decoded is None else (" (decoded)" if decoded else " (raw bytes, not decoded: as asked)")
    phys = machine.get("physical_cores")
    sub = (
        f"{result.dataset}{what}\nmeasured: {measured_words(result.settings)}\n"
        f"{machine.get('usable_cores', '?')} usable cores"
        + (f" ({phys} physical)" if phys and phys != machine.get("usable_cores") else "")
        + f", start method {result.settings.get('multiprocessing_context') or '?'}, "
        f"{step_words(result.settings)}, {result.settings.get('seconds')} s per point, "
        f"modes {'+'.join(result.settings.get('modes') or ['processes'])}"
    )
    table = point_table(result, rec, title=f"{head}\n{sub}")
    width = Console(width=10_000).measure(table).maximum
    console = _console_for(console, width)
    plain = not console.is_terminal and console.width >= width and console.no_color
    console.print(table)
    failures = failure_lines(result)
    if rec.config is None:
        for line in [*failures, "Nothing is recommended: no configuration could be measured."]:
            console.print(line, markup=False, highlight=False)
        return
    for line in failures:
        console.print(line, markup=False, highlight=False)
    shown = [p for p in ([rec.point] if rec.best is rec.point else [rec.point, rec.best]) if p is not None]
    if shown:
        console.print(process_table(result, shown))
    lines: list[tuple[str, str | None]] = [(rec.code(), "bold green")]
    if rec.point is not None and rec.best is not None:
        lines.append(
            (
                f"{rec.point.samples_per_s:,.0f} samples/s, {rec.ratio_to_best:.0%} of the best measured "
                f"({rec.best.samples_per_s:,.0f} at {rec.best.config.label()}). Bottleneck: {rec.bottleneck}.",
                None,
            )
        )
    for sentence in rec.diagnosis:
        lines.append(("• " + sentence, None))
    if rec.point is not None:
        lines.append((f"• First batch: {_split_text(rec.point.start_split)}.", None))
        if rec.point.restart_split:
            lines.append((f"• Later epochs' first batch: {_split_text(rec.point.restart_split)}.", None))
    if rec.estimate is not None:
        measured = rec.config.describe() if rec.config is not None else "?"
        # the rule counts cores, for workers that compute: beside workers that mostly wait it is said as such
        waiting = rec.bottleneck in WAITING_LABELS
        aside = (
            " (a rule for workers that compute; these mostly wait, so more than the cores can pay)" if waiting else ""
        )
        lines.append((f"• Estimate: workers = {rec.estimate[1]}{aside}; measured best: {measured}.", None))
    for check in rec.checks:
        mark = "✗ fires" if check.fires else "✓"
        lines.append((f"• Rule of thumb, {check.name} [{mark}]: {check.text}.", None))
    if rec.per_rank:
        lines.append(("• " + rec.per_rank["advice"], None))
    if plain:
        console.print("recommendation")
        for text, _style in lines:
            console.print(text, markup=False, highlight=False)
        return
    body = Text()
    for text, style in lines:
        body.append(text + "\n", style=style)
    console.print(Panel(body, title="recommendation", title_align="left"))


def failure_lines(result: SweepResult) -> list[str]:
    """Each error of the sweep once, in one line, with the configurations it stopped ("0w, 1w pf2 failed:
    ..."); their tracebacks are in the JSON (each point's ``traceback``)."""
    by_error: dict[str, list[str]] = {}
    for p in result.points:
        if not p.ok:
            by_error.setdefault(p.error or "no throughput", []).append(p.config.label())
    if not by_error:
        return []
    every = sum(len(v) for v in by_error.values()) == len(result.points)
    out = []
    for error, configs in by_error.items():
        who = "every configuration" if every and len(by_error) == 1 else ", ".join(configs)
        out.append(f"{who} failed: {error}")
    traced = any(p.traceback for p in result.points)
    return [*out, "(the tracebacks are in the JSON: --json FILE, each point's 'traceback')"] if traced else out


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
            str(rec.config.num_workers) if rec.config.mode == "processes" else rec.config.label().split()[0],
            f"{p.samples_per_s:,.0f}",
            f"{p.window.mb_per_s:.1f}",
            f"{p.startup_s:.2f}",
            rec.bottleneck,
            *extra,
        )
    return table


def to_json(result: SweepResult, rec: Recommendation | None = None) -> dict[str, Any]:
    """The whole result (points, exact settings, machine, versions) and the recommendation."""
    out: dict[str, Any] = {"fastdata_bench": JSON_VERSION, "result": result.to_dict()}
    settings = result.settings
    out["measured"] = {
        "words": measured_words(settings),
        "source": settings.get("source"),
        "decoded": settings.get("decoded"),
        "dataset_batch_size": settings.get("dataset_batch_size"),
        "batch_size": settings.get("batch_size"),
        "transport": settings.get("transport"),
        "fetched_bytes": settings.get("fetched_bytes"),
        "stored_bytes": settings.get("stored_bytes"),
        "fetch_cache": settings.get("fetch_cache"),
    }
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
    bottom.set_xlabel(
        "num_workers (loader threads in thread mode)"
        if any(p.config.mode == "threads" for p in result.points)
        else "num_workers"
    )
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    workers = sorted({p.config.num_workers for p in result.points})
    bottom.set_xticks(workers)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


__all__ = [
    "failure_lines",
    "point_table",
    "print_report",
    "process_table",
    "read_json",
    "summary_table",
    "to_json",
    "write_json",
    "write_plot",
]
