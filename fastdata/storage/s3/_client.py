"""S3 settings, one boto3 client per process, and the counters of what the client went through.

botocore clients are not fork-safe (their connection pool's sockets would be shared by parent and
child), so every process builds its own, on first use, through a :class:`~fastdata.core.process.HandleCache`:
a forked worker never touches its parent's client and a pickled dataset carries only the settings.
boto3 clients are thread-safe, so one client per process (per settings) serves every thread; its
connection pool is sized to the threads that use it.

Retries of whole requests (throttling, 5xx, connection errors before the body) are botocore's
(``retry_mode`` "standard" or "adaptive", ``max_attempts``). We only count them, through an observer on
botocore's ``needs-retry`` event: every failed attempt (``s3_errors``), the throttled ones
(``s3_throttles``), and the retries botocore made (``s3_retries``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol

from fastdata.core import process
from fastdata.core.epoch import worker_process
from fastdata.core.errors import ConfigError, check_choice, check_positive
from fastdata.core.process import HandleCache

RetryMode = Literal["standard", "adaptive"]
AddressingStyle = Literal["auto", "path", "virtual"]

COUNTERS = ("s3_requests", "s3_retries", "s3_throttles", "s3_errors", "s3_resumed", "s3_bytes", "s3_prefetch_hits")
"""Counters every S3 read reports: GETs/HEADs/LISTs sent (first attempts), retries made by botocore
and by our body resumption, throttled attempts (503 SlowDown, 429 ...), failed attempts of any kind,
body reads resumed after they broke off, bytes received, prefetched objects or ranges that were used."""

THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestThrottled",
        "ProvisionedThroughputExceededException",
        "503",
        "429",
    }
)

MiB = 1 << 20
JOB_THREADS = 16  # requests in flight per DataLoader (split among its workers) unless concurrency is set
MIN_THREADS = 4


@dataclass(frozen=True)
class S3Config:
    """How to reach S3 and how hard to try. Hashable: one client per process per distinct config.

    Anything left None comes from the standard AWS chain (``AWS_ENDPOINT_URL``, ``AWS_REGION``,
    ``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``..., ``~/.aws/config``, instance roles). Secrets are never
    part of ``repr``, log lines or error messages; they do travel (pickled) into ``spawn`` workers.

    Args:
        endpoint_url (str | None): e.g. ``"http://127.0.0.1:9000"`` for MinIO or moto. Defaults to None.
        region_name (str | None): Defaults to the chain's, else "us-east-1".
        profile_name (str | None): a profile of ``~/.aws/config``. Defaults to None.
        aws_access_key_id, aws_secret_access_key, aws_session_token (str | None): explicit credentials.
        anonymous (bool): send unsigned requests (public buckets). Defaults to False.
        retry_mode ("standard" | "adaptive"): botocore's retry mode; "adaptive" also slows the client
            down when throttled. Defaults to "standard".
        max_attempts (int): botocore's attempts per request, the first included. Defaults to 5.
        resume_attempts (int): times one read may be resumed after its body broke off (a cut
            connection, a read timeout, a short body). Defaults to 5.
        backoff_base (float): seconds; the n-th resumption waits ``uniform(0, min(cap, base * 2**n))``
            (exponential backoff with full jitter). Defaults to 0.05.
        backoff_cap (float): seconds. Defaults to 5.
        connect_timeout (float): seconds to open a connection. Defaults to 5.
        read_timeout (float): seconds without a byte arriving before an attempt fails. Defaults to 20.
        concurrency (int | None): threads per process issuing GETs in parallel (ranges of a shard, the
            objects of a batch, prefetches). Defaults to :data:`JOB_THREADS` shared by the DataLoader's
            workers: ``max(4, 16 // num_workers)`` in each (more threads than that only contend for the
            CPU that botocore's ~2-4 ms per request needs).
        max_pool_connections (int | None): the client's connection pool. Defaults to the threads + 4
            (every thread, plus the caller's own requests).
        addressing_style ("auto" | "path" | "virtual"): Defaults to "auto" (path style for IP endpoints).
    """

    endpoint_url: str | None = None
    region_name: str | None = None
    profile_name: str | None = None
    aws_access_key_id: str | None = field(default=None, repr=False)
    aws_secret_access_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)
    anonymous: bool = False
    retry_mode: RetryMode = "standard"
    max_attempts: int = 5
    resume_attempts: int = 5
    backoff_base: float = 0.05
    backoff_cap: float = 5.0
    connect_timeout: float = 5.0
    read_timeout: float = 20.0
    concurrency: int | None = None
    max_pool_connections: int | None = None
    addressing_style: AddressingStyle = "auto"

    def __post_init__(self) -> None:
        check_choice("retry_mode", self.retry_mode, RetryMode)
        check_choice("addressing_style", self.addressing_style, AddressingStyle)
        check_positive("max_attempts", self.max_attempts)
        check_positive("resume_attempts", self.resume_attempts, allow_zero=True)
        check_positive("backoff_base", self.backoff_base, allow_zero=True)
        check_positive("backoff_cap", self.backoff_cap, allow_zero=True)
        check_positive("connect_timeout", self.connect_timeout)
        check_positive("read_timeout", self.read_timeout)
        if self.concurrency is not None:
            check_positive("concurrency", self.concurrency)
        if self.max_pool_connections is not None:
            check_positive("max_pool_connections", self.max_pool_connections)
        if (self.aws_access_key_id is None) != (self.aws_secret_access_key is None):
            raise ConfigError(
                "give both aws_access_key_id and aws_secret_access_key, or neither "
                "(to use the standard AWS credential chain)"
            )
        if self.endpoint_url is not None and "://" not in self.endpoint_url:
            raise ConfigError(f"endpoint_url={self.endpoint_url!r} needs a scheme, like 'http://host:port'")

    @property
    def threads(self) -> int:
        """Threads issuing requests in this process: ``concurrency``, or this worker process's share of
        :data:`JOB_THREADS` (loader threads of one process share its pool: they are not counted)."""
        if self.concurrency is not None:
            return self.concurrency
        return max(MIN_THREADS, JOB_THREADS // worker_process()[1])

    @property
    def pool_size(self) -> int:
        """Connections the client of this process may keep open."""
        return self.max_pool_connections or self.threads + 4

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to, for messages: the explicit one, the environment's, or AWS (a
        ``user:password@`` in it left out)."""
        chosen = self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return without_secrets(chosen) if chosen else "the AWS default endpoint"

    @classmethod
    def from_options(cls, config: S3Config | None = None, **options: Any) -> S3Config:
        """``config`` with ``options`` (its field names) replaced; unknown names fail with the list."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"unknown S3 option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if config is None:
            return cls(**options)
        if not options:
            return config  # frozen: nothing to replace (a reader per object asks this for every object)
        return cls(**{**{f.name: getattr(config, f.name) for f in fields(cls)}, **options})


def without_secrets(url: str) -> str:
    """``url`` with any ``user:password@`` left out, for messages."""
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@", r"\1", url)


def _env_key() -> tuple[str | None, ...]:
    """The environment the chain reads, so a client built under other settings is not reused."""
    return tuple(
        os.environ.get(k)
        for k in (
            "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT_URL_S3",
            "AWS_PROFILE",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_ACCESS_KEY_ID",
        )
    )


# -- counters ------------------------------------------------------------------------------------------


class CounterSink(Protocol):
    counters: tuple[str, ...]

    def add(self, counter: str, n: int = 1) -> None: ...


_lock = threading.Lock()
_client_lock = threading.Lock()
_process_counts: Counter[str] = Counter()
_local = threading.local()


def _after_fork_in_child() -> None:
    global _lock, _client_lock, _local
    _lock = threading.Lock()  # another thread may have held them at the fork
    _client_lock = threading.Lock()
    _local = threading.local()
    _process_counts.clear()


process.at_fork(after_in_child=_after_fork_in_child)


class Stats:
    """Where one reader or dataset reports its counters: this process's totals, and optionally the
    dataset's :class:`~fastdata.core.process.SharedState` (visible in the main process).

    Args:
        shared (CounterSink | None): e.g. a dataset's shared state, holding some of :data:`COUNTERS`.
    """

    def __init__(self, shared: CounterSink | None = None) -> None:
        self.shared = shared
        self._names = frozenset(shared.counters) if shared is not None else frozenset()

    def add(self, counter: str, n: int = 1) -> None:
        if not n:
            return
        with _lock:  # several threads report at once; a numpy += is not atomic
            _process_counts[counter] += n
            if counter in self._names:
                self.shared.add(counter, n)  # type: ignore[union-attr]

    def __getstate__(self) -> dict[str, Any]:
        return {"shared": self.shared}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["shared"])  # type: ignore[misc]


def process_counters() -> dict[str, int]:
    """Every S3 counter of this process (all readers and datasets together), from 0 at its start."""
    with _lock:
        return {name: _process_counts.get(name, 0) for name in COUNTERS}


class observing:
    """Route botocore's per-attempt observations on this thread to ``stats``."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def __enter__(self) -> Stats:
        self.previous = getattr(_local, "stats", None)
        _local.stats = self.stats
        return self.stats

    def __exit__(self, *exc: object) -> None:
        _local.stats = self.previous


def error_code(response: dict[str, Any] | None) -> str:
    """The S3 error code of a parsed response (``"NoSuchKey"``, ``"SlowDown"``, ``"404"`` ...)."""
    if not response:
        return ""
    return str(response.get("Error", {}).get("Code", "")) or str(
        response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
    )


def _on_attempt(response: Any = None, caught_exception: Any = None, **_: Any) -> None:
    """botocore's ``needs-retry`` event, once per attempt: count the failed ones. Returns None, so
    botocore's own retry handler alone decides whether and when to retry."""
    stats: Stats | None = getattr(_local, "stats", None)
    if stats is None:
        return
    if caught_exception is not None:
        stats.add("s3_errors")
        return
    if response is None:
        return
    status = response[0].status_code
    code = error_code(response[1])
    if status >= 500 or status == 429 or code in THROTTLE_CODES:
        stats.add("s3_errors")
        if status in (503, 429) or code in THROTTLE_CODES:
            stats.add("s3_throttles")


# -- secrets stay out of log lines ----------------------------------------------------------------------

_secrets: set[str] = set()
_TOKEN_HEADER = re.compile(r"(?i)(x-amz-security-token['\"]?\s*[:=]\s*b?['\"]?)([^'\"\s,;}]+)")
# botocore logs every request's headers and canonical request at DEBUG, session token included
_HEADER_LOGGERS = (
    "botocore.endpoint",
    "botocore.auth",
    "botocore.parsers",
    "botocore.hooks",
    "botocore.retries.standard",
    "botocore.httpchecksum",
    "urllib3.connectionpool",
)


class _Redact(logging.Filter):
    """Replaces session tokens and the secrets this process was given with ``<redacted>``."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's business, not ours
            return True
        clean = _TOKEN_HEADER.sub(r"\1<redacted>", message)
        for secret in _secrets:
            clean = clean.replace(secret, "<redacted>")
        if clean != message:
            record.msg, record.args = clean, None
        return True


_redact = _Redact()


def _guard_logs(config: S3Config) -> None:
    _secrets.update(s for s in (config.aws_secret_access_key, config.aws_session_token) if s)
    for name in _HEADER_LOGGERS:
        logger = logging.getLogger(name)
        if _redact not in logger.filters:
            logger.addFilter(_redact)


# -- the client ---------------------------------------------------------------------------------------

_sessions: dict[str | None, Any] = {}


def _session(profile: str | None) -> Any:
    """A botocore session per profile, kept for the process (and inherited through fork: it is plain
    data, and building one costs ~150 ms of loading service models)."""
    import botocore.session

    session = _sessions.get(profile)
    if session is None:
        session = botocore.session.Session(profile=profile)
        _sessions[profile] = session
    return session


def build_client(key: tuple[S3Config, tuple[str | None, ...]]) -> Any:
    """A new S3 client for ``config`` (use :func:`client` to get this process's)."""
    from botocore import UNSIGNED
    from botocore.config import Config

    # called under _client_lock (from client()): creating clients from one session is not thread-safe
    cfg = key[0]
    _guard_logs(cfg)
    session = _session(cfg.profile_name)
    botocore_config = Config(
        retries={"mode": cfg.retry_mode, "total_max_attempts": cfg.max_attempts},
        connect_timeout=cfg.connect_timeout,
        read_timeout=cfg.read_timeout,
        max_pool_connections=cfg.pool_size,
        s3={"addressing_style": cfg.addressing_style},
        signature_version=UNSIGNED if cfg.anonymous else None,
    )
    region = cfg.region_name or session.get_config_variable("region") or "us-east-1"
    try:
        s3 = session.create_client(
            "s3",
            region_name=region,
            endpoint_url=cfg.endpoint_url,
            config=botocore_config,
            aws_access_key_id=cfg.aws_access_key_id,
            aws_secret_access_key=cfg.aws_secret_access_key,
            aws_session_token=cfg.aws_session_token,
        )
    except ValueError as e:  # botocore's "Invalid endpoint: host:9000" (an AWS_ENDPOINT_URL without a scheme)
        raise ConfigError(
            f"the S3 endpoint {cfg.endpoint!r} is not usable ({e}); give it as scheme://host[:port] "
            "(e.g. http://127.0.0.1:9000) in endpoint_url= or AWS_ENDPOINT_URL"
        ) from None
    s3.meta.events.register("needs-retry.s3", _on_attempt, unique_id="fastdata-count-attempts")
    return s3


def _close_client(s3: Any) -> None:
    s3.close()


# Process-local: a forked child starts with none and builds its own (the parent's are closed in the
# child, which only drops the child's copies of their socket descriptors).
_clients: HandleCache[tuple[S3Config, tuple[str | None, ...]], Any] = HandleCache(
    build_client, _close_client, max_open=8
)


def client(config: S3Config) -> Any:
    """This process's client for ``config``, built on first use."""
    key = (config, _env_key())
    with _client_lock:  # two threads asking first must not both build one
        return _clients.get(key)


def release(config: S3Config) -> None:
    """Close this process's client for ``config`` (and its pooled connections), if it has one."""
    _clients.discard((config, _env_key()))


def parse_url(url: str) -> tuple[str, str]:
    """``("bucket", "key")`` of ``s3://bucket/key`` (the key may be empty or a prefix).

    Raises:
        ConfigError: when ``url`` is not an ``s3://`` URL with a bucket.
    """
    head, sep, rest = url.partition("://")
    if not sep or head.lower() != "s3":
        raise ConfigError(f"{url!r} is not an s3:// URL (expected s3://bucket/key)")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ConfigError(f"{url!r} has no bucket (expected s3://bucket/key)")
    return bucket, key
