"""Bad input for the tar readers, through real DataLoader workers: truncated shard, corrupt member,
missing shard, unsafe member names and links. Under ``raise`` the error names the shard and member;
under ``skip`` every bad sample is counted in ``dataset.skipped`` (from the workers) and the rest is
read. Nothing is ever extracted to disk."""

from __future__ import annotations

import io
import os
import re
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
from fastdata.inspection._tar import inspect_tar
from tests.datagen import jpeg_bytes, make_image_folder, write_tar
from tests.stop_workers import stop_workers
from tests.tar_datagen import END, headers, member, patch, pax_header, samples, tar_bytes, within

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
    """The keys of every sample; a DataLoader's workers are shut down even when a sample raises (see
    tests/stop_workers.py)."""
    it = iter(samples)
    try:
        return [s["__key__"] for s in it]
    finally:
        stop_workers(it)


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


# -- damaged headers: never a hang, never a silent loss ------------------------------------------------
# A shard of four samples (s0000 .. s0003, jpg + cls); the damage hits the first header of s0002.
SHARD = tar_bytes(samples(4))
HIT = headers(SHARD)["s0002.jpg"]


def with_pax(records: bytes) -> bytes:
    """SHARD with a PAX header holding ``records`` right before the member at HIT."""
    return SHARD[:HIT] + pax_header(records) + SHARD[HIT:]


# (shard bytes, what the message says, the samples kept before the damage)
DAMAGE = {
    "negative-size-base256": (patch(SHARD, HIT, 124, b"\xff" * 12), "negative size", 2),
    "negative-size-octal": (patch(SHARD, HIT, 124, b"-0000001000\0"), "negative size", 2),
    "size-not-a-number": (patch(SHARD, HIT, 124, b"12x4567\0    "), "not a number", 2),
    "bad-checksum": (patch(SHARD, HIT, 0, b"X", checksum=False), "bad checksum", 1),
    "cut-inside-a-header": (SHARD[: HIT + 200], "truncated: the shard ends 200 bytes into a 512-byte header", 2),
    "pax-record-of-length-0": (with_pax(b"0 path=s0002.jpg\n"), "claims 0 bytes", 1),
    "pax-record-too-short": (with_pax(b"3 path=s0002.jpg\n"), "claims 3 bytes", 1),
    "pax-record-negative-length": (with_pax(b"-17 path=s0002.jpg\n"), "does not start with a length", 1),
    "pax-record-no-number": (with_pax(b"ab path=s0002.jpg\n"), "does not start with a length", 1),
    "pax-size-not-a-number": (with_pax(b"15 size=12a456\n"), "PAX size record '12a456' is not a number", 1),
    "pax-size-negative": (with_pax(b"13 size=-512\n"), "PAX size record is negative", 1),
}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("damaged")
    for name, (data, _, _) in DAMAGE.items():
        (root / f"{name}.tar").write_bytes(data)
    (root / "empty.tar").write_bytes(b"")
    (root / "random.tar").write_bytes(np.random.default_rng(3).bytes(10240))
    return root


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_header_raises_naming_shard_offset_and_what_was_found(damaged: Path, kind: str) -> None:
    url = str(damaged / f"{kind}.tar")
    with within(20), pytest.raises(fd.CorruptShard) as e:
        keys(loader(fd.TarShardDataset(url), num_workers=0))
    message = str(e.value)
    assert f"{kind}.tar: " in message and f"at byte {HIT}" in message and DAMAGE[kind][1] in message
    with within(20):
        report = inspect_tar(url)
    assert not report.complete and any(f"at byte {HIT}" in b for b in report.bad)


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_header_under_skip_keeps_the_samples_before_it_and_counts_the_loss(damaged: Path, kind: str) -> None:
    url = str(damaged / f"{kind}.tar")
    kept = [f"s{i:04d}" for i in range(DAMAGE[kind][2])]
    ds = fd.TarShardDataset(url, on_error="skip")
    with within(20), pytest.warns(BadSampleWarning, match=re.escape(f"skipping bad sample(s): {url}: ")):
        assert keys(loader(ds, num_workers=0)) == kept
    assert ds.skipped == 1  # how many samples followed the damage is unknown: one skip for the shard
    ds = fd.TarShardDataset(url, on_error="skip")
    with within(30):
        assert sorted(keys(loader(ds, num_workers=2))) == kept
    assert ds.skipped == 1


@pytest.mark.parametrize(
    ("name", "words"),
    [("empty", "is empty (0 bytes), not a tar archive"), ("random", "not a tar archive: the first 512 bytes")],
)
def test_a_shard_that_is_no_tar_is_named_not_an_empty_plan(damaged: Path, name: str, words: str) -> None:
    url = str(damaged / f"{name}.tar")
    with pytest.raises(fd.CorruptShard, match=re.escape(f"{url}: {words}")):
        keys(loader(fd.TarShardDataset(url), num_workers=0))
    with pytest.raises(fd.CorruptShard, match=re.escape(words)):
        fd.IndexedTarDataset(url)[0]
    cut = str(damaged / "cut-inside-a-header.tar")
    ds = fd.TarShardDataset([url, cut], on_error="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert keys(loader(ds, num_workers=0)) == ["s0000", "s0001"]
    said = " ".join(str(w.message) for w in caught if issubclass(w.category, BadSampleWarning))
    assert ds.skipped == 2 and f"(s): {url}: " in said and f"(s): {cut}: " in said


def test_damage_in_a_converted_shard_counts_each_sample_the_manifest_lost(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "src", classes=1, per_class=6)
    manifest = convert(tmp_path / "src", tmp_path / "out", shard_count=1, progress=False, fsync=False)
    url = str(tmp_path / "out" / manifest["shards"][0]["name"])
    data = Path(url).read_bytes()
    at = headers(data)["class_0/img_0003.cls"]  # sample 3's second member
    Path(url).write_bytes(patch(data, at, 0, b"X", checksum=False))
    ds = fd.TarShardDataset(url, on_error="skip")  # the manifest plans 6 samples
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = keys(loader(ds, num_workers=0))
    assert got == [f"class_0/img_{i:04d}" for i in range(3)] and ds.skipped == 3
    said = [str(w.message) for w in caught]
    assert any(re.search(r"\.idx: points at byte \d+, which follows no valid header; scanning", m) for m in said)
    assert any(m.startswith(f"fastdata: skipping bad sample(s): {url}: ") and "bad checksum" in m for m in said)


# -- PAX sizes are sizes: checked like the ustar field ---------------------------------------------------
def pax_sized(data: bytes, pax_size: int) -> bytes:
    """s0000 whole, then s0001.jpg with its size in a PAX record (the ustar field says 0, as for a
    member of 8 GiB and more), then the end-of-archive marker."""
    first = tar_bytes(samples(1))[: headers(tar_bytes(samples(2)))["s0001.jpg"]]
    records = b"size=%d\n" % pax_size
    records = b"%d %s" % (len(records) + 2 + len(str(len(records) + 3)) - 1, records)
    return first + pax_header(records) + member("s0001.jpg", data, size_field=0) + END


def test_a_pax_size_reads_exactly_its_member(tmp_path: Path) -> None:
    data = b"pax-sized" * 100
    (tmp_path / "a.tar").write_bytes(pax_sized(data, len(data)))
    with tarfile.open(tmp_path / "a.tar") as tf:
        assert tf.extractfile("s0001.jpg").read() == data  # the layout is right: tarfile reads it so
    got = {s["__key__"]: s for s in fd.TarShardDataset(str(tmp_path / "a.tar"))}
    assert bytes(got["s0001"]["jpg"]) == data and sorted(got) == ["s0000", "s0001"]


def test_a_pax_size_past_the_end_is_truncated_never_bytes_beyond_the_member(tmp_path: Path) -> None:
    data = b"pax-sized" * 100
    (tmp_path / "cut.tar").write_bytes(pax_sized(data, 50_000))  # the shard ends long before that
    url = str(tmp_path / "cut.tar")
    with pytest.raises(fd.CorruptShard, match=r"cut\.tar: truncated: member 's0001\.jpg' needs 50000 bytes"):
        keys(loader(fd.TarShardDataset(url), num_workers=0))
    report = inspect_tar(url)
    assert not report.complete and report.samples == 2 and any("truncated" in b for b in report.bad)


@pytest.mark.slow
def test_a_shard_cut_anywhere_ends_cleanly_only_where_tarfile_does(tmp_path: Path) -> None:
    """Every cut point of a shard without manifest or sidecar (members of odd sizes, so that each is
    followed by zero padding): wherever Python's tarfile finds the shard cut, fastdata says "truncated"
    too (raises under "raise", counts a skip under "skip"); a cut inside the padding after a member once
    read as a shard that ended cleanly."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(3):
            for ext, n in (("jpg", 300 + 37 * i), ("cls", 1 + i)):
                info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                info.size = n
                t.addfile(info, io.BytesIO(bytes([65 + i]) * n))
    data = buf.getvalue()
    end = data.index(b"s0002.cls") + 1024  # past the last member's padding: the end-of-archive zeros follow
    in_padding = 0
    for cut in range(1, end):
        path = tmp_path / f"cut{cut}.tar"
        path.write_bytes(data[:cut])
        try:
            with tarfile.open(path) as t:
                for m in t.getmembers():
                    t.extractfile(m).read()  # type: ignore[union-attr]
            tarfile_cut = False
        except tarfile.ReadError:
            tarfile_cut = True
        padding = data[cut - 1] == 0 and cut % 512 != 0
        if not tarfile_cut or not (padding or cut % 8 == 0):  # every cut in the padding, and 1 in 8 of the rest
            continue
        in_padding += padding
        with pytest.raises(fd.CorruptShard, match=rf"cut{cut}\.tar: truncated"):
            list(fd.TarShardDataset(str(path)))
        ds = fd.TarShardDataset(str(path), on_error="skip")
        with pytest.warns(fd.BadSampleWarning, match="truncated"):
            list(ds)
        assert ds.skipped >= 1, cut
        path.unlink()
    assert in_padding > 1500  # the padding after the members was among the cuts tried
