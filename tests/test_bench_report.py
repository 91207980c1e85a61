"""Reports: the rich table, JSON that round-trips, and the PNG plot."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image
from rich.console import Console

import fastdata as fd
from fastdata.bench import _report as report
from fastdata.bench._environment import describe
from tests.bench_points import WAITING, pt, sweep_of


def a_result(step_time: float = 0.0) -> fd.bench.SweepResult:
    stall = {"stall": 0.3, **WAITING} if step_time else dict(WAITING)
    result = sweep_of(
        pt(0, 100, **stall),
        pt(1, 180, **stall),
        pt(2, 340, **({"stall": 0.02} if step_time else {}), **WAITING),
        pt(2, 330, prefetch=4, **stall),
        pt(4, 350, **stall),
        step_time=step_time,
    )
    result.machine.update(describe())
    result.machine["usable_cores"] = 2
    return result


def test_json_holds_versions_machine_settings_and_the_recommendation(tmp_path: Path) -> None:
    result = a_result()
    rec = fd.bench.recommend(result)
    path = report.write_json(tmp_path / "out/bench.json", report.to_json(result, rec))
    data = json.loads(path.read_text())
    assert data["fastdata_bench"] == 1
    assert data["result"]["machine"]["versions"]["torch"].startswith("2.")
    assert data["result"]["machine"]["usable_cores"] == 2
    assert data["result"]["settings"]["batch_size"] == 64
    assert data["recommendation"]["kwargs"]["num_workers"] == 2
    assert data["recommendation"]["bottleneck"] == rec.bottleneck
    assert report.read_json(path) == result


def test_the_table_stars_the_recommendation_and_shows_the_diagnosis() -> None:
    result = a_result()
    rec = fd.bench.recommend(result)
    console = Console(record=True, width=200)
    report.print_report(result, rec, console)
    text = console.export_text()
    assert "★" in text and "2w pf2" in text and "4w pf2" in text
    assert "DataLoader(dataset, batch_size=64, num_workers=2" in text
    assert "Storage-bound" in text and "90% of its time in fetch" in text
    assert "per process" in text and "ctx/s invol" in text  # the process table
    assert "Rule of thumb, worker start-up [✓]" in text
    starred = [line for line in text.splitlines() if "★" in line]
    assert len(starred) == 1 and "2w pf2" in starred[0] and "340" in starred[0]


def test_a_failed_point_shows_its_error_once_in_one_line_below_the_table() -> None:
    result = a_result()
    for w in (8, 16):
        result.points.append(
            fd.bench.Point(fd.bench.Config(w, 2), error="RuntimeError: boom", traceback="Traceback ...\n")
        )
    console = Console(record=True, width=220)
    report.print_report(result, fd.bench.recommend(result), console)
    text = console.export_text()
    assert text.count("RuntimeError: boom") == 1  # once, naming both configurations
    assert "8w pf2, 16w pf2 failed: RuntimeError: boom" in text
    assert "tracebacks are in the JSON" in text and "Traceback" not in text


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    for step in (0.0, 0.05):
        result = a_result(step)
        path = report.write_plot(tmp_path / f"plot-{step}.png", result, fd.bench.recommend(result))
        with Image.open(path) as img:
            assert img.format == "PNG" and img.size == (700, 550)


def test_the_demo_summary_has_a_row_per_backend() -> None:
    result = a_result()
    rec = fd.bench.recommend(result)
    console = Console(record=True, width=160)
    console.print(report.summary_table([("tar", result, rec, ""), ("hdf5", None, None, "skipped: no h5py")]))
    text = console.export_text()
    assert "tar" in text and "340" in text and "storage" in text
    assert "skipped: no h5py" in text


def test_the_cores_rule_of_thumb_is_said_as_one_for_computing_workers_beside_waiting_ones() -> None:
    """Storage-bound workers: min(cores, data time / step time) is a rule for workers that compute; beside
    a measured best past the cores it must not read as the answer."""
    result = sweep_of(
        pt(0, 100, stall=0.6, **WAITING),
        pt(2, 340, stall=0.4, **WAITING),
        pt(4, 600, stall=0.3, **WAITING),
        step_time=0.02,
    )
    result.machine.update(describe())
    result.machine["usable_cores"] = 2
    rec = fd.bench.recommend(result)
    assert rec.bottleneck == "storage" and rec.estimate is not None, (rec.bottleneck, rec.diagnosis)
    console = Console(record=True, width=300)
    report.print_report(result, rec, console)
    estimate = [line for line in console.export_text().splitlines() if "• Estimate" in line]
    assert len(estimate) == 1 and "a rule for workers that compute; these mostly wait" in estimate[0], estimate
