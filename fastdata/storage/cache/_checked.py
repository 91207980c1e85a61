"""Which version of an object the cache uses: asked of the store once per node and epoch, not once per
process. A process that asks records the answer in ``objects/<url>.checked`` (the object's size, ETag and
SHA-256, or that there is no such object, and when it asked), holding ``<url>.checked.lock`` so that the
other processes wanting the same answer wait for it instead of asking too. A process uses a recorded
answer only if it was asked at or after ``since``, the start of its own epoch (or of its dataset, with
``cache_check="build"``): an object replaced before then is read as it is now."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from fastdata.core.errors import SourceNotFound
from fastdata.storage._remote import Remote, Version
from fastdata.storage.cache._layout import Layout, url_digest
from fastdata.storage.cache._locks import NOT_WRITABLE, lock, release


def current_version(
    layout: Layout,
    url: str,
    remote: Remote,
    since: int | None,
    replaced: Callable[[Version], None] | None = None,
) -> Version:
    """``url``'s version: the one recorded if a process of the node asked the store at or after ``since``
    (``time.time_ns()``), else asked now (one HEAD) and recorded. ``since=None``: always asked.
    ``replaced(old)`` is called when the store's answer is another version than the one recorded before.

    Raises:
        SourceNotFound: the store says (or said, since then) that there is no such object; and whatever
            else asking the store raises.
    """
    stamp = layout.path(url_digest(url), ".checked")
    if since is None:
        return _ask(url, remote, stamp, replaced)
    found = _recorded(url, stamp, since)
    if found is not None:
        return found
    try:
        held = lock(f"{stamp}.lock", shared=False)
    except OSError as e:
        if e.errno not in NOT_WRITABLE:
            raise
        return _ask(url, remote, stamp, replaced)  # a read-only cache: every process asks (nothing recorded)
    assert held is not None
    try:
        return _recorded(url, stamp, since) or _ask(url, remote, stamp, replaced)
    finally:
        release(held)


def _ask(url: str, remote: Remote, stamp: str, replaced: Callable[[Version], None] | None) -> Version:
    at = time.time_ns()  # before the request: the answer is at least this fresh
    try:
        version = remote.stat(url)
    except SourceNotFound as e:  # recorded too: a missing sidecar is looked for once per epoch and node
        _record(stamp, {"url": url, "missing": str(e), "at": at})
        raise
    try:
        old = _recorded(url, stamp, 0)
    except SourceNotFound:
        old = None
    _record(stamp, {"url": url, "size": version.size, "etag": version.etag, "sha256": version.sha256, "at": at})
    if old is not None and old != version and replaced is not None:
        replaced(old)
    return version


def _record(stamp: str, record: dict[str, Any]) -> None:
    tmp = f"{stamp}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, stamp)
    except OSError:  # not recorded (a full disk, a read-only cache): the next process asks again
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _recorded(url: str, stamp: str, since: int) -> Version | None:
    """The version recorded in ``stamp`` if it was asked of the store at or after ``since``.

    Raises:
        SourceNotFound: the store said then that there is no such object.
    """
    try:
        with open(stamp) as f:
            found = json.load(f)
        if found["url"] != url or found["at"] < since:
            return None
        if "missing" in found:
            missing = SourceNotFound(found["missing"], url)
        else:
            return Version(found["size"], found["etag"], found["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    raise missing


__all__ = ["current_version"]
