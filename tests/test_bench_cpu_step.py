"""The simulated step as CPU work (issue 22 item 5): ``--step-cpu-ms`` / ``sweep(step_cpu=...)`` computes in the
training process during the step, as CPU-side training does; ``--step-ms`` waits, leaving the cores free."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

import fastdata as fd
from fastdata.bench._step import CPUStep
from fastdata.cli import main
from fastdata.core.errors import ConfigError


class Cheap(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), i)


def _step_cpu_per_batch(**step: float) -> float:
    """The training process's CPU seconds (every thread) spent in the steps, per batch."""
    result = fd.bench.sweep(
        Cheap(), workers=[0], batch_size=8, seconds=0.6, window=0.2, warmup=0.1, confirm=False, **step
    )
    (point,) = result.points
    assert point.ok, point.error
    w = point.window
    assert w.step_s > 0 and w.batches > 0
    return (w.step_cpu_s + w.step_others_s) / w.batches


def test_a_cpu_step_computes_in_the_training_process_and_a_wait_does_not() -> None:
    # CPU seconds consumed, not a share of the wall time: other work on the machine stretches a step's wall
    # time (issue 34: a share of 0.41 under load) but not the CPU its computing takes, nor a wait's
    computing = _step_cpu_per_batch(step_cpu=0.01)
    waiting = _step_cpu_per_batch(step_time=0.01)
    assert computing > 10 * waiting, (computing, waiting)


def test_the_cpu_step_leaves_the_users_random_state_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    CPUStep(0.002)
    assert torch.equal(torch.rand(3), expected)


def test_cli_step_cpu_ms_reaches_the_sweep_and_its_report(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    spec = f"{__name__}:Cheap"
    rc = main(["bench", spec, "--workers", "0", "--seconds", "0.5", "--step-cpu-ms", "5", "--json", str(out)])
    assert rc == 0
    settings = json.loads(out.read_text())["result"]["settings"]
    assert settings["step_cpu"] == pytest.approx(0.005)


def test_a_negative_cpu_step_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", f"{__name__}:Cheap", "--step-cpu-ms", "-1"]) == 2
    assert "--step-cpu-ms -1.0 must be >= 0" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="step_cpu"):
        CPUStep(0.0)
