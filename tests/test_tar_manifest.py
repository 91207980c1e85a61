"""TarShardDataset plans from manifest.json: sample counts without opening shards, a missing shard's
samples counted when skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fastdata as fd
from fastdata.core.errors import SourceNotFound


def test_manifest_counts_are_used_without_opening_shards(tmp_path: Path) -> None:
    from tests.datagen import make_shards

    shards = make_shards(tmp_path, shards=2, per_shard=5)
    manifest = {"format": "tar", "version": 1, "shards": [{"name": Path(s).name, "samples": 5} for s in shards]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    Path(shards[1]).unlink()
    # the manifest says how many samples the missing shard had: each is counted when skipped
    ds = fd.TarShardDataset(shards, on_error="skip")
    assert len(ds) == 10
    with pytest.warns(fd.BadSampleWarning, match="no such file"):
        keys = [s["__key__"] for s in ds]
    assert keys == [f"s{i:06d}" for i in range(5)] and ds.skipped == 5
    with pytest.raises(SourceNotFound, match=r"train-000001\.tar: no such file"):
        list(fd.TarShardDataset(shards))
