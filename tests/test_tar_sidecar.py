"""Where samples lie is never taken on trust: a sidecar index (``SHARD.tar.idx``) that does not match
its shard (copied from another shard of the same size, offsets outside the shard, fewer samples than
the shard) is refused with a warning and the shard scanned, and a shard replaced on disk between epochs
is indexed again. Every test compares the bytes read with what Python's ``tarfile`` reads."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.formats.tar._index import ShardIndex
from fastdata.formats.tar._writer import TarShardWriter

N = 10


def write_shard(path: Path, prefix: str, seed: int) -> dict[str, dict[str, bytes]]:
    """A shard (and its sidecar, as ``fastdata convert`` writes it) of N samples ``PREFIX0000 ..``; the
    payload sizes depend on ``seed`` only, so shards with one seed have one size and layout."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(100, 3000, N)
    content = np.random.default_rng([seed, *prefix.encode()])
    written = {}
    with TarShardWriter(path, fsync=False) as w:
        for i in range(N):
            sample = {"__key__": f"{prefix}{i:04d}", "bin": content.bytes(int(sizes[i])), "cls": b"%d" % i}
            w.write_sample(sample)
            written[sample["__key__"]] = {"bin": sample["bin"], "cls": sample["cls"]}
    return written


def truth(url: str) -> dict[str, dict[str, bytes]]:
    """The shard's samples as tarfile reads them."""
    out: dict[str, dict[str, bytes]] = {}
    with tarfile.open(url) as tf:
        for m in tf:
            key, ext = m.name.split(".", 1)
            out.setdefault(key, {})[ext] = tf.extractfile(m).read()  # type: ignore[union-attr]
    return out


def as_dict(samples: object) -> dict[str, dict[str, bytes]]:
    return {s["__key__"]: {e: bytes(v) for e, v in s.items() if not e.startswith("__")} for s in samples}  # type: ignore[attr-defined]


def read_both(url: str) -> tuple[dict, dict]:
    """Every sample through TarShardDataset and IndexedTarDataset."""
    ds = fd.IndexedTarDataset(url)
    return as_dict(fd.TarShardDataset(url)), as_dict(ds[i] for i in range(len(ds)))


def rewrite_sidecar(url: str, change: Callable[[ShardIndex], None]) -> None:
    index = ShardIndex.from_bytes(url, Path(url + ".idx").read_bytes())
    change(index)
    Path(url + ".idx").write_bytes(index.to_bytes())


@pytest.fixture()
def two(tmp_path: Path) -> tuple[str, str]:
    """Two shards of the same size and layout with other keys and bytes."""
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    write_shard(a, "a", seed=1)
    write_shard(b, "b", seed=1)
    assert a.stat().st_size == b.stat().st_size
    return str(a), str(b)


def test_a_sidecar_that_matches_is_used(two: tuple[str, str]) -> None:
    _, b = two
    # spans are not used to read, and not checked: a sidecar with other spans shows that it was the one used
    rewrite_sidecar(b, lambda index: setattr(index, "spans", [(0, 0)] * len(index)))
    ds = fd.IndexedTarDataset(b)
    assert ds.source.index(b).spans == [(0, 0)] * N and as_dict(ds[i] for i in range(N)) == truth(b)


def test_a_sidecar_copied_from_another_shard_of_the_same_size_is_refused(two: tuple[str, str]) -> None:
    a, b = two
    Path(b + ".idx").write_bytes(Path(a + ".idx").read_bytes())
    with pytest.warns(UserWarning, match=r"b\.tar\.idx: says the member at byte 512 is a0000\.bin, its header names"):
        streamed, indexed = read_both(b)
    assert streamed == indexed == truth(b)


def test_a_sidecar_with_offsets_outside_the_shard_is_refused(two: tuple[str, str]) -> None:
    _, b = two

    def outside(index: ShardIndex) -> None:
        (ext, off, n), rest = index.members[3][0], index.members[3][1:]
        index.members[3] = ((ext, off + 10 * 1024 * 1024, n), *rest)

    rewrite_sidecar(b, outside)
    with pytest.warns(UserWarning, match=r"b\.tar\.idx: lists a member at byte \d+ .* past the end"):
        streamed, indexed = read_both(b)
    assert streamed == indexed == truth(b)


def test_a_sidecar_listing_fewer_samples_than_the_shard_is_refused(two: tuple[str, str]) -> None:
    _, b = two

    def fewer(index: ShardIndex) -> None:
        del index.keys[7:], index.members[7:], index.spans[7:]

    rewrite_sidecar(b, fewer)
    with pytest.warns(UserWarning, match=r"b\.tar\.idx: leaves out the member 'b0007\.bin' at byte \d+"):
        streamed, indexed = read_both(b)
    assert streamed == indexed == truth(b) and len(streamed) == N


def test_a_sidecar_with_a_wrong_size_is_refused(two: tuple[str, str]) -> None:
    _, b = two

    def shorter(index: ShardIndex) -> None:
        (ext, off, n), rest = index.members[5][0], index.members[5][1:]
        index.members[5] = ((ext, off, n - 1), *rest)

    rewrite_sidecar(b, shorter)
    with pytest.warns(UserWarning, match=r"b\.tar\.idx: says the member at byte \d+ has \d+ bytes, its header"):
        streamed, indexed = read_both(b)
    assert streamed == indexed == truth(b)


def test_an_old_sidecar_without_the_new_field_is_still_read_and_checked(two: tuple[str, str]) -> None:
    a, b = two
    for url, spans in ((b, [(1, 1)] * N), (a, None)):
        index = ShardIndex.from_bytes(url, Path(url + ".idx").read_bytes())
        flat = [m for ms in index.members for m in ms]
        buf = io.BytesIO()
        np.savez(  # the layout before the 'ignored' count was added
            buf,
            keys=np.array(index.keys if url == b else [f"x{k}" for k in index.keys], dtype=str),
            counts=np.array([len(m) for m in index.members], dtype=np.int32),
            exts=np.array([m[0] for m in flat], dtype=str),
            offsets=np.array([m[1] for m in flat], dtype=np.int64),
            sizes=np.array([m[2] for m in flat], dtype=np.int64),
            spans=np.array(spans or index.spans, dtype=np.int64).reshape(-1, 2),
            size=np.array(index.size, dtype=np.int64),
        )
        Path(url + ".idx").write_bytes(buf.getvalue())
    ds = fd.IndexedTarDataset(b)
    assert ds.source.index(b).spans == [(1, 1)] * N and as_dict(ds[i] for i in range(N)) == truth(b)
    with pytest.warns(UserWarning, match=r"a\.tar\.idx: says the member at byte 512 is xa0000\.bin"):
        assert read_both(a) == (truth(a), truth(a))


# -- a shard replaced on disk between epochs ---------------------------------------------------------------
def replace(url: str, how: str, tmp_path: Path) -> dict[str, dict[str, bytes]]:
    """Put another shard with the same keys at ``url``: renamed over it, or written into the same file."""
    new = tmp_path / "new" / "shard.tar"
    new.parent.mkdir(exist_ok=True)
    written = write_shard(new, "s", seed=2)
    if how == "renamed":
        os.replace(new, url)
        os.replace(str(new) + ".idx", url + ".idx")
    else:
        with open(url, "r+b") as f:  # the same inode, other bytes
            f.write(new.read_bytes())
            f.truncate()
        Path(url + ".idx").write_bytes(Path(str(new) + ".idx").read_bytes())
    return written


def epoch(ds: object, workers: int) -> dict[str, dict[str, bytes]]:
    if isinstance(ds, fd.IndexedTarDataset):
        loader = DataLoader(
            ds,
            batch_size=4,
            sampler=ds.sampler(shuffle=False),
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
            collate_fn=list,
        )
        return as_dict(s for batch in loader for s in batch)
    loader = DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context="fork" if workers else None)
    return as_dict(loader)


@pytest.mark.parametrize("how", ["renamed", "rewritten"])
@pytest.mark.parametrize(
    ("kind", "workers", "persistent"),
    [("streamed", 0, False), ("streamed", 2, False), ("indexed", 0, False), ("indexed", 2, True)],
)
def test_a_shard_replaced_between_epochs_is_indexed_again(
    tmp_path: Path, how: str, kind: str, workers: int, persistent: bool
) -> None:
    url = str(tmp_path / "shard.tar")
    first = write_shard(Path(url), "s", seed=1)
    ds = fd.TarShardDataset(url) if kind == "streamed" else fd.IndexedTarDataset(url)
    if persistent:
        loader_epochs = DataLoader(
            ds,
            batch_size=4,
            sampler=ds.sampler(shuffle=False),  # type: ignore[attr-defined]
            num_workers=workers,
            multiprocessing_context="fork",
            persistent_workers=True,
            collate_fn=list,
        )
        assert as_dict(s for b in loader_epochs for s in b) == first
        second = replace(url, how, tmp_path)
        ds.set_epoch(1)
        assert as_dict(s for b in loader_epochs for s in b) == second == truth(url)
        return
    assert epoch(ds, workers) == first
    second = replace(url, how, tmp_path)
    assert second != first
    ds.set_epoch(1)
    assert epoch(ds, workers) == second == truth(url)
