"""The S3 backend of ``fastdata bench`` against a real S3 server (moto over HTTP on 127.0.0.1): which
dataset each SPEC form gets, the options, the stage hooks, and the demo's own server (started, used,
stopped on exit, after an error and on Ctrl-C, credentials kept out of every output)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata as fd
from fastdata.bench import backends
from fastdata.bench._local_s3 import CREDENTIALS
from fastdata.bench.backends import DemoUnavailable, public_options
from fastdata.bench.backends import _s3 as s3_backend
from fastdata.cli import main
from fastdata.core import stages
from fastdata.core.errors import ConfigError
from fastdata.formats.tar._reader import scan
from fastdata.storage import open_reader
from fastdata.storage.s3._client import S3Config
from tests.datagen import jpeg_bytes, make_shards
from tests.s3_server import MotoServer, upload_files

ROOT = Path(__file__).resolve().parents[1]
SECRET = CREDENTIALS["aws_secret_access_key"]


def refuses(endpoint_url: str) -> bool:
    """Whether nothing listens at ``http://host:port`` any more."""
    host, port = endpoint_url.rsplit("/", 1)[-1].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError:
        return True
    return False


@pytest.fixture(scope="module")
def bucket(s3_server: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Objects under ``img/``, tar shards with a sidecar and a manifest under ``tar/``, both under ``mixed/``."""
    client = s3_server.client()
    client.create_bucket(Bucket="bench-s3-backend")
    rng = np.random.default_rng(3)
    upload_files(client, "bench-s3-backend", {f"img/{i:03d}.jpg": jpeg_bytes(rng) for i in range(20)})
    shards = make_shards(tmp_path_factory.mktemp("shards"), shards=2, per_shard=10, seed=2)
    files: dict[str, Any] = {f"tar/{os.path.basename(p)}": p for p in shards}
    with open_reader(shards[0]) as reader:  # a real sidecar index, as the converter uploads beside a shard
        files["tar/train-000000.tar.idx"] = scan(reader).to_bytes()
    files["tar/manifest.json"] = b"{}"
    files["mixed/a.tar"] = shards[0]
    files["mixed/b.jpg"] = jpeg_bytes(rng)
    upload_files(client, "bench-s3-backend", files)
    return "bench-s3-backend"


@pytest.fixture
def config(s3_server: MotoServer) -> S3Config:
    return S3Config(**s3_server.options())


def test_every_s3_spec_is_the_s3_backends_and_local_shards_stay_tar() -> None:
    for spec in ("s3://b/prefix/", "s3://b/train-{000000..000009}.tar", "s3://b/one.tar", "s3://b/list.json"):
        assert backends.detect(spec).name == "s3", spec
        assert not backends.get("tar").detect(spec)
    assert backends.detect("data/train-{000000..000009}.tar").name == "tar"


def test_each_spec_form_gets_its_dataset(bucket: str, config: S3Config) -> None:
    objects = s3_backend.open(f"s3://{bucket}/img/", config=config, decode="numpy")
    assert isinstance(objects, fd.S3Dataset) and len(objects) == 20
    assert objects[0]["jpg"].ndim == 3  # decoded
    # a prefix of shards, sidecars and a manifest is read as shards
    shards = s3_backend.open(f"s3://{bucket}/tar/", config=config)
    assert isinstance(shards, fd.TarShardDataset) and len(shards.source.urls) == 2
    shards.close()
    braces = s3_backend.open(f"s3://{bucket}/tar/train-{{000000..000001}}.tar", config=config, indexed=True)
    assert isinstance(braces, fd.IndexedTarDataset) and len(braces) == 20
    braces.close()
    # forced to objects, or a prefix that holds more than shards: one sample per object
    assert len(s3_backend.open(f"s3://{bucket}/tar/", config=config, shards=False)) == 4
    assert isinstance(s3_backend.open(f"s3://{bucket}/mixed/", config=config), fd.S3Dataset)


def test_options_are_checked_and_credentials_refused(bucket: str, config: S3Config) -> None:
    with pytest.raises(ConfigError, match=r"\(objects\): unknown option\(s\) shuffle_window"):
        s3_backend.open(f"s3://{bucket}/img/", config=config, shuffle_window=8)
    with pytest.raises(ConfigError, match=r"\(tar shards\): unknown option\(s\) lookahead"):
        s3_backend.open(f"s3://{bucket}/tar/", config=config, lookahead=2)
    with pytest.raises(ConfigError, match="aws_secret_access_key cannot be an option") as caught:
        s3_backend.open(f"s3://{bucket}/img/", aws_access_key_id="AKIA-TEST", aws_secret_access_key="hunter2")
    assert "hunter2" not in str(caught.value) and "AKIA-TEST" not in str(caught.value)
    # what a report records of a config: its repr, which hides the credentials
    assert SECRET not in json.dumps(public_options({"config": config, "decode": "torch"}))


def test_the_s3_dataset_reports_fetch_and_decode(bucket: str, config: S3Config) -> None:
    ds = s3_backend.open(f"s3://{bucket}/img/", config=config, decode="numpy", lookahead=0)
    stages.enable()
    try:
        assert len(ds.__getitems__([4, 2, 7])) == 3
        totals = stages.totals()
    finally:
        stages.disable()
        ds.close()
    assert totals["fetch"][1] == 3 and totals["decode"][1] == 3 and totals["transform"][1] == 0


@pytest.mark.slow
def test_bench_an_s3_prefix_from_the_command_line(
    bucket: str, s3_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "bench",
            f"s3://{bucket}/img/",
            "--workers",
            "0,1",
            "--seconds",
            "0.3",
            "--batch-size",
            "4",
            "-o",
            "decode=torch",
            "--json",
            str(tmp_path / "s3.json"),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "s3.json").read_text())
    assert data["result"]["settings"]["format"] == "s3"
    points = data["result"]["points"]
    assert all(p["error"] is None for p in points)
    assert all(p["stage_ms"]["fetch"] is not None and p["stage_ms"]["decode"] is not None for p in points)


def test_the_demo_serves_its_data_then_stops_its_server(tmp_path: Path) -> None:
    backend = backends.get("s3")
    with backend.demo(tmp_path, scale=0.1) as data:
        endpoint = data.options["config"].endpoint_url
        assert endpoint.startswith("http://127.0.0.1:") and not refuses(endpoint)
        ds = backend.open(data.spec, **data.options)
        assert ds.config.endpoint_url == endpoint  # passed to the dataset explicitly, not through the env
        assert len(ds) == round(s3_backend.DEMO_OBJECTS * 0.1)
        assert tuple(ds[0]["jpg"].shape) == (3, *s3_backend.DEMO_SIZE)  # decode="torch": CHW
        ds.close()
        assert SECRET not in json.dumps(public_options(data.options)) + repr(ds)
    assert refuses(endpoint)
    # an error inside the block stops the server too
    with pytest.raises(RuntimeError, match="boom"), backend.demo(tmp_path / "again", scale=0.1) as data:
        endpoint = data.options["config"].endpoint_url
        raise RuntimeError("boom")
    assert refuses(endpoint)


def test_without_moto_the_demo_skips_s3_with_an_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "moto", None)  # as if moto were not installed
    with pytest.raises(DemoUnavailable, match=r"pip install 'fastdata\[demo\]'"), backends.get("s3").demo(tmp_path):
        pass
    assert main(["bench", "--demo", "--backends", "s3"]) == 1  # nothing could be measured
    out = capsys.readouterr().out
    assert "s3: skipped: the S3 demo needs a local S3 server: moto is not installed" in out
    assert "pip install 'fastdata[demo]'" in out.replace("\n", "")


# starts the child with SIGINT ignored, as a shell's background job is: exec keeps an ignored signal
IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"
)


@pytest.mark.slow
@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_stops_the_demo_server(tmp_path: Path, inherited: str) -> None:
    # A process started in the background by a non-interactive shell (a CI runner) inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler: the child takes Ctrl-C as a user's
    # terminal sends it only because it installs the handler itself, before it says it is ready (the
    # test's signal can only come after that line, so nothing races its start-up).
    script = textwrap.dedent("""
        import signal, socket, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from pathlib import Path
        from fastdata.bench import backends

        try:
            with backends.get("s3").demo(Path(sys.argv[1]), scale=0.1) as data:
                print(data.options["config"].endpoint_url, flush=True)
                sys.stdin.read()  # until the test interrupts us
        except KeyboardInterrupt:
            host, port = data.options["config"].endpoint_url.rsplit("/", 1)[-1].split(":")
            try:
                socket.create_connection((host, int(port)), timeout=5).close()
                print("still running", flush=True)
            except OSError:
                print("stopped", flush=True)
    """)
    command = [sys.executable, "-c", script, str(tmp_path)]
    if inherited == "ignored":
        command = [sys.executable, "-c", IGNORING_SIGINT, *command]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().strip()
        assert endpoint.startswith("http://127.0.0.1:"), endpoint
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rest.strip() == "stopped"
    assert refuses(endpoint)
