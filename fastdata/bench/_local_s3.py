"""A local S3-compatible server for ``fastdata bench --demo``, tests and benchmarks: moto in server mode,
in its own process, on 127.0.0.1.

moto is single-threaded Python (~250-390 GETs/s here); in its own process it does not share the
client's GIL. It listens on a port the OS picks (``-p 0``): the port is read from its start-up line,
so two runs never race for a port. The child asks Linux to end it when its parent goes, so a run
killed without cleaning up (``kill -9``) leaves no server behind; a normal exit, an error or Ctrl-C
stops it through :meth:`MotoServer.close` (a context manager)::

    with MotoServer() as server:
        client = server.client()
        client.create_bucket(Bucket="data")

moto (``pip install 'fastdata[demo]'``, which is ``moto[server]``) is only needed here: :func:`missing`
says whether it is installed without importing it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

# Dummy credentials: moto accepts any; real ones must never reach a local test server.
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing-secret-key"}
REGION = "us-east-1"
START_TIMEOUT_S = 60.0  # a loaded 2-core machine can take a while to import moto
INSTALL_HINT = "pip install 'fastdata[demo]'"
_RUNNING = re.compile(r"Running on http://([\d.]+):(\d+)")

# Runs first in the child: asks Linux to end it when its parent goes (a run killed without cleaning
# up must not leave a server behind), then becomes the server.
DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); os.execv(sys.argv[1], sys.argv[1:])"
)


def missing() -> str | None:
    """Why the server cannot start here (moto or its server's libraries are not installed), or None.
    Looks for the packages without importing them (importing moto takes seconds)."""
    for name in ("moto", "flask", "flask_cors"):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{name} is not installed (moto[server] runs the local S3 server); {INSTALL_HINT}"
    return None


def _command(host: str) -> list[str]:
    script = Path(sys.executable).with_name("moto_server")
    if script.exists():
        server = [str(script), "-H", host, "-p", "0"]
    elif shutil.which("moto_server"):
        server = [str(shutil.which("moto_server")), "-H", host, "-p", "0"]
    else:
        server = [sys.executable, "-m", "moto.server", "-H", host, "-p", "0"]
    if sys.platform != "linux":
        return server
    return [sys.executable, "-c", DIE_WITH_PARENT, *server]


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """Terminate ``proc`` and wait for it; kill it if it has not ended after ``grace_s``. Idempotent."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class MotoServer:
    """A moto S3 server in a child process, listening on ``host`` (loopback) on a free port.

    Args:
        host (str): the address to bind. Defaults to "127.0.0.1".
        timeout_s (float): how long to wait for it to start, in seconds. Defaults to 60.

    Raises:
        RuntimeError: the server did not start in time (its last log lines are in the message).
    """

    def __init__(self, host: str = "127.0.0.1", timeout_s: float = START_TIMEOUT_S) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._proc = subprocess.Popen(
            _command(host),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._log: deque[str] = deque(maxlen=50)
        self._ready = threading.Event()
        self.port = 0
        self.host = host
        # moto logs every request to stderr: drain it for the server's whole life, or it blocks
        self._drain = threading.Thread(target=self._read_log, name="moto-log", daemon=True)
        self._drain.start()
        try:
            started = self._ready.wait(timeout_s) and self.port
        except BaseException:  # Ctrl-C while waiting: the server must not outlive us
            self.close()
            raise
        if not started:
            self.close()
            raise RuntimeError(f"moto_server did not start within {timeout_s:.0f} s: {''.join(self._log)}")

    def _read_log(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._log.append(line)
            if not self.port:
                m = _RUNNING.search(line)
                if m:
                    self.port = int(m.group(2))
                    self._ready.set()
        self._ready.set()  # the process ended: stop waiting

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc.poll() is None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self, endpoint_url: str | None = None, **config: Any) -> Any:
        """A plain boto3 client for this server (for setting data up, not for the code under test)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=endpoint_url or self.endpoint_url,
            region_name=REGION,
            config=Config(**config) if config else None,
            **CREDENTIALS,
        )

    def options(self) -> dict[str, Any]:
        """Explicit client options for this server (:class:`~fastdata.storage.s3.S3Config` fields)."""
        return {"endpoint_url": self.endpoint_url, "region_name": REGION, **CREDENTIALS}

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        """Environment variables that point the standard AWS chain at this server."""
        return {
            "AWS_ENDPOINT_URL": endpoint_url or self.endpoint_url,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
        }

    def close(self) -> None:
        """Stop the server. Idempotent."""
        stop_process(self._proc)
        if self._proc.stderr is not None:
            self._drain.join(5)
            self._proc.stderr.close()

    def __enter__(self) -> MotoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MotoServer({self.endpoint_url})"


__all__ = ["CREDENTIALS", "INSTALL_HINT", "REGION", "MotoServer", "missing"]
