"""Decoding by extension, URL expansion, the local reader and the map-style sampler."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import fastdata as fd
from fastdata.core.errors import ConfigError, DecodeFailed, SourceNotFound, SourceUnreadable
from fastdata.formats.decode import Decoder
from fastdata.storage import expand_urls, open_reader
from tests.datagen import jpeg_bytes


def sample_with(**members: bytes) -> dict:
    return {"__key__": "k1", "__url__": "shard.tar", **members}


@pytest.mark.parametrize("backend", ["pil", "cv2"])
def test_decoder_turns_members_into_values_by_extension(backend: str) -> None:
    arr = np.arange(6, dtype=np.int16)
    npy = io.BytesIO()
    np.save(npy, arr)
    raw = sample_with(
        jpg=jpeg_bytes(np.random.default_rng(0), (8, 6)),
        cls=b"3",
        json=b'{"a": 1}',
        txt="héllo".encode(),
        npy=npy.getvalue(),
        bin=b"\x00\x01",
    )
    out = Decoder("torch", backend)(dict(raw))
    assert isinstance(out["jpg"], torch.Tensor) and out["jpg"].shape == (3, 6, 8) and out["jpg"].dtype == torch.uint8
    assert out["cls"] == 3 and out["json"] == {"a": 1} and out["txt"] == "héllo"
    assert np.array_equal(out["npy"], arr) and out["bin"] == b"\x00\x01"
    assert Decoder("numpy", backend)(dict(raw))["jpg"].shape == (6, 8, 3)
    assert Decoder("raw")(dict(raw)) == raw


def test_corrupt_member_names_sample_and_member() -> None:
    with pytest.raises(DecodeFailed, match=r"shard.tar: sample 'k1', member '.jpg'"):
        Decoder("numpy")(sample_with(jpg=b"not a jpeg"))


def test_decoder_options_are_checked_at_construction() -> None:
    with pytest.raises(ConfigError, match="'raw', 'pil', 'numpy', 'torch'"):
        Decoder("tensor")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="image_backend"):
        Decoder("pil", "cv2")


def test_expand_urls_braces_and_globs(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"a-{i:02d}.tar").write_bytes(b"")
    assert expand_urls(str(tmp_path / "a-{00..02}.tar")) == [str(tmp_path / f"a-{i:02d}.tar") for i in range(3)]
    assert expand_urls(str(tmp_path / "a-*.tar")) == [str(tmp_path / f"a-{i:02d}.tar") for i in range(3)]
    assert expand_urls(["s3://b/x-{1..2}.tar"]) == ["s3://b/x-1.tar", "s3://b/x-2.tar"]
    with pytest.raises(SourceNotFound, match="matches no file"):
        expand_urls(str(tmp_path / "b-*.tar"))


def test_local_reader_reads_ranges_and_names_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(100)))
    with open_reader(str(path)) as reader:
        assert reader.size == 100 and reader.read(98, 10) == b"\x62\x63"
        assert reader.read_ranges([(0, 2), (50, 1)]) == [b"\x00\x01", b"\x32"]
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert open_reader(str(empty)).read(0, 10) == b""
    with pytest.raises(SourceNotFound, match=r"missing\.bin: no such file"):
        open_reader(str(tmp_path / "missing.bin"))
    with pytest.raises(SourceUnreadable, match="is a folder"):
        open_reader(str(tmp_path))
    with pytest.raises(ConfigError, match="unknown scheme 'gs'"):
        open_reader("gs://bucket/key")


def test_epoch_sampler_follows_epoch_and_resumes() -> None:
    sampler = fd.EpochSampler(10, shuffle=True, seed=1, rank=1, world_size=3)
    assert len(sampler) == 3
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert first != second
    state = sampler.state_dict(consumed=2)
    resumed = fd.EpochSampler(10, shuffle=True, seed=1, rank=1, world_size=3)
    resumed.load_state_dict(state)
    assert list(resumed) == second[2:]
    assert list(resumed) == second, "resuming applies to one pass only"
    with pytest.raises(ConfigError, match="outside"):
        resumed.load_state_dict({"epoch": 0, "consumed": 4})


def test_manifest_counts_are_used_without_opening_shards(tmp_path: Path) -> None:
    from tests.datagen import make_shards

    shards = make_shards(tmp_path, shards=2, per_shard=5)
    manifest = {"format": "tar", "version": 1, "shards": [{"name": Path(s).name, "samples": 5} for s in shards]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    Path(shards[1]).unlink()
    # the manifest says how many samples the missing shard had: each is counted when skipped
    ds = fd.TarShardDataset(shards, on_error="skip")
    assert len(ds) == 10
    with pytest.warns(fd.errors.BadSampleWarning, match="no such file"):
        keys = [s["__key__"] for s in ds]
    assert keys == [f"s{i:06d}" for i in range(5)] and ds.skipped == 5
    with pytest.raises(SourceNotFound, match=r"train-000001\.tar: no such file"):
        list(fd.TarShardDataset(shards))


def test_the_package_and_a_local_conversion_do_not_import_torch(tmp_path: Path) -> None:
    # torch takes ~2 s to import: `import fastdata`, `fastdata --help` and converting a local corpus
    # must not pay it (the datasets import it when first used)
    import subprocess
    import sys

    from tests.datagen import make_image_folder

    make_image_folder(tmp_path / "corpus", classes=2, per_class=3, seed=0)
    script = (
        "import sys, fastdata, fastdata.cli\n"
        "from fastdata.convert import convert\n"
        f"convert({str(tmp_path / 'corpus')!r}, {str(tmp_path / 'out')!r}, progress=False)\n"
        "print(sorted(m for m in ('torch', 'boto3', 'h5py') if m in sys.modules))\n"
        "fastdata.TarShardDataset\n"
        "print('torch' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1]
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[:2] == ["[]", "True"]  # and a dataset name does import it
    assert (tmp_path / "out" / "manifest.json").exists()
