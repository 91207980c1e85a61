"""The benchmark harness: measure DataLoader settings on real data, recommend the best, say why.

::

    import fastdata as fd
    result = fd.bench.sweep(dataset, workers=[0, 1, 2, 4], batch_size=64)
    rec = fd.bench.recommend(result)
    print(rec.kwargs)        # {'batch_size': 64, 'num_workers': 2, 'prefetch_factor': 2, ...}
    print(rec.text())        # the label (cpu, storage, main-process, ipc, fork, worker-init,
                             # shuffle-fill, memory, step, uncertain, unknown) and its evidence

Private modules: ``_sweep`` (``sweep``: run the grid), ``_loop`` (one configuration, measured through the
library's probe, :mod:`fastdata.loading.observe`), ``_result`` (a configuration and its windows),
``_advise`` (``recommend``, per-rank advice), ``_diagnose`` (what only a sweep sees, over the library's
label rules), ``_report`` (table, JSON, plot), ``_profile`` (``--profile``: py-spy), ``_command`` (the
CLI), ``_demo`` (``--demo``), and :mod:`~fastdata.bench.backends` (one module per data format for
``fastdata bench SPEC``). The test datasets of ``_synthetic`` (items that wait, compute, start slowly ...)
are public: ``fastdata bench fastdata.bench:IOWaitDataset`` measures one.

This ``__init__`` imports nothing: datasets import :mod:`fastdata.core.stages` on their hot path, and the
rest loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.bench._advise import Recommendation, recommend
    from fastdata.bench._loop import Timing
    from fastdata.bench._profile import record as profile
    from fastdata.bench._report import print_report, write_plot
    from fastdata.bench._result import Config, Point, SweepResult
    from fastdata.bench._sweep import sweep
    from fastdata.bench._synthetic import (
        CheapDataset,
        CPUDataset,
        HeavyBatchDataset,
        HoldMemoryDataset,
        IOWaitDataset,
        SlowStartDataset,
    )

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "CPUDataset",
    "CheapDataset",
    "Config",
    "HeavyBatchDataset",
    "HoldMemoryDataset",
    "IOWaitDataset",
    "Point",
    "Recommendation",
    "SlowStartDataset",
    "SweepResult",
    "Timing",
    "print_report",
    "profile",
    "recommend",
    "sweep",
    "write_plot",
]
