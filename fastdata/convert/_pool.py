"""Running a conversion's shard tasks on this machine: in this process (``workers=1``) or in worker
processes, each writing whole shards.

Either way a finished shard is published (fsync, sidecar, rename, record) by a thread of the process
that wrote it while that process writes its next shard, so with ``fsync`` the disk flushes one shard
while the next is being filled. Worker processes are forked (they need nothing from the parent but the
plan, which they inherit), take shard numbers from a queue, and report each published record (or an
error) on another; the parent hands out at most ``2 x workers`` shards at a time, so that an ``s3://``
output can pause the writing while uploads catch up. A worker dies with the parent (``PR_SET_PDEATHSIG``):
a killed conversion leaves no writer running behind it.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import multiprocessing
import os
import pickle
import queue as queue_module
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from fastdata.convert._plan import Entry, Plan
from fastdata.core.errors import FastdataError

Progress = Callable[[int, int], None]  # (files, bytes) done since the last call
OnRecord = Callable[[dict[str, Any]], None]
_POLL_S = 0.25  # how often the parent looks at progress and at dead workers while it waits


class ShardTask(Protocol):
    """What writes one shard (``TarTask``, the HDF5 one ...)."""

    def write(
        self, name: str, entries: list[Entry], progress: Progress | None = None, finisher: Any = None
    ) -> Future[dict[str, Any]]: ...


class WorkerDied(FastdataError, RuntimeError):
    """A worker process ended without reporting (killed, out of memory ...)."""


def run_serial(
    task: ShardTask,
    plan: Plan,
    todo: list[int],
    *,
    on_record: OnRecord,
    progress: Progress,
    before_each: Callable[[], None] | None = None,
) -> None:
    """Write the shards ``todo`` in this process; ``on_record`` gets each record, in order."""
    pending: collections.deque[Future[dict[str, Any]]] = collections.deque()
    with ThreadPoolExecutor(1, thread_name_prefix="fastdata-convert-finish") as finisher:
        try:
            for i in todo:
                if before_each is not None:
                    before_each()
                pending.append(task.write(plan.names[i], plan.shards[i], progress, finisher))
                while len(pending) > 1 or (pending and pending[0].done()):
                    on_record(pending.popleft().result())
            while pending:
                on_record(pending.popleft().result())
        finally:
            for fut in pending:  # an error: let the shards being finished end (or fail) first
                with contextlib.suppress(BaseException):
                    fut.result()


def run_parallel(
    task: ShardTask,
    plan: Plan,
    todo: list[int],
    *,
    workers: int,
    on_record: OnRecord,
    progress: Progress,
    room: Callable[[], bool] | None = None,
    make_room: Callable[[], None] | None = None,
    started: Callable[[], None] | None = None,
    lock_fd: int = -1,
) -> None:
    """Write the shards ``todo`` in ``workers`` processes; ``on_record`` gets each record as it comes.

    Args:
        room: whether another shard may be handed out now (an ``s3://`` output's staging bound).
        make_room: waits until there is room, when nothing else is left to wait for.
        started: called once the workers exist (threads started before a fork would be copied half-way).
        lock_fd: the parent's lock on the output folder, closed in the workers.

    Raises:
        the first error a worker reports (the other workers are stopped first), or WorkerDied.
    """
    ctx = _mp_context()
    tasks: Any = ctx.Queue()
    results: Any = ctx.Queue()
    counter: Any = ctx.Array("q", 2)
    fork = ctx.get_start_method() == "fork"
    procs = [
        ctx.Process(
            target=_worker,
            args=(task, plan, tasks, results, counter, lock_fd if fork else -1),
            name=f"fastdata-convert-{k}",
            daemon=True,
        )
        for k in range(workers)
    ]
    try:
        for p in procs:
            p.start()
        if started is not None:
            started()
    except BaseException:
        _stop(procs, tasks, graceful=False)
        raise
    left = collections.deque(todo)
    outstanding = 0
    ahead = 2 * workers
    seen = [0, 0]
    clean = finished = False
    try:
        while left or outstanding:
            while left and outstanding < ahead and (room is None or room()):
                tasks.put(left.popleft())
                outstanding += 1
            if not outstanding:  # everything left waits for room
                assert make_room is not None
                make_room()
                continue
            try:
                kind, _, payload = results.get(timeout=_POLL_S)
            except queue_module.Empty:
                kind = None
            with counter.get_lock():
                files, nbytes = counter[0], counter[1]
            progress(files - seen[0], nbytes - seen[1])
            seen = [files, nbytes]
            if kind is None:
                dead = [p for p in procs if p.exitcode is not None]
                if dead:
                    raise WorkerDied(
                        f"conversion worker {dead[0].name} (pid {dead[0].pid}) ended with exit code "
                        f"{dead[0].exitcode} while writing (killed? out of memory?); rerun the same "
                        "command to resume"
                    )
                continue
            if kind == "error":
                raise payload
            outstanding -= 1
            on_record(payload)
        with counter.get_lock():
            progress(counter[0] - seen[0], counter[1] - seen[1])
        clean = finished = True
    except (FastdataError, OSError):
        clean = True  # a worker's error: let the others end their shard (or fail) before leaving
        raise
    finally:
        _stop(procs, tasks, graceful=clean, drain=not finished)


def _stop(procs: list[Any], tasks: Any, *, graceful: bool, drain: bool = False) -> None:
    if drain:  # an error stops the run: shards handed out but not begun are not begun at all
        with contextlib.suppress(queue_module.Empty, OSError, ValueError):
            while True:
                tasks.get(timeout=0.05)
    if graceful:
        for _ in procs:
            tasks.put(None)
        for p in procs:
            p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is not None:
            p.join()
    tasks.cancel_join_thread()


def _mp_context() -> Any:
    # fork starts writers in milliseconds and they need nothing from the parent but the plan
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _init_worker(lock_fd: int) -> None:
    if lock_fd >= 0:
        # the lock is the main process's: were it shared, a rerun would wait for a dying writer
        with contextlib.suppress(OSError):
            os.close(lock_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C and stops us
    if sys.platform.startswith("linux"):
        # die with the main process: a killed conversion must not leave writers running behind it
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the main process died before prctl took effect
            os._exit(1)


def _sendable(error: BaseException) -> BaseException:
    """``error``, or a stand-in that names it, when it does not survive pickling."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - whatever pickling raises, the parent gets a readable error
        return FastdataError(f"{type(error).__name__}: {error}")


def _published(results: Any, name: str, fut: Future[dict[str, Any]]) -> None:
    try:
        results.put(("done", name, fut.result()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        results.put(("error", name, _sendable(e)))


def _worker(task: ShardTask, plan: Plan, tasks: Any, results: Any, counter: Any, lock_fd: int) -> None:
    _init_worker(lock_fd)

    def report(files: int, nbytes: int) -> None:
        with counter.get_lock():
            counter[0] += files
            counter[1] += nbytes

    with ThreadPoolExecutor(1, thread_name_prefix="fastdata-convert-finish") as finisher:
        while (i := tasks.get()) is not None:
            name = plan.names[i]
            try:
                fut = task.write(name, plan.shards[i], report, finisher)
            except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
                results.put(("error", name, _sendable(e)))
                continue
            fut.add_done_callback(functools.partial(_published, results, name))
