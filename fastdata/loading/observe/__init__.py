"""What a loader does, measured the same way offline (``fastdata bench``) and inside training: the probe
(``_probe``, over the one ``/proc`` reader in core and the workers' shared stage table, ``_stage_table``),
the window record, the diagnosis (``_diagnosis``: evidence and one set of label rules), the monitor's
reports (``_monitor``, ``_report``) and ``num_workers="auto"`` (``_autotune``).

The one record is :class:`Window` (``_window``): raw counters of one span of time, with every figure a
property of them; the sweep's points and the monitor's reports are both made of windows, and
:func:`evidence` turns one into what the label rules (:func:`classify`) read. A session (``_session``)
feeds one per-batch counter (``_counter``) that its reporter (``_reporting``) and tuner (``_tuning``) read
through the one probe."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.loading.observe._autotune_types import AutoTune, Change, Setting
    from fastdata.loading.observe._diagnosis import LABELS, Label, Verdict, classify
    from fastdata.loading.observe._evidence import Context, Evidence, evidence
    from fastdata.loading.observe._monitor import Monitored, monitor
    from fastdata.loading.observe._report import Monitor, Stats
    from fastdata.loading.observe._window import Process, Window

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AutoTune": "._autotune_types",
        "Change": "._autotune_types",
        "Setting": "._autotune_types",
        "LABELS": "._diagnosis",
        "Context": "._evidence",
        "Evidence": "._evidence",
        "evidence": "._evidence",
        "Process": "._window",
        "Window": "._window",
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
    "Context",
    "Evidence",
    "Label",
    "Monitor",
    "Monitored",
    "Process",
    "Setting",
    "Stats",
    "Verdict",
    "Window",
    "classify",
    "evidence",
    "monitor",
]
