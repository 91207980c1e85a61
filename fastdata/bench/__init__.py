"""The benchmark harness: measure DataLoader settings on real data, recommend the best, say why.

::

    import fastdata as fd
    result = fd.bench.sweep(dataset, workers=[0, 1, 2, 4], batch_size=64)
    rec = fd.bench.recommend(result)
    print(rec.kwargs)        # {'batch_size': 64, 'num_workers': 2, 'prefetch_factor': 2, ...}
    print(rec.text())        # the label (cpu, storage, main-process, ipc, fork, worker-init,
                             # shuffle-fill, memory, step, uncertain, unknown) and its evidence

Modules: :mod:`~fastdata.bench.measure` (``sweep``: run the grid), :mod:`~fastdata.bench.loop` (one
configuration), :mod:`~fastdata.bench.probes` (the envelope around each batch, and the system probe
over the library's :mod:`fastdata.loading.probes`), :mod:`~fastdata.core.stages` (the hook datasets
call), :mod:`~fastdata.bench.cores` (usable and physical cores, memory), :mod:`~fastdata.bench.advise`
(``recommend``, per-rank advice) and :mod:`~fastdata.bench.diagnose` (the sweep's headline over the
library's label rules, :mod:`fastdata.loading.diagnosis`), :mod:`~fastdata.bench.report` (table, JSON,
plot), :mod:`~fastdata.bench.profile` (``--profile``: py-spy), :mod:`~fastdata.bench.backends` (one
module per data format for ``fastdata bench``). The modules are
not named after the functions ``sweep`` and ``recommend``, so that importing a module never hides the
function of the same name on this package.

This package's ``__init__`` imports nothing: datasets import :mod:`fastdata.core.stages` on their
hot path, and the rest loads on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastdata.bench.advise import Recommendation, recommend
    from fastdata.bench.measure import sweep
    from fastdata.bench.result import Config, Point, SweepResult

_LAZY = {
    "sweep": "fastdata.bench.measure",
    "recommend": "fastdata.bench.advise",
    "Recommendation": "fastdata.bench.advise",
    "Config": "fastdata.bench.result",
    "Point": "fastdata.bench.result",
    "SweepResult": "fastdata.bench.result",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fastdata.bench' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = ["Config", "Point", "Recommendation", "SweepResult", "recommend", "sweep"]
