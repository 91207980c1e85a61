"""A watchdog for native decoder calls: run them on a helper thread, stop waiting after a limit.

A damaged file or a stalled mount can block a decoder inside FFmpeg forever, and native code cannot
be interrupted from Python. So each call runs on a helper thread while the caller waits at most
``timeout`` seconds. When the limit passes, the caller gives up on that thread (and on the reader it
was using, which must then be neither used nor closed: another thread is still inside it), raises
:class:`~fastdata.formats.video.DecodeTimeout`, and later calls get a fresh helper thread. The stuck
thread is a daemon: it never delays the process's exit. If it ever returns, it closes what it opened
and ends.

This relies on the decoder releasing the GIL while it blocks; PyAV, decord (ctypes), OpenCV and
torchcodec all do (``tests/test_video_faults.py`` checks each with a FIFO nobody writes to).
A process keeps at most ``max_stuck`` stuck threads; one more means the storage itself is gone, and
the watchdog raises :class:`~fastdata.errors.FastdataError` instead of leaking threads without end.

Why a thread and not a subprocess: a clip is ~1 MB of pixels; sending it back from a subprocess would
cost more than decoding it (see MEASURED.md), while a thread handoff costs a few microseconds.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from fastdata.errors import FastdataError
from fastdata.formats.video.base import DecodeTimeout

T = TypeVar("T")

MAX_STUCK = 4
# Helper threads given up on in this process (tests join them once they unblock the decoder).
_abandoned_threads: list[threading.Thread] = []


def stuck_threads() -> list[threading.Thread]:
    """Helper threads of this process that were given up on and are still running."""
    return [t for t in _abandoned_threads if t.is_alive()]


class _Job:
    __slots__ = ("abandoned", "args", "done", "error", "fn", "kwargs", "lock", "result")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.result: Any = None
        self.error: BaseException | None = None
        self.abandoned = False

    def run(self) -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
            error = e
        with self.lock:
            if self.abandoned:  # nobody waits any more: release what we made
                close = getattr(result, "close", None)
                if callable(close):
                    try:
                        close()
                    except Exception:  # noqa: BLE001
                        pass
                return
            self.result, self.error = result, error
            self.done.set()

    def abandon(self) -> bool:
        """Give up on the job; False if it finished meanwhile (then its outcome stands)."""
        with self.lock:
            if self.done.is_set():
                return False
            self.abandoned = True
            return True

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        job.run()
        if job.abandoned:  # this thread was given up on; a fresh one serves the queue's successor
            return


class Watchdog:
    """Runs calls on a helper thread with a time limit. One per process (not fork-safe by itself:
    keep it in a :class:`~fastdata.worker.ProcessLocal`).

    Args:
        timeout (float | None): seconds to wait for one call. None runs calls inline, unguarded.
        max_stuck (int): stuck helper threads tolerated in this process. Defaults to 4.
    """

    def __init__(self, timeout: float | None, max_stuck: int = MAX_STUCK) -> None:
        self.timeout = timeout
        self.max_stuck = max_stuck
        self.stuck = 0
        self._jobs: queue.SimpleQueue[_Job | None] | None = None
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[..., T], *args: Any, what: str, source: str, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, or :class:`DecodeTimeout` after ``timeout`` seconds.

        Args:
            what (str): what the call does, for the message ("decoding frames 10..24").
            source (str): the file, for the message and the skip counter.
        """
        if self.timeout is None:
            return fn(*args, **kwargs)
        if self._jobs is None:
            if self.stuck >= self.max_stuck:
                raise FastdataError(
                    f"{self.stuck} decoder calls are stuck in this process (the last in {source}); the "
                    "storage is probably unavailable: check it, then restart the job")
            self._jobs = queue.SimpleQueue()
            self._thread = threading.Thread(target=_serve, args=(self._jobs,), name="fastdata-decode",
                                            daemon=True)
            self._thread.start()
        job = _Job(fn, args, kwargs)
        self._jobs.put(job)
        if not job.done.wait(self.timeout) and job.abandon():
            if self._thread is not None:
                _abandoned_threads.append(self._thread)
            self._jobs = self._thread = None
            self.stuck += 1
            raise DecodeTimeout(
                f"{source}: {what} took longer than {self.timeout:g} s and was abandoned; the file is "
                "damaged or its storage stalled: check it, pass on_error='skip', or raise decode_timeout",
                source)
        return job.outcome()  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the helper thread (it is idle between calls). Idempotent."""
        jobs, thread = self._jobs, self._thread
        self._jobs = self._thread = None
        if jobs is not None and thread is not None:
            jobs.put(None)
            thread.join()

    def __getstate__(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "max_stuck": self.max_stuck, "stuck": 0, "_jobs": None,
                "_thread": None}
