"""Shards whose samples' members are not next to each other (``tar cf shard.tar -C folder .`` stores
directory order): every member of one key is one sample wherever it sits, for every reader, and
``fastdata inspect`` says so; ``--write-manifest`` counts the grouped samples and writes no sidecar that
would split them."""

from __future__ import annotations

import io
import json
import random
import subprocess
import tarfile
import warnings
from pathlib import Path

import pytest
import webdataset as wds
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.cli import main
from fastdata.formats.tar import ShardIndex, index_url, scan
from fastdata.storage import open_reader

N = 40
FIELDS = ("cls", "jpg", "json")


def _files(folder: Path) -> dict[str, bytes]:
    """A webdataset-style folder: ``sNNNNNN.jpg``/``.cls``/``.json``, each member's bytes its own."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for i in range(N):
        for ext in FIELDS:
            data = f"{ext}-{i}-".encode() * (1 + i % 7 + 30 * (ext == "jpg"))
            (folder / f"s{i:06d}.{ext}").write_bytes(data)
            out[f"s{i:06d}.{ext}"] = data
    return out


def _scattered(names: list[str]) -> list[str]:
    """``names`` in a seeded order in which no key's members are all together."""
    order = sorted(names)
    random.Random(0).shuffle(order)
    return order


def _gnu_tar(folder: Path, out: Path) -> Path:
    listing = folder.parent / "list.txt"
    listing.write_text("\n".join(_scattered([p.name for p in folder.iterdir()])) + "\n")
    subprocess.run(["tar", "cf", str(out), "-C", str(folder), "-T", str(listing)], check=True)
    return out


def _python_tar(folder: Path, out: Path) -> Path:
    with tarfile.open(out, "w") as tf:
        for name in _scattered([p.name for p in folder.iterdir()]):
            tf.add(folder / name, arcname=f"./{name}")  # as 'tar cf - -C folder .' names them
    return out


def _webdataset_tar(folder: Path, out: Path) -> Path:
    with wds.TarWriter(str(out)) as sink:
        for i in range(N):
            key = f"s{i:06d}"
            sink.write({"__key__": key, **{ext: (folder / f"{key}.{ext}").read_bytes() for ext in FIELDS}})
    return out


def _check(samples: list[dict[str, object]], files: dict[str, bytes]) -> None:
    """Each key exactly once, with every field and the bytes of its own files."""
    keys = [str(s["__key__"]).removeprefix("./") for s in samples]
    assert sorted(keys) == [f"s{i:06d}" for i in range(N)]
    for s, key in zip(samples, keys):
        assert {k for k in s if not k.startswith("__")} == set(FIELDS)
        for ext in FIELDS:
            assert bytes(s[ext]) == files[f"{key}.{ext}"]  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [_gnu_tar, _python_tar, _webdataset_tar], ids=["gnu-tar-T", "tarfile", "webdataset"])
def test_every_key_is_one_sample_wherever_its_members_sit(tmp_path: Path, make: object) -> None:
    files = _files(tmp_path / "src")
    shard = make(tmp_path / "src", tmp_path / "shard.tar")  # type: ignore[operator]
    scattered = make is not _webdataset_tar
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        streamed = list(fd.TarShardDataset([str(shard)]))
        indexed = fd.IndexedTarDataset([str(shard)])
        assert len(indexed) == N
        _check([indexed[i] for i in range(len(indexed))], files)
    _check(streamed, files)
    split = [w for w in caught if "scattered over the shard" in str(w.message)]
    assert bool(split) == scattered
    if scattered:
        assert str(shard) in str(split[0].message) and "tar --sort=name" in str(split[0].message)
    index = scan(open_reader(str(shard)))
    assert index.split == (N if scattered else 0) and not index.bad


@pytest.mark.parametrize("workers", [0, 2])
def test_a_tar_of_a_folder_reads_each_sample_once_through_dataloader_workers(tmp_path: Path, workers: int) -> None:
    files = _files(tmp_path / "src")
    shards = [_python_tar(tmp_path / "src", tmp_path / f"shard-{k}.tar") for k in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = fd.TarShardDataset([str(s) for s in shards], shuffle=True, seed=1)
        got = list(DataLoader(ds, batch_size=None, num_workers=workers))
    assert len(got) == 2 * N
    by_shard = {str(s): [x for x in got if x["__url__"] == str(s)] for s in shards}
    for samples in by_shard.values():
        _check(samples, files)


def test_a_sidecar_that_lists_a_key_twice_is_refused_and_the_shard_grouped(tmp_path: Path) -> None:
    files = _files(tmp_path / "src")
    shard = _python_tar(tmp_path / "src", tmp_path / "shard.tar")
    grouped = scan(open_reader(str(shard)))
    # the sidecar an older fastdata wrote: one sample per run of members, in file order
    flat = sorted((off, ext, n, key) for key, ms in zip(grouped.keys, grouped.members) for ext, off, n in ms)
    old = ShardIndex(str(shard), size=grouped.size)
    for off, ext, n, key in flat:
        old.keys.append(key)
        old.members.append(((ext, off, n),))
        old.spans.append((off - 512, off + n + (-n % 512)))
    Path(index_url(str(shard))).write_bytes(old.to_bytes())
    with pytest.warns(UserWarning, match="under one key"):
        samples = list(fd.TarShardDataset([str(shard)]))
    _check(samples, files)


def test_inspect_reports_split_keys_and_write_manifest_counts_grouped_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _files(tmp_path / "src")
    out = tmp_path / "shards"
    out.mkdir()
    shard = _gnu_tar(tmp_path / "src", out / "shard-000000.tar")
    Path(index_url(str(shard))).write_bytes(b"stale")  # left from before: it must not survive
    assert main(["inspect", str(shard)]) == 0
    text = capsys.readouterr().out
    assert f"{N} samples" in text and "keys split across the shard: 40 key(s)" in text
    assert "tar --sort=name" in text and "1 with keys split across the shard" in text
    assert main(["inspect", str(out), "--write-manifest"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["samples"] == N and manifest["shards"][0]["samples"] == N
    assert not Path(index_url(str(shard))).exists()  # a sidecar lists members in file order: none
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert len(fd.IndexedTarDataset(str(out / "shard-{000000..000000}.tar"))) == N


def test_a_damaged_shard_with_split_keys_still_lists_each_key_once_and_ends_with_the_damage(tmp_path: Path) -> None:
    _files(tmp_path / "src")
    shard = _python_tar(tmp_path / "src", tmp_path / "shard.tar")
    data = shard.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        members = tf.getmembers()
    cut = members[len(members) // 2].offset + 100  # inside a header halfway through
    (tmp_path / "cut.tar").write_bytes(data[:cut])
    index = scan(open_reader(str(tmp_path / "cut.tar")))
    assert not index.complete and index.error_at(len(index) - 1) is not None
    assert len(set(index.keys)) == len(index.keys) and index.split  # still one sample per key
