"""The CacheWarning's remedy works where it is raised: shards on S3 without sidecars warn, naming
``fastdata inspect --write-manifest s3://.../``; that command (or a pattern of the shards) uploads the
sidecars and manifest beside them, and the dataset then reads them without the warning or a cache."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

import fastdata as fd
from fastdata.cli import main
from fastdata.inspection import write_manifest
from fastdata.storage.cache import CacheWarning
from tests.datagen import make_shards
from tests.s3_server import MotoServer, upload_files


def _bucket(s3_server: MotoServer, tmp_path: Path, name: str) -> str:
    paths = make_shards(tmp_path / name, shards=3, per_shard=10, seed=5)
    client = s3_server.client()
    client.create_bucket(Bucket=name)
    upload_files(client, name, {f"data/{os.path.basename(p)}": p for p in paths})  # no sidecar, no manifest
    return f"s3://{name}/data/"


def _keys(ds: Any) -> list[str]:
    return sorted(s["__key__"] for s in ds)


def test_the_cache_warnings_command_writes_sidecars_on_s3(
    s3_server: MotoServer, s3_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FASTDATA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    prefix = _bucket(s3_server, tmp_path, "nosidecars")
    shards = prefix + "train-{000000..000002}.tar"
    with pytest.warns(CacheWarning) as caught:
        before = _keys(fd.TarShardDataset(shards, shuffle=False))
    command = re.search(r"'fastdata (inspect --write-manifest \S+)'", str(caught[0].message))
    assert command is not None and command.group(1).endswith(prefix), str(caught[0].message)
    assert main(command.group(1).split()) == 0  # the command the warning names, as named
    manifest = s3_server.client().get_object(Bucket="nosidecars", Key="data/manifest.json")["Body"].read()
    assert json.loads(manifest)["samples"] == 30
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        ds = fd.TarShardDataset(prefix, shuffle=False)  # the prefix alone, now that it has a manifest
        assert len(ds) == 30 and _keys(ds) == before


def test_write_manifest_takes_a_pattern_of_s3_shards(
    s3_server: MotoServer, s3_env: dict[str, str], tmp_path: Path
) -> None:
    prefix = _bucket(s3_server, tmp_path, "pattern")
    written = write_manifest(prefix + "train-{000000..000002}.tar")
    assert written == [prefix + "manifest.json"]
    listed = s3_server.client().list_objects_v2(Bucket="pattern", Prefix="data/")["Contents"]
    assert sum(o["Key"].endswith(".idx") for o in listed) == 3
    with pytest.raises(fd.ConfigError, match="exists already"):
        write_manifest(prefix)
