"""Measuring a loader: the one record (:class:`Window` of :class:`Process` readings), the probe reading it
(:class:`Probe`), the loop's counter (:class:`BatchCounter`) and the workers' shared :class:`StageTable` (with
:func:`batch_begin`/:func:`batch_end` around each batch, and how a first wait split, :class:`StartSplit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.loading.observe.measure._counter import BatchCounter
    from fastdata.loading.observe.measure._probe import Probe, batch_samples
    from fastdata.loading.observe.measure._stage_table import (
        ProbeInit,
        StageTable,
        StartSplit,
        batch_begin,
        batch_end,
        start_split,
    )
    from fastdata.loading.observe.measure._window import Process, Window

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(["BatchCounter"], "._counter"),
        **dict.fromkeys(["Probe", "batch_samples"], "._probe"),
        **dict.fromkeys(
            ["ProbeInit", "StageTable", "StartSplit", "batch_begin", "batch_end", "start_split"], "._stage_table"
        ),
        **dict.fromkeys(["Process", "Window"], "._window"),
    },
)

__all__ = [
    "BatchCounter",
    "Probe",
    "ProbeInit",
    "Process",
    "StageTable",
    "StartSplit",
    "Window",
    "batch_begin",
    "batch_end",
    "batch_samples",
    "start_split",
]
