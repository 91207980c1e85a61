"""``fastdata convert`` stopped by Ctrl-C says what to do next (rerun the same command: finished shards are
kept), and the rerun resumes: the real conversion, held after its second finished shard, interrupted by a
real SIGINT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.datagen import make_image_folder

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


CTRL_C_CLI = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # also where the test runner ignores SIGINT
import fastdata.convert
real = fastdata.convert.convert

def paused(*args, **kwargs):  # the real conversion, held after its second finished shard
    seen = []

    def on_shard(record):
        seen.append(record)
        if len(seen) == 2:
            print("MID", flush=True)
            sys.stdin.read()  # until the test's Ctrl-C

    return real(*args, on_shard=on_shard, **kwargs)

fastdata.convert.convert = paused
from fastdata.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_ctrl_c_says_to_rerun_the_same_command_and_the_rerun_resumes(tmp_path) -> None:
    root = tmp_path / "src"
    make_image_folder(root, classes=2, per_class=10, seed=4)
    out = tmp_path / "out"
    args = ["convert", str(root), str(out), "--shard-count", "10", "--workers", "1", "--quiet"]
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_CLI, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "MID"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert "fastdata convert: interrupted; rerun the same command to resume (finished shards are kept)" in err
    assert not (out / "manifest.json").exists()
    resumed = subprocess.run(
        [sys.executable, "-m", "fastdata", *args], env=_env(), cwd=ROOT, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "manifest.json").read_text())["samples"] == 20
