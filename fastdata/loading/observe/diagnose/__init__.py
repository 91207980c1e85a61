"""Naming what limits a loader: the figures the label rules read (:class:`Evidence`, a view of a
:class:`~fastdata.loading.observe.Window` in its :class:`Context`), the rules (:func:`classify`, one label
of :data:`LABELS` with its evidence and advice: a :class:`Verdict`), and the thresholds they use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.loading.observe.diagnose._diagnosis import agree, classify
    from fastdata.loading.observe.diagnose._evidence import Context, Evidence, evidence
    from fastdata.loading.observe.diagnose._verdict import (
        COMPUTING,
        CORES_SATURATED,
        LABELS,
        MAIN_BUSY,
        MEMORY_NEAR,
        WAITING_LABELS,
        Label,
        Verdict,
    )
    from fastdata.loading.observe.diagnose._waiting import storage_signs, waiting

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(["agree", "classify"], "._diagnosis"),
        **dict.fromkeys(["Context", "Evidence", "evidence"], "._evidence"),
        **dict.fromkeys(["COMPUTING", "CORES_SATURATED", "LABELS", "Label", "MAIN_BUSY"], "._verdict"),
        **dict.fromkeys(["MEMORY_NEAR", "WAITING_LABELS", "Verdict"], "._verdict"),
        **dict.fromkeys(["storage_signs", "waiting"], "._waiting"),
    },
)

__all__ = [
    "COMPUTING",
    "CORES_SATURATED",
    "LABELS",
    "MAIN_BUSY",
    "MEMORY_NEAR",
    "WAITING_LABELS",
    "Context",
    "Evidence",
    "Label",
    "Verdict",
    "agree",
    "classify",
    "evidence",
    "storage_signs",
    "waiting",
]
