"""A watchdog for native decoder calls: run them on a helper thread, stop waiting after a limit.

A damaged file or a stalled mount can block a decoder inside FFmpeg forever, and native code cannot
be interrupted from Python. So each call runs on a helper thread while the caller waits at most
``timeout`` seconds. When the limit passes, the caller gives up on that thread (and on the reader it
was using, which must then be neither used nor closed: another thread is still inside it), raises
:class:`~fastdata.formats.video.DecodeTimeout`, and its later calls get a fresh helper thread. If the
stuck call ever returns, the helper closes what it made.

Helper threads never exit before their process does: one per calling thread, kept idle between
calls; a given-up one, once its call returns, waits to serve the next caller that needs a helper.
A thread that exits runs its libraries' thread-local destructors at a moment nobody controls, and
a fork in that moment can hand the child a lock that is never released. When helpers still exited
(one per dataset, stopped on ``close``), about one test run in five hung in a forked worker's first
``cv2.VideoCapture``, right after the parent had stopped a helper that had used OpenCV.

This relies on the decoder releasing the GIL while it blocks; PyAV, decord (ctypes), OpenCV and
torchcodec all do (``tests/test_video_faults.py`` checks each with a FIFO nobody writes to).
A process tolerates ``max_stuck`` calls stuck at once; one more means the storage itself is gone, and
the watchdog raises :class:`~fastdata.core.errors.FastdataError` instead of starting threads without end.

Why a thread and not a subprocess: a clip is ~1 MB of pixels; sending it back from a subprocess would
cost more than decoding it (~2 ms of CPU a clip; docs/video.md), while a thread handoff costs ~30 microseconds.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from fastdata.core import process
from fastdata.core.errors import FastdataError
from fastdata.formats.video._base import DecodeTimeout

T = TypeVar("T")

MAX_STUCK = 4


class _Job:
    __slots__ = ("abandoned", "args", "done", "error", "fn", "kwargs", "lock", "result", "returned")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.done = threading.Event()  # the outcome is there for the caller
        self.returned = threading.Event()  # fn returned (even if nobody waits any more)
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
            else:
                self.result, self.error = result, error
                self.done.set()
        self.returned.set()

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


def _serve(jobs: queue.SimpleQueue[_Job], helpers: _Helpers) -> None:
    while True:
        job = jobs.get()
        job.run()
        if job.abandoned:  # its caller has a fresh helper now: offer this one to the next caller
            helpers.spare.put(jobs)


class _Helpers:
    """This process's helper threads, one per calling thread, and its stuck calls."""

    def __init__(self) -> None:
        self.pid = process.pid()
        self.local = threading.local()
        self.stuck: list[_Job] = []
        self.spare: queue.SimpleQueue[queue.SimpleQueue[_Job]] = queue.SimpleQueue()

    def queue_for_this_thread(self) -> queue.SimpleQueue[_Job]:
        jobs: queue.SimpleQueue[_Job] | None = getattr(self.local, "jobs", None)
        if jobs is None:
            try:
                jobs = self.spare.get_nowait()
            except queue.Empty:
                jobs = queue.SimpleQueue()
                threading.Thread(target=_serve, args=(jobs, self), name="fastdata-decode", daemon=True).start()
            self.local.jobs = jobs
        return jobs

    def abandon_this_threads_helper(self, job: _Job) -> None:
        self.local.jobs = None
        self.stuck = [j for j in self.stuck if not j.returned.is_set()] + [job]


_helpers = _Helpers()


def _this_process() -> _Helpers:
    global _helpers
    if _helpers.pid != process.pid():  # forked: the parent's helper threads do not exist here
        _helpers = _Helpers()
    return _helpers


def stuck_calls() -> list[_Job]:
    """Calls of this process that were given up on and have not returned (tests wait on
    ``job.returned`` after unblocking them)."""
    return [job for job in _this_process().stuck if not job.returned.is_set()]


class Watchdog:
    """Runs calls on a helper thread with a time limit. Holds only its settings: it pickles, and
    works in any process (helper threads belong to the process and the calling thread).

    Args:
        timeout (float | None): seconds to wait for one call. None runs calls inline, unguarded.
        max_stuck (int): stuck calls tolerated in this process. Defaults to 4.
    """

    def __init__(self, timeout: float | None, max_stuck: int = MAX_STUCK) -> None:
        self.timeout = timeout
        self.max_stuck = max_stuck

    def call(self, fn: Callable[..., T], *args: Any, what: str, source: str, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, or :class:`DecodeTimeout` after ``timeout`` seconds.

        Args:
            what (str): what the call does, for the message ("decoding frames 10..24").
            source (str): the file, for the message and the skip counter.
        """
        if self.timeout is None:
            return fn(*args, **kwargs)
        helpers = _this_process()
        stuck = stuck_calls()
        if len(stuck) >= self.max_stuck:
            raise FastdataError(
                f"{len(stuck)} decoder calls are stuck in this process (the latest: {source}); the storage "
                "is probably unavailable: check it, then restart the job"
            )
        job = _Job(fn, args, kwargs)
        helpers.queue_for_this_thread().put(job)
        if not job.done.wait(self.timeout) and job.abandon():
            helpers.abandon_this_threads_helper(job)
            raise DecodeTimeout(
                f"{source}: {what} took longer than {self.timeout:g} s and was abandoned; the file is "
                "damaged or its storage stalled: check it, pass on_error='skip', or raise decode_timeout",
                source,
            )
        return job.outcome()  # type: ignore[no-any-return]
