"""Interoperability with upstream webdataset, both ways: shards written by its ``ShardWriter`` and
``TarWriter`` read by our datasets; shards written by fastdata read by ``webdataset.WebDataset``."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import subprocess
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
import zstandard
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.convert import convert
from fastdata.formats.tar._writer import TarShardWriter
from fastdata.inspection._tar import inspect_tar
from tests.datagen import jpeg_bytes, make_image_folder

EXTS = ("jpg", "cls", "json")


def samples(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"__key__": f"k{i:05d}", "jpg": jpeg_bytes(rng), "cls": str(i % 5).encode(), "json": b'{"i": %d}' % i}
        for i in range(n)
    ]


def as_bytes(sample: dict) -> tuple:
    return (sample["__key__"], *((e, bytes(sample[e])) for e in EXTS))


def read_ours(urls: list[str], iterable: bool) -> list[tuple]:
    if iterable:
        ds = fd.TarShardDataset(urls, shuffle=True, seed=1)
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    else:
        ds = fd.IndexedTarDataset(urls)
        loader = DataLoader(
            ds, batch_size=4, sampler=ds.sampler(), num_workers=2, multiprocessing_context="fork", collate_fn=list
        )
    out = []
    for item in loader:
        out.extend(item if isinstance(item, list) else [item])
    return sorted(as_bytes(s) for s in out)


@pytest.mark.parametrize("iterable", [True, False], ids=["TarShardDataset", "IndexedTarDataset"])
def test_webdataset_shardwriter_shards_read_by_our_datasets(tmp_path: Path, iterable: bool) -> None:
    written = samples(23)
    # ShardWriter goes through tarfile's default PAX format: a PAX header before every member
    with wds.ShardWriter(str(tmp_path / "wds-%06d.tar"), maxcount=7, verbose=0) as sink:
        for s in written:
            sink.write(dict(s))
    urls = sorted(str(p) for p in tmp_path.glob("wds-*.tar"))
    assert len(urls) == 4
    assert read_ours(urls, iterable) == sorted(as_bytes(s) for s in written)


def test_webdataset_tarwriter_shard_read_by_ours(tmp_path: Path) -> None:
    written = samples(9, seed=2)
    with wds.TarWriter(str(tmp_path / "one.tar")) as sink:
        for s in written:
            sink.write(dict(s))
    got = [as_bytes(s) for s in fd.TarShardDataset(str(tmp_path / "one.tar"))]
    assert got == [as_bytes(s) for s in written]  # same order too


def test_our_shards_read_by_webdataset(tmp_path: Path) -> None:
    written = samples(20, seed=3)
    long_key = "deep/" + "x" * 120  # a PAX path record
    written.append({"__key__": long_key, "jpg": b"long", "cls": b"1", "json": b"{}"})
    urls = []
    for shard in range(4):
        urls.append(str(tmp_path / f"ours-{shard:06d}.tar"))
        with TarShardWriter(urls[-1], fsync=False) as w:
            for s in written[shard::4]:
                w.write_sample(s)
    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    assert sorted(as_bytes(s) for s in dataset) == sorted(as_bytes(s) for s in written)
    # and through DataLoader workers, each worker taking its own shards
    loader = DataLoader(
        wds.WebDataset(urls, shardshuffle=False), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    assert sorted(as_bytes(s) for s in loader) == sorted(as_bytes(s) for s in written)


def test_converted_corpus_read_by_webdataset_with_decoding(tmp_path: Path) -> None:
    files = make_image_folder(tmp_path / "src", classes=2, per_class=5)
    manifest = convert(tmp_path / "src", tmp_path / "out", shard_count=2, progress=False, fsync=False)
    urls = [str(tmp_path / "out" / s["name"]) for s in manifest["shards"]]
    got = {s["__key__"]: (s["jpg"].shape, s["cls"]) for s in wds.WebDataset(urls, shardshuffle=False).decode("rgb8")}
    assert got == {rel[:-4]: ((24, 32, 3), label) for rel, label in files}


# -- shards as found in the wild: gzip, stray files, GNU sparse members --------------------------------
def write_files(folder: Path, members: list[tuple[str, bytes]]) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in members:
        (folder / name).write_bytes(data)
    return [name for name, _ in members]


def gnu_tar(out: Path, folder: Path, names: list[str], *options: str) -> str:
    """A shard written by GNU tar itself, members in the order given."""
    subprocess.run(["tar", *options, "-cf", str(out), "-C", str(folder), *names], check=True)
    return str(out)


def wds_samples(urls: list[str]) -> list[tuple]:
    return sorted(as_bytes(s) for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False))


def streamed(urls: list[str], **options: object) -> list[tuple]:
    ds = fd.TarShardDataset(urls, **options)
    return sorted(as_bytes(s) for s in DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))


@pytest.mark.parametrize("how", ["tar-czf.tar.gz", "webdataset.tgz", "gzip-named.tar"])
def test_gzip_shards_are_streamed_as_webdataset_reads_them(tmp_path: Path, how: str) -> None:
    urls = []
    for shard in range(3):
        written = samples(5, seed=10 + shard)
        for s in written:
            s["__key__"] = f"{shard}-{s['__key__']}"
        url = str(tmp_path / f"{shard}-{how}")
        if how.startswith("tar-czf"):
            names = write_files(
                tmp_path / f"src{shard}", [(f"{s['__key__']}.{e}", s[e]) for s in written for e in EXTS]
            )
            gnu_tar(Path(url), tmp_path / f"src{shard}", names, "-z")
        elif how.startswith("webdataset"):
            with wds.TarWriter(url, compress=True) as sink:
                for s in written:
                    sink.write(dict(s))
        else:
            with wds.TarWriter(str(tmp_path / "plain.tar")) as sink:
                for s in written:
                    sink.write(dict(s))
            Path(url).write_bytes(gzip.compress((tmp_path / "plain.tar").read_bytes()))
        assert Path(url).read_bytes()[:2] == b"\x1f\x8b"
        urls.append(url)
    expected = wds_samples(urls)
    assert len(expected) == 15 and streamed(urls) == expected
    with pytest.raises(
        fd.ConfigError,
        match=r"is gzip-compressed, so its samples cannot be read in random order.*"
        r"TarShardDataset",
    ):
        fd.IndexedTarDataset(urls)
    report = inspect_tar(urls[0])
    assert report.samples == 5 and report.complete and "gzip-compressed" in report.notes[0]


def test_a_cut_gzip_shard_keeps_the_samples_before_the_cut(tmp_path: Path) -> None:
    written = samples(40, seed=4)
    with wds.TarWriter(str(tmp_path / "whole.tar.gz"), compress=True) as sink:
        for s in written:
            sink.write(dict(s))
    data = (tmp_path / "whole.tar.gz").read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(data[: len(data) * 2 // 3])
    url = str(tmp_path / "cut.tar.gz")
    with pytest.raises(fd.CorruptShard, match=r"cut\.tar\.gz: .*the gzip stream is cut short"):
        list(fd.TarShardDataset(url))
    ds = fd.TarShardDataset(url, on_error="skip")
    with pytest.warns(fd.BadSampleWarning, match="gzip stream is cut short"):
        got = [as_bytes(s) for s in ds]
    assert 10 < len(got) < 40 and got == [as_bytes(s) for s in written[: len(got)]] and ds.skipped == 1


# GNU tar's option for each compression, and the Python module that writes the same stream
COMPRESSIONS = {"xz": ("-J", "tar.xz"), "bz2": ("-j", "tar.bz2"), "zstd": ("--zstd", "tar.zst")}


def compress(data: bytes, compression: str) -> bytes:
    if compression == "xz":
        return lzma.compress(data)
    if compression == "bz2":
        return bz2.compress(data)
    return zstandard.ZstdCompressor().compress(data)


def decompress(data: bytes, compression: str) -> bytes:
    if compression == "zstd":
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
    return lzma.decompress(data) if compression == "xz" else bz2.decompress(data)


@pytest.mark.parametrize("maker", ["gnu-tar", "python"])
@pytest.mark.parametrize("compression", sorted(COMPRESSIONS))
def test_xz_bz2_and_zstd_shards_are_streamed_as_tarfile_reads_them(
    tmp_path: Path, compression: str, maker: str
) -> None:
    option, suffix = COMPRESSIONS[compression]
    urls, expected = [], []
    for shard in range(3):
        written = samples(5, seed=20 + shard)
        for s in written:
            s["__key__"] = f"{shard}-{s['__key__']}"
        expected.extend(as_bytes(s) for s in written)
        url = tmp_path / f"{shard}-{maker}.{suffix}"
        if maker == "gnu-tar":  # the real tool, through xz, bzip2 and zstd themselves
            names = write_files(
                tmp_path / f"src{shard}", [(f"{s['__key__']}.{e}", s[e]) for s in written for e in EXTS]
            )
            gnu_tar(url, tmp_path / f"src{shard}", names, option)
        else:  # a webdataset shard, compressed by Python's modules (two concatenated streams for the last one)
            with wds.TarWriter(str(tmp_path / "plain.tar")) as sink:
                for s in written:
                    sink.write(dict(s))
            plain = (tmp_path / "plain.tar").read_bytes()
            packed = compress(plain, compression)
            if shard == 2:
                half = len(plain) // 1024 * 512
                packed = compress(plain[:half], compression) + compress(plain[half:], compression)
            url.write_bytes(packed)
        urls.append(str(url))
    # what tarfile finds in them, decompressed by the command-line tools' own libraries
    for url in urls:
        with tarfile.open(fileobj=io.BytesIO(decompress(Path(url).read_bytes(), compression))) as t:
            assert len([m for m in t.getmembers() if m.isfile()]) == 15
    assert streamed(urls) == sorted(expected)
    assert sorted(as_bytes(s) for s in fd.TarShardDataset(urls, shuffle=True, batch_size=None)) == sorted(expected)
    with pytest.raises(fd.ConfigError, match=rf"is {compression}-compressed, so its samples cannot be read in random"):
        fd.IndexedTarDataset(urls)


@pytest.mark.parametrize("compression", sorted(COMPRESSIONS))
def test_a_cut_xz_bz2_or_zstd_shard_says_truncated_and_keeps_what_came_before(tmp_path: Path, compression: str) -> None:
    option, suffix = COMPRESSIONS[compression]
    written = samples(40, seed=7)
    names = write_files(tmp_path / "src", [(f"{s['__key__']}.{e}", s[e]) for s in written for e in EXTS])
    whole = Path(gnu_tar(tmp_path / f"whole.{suffix}", tmp_path / "src", names, option))
    url = tmp_path / f"cut.{suffix}"
    url.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    with pytest.raises(
        fd.CorruptShard, match=rf"cut\.{suffix.replace('.', '[.]')}: .*the {compression} stream is cut short"
    ):
        list(fd.TarShardDataset(str(url)))
    ds = fd.TarShardDataset(str(url), on_error="skip")
    with pytest.warns(fd.BadSampleWarning, match=f"the {compression} stream is cut short"):
        got = [as_bytes(s) for s in ds]
    # bzip2 and xz decode in blocks, so the cut loses the whole block it falls in: fewer samples, never wrong ones
    assert len(got) < 40 and got == [as_bytes(s) for s in written[: len(got)]] and ds.skipped == 1


def test_members_without_an_extension_are_left_out_with_one_warning(tmp_path: Path) -> None:
    written = samples(3, seed=5)
    files = [(f"{s['__key__']}.{e}", s[e]) for s in written for e in EXTS]
    # a README first, and a stray file between the members of one sample (GNU tar keeps the order given)
    files = [("README", b"read me"), *files[:4], ("NOTES", b"notes"), *files[4:]]
    url = gnu_tar(tmp_path / "a.tar", tmp_path / "src", write_files(tmp_path / "src", files))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [as_bytes(s) for s in fd.TarShardDataset(url)]  # on_error="raise": not a stop
    assert got == [as_bytes(s) for s in written] == wds_samples([url])
    said = [str(w.message) for w in caught if "without an extension" in str(w.message)]
    assert len(said) == 1 and "2 member(s)" in said[0] and "a.tar" in said[0]
    report = inspect_tar(url)
    assert report.samples == 3 and not report.bad and any("2 member(s) without an extension" in n for n in report.notes)


@pytest.mark.parametrize("fmt", ["gnu", "posix"])
def test_gnu_sparse_members_are_refused_never_misread(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "k1.bin", "wb") as f:  # holes between eight stretches of data: more than a header's map holds
        f.truncate(1 << 20)
        for i in range(8):
            f.seek(i * 120_000)
            f.write(b"data%d" % i * 100)
    names = write_files(src, [("k0.cls", b"0"), ("k1.cls", b"1"), ("k2.cls", b"2")])
    url = gnu_tar(tmp_path / "a.tar", src, [names[0], "k1.bin", names[1], names[2]], "--sparse", f"--format={fmt}")
    with tarfile.open(url) as tf:
        assert tf.getmember("k1.bin").sparse  # GNU tar did store it sparse
    with pytest.raises(fd.UnsafeMember, match=r"a\.tar: member 'k1\.bin' is a GNU sparse file"):
        list(fd.TarShardDataset(url))
    ds = fd.TarShardDataset(url, on_error="skip")
    with pytest.warns(fd.BadSampleWarning, match="k1.bin"):
        got = {s["__key__"]: bytes(s["cls"]) for s in ds}
    assert got == {"k0": b"0", "k2": b"2"} and ds.skipped == 1
