"""``num_workers="auto"``: its options (:class:`AutoTune`), what it moves (:class:`Setting`), what it reads
(:class:`Observation`), the decisions (:class:`Tuner`, :func:`replay` over recorded observations) and what
it answers (:class:`Change`); inside training, ``_tuning`` hands it the session's windows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.loading.observe.tune._decide import WAIT_WORKERS, Tuner, ladder, replay
    from fastdata.loading.observe.tune._options import AutoTune, Change, Observation, Requested, Setting

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(["Tuner", "WAIT_WORKERS", "ladder", "replay"], "._decide"),
        **dict.fromkeys(["AutoTune", "Change", "Observation", "Requested", "Setting"], "._options"),
    },
)

__all__ = [
    "WAIT_WORKERS",
    "AutoTune",
    "Change",
    "Observation",
    "Requested",
    "Setting",
    "Tuner",
    "ladder",
    "replay",
]
