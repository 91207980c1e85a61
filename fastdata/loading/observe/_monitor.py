"""``fastdata.monitor(dataloader)``: the monitor of ``fd.Loader(monitor=...)`` for a plain ``DataLoader``.

The wrapper iterates the DataLoader as it is, handing out its batches unchanged, and reports as
``fd.Loader`` does (:class:`~fastdata.loading.observe.Stats`, to a log line, a function or a JSON-lines file).
So that the workers write their stage times and their own CPU and context switches into the shared
stage table, it wraps the DataLoader's ``worker_init_fn`` (the user's still runs, after the probe's) and
``collate_fn`` in place, before the first epoch: wrap a DataLoader before iterating it (with persistent
workers, before they start). Nothing else is needed: no ``fd.worker_init_fn`` (which seeds, and which
a fastdata dataset does not need either).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from fastdata.core.errors import ConfigError
from fastdata.loading.observe._session import MonitoredCollate, Session
from fastdata.loading.observe.measure._stage_table import ProbeInit
from fastdata.loading.observe.report._reporter import Monitor, Since, Sink, as_monitor
from fastdata.loading.observe.report._stats import Stats
from fastdata.loading.observe.tune._options import Setting


class Monitored:
    """A DataLoader under the monitor (see :func:`monitor`); iterate it as the DataLoader itself.

    Attributes:
        dataloader (DataLoader): the DataLoader, its ``collate_fn`` and ``worker_init_fn`` wrapped.
        passes (int): passes started (the report's ``epoch``).
    """

    def __init__(self, dataloader: DataLoader[Any], spec: Monitor) -> None:
        if getattr(dataloader, "_iterator", None) is not None:
            raise ConfigError(
                "fastdata.monitor: this DataLoader's persistent workers already run with its old worker_init_fn "
                "and collate_fn; wrap it before its first epoch"
            )
        self.dataloader = dataloader
        workers = int(dataloader.num_workers)
        prefetch = dataloader.prefetch_factor if workers else None
        self._session = Session(
            spec,
            None,
            Setting(workers, prefetch),
            1 + workers,
            start_method=_start_method(dataloader),
            persistent=bool(dataloader.persistent_workers),
        )
        batched = dataloader.batch_sampler is not None
        dataloader.collate_fn = MonitoredCollate(dataloader.collate_fn, batched)
        if workers:
            dataloader.worker_init_fn = ProbeInit(self._session.probe.table, dataloader.worker_init_fn)
        self.passes = 0

    def __iter__(self) -> Iterator[Any]:
        epoch, self.passes = self.passes, self.passes + 1
        self._session.pass_starts(epoch)
        batches = iter(self.dataloader)
        return self._session.run(batches, epoch, 0, _length(self.dataloader), None)

    def __len__(self) -> int:
        return len(self.dataloader)

    def stats(self, since: Since = "report") -> Stats | None:
        """A report made now over what was seen since the last periodic report (``since="report"``), the
        current pass's start (``"epoch"``) or the first's (``"start"``); None before the first batch."""
        return self._session.stats(since)

    def close(self) -> None:
        """Stop the monitor's D-state looks and close its report files (idempotent)."""
        self._session.close()

    def __enter__(self) -> Monitored:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def monitor(
    dataloader: DataLoader[Any],
    to: Sink | list[Sink] | None = None,
    *,
    seconds: float | None = 10.0,
    every: int | None = None,
) -> Monitored:
    """Report on a plain ``torch.utils.data.DataLoader`` (any dataset) while a model trains.

    Example::

        loader = fd.monitor(DataLoader(ds, batch_size=64, num_workers=4), "loader.jsonl")
        for batch in loader:
            ...
        print(loader.stats().line())

    Args:
        dataloader (DataLoader): not yet iterated (its ``collate_fn`` and ``worker_init_fn`` are wrapped).
        to (Sink | list[Sink] | None): a function called with each report, a JSON-lines file's path, or
            several. Defaults to None: a log line (logger ``fastdata.monitor``, INFO).
        seconds (float | None): seconds of training per report. Defaults to 10.
        every (int | None): batches per report. Defaults to None.

    Returns:
        Monitored: iterate it instead of the DataLoader; ``stats()`` gives the latest report.
    """
    spec = as_monitor(Monitor(to=to, seconds=seconds, every=every))
    assert spec is not None
    return Monitored(dataloader, spec)


def _length(dataloader: DataLoader[Any]) -> int | None:
    try:
        return len(dataloader)
    except TypeError:
        return None


def _start_method(dataloader: DataLoader[Any]) -> str:
    import multiprocessing

    ctx = dataloader.multiprocessing_context
    if ctx is not None:
        return str(ctx.get_start_method())
    return multiprocessing.get_start_method(allow_none=True) or "fork"


__all__ = ["Monitored", "monitor"]
