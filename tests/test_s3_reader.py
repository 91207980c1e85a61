"""S3Reader and the per-process client, against a real S3 server (moto) over HTTP on 127.0.0.1."""

from __future__ import annotations

import logging
import multiprocessing
import pickle
from typing import Any

import numpy as np
import pytest

import fastdata as fd
from fastdata.core.errors import ConfigError, SourceNotFound
from fastdata.core.process._shared import SharedState
from fastdata.formats.tar._index import ShardIndex
from fastdata.formats.tar._reader import scan
from fastdata.storage import open_reader
from fastdata.storage._local import LocalReader
from fastdata.storage._remote import ObjectChanged
from fastdata.storage.s3 import _client as s3_client
from fastdata.storage.s3._client import COUNTERS, S3Config, Stats
from fastdata.storage.s3._reader import S3Reader
from tests.datagen import make_shards
from tests.s3_server import MotoServer, upload_files

KiB, MiB = 1024, 1 << 20


def counted() -> tuple[Stats, SharedState]:
    shared = SharedState(COUNTERS)
    return Stats(shared), shared


@pytest.fixture
def blob(s3_server: MotoServer, s3_bucket: str) -> tuple[str, bytes]:
    data = np.random.default_rng(3).bytes(3 * MiB + 123)
    upload_files(s3_server.client(), s3_bucket, {"blob.bin": data})
    return f"s3://{s3_bucket}/blob.bin", data


def test_reads_are_the_object_bytes(blob: tuple[str, bytes], s3_options: dict[str, Any]) -> None:
    url, data = blob
    with S3Reader(url, readahead=256 * KiB, part_size=512 * KiB, open_bytes=4 * KiB, **s3_options) as r:
        assert r.size == len(data)
        assert r.read(10, 100) == data[10:110]
        assert r.read(len(data) - 5, 100) == data[-5:]  # clamped at the end
        assert r.read(len(data) + 10, 5) == b""
        assert r.read(1000, 2 * MiB) == data[1000 : 1000 + 2 * MiB]  # parallel parts
        ranges = [(0, 0), (5 * KiB, 7), (2 * MiB, 300 * KiB), (17, 4), (len(data) - 3, 10), (900 * KiB, 1)]
        assert r.read_ranges(ranges) == [data[o : o + n] for o, n in ranges]
        with pytest.raises(ValueError, match="negative"):
            r.read(-1, 4)
    with pytest.raises(ValueError, match="after close"):
        r.read(0, 1)
    r.close()  # idempotent


def test_open_is_one_get_and_small_files_need_no_other(
    s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    upload_files(s3_server.client(), s3_bucket, {"manifest.json": b'{"shards": []}', "empty": b""})
    stats, shared = counted()
    with S3Reader(f"s3://{s3_bucket}/manifest.json", stats=stats, **s3_options) as r:
        assert r.read(0, r.size) == b'{"shards": []}'
    assert shared.total("s3_requests") == 1
    with S3Reader(f"s3://{s3_bucket}/empty", **s3_options) as r:
        assert r.size == 0 and r.read(0, 10) == b"" and r.read_ranges([(0, 3)]) == [b""]


def test_header_scan_is_a_few_large_gets(
    s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], tmp_path: Any
) -> None:
    # ~2 MB shard of 400 samples: 800 members, 1600 header reads in the scan and its checksum pass
    (path,) = make_shards(tmp_path, shards=1, per_shard=400, seed=2)
    upload_files(s3_server.client(), s3_bucket, {"train-000000.tar": path})
    stats, shared = counted()
    with S3Reader(f"s3://{s3_bucket}/train-000000.tar", readahead=512 * KiB, stats=stats, **s3_options) as r:
        index = scan(r)
        size = r.size
    with LocalReader(path) as local:
        expected = scan(local)
    assert index.keys == expected.keys and index.members == expected.members and index.complete
    # every byte once, in windows of readahead: no GET per header
    assert shared.total("s3_requests") <= size // (512 * KiB) + 3
    assert shared.total("s3_bytes") < 1.5 * size


def test_sequential_read_ranges_are_prefetched_and_coalesced(
    blob: tuple[str, bytes], s3_options: dict[str, Any]
) -> None:
    url, data = blob
    stats, shared = counted()
    # members of 30 KB separated by 512-byte headers, as in a tar shard, read 16 at a time in order
    members = [(o, 30 * KiB) for o in range(0, len(data) - 31 * KiB, 30 * KiB + 512)]
    with S3Reader(url, readahead=256 * KiB, open_bytes=4 * KiB, stats=stats, **s3_options) as r:
        for lo in range(0, len(members), 16):
            batch = members[lo : lo + 16]
            assert r.read_ranges(batch) == [data[o : o + n] for o, n in batch]
    calls = -(-len(members) // 16)
    # one span per call (nearby ranges coalesced), and most calls served by the previous call's read-ahead
    assert shared.total("s3_prefetch_hits") >= len(members) // 2
    assert shared.total("s3_requests") <= 2 * calls


def test_random_ranges_are_fetched_exactly(blob: tuple[str, bytes], s3_options: dict[str, Any]) -> None:
    url, data = blob
    stats, shared = counted()
    rng = np.random.default_rng(0)
    offsets = sorted(rng.choice(len(data) // (64 * KiB), 8, replace=False) * 64 * KiB)
    ranges = [(int(o) + 3, 1000) for o in offsets]
    with S3Reader(url, open_bytes=1, coalesce_gap=4 * KiB, stats=stats, **s3_options) as r:
        before = shared.total("s3_bytes")
        assert r.read_ranges(ranges) == [data[o : o + n] for o, n in ranges]
    assert shared.total("s3_bytes") - before == 8 * 1000  # far apart: never coalesced, no read-ahead


def test_missing_key_and_bucket_name_what_is_missing(s3_bucket: str, s3_options: dict[str, Any]) -> None:
    with pytest.raises(SourceNotFound, match=rf"s3://{s3_bucket}/nope/x.tar: no such key"):
        S3Reader(f"s3://{s3_bucket}/nope/x.tar", **s3_options)
    with pytest.raises(SourceNotFound, match=r"s3://no-such-bucket-here: no such bucket"):
        S3Reader("s3://no-such-bucket-here/x.tar", **s3_options)
    with pytest.raises(ConfigError, match="names a prefix"):
        S3Reader(f"s3://{s3_bucket}/folder/", **s3_options)
    with pytest.raises(ConfigError, match="not an s3:// URL"):
        S3Reader("http://example/x", **s3_options)


def test_object_replaced_mid_read_fails_loudly(
    s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    client = s3_server.client()
    upload_files(client, s3_bucket, {"shard.tar": b"a" * 100_000})
    with S3Reader(f"s3://{s3_bucket}/shard.tar", open_bytes=1000, readahead=1000, **s3_options) as r:
        upload_files(client, s3_bucket, {"shard.tar": b"b" * 100_000})
        with pytest.raises(ObjectChanged, match="changed while it was being read"):
            r.read(50_000, 10)


def test_options_are_checked_when_built(s3_options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="'standard', 'adaptive'"):
        S3Config(retry_mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"unknown S3 option.*max_atempts"):
        S3Reader("s3://b/k", max_atempts=3, **s3_options)
    with pytest.raises(ConfigError, match="both aws_access_key_id and aws_secret_access_key"):
        S3Config(aws_access_key_id="x")
    with pytest.raises(ConfigError, match="needs a scheme"):
        S3Config(endpoint_url="localhost:9000")
    with pytest.raises(ConfigError, match="concurrency"):
        S3Config(concurrency=0)


def test_endpoint_and_credentials_from_the_environment(blob: tuple[str, bytes], s3_env: dict[str, str]) -> None:
    url, data = blob
    with open_reader(url) as r:  # no options at all: the standard AWS chain
        assert r.read(0, 1000) == data[:1000]
    assert S3Config().endpoint == s3_env["AWS_ENDPOINT_URL"]


def test_secrets_never_in_repr_logs_or_errors(
    s3_bucket: str, s3_server: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "SECRET-do-not-print-4f9c"
    options = {
        "endpoint_url": s3_server.endpoint_url,
        "region_name": "us-east-1",
        "aws_access_key_id": "AKIDTEST",
        "aws_secret_access_key": secret,
        "aws_session_token": secret + "tok",
    }
    upload_files(s3_server.client(), s3_bucket, {"a.bin": b"x" * 10})
    caplog.set_level(logging.DEBUG)  # botocore's own debug logs included
    seen = [repr(S3Config(**options))]
    reader = S3Reader(f"s3://{s3_bucket}/a.bin", **options)
    seen += [repr(reader), str(reader.config)]
    ds = fd.S3Dataset(f"s3://{s3_bucket}/", **options)
    seen += [repr(ds), str(ds[0])]
    for url in (f"s3://{s3_bucket}/missing", "s3://no-such-bucket-x/a"):
        with pytest.raises(SourceNotFound) as e:
            S3Reader(url, **options)
        seen.append(str(e.value))
    assert caplog.records, "botocore's debug logging was captured"
    seen += [r.getMessage() for r in caplog.records]
    assert not [s for s in seen if secret in s]


_parent_client: list[Any] = []  # held, so the child cannot get a new client at the same address


def _child_reads(url: str, options: dict[str, Any], queue: Any) -> None:
    with S3Reader(url, **options) as r:
        head = r.read(0, 16)
    own = s3_client.client(S3Config.from_options(**options))
    queue.put((own is not _parent_client[0], s3_client._clients.opened, head))


def test_one_client_per_process_rebuilt_after_fork(blob: tuple[str, bytes], s3_options: dict[str, Any]) -> None:
    url, data = blob
    config = S3Config.from_options(**s3_options)
    assert s3_client.client(config) is s3_client.client(config)  # one per process per config
    _parent_client[:] = [s3_client.client(config)]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_reads, args=(url, s3_options, queue))
    child.start()
    not_parents, built, head = queue.get(timeout=60)
    child.join(60)
    assert (not_parents, built, head) == (True, 1, data[:16])  # its own client, built once
    assert child.exitcode == 0


def test_readers_are_never_pickled_datasets_are(blob: tuple[str, bytes], s3_options: dict[str, Any]) -> None:
    url, data = blob
    with S3Reader(url, **s3_options) as r, pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(r)
    prefix = url.rsplit("/", 1)[0] + "/"
    ds = fd.S3Dataset(prefix, **s3_options)
    ds[0]  # builds this process's client and threads: none of it travels
    copy = pickle.loads(pickle.dumps(ds))
    assert copy[0]["bin"] == data


def test_index_sidecar_is_read_from_s3_and_checked(
    s3_server: MotoServer, s3_bucket: str, s3_env: dict[str, str], tmp_path: Any
) -> None:
    (path,) = make_shards(tmp_path, shards=1, per_shard=20, seed=4)
    with LocalReader(path) as local:
        index = scan(local)
    # a sidecar the check accepts that a scan would not write (spans are not used to read): shows it was used
    index.spans = [(0, 0)] * len(index)
    client = s3_server.client()
    upload_files(client, s3_bucket, {"t-000000.tar": path, "t-000000.tar.idx": index.to_bytes()})
    url = f"s3://{s3_bucket}/t-000000.tar"
    ds = fd.IndexedTarDataset(url)
    assert ds[7]["__key__"] == index.keys[7] and ds.source.index(url).spans == index.spans
    # one that names other members (renamed keys) is checked against the shard's headers and not used
    wrong = ShardIndex.from_bytes(url, index.to_bytes())
    wrong.keys = [f"from-sidecar-{k}" for k in wrong.keys]
    upload_files(client, s3_bucket, {"t-000000.tar.idx": wrong.to_bytes()})
    # (a remote shard's headers are checked as its members are read: the first read finds it)
    ds = fd.IndexedTarDataset(url)
    with pytest.warns(UserWarning, match=r"t-000000\.tar\.idx: says the member at byte \d+ is from-sidecar-s000007"):
        assert ds[7]["__key__"] == "s000007"


def test_a_known_size_opens_without_a_request_and_pins_the_first_gets_version(
    s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    data = np.random.default_rng(4).bytes(600 * KiB)
    client = s3_server.client()
    upload_files(client, s3_bucket, {"shard.tar": data})
    url = f"s3://{s3_bucket}/shard.tar"
    stats, shared = counted()
    with S3Reader(url, size=len(data), follow_streams=False, stats=stats, **s3_options) as r:
        assert shared.total("s3_requests") == 0 and r.size == len(data)
        # dense calls of a stream, without read-ahead: each fetches exactly its span, in one GET
        for lo in (0, 200 * KiB):
            ranges = [(o, 9 * KiB) for o in range(lo, lo + 200 * KiB, 10 * KiB)]
            assert r.read_ranges(ranges) == [data[o : o + n] for o, n in ranges]
        assert shared.total("s3_requests") == 2 and shared.total("s3_prefetch_hits") == 0
        assert shared.total("s3_bytes") == 2 * (190 * KiB + 9 * KiB)
        upload_files(client, s3_bucket, {"shard.tar": data[::-1]})
        with pytest.raises(ObjectChanged, match="changed while it was being read"):
            r.read(500 * KiB, 10)
    with S3Reader(url, size=len(data) + 1, **s3_options) as r, pytest.raises(ObjectChanged, match="bytes"):
        r.read(0, 10)
