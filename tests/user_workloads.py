"""Users' own workloads with a known bottleneck (issue 22), for the known-answer suite (tests/known_answers.py):
plain torch datasets whose items wait on something real, each measured offline (a sweep) and live (the
monitor inside a training loop), which must give the same label.

* items fetched from a loopback HTTP server that answers each request after 5 ms (a subprocess; the client
  keeps one connection per process, with a timeout, so each read polls its socket before receiving): storage;
* items that sleep 5 ms: sleep;
* items that take a lock another thread of the same process holds most of the time: lock;
* pure-Python work in loader threads (thread mode), which holds the GIL: cpu;
* JPEG decoding in loader threads (PIL releases the GIL while it decodes): cpu;
* 4 MiB reads at random offsets of a 64 MiB file, its pages dropped from the page cache before each read
  (``os.posix_fadvise(..., POSIX_FADV_DONTNEED)``): storage (the disk).

The sleeps in the datasets and the server are their workload (a round trip, a held lock), not synchronisation.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import fastdata as fd
from fastdata.bench._synthetic import spin
from fastdata.datasets._base import MapDatasetBase
from fastdata.loading.observe import Monitor, Stats

ITEMS = 1_000_000  # more items than any run reads: every run is one epoch, measured part of the way

# ---------------------------------------------------------------------------------------------- the datasets


class Sleeping(Dataset[torch.Tensor]):
    """Items that sleep 5 ms (a rate limit, a retry's back-off, a simulated latency)."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.005)
        return torch.full((16,), i)


SERVER = """
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = bytes(range(256)) * 8


class Slow(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        # headers and body go out in two writes: without this, Nagle's algorithm holds the body back until
        # the client's delayed ACK (40 ms), not the 5 ms the server means to take
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()  # keep-alive: one connection per client process

    def do_GET(self):
        time.sleep(0.005)  # the server's latency: the workload
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextlib.contextmanager
def http_server() -> Iterator[int]:
    """A loopback HTTP server answering every GET after 5 ms, in a subprocess; yields its port."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


class HttpItems(Dataset[torch.Tensor]):
    """Items fetched over HTTP from ``127.0.0.1:port``, one kept-alive connection per process (opened on first
    use, with a 10 s timeout: Python then polls the socket before each receive)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._conn: http.client.HTTPConnection | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"port": self.port, "_conn": None, "_pid": -1}

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._pid != os.getpid():
            self._conn, self._pid = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10), os.getpid()
        assert self._conn is not None
        self._conn.request("GET", f"/item/{i}")
        body = self._conn.getresponse().read()
        return torch.frombuffer(bytearray(body), dtype=torch.uint8)[:16].clone()


class Locked(Dataset[torch.Tensor]):
    """Items that take a lock which a thread of the same process holds 4 ms of every 5 (a client library's
    connection lock, a logging handler), and hold it 0.2 ms each (a call through that client): started in
    each process on its first item."""

    def __init__(self) -> None:
        self._pid = -1
        self._lock: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_pid": -1, "_lock": None}

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._pid != os.getpid():
            self._pid, self._lock = os.getpid(), threading.Lock()
            threading.Thread(target=_hold, args=(self._lock,), daemon=True).start()
        with self._lock:
            time.sleep(0.0002)
        return torch.full((16,), i)


def _hold(lock: Any) -> None:
    while True:
        with lock:
            time.sleep(0.004)
        time.sleep(0.001)


class GilBound(MapDatasetBase, Dataset[torch.Tensor]):
    """Items that each cost ~2 ms of pure-Python work (a transform written in Python): it holds the GIL.
    A fastdata dataset (``fd.Loader(workers="threads")`` reads fastdata datasets)."""

    def __init__(self) -> None:
        self._init_base(seed=0, on_error="raise", rank=None, world_size=None)

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), spin(20_000))


class Decoding(MapDatasetBase, Dataset[torch.Tensor]):
    """Items that each decode a 256x256 JPEG with PIL (which releases the GIL while it decodes)."""

    def __init__(self) -> None:
        self._init_base(seed=0, on_error="raise", rank=None, world_size=None)
        rng = np.random.default_rng(0)
        pixels = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        self.jpeg = buf.getvalue()

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> torch.Tensor:
        image = Image.open(io.BytesIO(self.jpeg))
        image.load()
        return torch.from_numpy(np.asarray(image)[:4, :4].copy())


COLD_FILE = 64 << 20
COLD_READ = 4 << 20


def cold_file(folder: Path) -> str:
    """A 64 MiB file of random bytes (made once per folder)."""
    path = folder / "cold.bin"
    if not path.exists() or path.stat().st_size != COLD_FILE:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_bytes(np.random.default_rng(0).bytes(COLD_FILE))
    return str(path)


class ColdReads(Dataset[torch.Tensor]):
    """Items read as 4 MiB at an offset chosen by the index, the file's pages for it dropped from the page
    cache first (``POSIX_FADV_DONTNEED``): every read goes to the device."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        self._pid = -1
        self._buf = bytearray(COLD_READ)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_fd": -1, "_pid": -1, "_buf": bytearray(COLD_READ)}

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        offset = (i * 7919 % (COLD_FILE // 4096 - COLD_READ // 4096)) * 4096
        os.posix_fadvise(self._fd, offset, COLD_READ, os.POSIX_FADV_DONTNEED)
        os.preadv(self._fd, [self._buf], offset)
        return torch.frombuffer(self._buf[:16], dtype=torch.uint8).clone()


# ------------------------------------------------------------------------------------------- offline, live


def _sweep(dataset: Any, timing: dict[str, Any], **grid: Any) -> fd.bench.Recommendation:
    result = fd.bench.sweep(dataset, batch_size=8, **grid, **timing)
    return fd.bench.recommend(result)


def _live_seconds(timing: dict[str, Any]) -> float:
    """As long as an offline point takes: its warm-up and its measuring (at least 2 s, so that starting the
    workers stays a small part of the report)."""
    return max(2.0, float(timing["warmup"]) + float(timing["seconds"]))


def _train(batches: Any, seconds: float) -> None:
    """A training loop without a model, for ``seconds`` (the monitor's hook counts each batch)."""
    end = time.perf_counter() + seconds
    for _ in batches:
        if time.perf_counter() >= end:
            break


def _live_dataloader(dataset: Any, timing: dict[str, Any], workers: int = 2) -> Stats:
    """A plain DataLoader under ``fd.monitor``, for about as long as an offline point; its report over the run."""
    loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=workers)
    monitored = fd.monitor(loader, lambda s: None, seconds=3600)
    try:
        _train(monitored, _live_seconds(timing))
        stats = monitored.stats(since="start")
    finally:
        monitored.close()
    assert stats is not None
    return stats


def _live_threads(dataset: Any, timing: dict[str, Any], threads: int) -> Stats:
    """``fd.Loader(..., workers="threads", monitor=...)``: its report over the run."""
    loader = fd.Loader(
        dataset, batch_size=8, num_workers=threads, workers="threads", monitor=Monitor(to=lambda s: None, seconds=3600)
    )
    try:
        _train(loader, _live_seconds(timing))
        stats = loader.stats(since="start")
    finally:
        loader.close()
    assert stats is not None
    return stats


def http_items(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    with http_server() as port:
        return _sweep(HttpItems(port), timing, workers=[2])


def http_live(folder: Path, timing: dict[str, Any]) -> Stats:
    with http_server() as port:
        return _live_dataloader(HttpItems(port), timing)


def sleeping(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    return _sweep(Sleeping(), timing, workers=[2])


def sleeping_live(folder: Path, timing: dict[str, Any]) -> Stats:
    return _live_dataloader(Sleeping(), timing)


def locked(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    return _sweep(Locked(), timing, workers=[2])


def locked_live(folder: Path, timing: dict[str, Any]) -> Stats:
    return _live_dataloader(Locked(), timing)


def gil_threads(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    return _sweep(GilBound(), timing, modes=["threads"], threads=[4])


def gil_threads_live(folder: Path, timing: dict[str, Any]) -> Stats:
    return _live_threads(GilBound(), timing, 4)


def decode_threads(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    return _sweep(Decoding(), timing, modes=["threads"], threads=[2])


def decode_threads_live(folder: Path, timing: dict[str, Any]) -> Stats:
    return _live_threads(Decoding(), timing, 2)


def cold_reads(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    return _sweep(ColdReads(cold_file(folder)), timing, workers=[2])


def cold_reads_live(folder: Path, timing: dict[str, Any]) -> Stats:
    return _live_dataloader(ColdReads(cold_file(folder)), timing)


Live = Callable[[Path, dict[str, Any]], Stats]

__all__ = [
    "ColdReads",
    "Decoding",
    "GilBound",
    "HttpItems",
    "Live",
    "Locked",
    "Sleeping",
    "cold_reads",
    "cold_reads_live",
    "decode_threads",
    "decode_threads_live",
    "gil_threads",
    "gil_threads_live",
    "http_items",
    "http_live",
    "http_server",
    "locked",
    "locked_live",
    "sleeping",
    "sleeping_live",
]
