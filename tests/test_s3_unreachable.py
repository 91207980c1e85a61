"""An S3 endpoint that cannot be reached (nothing listening, TLS against a plain server, no credentials):
fastdata's own errors naming the endpoint and the fix, never botocore's raw ones, under ``on_error`` where
the failure is the read of one object, and one line from the CLI."""

from __future__ import annotations

import socket
import warnings
from typing import Any

import pytest
from botocore.exceptions import (
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ProxyConnectionError,
    ReadTimeoutError,
    SSLError,
)

import fastdata as fd
from fastdata.cli import main
from fastdata.core.errors import BadSampleWarning, ConfigError, FastdataError, TooManyBadSamples
from fastdata.storage.cache._node import CacheWarning
from fastdata.storage.s3._client import S3Config
from fastdata.storage.s3._fetch import S3CredentialsMissing, S3Unavailable, S3Unreachable, translate
from fastdata.storage.s3._reader import S3Reader
from tests.datagen import make_shards
from tests.fault_proxy import FaultProxy
from tests.s3_server import CREDENTIALS, REGION, MotoServer, upload_files

SECRET = "do-not-print-me-0123456789"
FAST = {"max_attempts": 2, "connect_timeout": 1.0, "read_timeout": 2.0}


@pytest.fixture
def closed_port() -> int:
    """A loopback port with nothing listening: bound, then closed."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


@pytest.fixture
def dead(closed_port: int) -> dict[str, Any]:
    """Client options for an endpoint on the closed port."""
    return {"endpoint_url": f"http://127.0.0.1:{closed_port}", "region_name": REGION, **CREDENTIALS, **FAST}


@pytest.mark.parametrize(
    ("error", "kind", "words"),
    [
        (EndpointConnectionError(endpoint_url="http://h:9/b/k", error=OSError("[Errno 111] Connection refused")),
         S3Unreachable, "Connection refused"),
        (ConnectTimeoutError(endpoint_url="http://h:9/b/k", error="timed out"), S3Unreachable, "connect_timeout"),
        (SSLError(endpoint_url="https://h:9/b/k", error="[SSL: WRONG_VERSION_NUMBER] wrong version number"),
         S3Unreachable, "WRONG_VERSION_NUMBER"),
        (ProxyConnectionError(proxy_url="http://proxyuser:proxypass@proxy:3128", error="refused"), S3Unreachable,
         "HTTPS_PROXY"),
        (ReadTimeoutError(endpoint_url="http://h:9/b/k", error="read timed out"), S3Unavailable, "read_timeout"),
        (NoCredentialsError(), S3CredentialsMissing, "AWS_ACCESS_KEY_ID"),
        (PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"), S3CredentialsMissing,
         "AWS_SECRET_ACCESS_KEY is missing"),
        (CredentialRetrievalError(provider="custom-process", error_msg=SECRET), S3CredentialsMissing,
         "custom-process"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None,
)  # fmt: skip
def test_every_connection_level_failure_is_a_fastdata_error_naming_the_endpoint(
    error: Exception, kind: type, words: str
) -> None:
    config = S3Config(
        endpoint_url=f"http://admin:{SECRET}@store.example:9000",
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key=SECRET,
        aws_session_token=SECRET,
    )
    got = translate(error, "s3://b/k", config)
    assert isinstance(got, kind) and isinstance(got, FastdataError)
    message = str(got)
    assert message.startswith("s3://b/k: ") and words in message
    assert SECRET not in message and "proxypass" not in message
    if kind is not S3CredentialsMissing or isinstance(error, NoCredentialsError):
        assert "store.example:9000" in message or "proxy" in message
    assert got.source == "s3://b/k"  # type: ignore[attr-defined]


def test_credentials_missing_is_a_config_error_not_a_skip() -> None:
    assert issubclass(S3CredentialsMissing, ConfigError)  # S3Dataset's policy never swallows it
    assert issubclass(S3Unreachable, fd.SourceUnavailable)


def test_s3_dataset_on_a_closed_port(dead: dict[str, Any]) -> None:
    endpoint = dead["endpoint_url"]
    for on_error in ("raise", "skip"):  # listing is not the read of one object: it raises either way
        with pytest.raises(S3Unreachable, match=rf"s3://b/p/: cannot connect to the S3 endpoint {endpoint} "):
            fd.S3Dataset("s3://b/p/", on_error=on_error, **dead)
    urls = ["s3://b/one.bin", "s3://b/two.bin"]
    with pytest.raises(S3Unreachable, match=r"s3://b/one\.bin: .*Connection refused.*endpoint_url="):
        fd.S3Dataset(urls, **dead)[0]
    skipping = fd.S3Dataset(urls, on_error="skip", **dead)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in (0, 1):  # nothing answers: no object can stand in for the one asked for
            with pytest.raises(TooManyBadSamples, match=r"(?=.*one\.bin)(?=.*two\.bin)"):
                skipping[i]
    messages = [str(w.message) for w in caught if issubclass(w.category, BadSampleWarning)]
    assert len(messages) == 2 and all(endpoint in m for m in messages)
    assert [u for u in urls if any(u in m for m in messages)] == urls
    assert skipping.skipped == 2


def test_tls_against_a_plain_http_server(s3_server: MotoServer) -> None:
    https = s3_server.endpoint_url.replace("http://", "https://")
    with pytest.raises(S3Unreachable, match=r"TLS handshake with the S3 endpoint https://127\.0\.0\.1.*http://"):
        S3Reader("s3://b/k", endpoint_url=https, region_name=REGION, **CREDENTIALS, **FAST)


def test_tar_shards_on_a_closed_port(dead: dict[str, Any]) -> None:
    for on_error in ("raise", "skip"):  # the shards' sample counts are needed to plan: raised either way
        with pytest.raises(S3Unreachable, match=rf"cannot connect to the S3 endpoint {dead['endpoint_url']}"):
            fd.TarShardDataset("s3://b/train-{0..1}.tar", storage_options=dead, on_error=on_error)


def test_tar_shards_whose_store_stops_answering_are_skipped_per_shard(
    tmp_path: Any, s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    shards = make_shards(tmp_path, shards=2, per_shard=3)
    urls = upload_files(s3_server.client(), s3_bucket, {f"train-{i}.tar": p for i, p in enumerate(shards)})
    options = {**s3_options, **FAST, "endpoint_url": fault_proxy.endpoint_url, "resume_attempts": 0}
    # no sidecars: by default indexing keeps each shard in the node-local cache; here the reads go to the store
    strict = fd.TarShardDataset(urls, storage_options=options, cache_dir=False)
    skipping = fd.TarShardDataset(urls, storage_options=options, on_error="skip", cache_dir=False)
    fault_proxy.configure(reset=1.0)  # from now on every GET is reset before its response
    with pytest.raises(S3Unavailable, match=rf"{fault_proxy.endpoint_url}"):
        list(strict)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(skipping) == []
    messages = [str(w.message) for w in caught if issubclass(w.category, BadSampleWarning)]
    assert [u for u in urls if any(u in m for m in messages)] == urls and len(messages) == 2
    assert skipping.skipped == 6  # every sample of both shards, counted


def test_tar_shards_kept_by_the_default_cache_are_read_when_the_store_stops_answering(
    tmp_path: Any, s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    shards = make_shards(tmp_path, shards=2, per_shard=3)
    urls = upload_files(s3_server.client(), s3_bucket, {f"train-{i}.tar": p for i, p in enumerate(shards)})
    options = {**s3_options, **FAST, "endpoint_url": fault_proxy.endpoint_url, "resume_attempts": 0}
    with pytest.warns(CacheWarning):  # no sidecar: indexing downloads each shard once, into the cache
        cached = fd.TarShardDataset(urls, storage_options=options)
    fault_proxy.configure(reset=1.0)  # from now on every GET is reset before its response
    assert len(list(cached)) == 6 and cached.skipped == 0  # read from the copies indexing kept


@pytest.mark.parametrize(
    "command", [["inspect", "s3://b/"], ["bench", "s3://b/", "--workers", "0", "--seconds", "0.5"]]
)
def test_the_cli_prints_one_line(
    command: list[str], closed_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for name, value in {**CREDENTIALS, "AWS_REGION": REGION}.items():
        monkeypatch.setenv(name.upper(), value)
    assert main(command) == 2  # an uncaught botocore error would end the test with its traceback
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"fastdata {command[0]}: error: s3://b/: cannot connect to the S3 endpoint {endpoint}")
