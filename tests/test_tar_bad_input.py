"""Bad input for the tar readers, through real DataLoader workers: truncated shard, corrupt member,
missing shard, unsafe member names and links. Under ``raise`` the error names the shard and member;
under ``skip`` every bad sample is counted in ``dataset.skipped`` (from the workers) and the rest is
read. Nothing is ever extracted to disk."""

from __future__ import annotations

import io
import os
import tarfile
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.convert import convert
from fastdata.core.errors import BadSampleWarning
from tests.datagen import jpeg_bytes, make_image_folder, write_tar

N = 10  # samples per shard


def good_samples(rng: np.random.Generator, first: int) -> list[dict[str, bytes]]:
    return [{"__key__": f"s{first + i:04d}", "jpg": jpeg_bytes(rng), "cls": str(i % 3).encode()} for i in range(N)]


def unsafe_tar(path: Path, escape: str) -> None:
    """Shard with, between good samples, members named ``../ESC``, ``/tmp/ESC/x``, a symlink and a hard link."""
    rng = np.random.default_rng(5)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:

        def add(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, link, len(data)
            tf.addfile(info, io.BytesIO(data) if data else None)

        add("u0000.jpg", jpeg_bytes(rng))
        add(f"../{escape}.jpg", b"escaped")
        add(f"/tmp/{escape}/abs.jpg", b"escaped")
        add("u0001.jpg", jpeg_bytes(rng))
        add(f"{escape}-link.jpg", kind=tarfile.SYMTYPE, link="/etc/passwd")
        add(f"{escape}-hard.jpg", kind=tarfile.LNKTYPE, link="u0000.jpg")
        add("u0002.jpg", jpeg_bytes(rng))


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(1)
    write_tar(root / "good.tar", good_samples(rng, 0))
    # truncated inside the first member of sample 6: samples 0-5 stay readable, sample 6 is lost
    write_tar(root / "truncated.tar", good_samples(rng, 100))
    data = (root / "truncated.tar").read_bytes()
    cut_at = data.index(b"s0106.jpg") + 512 + 100
    (root / "truncated.tar").write_bytes(data[:cut_at])
    # a corrupt JPEG: sample 3's image is cut short and scrambled (the tar itself is fine)
    samples = good_samples(rng, 200)
    samples[3]["jpg"] = samples[3]["jpg"][:40] + b"\x00garbage" * 10
    write_tar(root / "corrupt.tar", samples)
    escape = f"fastdata-escape-{uuid.uuid4().hex[:8]}"
    unsafe_tar(root / "unsafe.tar", escape)
    return {"root": root, "escape": escape}


def urls(bad: dict[str, object], *names: str) -> list[str]:
    return [str(bad["root"] / f"{n}.tar") for n in names]  # type: ignore[operator]


def loader(ds: object, num_workers: int = 2, context: str = "fork") -> DataLoader:
    return DataLoader(
        ds,
        batch_size=None,
        num_workers=num_workers,  # type: ignore[arg-type]
        multiprocessing_context=context if num_workers else None,
    )


def keys(samples: Iterable[dict]) -> list[str]:
    """The keys of every sample; a DataLoader's workers are shut down even when a sample raises.

    Without the explicit shutdown, the raised error's traceback keeps the iterator alive in a reference
    cycle; the cyclic GC later finalizes its queues before calling its ``__del__``, so torch's shutdown
    message never reaches the workers and it waits 5 s per worker before killing them.
    """
    it = iter(samples)
    try:
        return [s["__key__"] for s in it]
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


@pytest.mark.parametrize(
    ("name", "error", "words"),
    [
        ("truncated", fd.CorruptShard, ["truncated.tar", "truncated", "s0106.jpg", "re-create"]),
        ("unsafe", fd.UnsafeMember, ["unsafe.tar", "'../fastdata-escape-", "absolute path or '..'", "never extracts"]),
    ],
)
def test_raise_names_the_shard_and_member(bad, name: str, error: type, words: list[str]) -> None:
    ds = fd.TarShardDataset(urls(bad, "good", name))
    with pytest.raises(error) as e:
        keys(loader(ds))
    for word in words:
        assert word in str(e.value)


def test_raise_on_a_corrupt_jpeg_names_sample_and_member(bad) -> None:
    ds = fd.TarShardDataset(urls(bad, "corrupt"), decode="numpy")
    with pytest.raises(fd.DecodeFailed) as e:
        keys(loader(ds))
    assert "corrupt.tar" in str(e.value) and "'s0203'" in str(e.value) and "'.jpg'" in str(e.value)
    assert len(keys(loader(fd.TarShardDataset(urls(bad, "corrupt"))))) == N  # raw bytes: nothing to decode


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_skip_counts_every_bad_sample_from_the_workers(bad, context: str) -> None:
    ds = fd.TarShardDataset(urls(bad, "good", "truncated", "corrupt", "unsafe"), decode="numpy", on_error="skip")
    got = keys(loader(ds, 2, context))
    # good: 10; truncated: 6 of 7 (one lost); corrupt: 9 of 10; unsafe: 3 of 7 (2 bad names, 2 links)
    assert len(got) == len(set(got)) == 10 + 6 + 9 + 3
    assert "s0203" not in got and "s0105" in got and "s0106" not in got
    assert ds.skipped == 1 + 1 + 4


def test_skip_in_the_map_style_dataset_leaves_bad_samples_out_of_batches(bad) -> None:
    ds = fd.IndexedTarDataset(urls(bad, "truncated", "unsafe"), on_error="skip")
    batches = list(
        DataLoader(
            ds,
            batch_size=4,
            sampler=ds.sampler(shuffle=True),
            num_workers=2,
            multiprocessing_context="fork",
            collate_fn=list,
        )
    )
    assert sorted(s["__key__"] for b in batches for s in b) == [f"s{i:04d}" for i in range(100, 106)] + [
        "u0000",
        "u0001",
        "u0002",
    ]
    assert ds.skipped == 1 + 4


def test_skip_warns_once_per_shard(bad) -> None:
    ds = fd.TarShardDataset(urls(bad, "unsafe", "truncated"), on_error="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys(iter(ds))
    sources = [str(w.message).split(":")[1].strip() for w in caught if issubclass(w.category, BadSampleWarning)]
    assert len(sources) == 2 and ds.skipped == 5


def test_missing_shard_raises_or_is_counted(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "src", classes=2, per_class=6)
    manifest = convert(tmp_path / "src", tmp_path / "out", shard_count=3, progress=False, fsync=False)
    shard_urls = [str(tmp_path / "out" / s["name"]) for s in manifest["shards"]]
    os.unlink(shard_urls[1])  # the manifest still plans its 4 samples
    with pytest.raises(fd.SourceNotFound, match=r"shard-000001\.tar: no such file"):
        keys(loader(fd.TarShardDataset(shard_urls)))
    ds = fd.TarShardDataset(shard_urls, on_error="skip")
    assert len(keys(loader(ds))) == 8 and ds.skipped == 4


def test_nothing_is_extracted(bad, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    before = sorted(os.listdir(tmp_path))
    ds = fd.IndexedTarDataset(urls(bad, "unsafe"), on_error="skip")
    list(DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork", collate_fn=list))
    keys(loader(fd.TarShardDataset(urls(bad, "unsafe"), on_error="skip")))
    escape = str(bad["escape"])
    assert os.listdir(work) == [] and sorted(os.listdir(tmp_path)) == before
    assert not Path(f"/tmp/{escape}").exists() and not (Path(str(bad["root"])).parent / f"{escape}.jpg").exists()
