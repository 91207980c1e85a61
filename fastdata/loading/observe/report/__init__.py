"""The monitor's reports: what one holds (:class:`Stats`), how often and where they go (:class:`Monitor`),
and the spans an on-demand report may cover (:data:`Since`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.loading.observe.report._reporter import Monitor, MonitorWriteWarning, Since
    from fastdata.loading.observe.report._stats import Stats

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(["Monitor", "MonitorWriteWarning", "Since"], "._reporter"),
        **dict.fromkeys(["Stats"], "._stats"),
    },
)

__all__ = [
    "Monitor",
    "MonitorWriteWarning",
    "Since",
    "Stats",
]
