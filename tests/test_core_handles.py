"""Per-process handles (fastdata.core.process._handles): lazy opening, the bounded LRU, pickling without handles,
fork safety, ProcessLocal, the default bound from ulimit."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import resource

import pytest

from fastdata.core.errors import ConfigError
from fastdata.core.process._handles import HandleCache, ProcessLocal, default_max_open


class Handle:
    """A fake handle that records who opened it and whether it was closed."""

    def __init__(self, key: str) -> None:
        self.key, self.pid, self.closed = key, os.getpid(), False

    def close(self) -> None:
        self.closed = True


def test_handles_open_lazily_and_lru_bound_closes_the_oldest() -> None:
    cache: HandleCache[str, Handle] = HandleCache(Handle, max_open=2)
    assert len(cache) == 0 and cache.opened == 0
    a = cache.get("a")
    assert cache.get("a") is a and cache.opened == 1
    b = cache.get("b")
    cache.get("a")  # a is now the most recent
    c = cache.get("c")  # evicts b
    assert b.closed and not a.closed and not c.closed and len(cache) == 2
    cache.close()
    assert a.closed and c.closed and len(cache) == 0
    cache.close()  # idempotent


def test_max_open_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        HandleCache(Handle, max_open=0)


def test_pickling_drops_handles() -> None:
    cache: HandleCache[str, Handle] = HandleCache(Handle, max_open=4)
    cache.get("a")
    clone = pickle.loads(pickle.dumps(cache))
    assert len(clone) == 0 and clone.opened == 0
    assert clone.get("a") is not cache.get("a")


def _child_view(cache: HandleCache[str, Handle], parent_handle: Handle, queue: multiprocessing.Queue) -> None:
    mine = cache.get("a")
    queue.put((mine.pid, mine is parent_handle, parent_handle.closed))


@pytest.mark.parametrize("close_inherited", [True, False])
def test_a_forked_child_never_uses_its_parents_handle(close_inherited: bool) -> None:
    ctx = multiprocessing.get_context("fork")
    cache: HandleCache[str, Handle] = HandleCache(Handle, max_open=4, close_inherited=close_inherited)
    parent_handle = cache.get("a")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_view, args=(cache, parent_handle, queue))
    proc.start()
    child_pid, same, closed_in_child = queue.get(timeout=60)
    proc.join(60)
    assert child_pid == proc.pid and not same
    assert closed_in_child is close_inherited  # closed, or abandoned untouched (decord must not be destroyed)
    assert not parent_handle.closed and cache.get("a") is parent_handle  # the parent's copy is unaffected


def test_process_local_builds_once_per_process_and_is_picklable() -> None:
    local = ProcessLocal(lambda: Handle("client"))
    first = local.get()
    assert local.get() is first
    clone = pickle.loads(pickle.dumps(ProcessLocal(_make_client)))
    assert clone.get().key == "client"
    local.close()
    assert first.closed


def _make_client() -> Handle:
    return Handle("client")


def test_default_max_open_follows_ulimit_and_workers() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert default_max_open(7) == 1024 // 4 // 8
        assert default_max_open(0) == 256
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        assert default_max_open(8) == 4, "never below 4"
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
