"""Shared fixtures: a real S3 server (moto, in its own process) and a fault-injecting proxy in front of
it, each started once per test session on a free port on 127.0.0.1 and stopped at its end.

Tests that need none of them start nothing: every fixture here is requested explicitly, but for one:
fastdata's own cache folder (``XDG_CACHE_HOME``, where a dataset keeps remote shards it had to download to
index them) points into the session's temporary folder, never the home of whoever runs the tests.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fault_proxy import FaultProxy
from tests.s3_server import CREDENTIALS, REGION, MotoServer

_buckets = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def own_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    """The moto server, for the whole session."""
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def s3_env(s3_server: MotoServer) -> Iterator[dict[str, str]]:
    """Point the standard AWS chain (``AWS_ENDPOINT_URL``, credentials, region) at the moto server, for
    code that is given no S3 options (tar shards read through ``open_reader``), in this process and in
    the worker processes it starts."""
    with pytest.MonkeyPatch.context() as mp:
        env = s3_server.env()
        for name, value in env.items():
            mp.setenv(name, value)
        yield env


@pytest.fixture(scope="session")
def _proxy_process(s3_server: MotoServer) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint_url) as proxy:
        yield proxy


@pytest.fixture
def fault_proxy(_proxy_process: FaultProxy) -> Iterator[FaultProxy]:
    """The fault proxy in front of the server, with no faults and zeroed counters at the start and end
    of each test (configure it with ``fault_proxy.configure(...)``)."""
    _proxy_process.reset()
    yield _proxy_process
    _proxy_process.reset()


@pytest.fixture
def s3_options(s3_server: MotoServer) -> dict[str, Any]:
    """Explicit client options for the moto server."""
    return {"endpoint_url": s3_server.endpoint_url, "region_name": REGION, **CREDENTIALS}


@pytest.fixture
def s3_bucket(s3_server: MotoServer, request: pytest.FixtureRequest) -> str:
    """A new, empty bucket named after the test."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    name = f"t{next(_buckets)}-{slug}"[:63].rstrip("-")
    s3_server.client().create_bucket(Bucket=name)
    return name
