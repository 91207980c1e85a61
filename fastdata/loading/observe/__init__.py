"""What a loader does, measured the same way offline (``fastdata bench``) and inside training: the probe
(``_probe``, over the one ``/proc`` reader in core and the workers' shared stage table, ``_stage_table``),
the window record, the diagnosis (``_diagnosis``: evidence and one set of label rules), the monitor's
reports (``_monitor``, ``_report``) and ``num_workers="auto"`` (``_autotune``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.loading.observe._autotune_types import AutoTune, Change, Setting
    from fastdata.loading.observe._diagnosis import LABELS, Evidence, Label, Verdict, classify
    from fastdata.loading.observe._monitor import Monitored, monitor
    from fastdata.loading.observe._report import Monitor, Stats

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AutoTune": "._autotune_types",
        "Change": "._autotune_types",
        "Setting": "._autotune_types",
        "LABELS": "._diagnosis",
        "Evidence": "._diagnosis",
        "Label": "._diagnosis",
        "Verdict": "._diagnosis",
        "classify": "._diagnosis",
        "Monitored": "._monitor",
        "monitor": "._monitor",
        "Monitor": "._report",
        "Stats": "._report",
    },
)

__all__ = [
    "LABELS",
    "AutoTune",
    "Change",
    "Evidence",
    "Label",
    "Monitor",
    "Monitored",
    "Setting",
    "Stats",
    "Verdict",
    "classify",
    "monitor",
]
