"""GETs that survive a connection dropped mid-body, and S3 errors turned into fastdata's.

botocore retries a request that fails before its body arrives, but a connection cut while the body
is being read surfaces as ``ResponseStreamingError`` (or ``IncompleteReadError``, a read timeout) and
is not retried (see tests/test_s3_faults.py). :func:`get` keeps every byte already received and reissues a ranged GET
from the byte reached, pinned to the first response's ETag (``If-Match``) so that an object replaced
in the meantime fails loudly instead of being spliced from two versions. Waits between resumptions
use exponential backoff with full jitter. No library does this for botocore, hence this module.

Every error botocore raises leaves here as a fastdata error naming the object, the endpoint (never a
credential) and the fix (:func:`translate`): missing keys and buckets, access denied, throttling and
5xx (:class:`S3Unavailable`), connection-level failures (nothing listening, DNS, connect timeouts, TLS,
proxies: :class:`S3Unreachable`) and credentials the AWS chain could not find
(:class:`S3CredentialsMissing`, a :class:`~fastdata.core.errors.ConfigError`).
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from fastdata.core.errors import ConfigError, FastdataError, SourceNotFound, SourceUnavailable, SourceUnreadable
from fastdata.storage._remote import ObjectChanged
from fastdata.storage.s3._client import S3Config, Stats, client, error_code, observing, without_secrets

log = logging.getLogger("fastdata.s3")
CHUNK = 1 << 20  # bytes per body read: progress is kept at this granularity when a body breaks off
_jitter = random.SystemRandom()  # never the user's seeded stream, and different in every worker

NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})
DENIED = frozenset(
    {
        "AccessDenied",
        "403",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidToken",
        "AccountProblem",
        "InvalidObjectState",
    }
)


class S3Unavailable(SourceUnavailable):
    """The store did not serve a request after every retry: throttling, 5xx, timeouts, cut connections."""


class S3Unreachable(S3Unavailable):
    """No connection to the endpoint could be made after every retry: nothing listening, a name that does
    not resolve, a connect timeout, a TLS handshake that failed, a proxy that refused."""


class S3CredentialsMissing(ConfigError):
    """The AWS credential chain found no credentials (or incomplete ones) for a request that needs them."""


@dataclass
class Fetched:
    """The bytes of one GET, and what the response said about the object."""

    data: bytes
    size: int  # the whole object's size, in bytes
    etag: str


def backoff(attempt: int, config: S3Config) -> float:
    """Seconds to wait before resumption ``attempt`` (1-based): full jitter over an exponential cap."""
    return _jitter.uniform(0.0, min(config.backoff_cap, config.backoff_base * (2 ** (attempt - 1))))


def _body_errors() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import (
        ConnectionClosedError,
        IncompleteReadError,
        ReadTimeoutError,
        ResponseStreamingError,
    )
    from urllib3.exceptions import HTTPError as Urllib3Error

    return (
        ResponseStreamingError,
        IncompleteReadError,
        ReadTimeoutError,
        ConnectionClosedError,
        Urllib3Error,
        ConnectionError,
        TimeoutError,
    )


def translate(e: BaseException, url: str, config: S3Config, attempts: int = 0) -> Exception:
    """A fastdata error naming ``url`` and the fix, for an exception raised by botocore."""
    error = _translate(e, url, config, attempts)
    if error is not e:
        error.source = url  # type: ignore[attr-defined]  # what ErrorPolicy warns about, once per object
    return error


_ERRNO = re.compile(r"\[Errno -?\d+\][^'\"()]*")  # "[Errno 111] Connection refused" inside urllib3's text
_SSL = re.compile(r"\[SSL[^\]]*\][^'\"]*")  # "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)"
CREDENTIAL_CHAIN = (
    "the options aws_access_key_id= and aws_secret_access_key=, the environment (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY), AWS_PROFILE or the default profile of ~/.aws/credentials and ~/.aws/config, "
    "then container and instance roles"
)


def _where(e: BaseException, config: S3Config) -> str:
    """The endpoint a connection failed to, for a message: the configured one, else scheme://host of the
    request botocore sent (the AWS default endpoint for the bucket and region). Never credentials."""
    if config.endpoint_url or "default" not in config.endpoint:
        return config.endpoint
    sent = str(getattr(e, "kwargs", {}).get("endpoint_url", "") or "")
    head = re.match(r"[a-z][a-z0-9+.-]*://[^/?#]+", sent)
    return without_secrets(head.group(0)) if head else config.endpoint


def _reason(e: BaseException) -> str:
    """What went wrong at the socket, in a few words (``[Errno 111] Connection refused``)."""
    inner = str(getattr(e, "kwargs", {}).get("error", "") or e)
    found = _SSL.search(inner) or _ERRNO.search(inner)
    return found.group(0).strip() if found else type(e).__name__


def _connection(e: BaseException, url: str, config: S3Config) -> Exception | None:
    """A :class:`S3Unreachable` for a botocore connection-level failure, None for anything else."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import ConnectTimeoutError, ProxyConnectionError, SSLError

    if not isinstance(e, BotoConnectionError):
        return None
    where = _where(e, config)
    tries = f"after {config.max_attempts} attempt(s)"
    if isinstance(e, SSLError):
        return S3Unreachable(
            f"{url}: the TLS handshake with the S3 endpoint {where} failed ({_reason(e)}) {tries}; check the "
            "endpoint's scheme (http:// for a server without TLS) and its certificate (AWS_CA_BUNDLE)"
        )
    if isinstance(e, ProxyConnectionError):
        return S3Unreachable(
            f"{url}: the proxy in front of the S3 endpoint {where} refused the connection {tries}; check "
            "HTTPS_PROXY / HTTP_PROXY (and NO_PROXY for a local endpoint)"
        )
    if isinstance(e, ConnectTimeoutError):
        return S3Unreachable(
            f"{url}: no connection to the S3 endpoint {where} within connect_timeout={config.connect_timeout}s "
            f"{tries}; check endpoint_url= (or AWS_ENDPOINT_URL) and the network, or raise connect_timeout"
        )
    return S3Unreachable(
        f"{url}: cannot connect to the S3 endpoint {where} ({_reason(e)}) {tries}; check endpoint_url= "
        "(or AWS_ENDPOINT_URL) and that the server is running and reachable from here"
    )


def _translate(e: BaseException, url: str, config: S3Config, attempts: int) -> Exception:
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        CredentialRetrievalError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    bucket = url[len("s3://") :].split("/", 1)[0]
    if isinstance(e, NoCredentialsError):
        return S3CredentialsMissing(
            f"{url}: no AWS credentials found for the S3 endpoint {config.endpoint}; the AWS chain looked at "
            f"{CREDENTIAL_CHAIN}. Set one of them, or pass anonymous=True for a public bucket"
        )
    if isinstance(e, PartialCredentialsError):
        missing = getattr(e, "kwargs", {}).get("cred_var", "a key")
        return S3CredentialsMissing(
            f"{url}: incomplete AWS credentials ({missing} is missing); give both the access key id and "
            f"the secret access key in one place of the AWS chain ({CREDENTIAL_CHAIN})"
        )
    if isinstance(e, CredentialRetrievalError):
        provider = getattr(e, "kwargs", {}).get("provider", "a credential provider")
        return S3CredentialsMissing(
            f"{url}: the AWS credential provider {provider!r} failed; check its settings (AWS_PROFILE, "
            f"credential_process, the instance role), or give credentials another way ({CREDENTIAL_CHAIN})"
        )
    unreachable = _connection(e, url, config)
    if unreachable is not None:
        return unreachable
    if isinstance(e, ClientError):
        code = error_code(e.response)
        meta = e.response.get("ResponseMetadata", {})
        tries = f" after {meta.get('RetryAttempts', 0) + 1} attempt(s)"
        if code in NOT_FOUND:
            return SourceNotFound(
                f"{url}: no such key; check the prefix, or list it with 'fastdata inspect s3://{bucket}/'"
            )
        if code == "NoSuchBucket":
            return SourceNotFound(
                f"s3://{bucket}: no such bucket (reading {url}); check the bucket name "
                f"and the endpoint ({config.endpoint})"
            )
        if code in DENIED:
            return SourceUnreadable(
                f"{url}: access denied ({code}); check that the credentials in use "
                "(explicit, AWS_PROFILE or the environment) may read here "
                "(s3:GetObject; s3:ListBucket to list) (not retried)"
            )
        if code in ("PreconditionFailed", "412"):
            return ObjectChanged(
                f"{url}: the object changed while it was being read; read it again once it is no longer being written"
            )
        status = int(meta.get("HTTPStatusCode", 0) or 0)
        if status >= 500 or status == 429 or code in ("SlowDown", "Throttling", "RequestTimeout"):
            return S3Unavailable(
                f"{url}: the store kept failing ({code}){tries}; it is throttling or down: "
                "lower the request rate (fewer workers or a smaller concurrency) or raise "
                "max_attempts"
            )
        message = e.response.get("Error", {}).get("Message", "")
        return SourceUnreadable(f"{url}: {code}: {message}")
    if isinstance(e, (*_body_errors(), OSError)):
        more = f" after {attempts} resumption(s)" if attempts else ""
        return S3Unavailable(
            f"{url}: {type(e).__name__} talking to the S3 endpoint {config.endpoint}{more} "
            f"(connect_timeout={config.connect_timeout}s, read_timeout={config.read_timeout}s); "
            "check the endpoint and the network, or raise the timeouts"
        )
    if isinstance(e, BotoCoreError):  # anything else botocore raises: named, with the endpoint
        return FastdataError(f"{url}: {type(e).__name__} talking to the S3 endpoint {config.endpoint}: {e}")
    return e if isinstance(e, Exception) else RuntimeError(str(e))


def _raise(e: BaseException, url: str, config: S3Config, attempts: int = 0) -> NoReturn:
    raise translate(e, url, config, attempts) from e


def call(config: S3Config, stats: Stats, url: str, operation: Callable[[Any], Any]) -> Any:
    """Run ``operation(client)`` (one botocore call, retried by botocore), counted; errors translated."""
    from botocore.exceptions import BotoCoreError, ClientError

    stats.add("s3_requests")
    try:
        with observing(stats):
            response = operation(client(config))
    except (ClientError, BotoCoreError, OSError) as e:
        meta = getattr(e, "response", {}).get("ResponseMetadata", {}) if isinstance(e, ClientError) else {}
        stats.add("s3_retries", int(meta.get("RetryAttempts", 0)))
        _raise(e, url, config)
    stats.add("s3_retries", int(response.get("ResponseMetadata", {}).get("RetryAttempts", 0)))
    return response


def _total_size(response: dict[str, Any]) -> int:
    content_range = response.get("ContentRange")  # "bytes 0-99/1234"
    if content_range and "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        if total != "*":
            return int(total)
    return int(response["ContentLength"])


def get(
    config: S3Config,
    stats: Stats,
    url: str,
    start: int = 0,
    length: int | None = None,
    *,
    etag: str | None = None,
    size: int | None = None,
) -> Fetched:
    """``length`` bytes of ``url`` from ``start`` (the rest of the object when None), resumed from the
    byte reached whenever the body breaks off, up to ``config.resume_attempts`` times.

    Args:
        start (int): first byte. Defaults to 0.
        length (int | None): bytes wanted (fewer at the end of the object). Defaults to the rest.
        etag (str | None): read only this version of the object (``If-Match``). Defaults to whichever
            the first response carries (later resumptions are pinned to it).
        size (int | None): the object's size if known (from a listing): a shorter body is then caught
            even when the server's ``Content-Length`` agrees with it.

    Raises:
        SourceNotFound: no such key or bucket. SourceUnreadable: access denied and other 4xx.
        S3Unavailable: retries and resumptions exhausted. ObjectChanged: the ETag changed mid-read.
    """
    if length is not None and length <= 0:
        raise ValueError(f"{url}: length={length}; ask for at least one byte")
    bucket, key = url[len("s3://") :].split("/", 1)
    parts: list[bytes] = []
    got = 0
    want = length  # bytes still to read once the object's size is known; None: up to the end
    total = size
    resumed = 0
    while True:
        pos = start + got
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if pos or want is not None:
            end = "" if want is None else str(start + want - 1)
            kwargs["Range"] = f"bytes={pos}-{end}"
        if etag:
            kwargs["IfMatch"] = etag
        # failures before the body are botocore's to retry (max_attempts); they propagate from here
        response = call(config, stats, url, lambda s3, kw=kwargs: s3.get_object(**kw))  # type: ignore[misc]
        etag = etag or response.get("ETag")
        reported = _total_size(response)
        if total is not None and reported != total:
            changed = ObjectChanged(
                f"{url}: the object has {reported} bytes, {total} were expected (it was "
                "replaced since it was listed or opened); list or open it again"
            )
            changed.source = url  # type: ignore[attr-defined]
            raise changed
        total = reported
        if want is None:
            want = total - start
        want = min(want, total - start)
        body = response["Body"]
        error: BaseException | None = None
        try:
            if "Range" in kwargs and not response.get("ContentRange"):
                _skip(body, pos)  # the server ignored the range and sent the whole object
            while got < want:
                chunk = body.read(min(CHUNK, want - got))
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
                stats.add("s3_bytes", len(chunk))
            if got == want:
                body.read(1)  # lets botocore check Content-Length (and a checksum, when there is one)
        except _body_errors() as e:
            error = e
        finally:
            body.close()
        if error is None and got == want:
            return Fetched(b"".join(parts) if len(parts) != 1 else parts[0], total, etag or "")
        # the body broke off, or was shorter than promised: resume from the byte reached
        stats.add("s3_errors")
        resumed += 1
        if resumed > config.resume_attempts:
            cause = error or OSError(f"body ended after {got} of {want} bytes")
            raise translate(cause, url, config, resumed - 1) from cause
        stats.add("s3_resumed")
        stats.add("s3_retries")
        log.debug(
            "%s: body broke off after %d of %d bytes (%s); resuming",
            url,
            got,
            want,
            type(error).__name__ if error else "short body",
        )
        time.sleep(backoff(resumed, config))


def _skip(body: Any, n: int) -> None:
    while n > 0:
        chunk = body.read(min(CHUNK, n))
        if not chunk:
            raise OSError(f"body ended {n} bytes before the requested range")
        n -= len(chunk)
