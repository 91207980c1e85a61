"""What an :class:`~fastdata.storage.s3.S3Reader` has fetched, or is fetching, of one object: stretches
("windows") of bytes, each a future, bounded in bytes. Plain data guarded by a lock; nothing here talks
to S3."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future


def done(data: bytes) -> Future[bytes]:
    f: Future[bytes] = Future()
    f.set_result(data)
    return f


class Windows:
    """Fetched (or being fetched) stretches of one object, least recently added dropped first once
    they hold more than ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._items: OrderedDict[int, tuple[int, Future[bytes]]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, start: int, end: int, data: Future[bytes]) -> None:
        with self._lock:
            old = self._items.pop(start, None)
            if old is not None:
                self._bytes -= old[0] - start
            self._items[start] = (end, data)
            self._bytes += end - start
            while self._bytes > self.budget and len(self._items) > 1:
                s, (e, f) = self._items.popitem(last=False)
                f.cancel()
                self._bytes -= e - s

    def missing(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The stretches of ``lo .. hi-1`` that no window holds (or is fetching)."""
        with self._lock:
            held = sorted((s, e) for s, (e, _) in self._items.items() if s < hi and e > lo)
        gaps, at = [], lo
        for s, e in held:
            if s > at:
                gaps.append((at, s))
            at = max(at, e)
        if at < hi:
            gaps.append((at, hi))
        return gaps

    def get(self, lo: int, hi: int) -> bytes | None:
        """Bytes ``lo .. hi-1`` if fetched windows cover them all (waiting for pending ones), else None."""
        with self._lock:
            found: list[tuple[int, int, Future[bytes]]] = []
            at = lo
            while at < hi:
                hit = next(((s, e, f) for s, (e, f) in self._items.items() if s <= at < e), None)
                if hit is None:
                    return None
                found.append(hit)
                at = hit[1]
        pieces = []
        for s, e, f in found:
            try:
                data = f.result()
            except Exception:  # noqa: BLE001 - a failed (or cancelled) prefetch is dropped; fetched again
                self.drop(s)
                return None
            pieces.append(data[max(lo, s) - s : min(hi, e) - s])
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def drop(self, start: int) -> None:
        with self._lock:
            item = self._items.pop(start, None)
            if item is not None:
                self._bytes -= item[0] - start

    def clear(self) -> list[Future[bytes]]:
        """Forget every window; returns the fetches still running (to wait for)."""
        with self._lock:
            items, self._items, self._bytes = list(self._items.values()), OrderedDict(), 0
        running = []
        for _, f in items:
            if not f.cancel() and not f.done():
                running.append(f)
        return running
