"""Progress bars for long work (indexing shards, listing a prefix, converting a corpus), through the one
console library fastdata uses (rich; ``fastdata bench`` prints its tables with it too).

A bar goes to standard error and is gone when the work ends (``transient``): it reports, it does not
log. Off a terminal (CI, a log file, a DataLoader worker's pipe) rich draws nothing. rich is imported
only when a bar is shown, so a short job never pays for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Bar(Protocol):
    def advance(self, n: float = 1, **fields: Any) -> None: ...


class _NoBar:
    def advance(self, n: float = 1, **fields: Any) -> None:
        pass


@contextmanager
def progress_bar(
    desc: str, *, unit: str, total: float | None = None, enabled: bool = True, completed: int = 0
) -> Iterator[Bar]:
    """A bar that counts ``unit`` towards ``total`` (None: a running count) from ``completed``, advanced with
    ``bar.advance(n)`` (``bar.advance(0, description=...)`` renames it); ``unit="bytes"`` shows sizes and
    the rate (MB, MB/s); ``enabled=False`` gives one that draws nothing and imports nothing."""
    if not enabled:
        yield _NoBar()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    columns: list[Any] = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit)]
    if unit == "bytes":
        columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn()]
    if total is None:  # no end known: a count and the time it took
        columns = [TextColumn("{task.description}"), TextColumn("{task.completed:,.0f} " + unit)]
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bars:
        task = bars.add_task(desc, total=total, completed=completed)

        class _Bar:
            def advance(self, n: float = 1, **fields: Any) -> None:
                bars.update(task, advance=n, **fields)

        yield _Bar()


def tracked(items: Iterable[T], desc: str, *, unit: str, total: int | None = None, enabled: bool = True) -> Iterator[T]:
    """``items``, with a bar while they are consumed (``total`` defaults to ``len(items)`` where it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress_bar(desc, unit=unit, total=total, enabled=enabled) as bar:
        for item in items:
            yield item
            bar.advance()


__all__ = ["Bar", "progress_bar", "tracked"]
