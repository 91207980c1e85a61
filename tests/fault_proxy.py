"""A fault-injecting HTTP proxy between an S3 client and a test server, on loopback.

It relays HTTP/1.1 requests to the upstream server and, for a seeded random fraction of object
requests, injects the faults a real object store shows: ``503 SlowDown``, a connection reset before the
response, a body cut off partway (clean close or TCP reset), a response held back (before the headers
or in the middle of the body), ``403 AccessDenied`` for chosen keys, and latency added to every
request. Listing requests are relayed untouched unless asked.

It runs in its own process (``python tests/fault_proxy.py --upstream 127.0.0.1:PORT``), so relaying
never competes for the client's GIL, and is controlled over HTTP on its own port (paths under
``/__fault_proxy__/``), which is how :class:`FaultProxy` drives it from tests and benchmarks::

    with FaultProxy(server.endpoint_url) as proxy:
        proxy.configure(slowdown=0.1, cut=0.1, seed=1)
        ...  # point the client at proxy.endpoint_url
        proxy.stats()  # {"requests": ..., "slowdown": ..., "cut": ...}

Only the standard library is used, so the file runs as a script from anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import struct
import subprocess
import sys
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from fastdata.bench._local_s3 import stop_process

CONTROL = "/__fault_proxy__/"
CHUNK = 1 << 16


@dataclass
class Faults:
    """What to inject. Fractions are of the requests faults apply to (``methods``, object keys).

    Attributes:
        slowdown (float): answered ``503 SlowDown`` without reaching the server.
        reset (float): connection reset (TCP RST) before any response.
        cut (float): the body is cut off at a random point (10-90%), then the connection closes.
        cut_reset (bool): cut with a TCP reset instead of a clean close. Defaults to False.
        stall (float): the response is held back ``stall_s`` seconds.
        stall_s (float): seconds a stalled response waits.
        stall_at ("head" | "body"): hold back before the headers, or after half of the body.
        latency_ms (float): added before every relayed request (a network round trip), ms.
        deny (str): keys containing this substring are answered ``403 AccessDenied`` (any method).
        only (str): when set, faults apply only to keys containing this substring.
        methods (list[str]): methods faults apply to. Defaults to ["GET"].
        listings (bool): fault bucket-level requests (listings) too. Defaults to False.
        seed (int): seeds the fault draws (one draw sequence per configuration).
    """

    slowdown: float = 0.0
    reset: float = 0.0
    cut: float = 0.0
    cut_reset: bool = False
    stall: float = 0.0
    stall_s: float = 0.0
    stall_at: str = "head"
    latency_ms: float = 0.0
    deny: str = ""
    only: str = ""
    methods: list[str] = field(default_factory=lambda: ["GET"])
    listings: bool = False
    seed: int = 0


def _error(status: int, reason: str, code: str, message: str, head_only: bool) -> bytes:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
        f"<RequestId>fault-proxy</RequestId></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head if head_only else head + body


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    out: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            out[name.strip().lower()] = value.strip()
    return lines[0], out


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Proxy:
    def __init__(self, upstream: tuple[str, int], faults: Faults) -> None:
        self.upstream = upstream
        self.stats: Counter[str] = Counter()
        self.set_faults(faults)

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults
        self.rng = random.Random(faults.seed)

    def decide(self, method: str, path: str) -> tuple[str, float]:
        """The fault for one request and, for a cut, where (fraction of the body)."""
        f = self.faults
        if f.deny and f.deny in path:
            return "deny", 0.0
        parts = path.split("?", 1)[0].lstrip("/").split("/", 1)
        is_object = len(parts) == 2 and parts[1] != ""
        if method not in f.methods or not (is_object or f.listings) or (f.only and f.only not in path):
            return "", 0.0
        u, where = self.rng.random(), self.rng.uniform(0.1, 0.9)
        for name, p in (("slowdown", f.slowdown), ("reset", f.reset), ("cut", f.cut), ("stall", f.stall)):
            if u < p:
                return name, where
            u -= p
        return "", 0.0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                request_line, headers = _headers(head)
                method, target = request_line.split(" ")[:2]
                if headers.get("expect", "").lower() == "100-continue":
                    # answer for the server (botocore would otherwise wait a second before the body)
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await writer.drain()
                    head = b"".join(
                        line + b"\r\n" for line in head.split(b"\r\n") if not line.lower().startswith(b"expect:")
                    )[:-2]
                body = await self._read_body(reader, headers)
                if target.startswith(CONTROL):
                    await self._control(writer, method, target, body)
                    return
                if not await self._relay(writer, method, target, head + body, headers):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            return  # the proxy is stopping while a response is held back
        finally:
            if not writer.is_closing():
                writer.close()

    async def _read_body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "content-length" in headers:
            return await reader.readexactly(int(headers["content-length"]))
        if headers.get("transfer-encoding", "").lower() == "chunked":
            raw = bytearray()
            while True:
                size_line = await reader.readuntil(b"\r\n")
                raw += size_line
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    while True:  # trailers, then an empty line
                        line = await reader.readuntil(b"\r\n")
                        raw += line
                        if line == b"\r\n":
                            return bytes(raw)
                raw += await reader.readexactly(size + 2)
        return b""

    async def _control(self, writer: asyncio.StreamWriter, method: str, target: str, body: bytes) -> None:
        what = target[len(CONTROL) :]
        if what == "faults" and method == "POST":
            given = json.loads(body or b"{}")
            known = {f.name for f in fields(Faults)}
            unknown = set(given) - known
            if unknown:
                payload = json.dumps({"error": f"unknown fault options {sorted(unknown)}"}).encode()
                status = "400 Bad Request"
            else:
                self.set_faults(Faults(**given))
                self.stats.clear()
                payload, status = json.dumps(asdict(self.faults)).encode(), "200 OK"
        elif what == "stats":
            payload, status = json.dumps(dict(self.stats)).encode(), "200 OK"
        else:
            payload, status = b'{"error": "unknown control path"}', "404 Not Found"
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            f"Connection: close\r\n\r\n".encode()
            + payload
        )
        await writer.drain()

    async def _relay(
        self, writer: asyncio.StreamWriter, method: str, target: str, request: bytes, headers: dict[str, str]
    ) -> bool:
        """Relay one request (or fault it); True when the client connection stays open."""
        f = self.faults
        fault, where = self.decide(method, target)
        self.stats["requests"] += 1
        if fault:
            self.stats[fault] += 1
        if f.latency_ms:
            await asyncio.sleep(f.latency_ms / 1000)
        head_only = method == "HEAD"
        if fault == "deny":
            writer.write(_error(403, "Forbidden", "AccessDenied", "Access Denied", head_only))
            await writer.drain()
            return False
        if fault == "slowdown":
            writer.write(_error(503, "Slow Down", "SlowDown", "Please reduce your request rate.", head_only))
            await writer.drain()
            return False
        if fault == "reset":
            _reset(writer)
            return False
        if fault == "stall" and f.stall_at == "head":
            await asyncio.sleep(f.stall_s)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        try:
            up_writer.write(request)
            await up_writer.drain()
            resp_head = await up_reader.readuntil(b"\r\n\r\n")
            status_line, resp_headers = _headers(resp_head)
            status = int(status_line.split(" ")[1])
            no_body = head_only or status in (204, 304) or 100 <= status < 200
            length = 0 if no_body else int(resp_headers.get("content-length", "-1"))
            writer.write(resp_head)
            body_fault = fault == "cut" or (fault == "stall" and f.stall_at == "body")
            stop_at = min(length - 1, max(1, int(length * where))) if length > 1 and body_fault else -1
            sent = 0
            while length < 0 or sent < length:
                want = CHUNK if length < 0 else min(CHUNK, length - sent)
                if stop_at > sent:
                    want = min(want, stop_at - sent)
                chunk = await up_reader.read(want)
                if not chunk:
                    break
                writer.write(chunk)
                sent += len(chunk)
                if sent == stop_at:
                    await writer.drain()
                    if fault == "cut":
                        self.stats["cut_bytes"] += length - sent
                        if f.cut_reset:
                            _reset(writer)
                        return False
                    await asyncio.sleep(f.stall_s)  # a stall in the middle of the body
                    stop_at = -1
            await writer.drain()
            self.stats["bytes"] += sent
            keep = "close" not in (resp_headers.get("connection", "").lower(), headers.get("connection", "").lower())
            return keep and length >= 0
        finally:
            up_writer.close()


async def serve(host: str, port: int, upstream: tuple[str, int], faults: Faults) -> None:
    proxy = Proxy(upstream, faults)
    server = await asyncio.start_server(proxy.handle, host, port, backlog=1024)
    bound = server.sockets[0].getsockname()
    print(f"fault-proxy listening on http://{bound[0]}:{bound[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: end with the process that started us
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--upstream", required=True, help="HOST:PORT of the server to relay to")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on start)")
    p.add_argument("--faults", default="{}", help="JSON object of Faults fields")
    args = p.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    asyncio.run(serve(args.host, args.port, (host, int(port)), Faults(**json.loads(args.faults))))


class FaultProxy:
    """The proxy in a child process, in front of ``upstream`` (a URL like ``http://127.0.0.1:5000``).

    Args:
        upstream (str): the server's endpoint URL.
        **faults: initial :class:`Faults` fields (none: a plain relay).
    """

    def __init__(self, upstream: str, **faults: Any) -> None:
        hostport = upstream.split("://", 1)[-1].rstrip("/")
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--upstream", hostport, "--faults", json.dumps(asdict(Faults(**faults)))],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()  # printed once the socket is bound
        self._proc.stdout.close()
        if "listening on" not in line:
            self.close()
            raise RuntimeError(f"fault proxy did not start: {line!r}")
        self.endpoint_url = line.rsplit(" ", 1)[-1].strip()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # ignore *_proxy env

    def _call(self, path: str, data: bytes | None = None) -> dict[str, Any]:
        req = urllib.request.Request(
            self.endpoint_url + CONTROL + path, data=data, method="POST" if data is not None else "GET"
        )
        with self._opener.open(req, timeout=30) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def configure(self, **faults: Any) -> dict[str, Any]:
        """Replace the faults (unset fields take their defaults) and zero the counters."""
        return self._call("faults", json.dumps(faults).encode())

    def reset(self) -> None:
        """No faults, counters zeroed."""
        self.configure()

    def stats(self) -> dict[str, int]:
        """Requests relayed and faults injected since the last configure: ``{"requests": n, "cut": k, ...}``."""
        return self._call("stats")

    def close(self) -> None:
        """Stop the proxy. Idempotent."""
        stop_process(self._proc)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    main()
