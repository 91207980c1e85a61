"""What a loader does, measured the same way offline (``fastdata bench``) and inside training, by role:
:mod:`~fastdata.loading.observe.measure` (the probe and the one record, :class:`Window`: raw counters of a
span of time, every figure a property of them), :mod:`~fastdata.loading.observe.diagnose` (the label rules,
:func:`classify`, over :class:`Evidence`: a window in its :class:`Context`), :mod:`~fastdata.loading.observe.tune`
(``num_workers="auto"``) and :mod:`~fastdata.loading.observe.report` (:class:`Stats`, sent per :class:`Monitor`).
A session (``_session``) feeds the probe that its reporter and tuner read; :func:`monitor` wraps a DataLoader in one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.loading.observe._monitor import Monitored, monitor
    from fastdata.loading.observe.diagnose import LABELS, Context, Evidence, Label, Verdict, classify, evidence
    from fastdata.loading.observe.measure import Process, Window
    from fastdata.loading.observe.report import Monitor, Stats
    from fastdata.loading.observe.tune import AutoTune, Change, Setting

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(["Monitored", "monitor"], "._monitor"),
        **dict.fromkeys(["Context", "Evidence", "LABELS", "Label", "Verdict", "classify", "evidence"], ".diagnose"),
        **dict.fromkeys(["Process", "Window"], ".measure"),
        **dict.fromkeys(["Monitor", "Stats"], ".report"),
        **dict.fromkeys(["AutoTune", "Change", "Setting"], ".tune"),
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
