"""``recommend``: the cheapest DataLoader settings that do the job, as keyword arguments, with the why.

Without a step time, "the job" is throughput: the smallest configuration (fewest workers, then least
prefetch, no pinning) within ``tolerance`` (5%) of the best measured. With a step time, it is feeding
the model: the smallest configuration whose stall stays under ``stall_target`` (5%); when none does,
the fastest. Fewer workers is better at equal speed: less memory, fewer processes to start, cores left
for the training process. A CPU-bound configuration with more workers than usable cores is never the
target: what it gains over ``cores`` workers is CPU taken from other programs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from fastdata.bench.diagnose import (
    STARTUP_NOTE,
    Bottleneck,
    classify,
    cores_saturated,
    diagnose,
    oversubscribed,
    startup_share,
)
from fastdata.bench.result import Config, Point, SweepResult
from fastdata.core.errors import check_positive


@dataclass
class Recommendation:
    """What to use and why.

    Attributes:
        config (Config | None): the recommended configuration (None when every point failed).
        kwargs (dict): ``DataLoader`` keyword arguments, ready to paste.
        point (Point | None): what the recommended configuration measured.
        best (Point | None): the fastest point measured.
        bottleneck: the headline: "storage", "cpu", "main-process", "memory", "start-up", "ipc",
            "none" (the model is the limit) or "unknown".
        diagnosis (list[str]): plain-language sentences, most important first.
        per_rank (dict | None): with ``procs_per_node`` > 1, the keyword arguments for each rank of
            a DDP job, and why.
    """

    config: Config | None
    kwargs: dict[str, Any]
    point: Point | None
    best: Point | None
    bottleneck: Bottleneck
    diagnosis: list[str] = field(default_factory=list)
    per_rank: dict[str, Any] | None = None

    @property
    def ratio_to_best(self) -> float | None:
        """The recommended point's throughput over the best's."""
        if not self.point or not self.best or not self.best.samples_per_s:
            return None
        return self.point.samples_per_s / self.best.samples_per_s

    def code(self) -> str:
        """``DataLoader(dataset, ...)`` with the recommended keyword arguments."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"DataLoader(dataset, {args})"

    def text(self) -> str:
        """The recommendation and the diagnosis as a paragraph of plain text."""
        lines = [self.code()]
        if self.point is not None and self.best is not None:
            best = self.best
            lines.append(
                f"{self.point.samples_per_s:,.0f} samples/s ({self.ratio_to_best:.0%} of the best measured, "
                f"{best.samples_per_s:,.0f} at {best.config.label()}); bottleneck: {self.bottleneck}."
            )
        lines.extend(self.diagnosis)
        if self.per_rank:
            lines.append(self.per_rank["advice"])
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kwargs": self.kwargs,
            "config": None if self.config is None else self.config.label(),
            "samples_per_s": self.point.samples_per_s if self.point else None,
            "best_samples_per_s": self.best.samples_per_s if self.best else None,
            "ratio_to_best": self.ratio_to_best,
            "bottleneck": self.bottleneck,
            "diagnosis": self.diagnosis,
            "per_rank": self.per_rank,
        }


def fair_points(result: SweepResult) -> list[Point]:
    """The points that succeeded, less the oversubscribed CPU-bound ones (unless nothing else is left)."""
    ok = sorted(result.ok_points(), key=lambda p: p.config)
    # past the cores, a CPU-bound loader only takes CPU from other programs: not a speed to aim for
    return [p for p in ok if not oversubscribed(p, result.usable_cores)] or ok


def pick(result: SweepResult, *, tolerance: float = 0.05, stall_target: float = 0.05) -> Point | None:
    """The recommended point (see the module docstring), or None when every point failed."""
    ok = fair_points(result)
    if not ok:
        return None
    best = max(ok, key=lambda p: p.samples_per_s)
    if result.step_time:
        fed = [p for p in ok if p.stall is not None and p.stall < stall_target]
        if fed:
            return fed[0]
        return best
    return next(p for p in ok if p.samples_per_s >= (1 - tolerance) * best.samples_per_s)


def per_rank(result: SweepResult, rec: Point, kind: Bottleneck, procs_per_node: int) -> dict[str, Any]:
    """Workers per rank when ``procs_per_node`` training processes share this machine's cores."""
    cores, w = result.usable_cores, rec.config.num_workers
    reason: str
    if kind in ("cpu", "main-process") or (kind == "none" and cores_saturated(rec, cores)):
        # every rank's main process needs a core of its own; the workers share the rest
        spare = max(0, cores - procs_per_node)
        workers = min(w, spare // procs_per_node) if w else 0
        reason = (
            f"the loader is CPU-limited, so the {cores} cores are split: {procs_per_node} for the ranks' main "
            f"processes, {spare} for workers"
        )
    elif kind == "storage":
        workers = w
        reason = "waiting workers use little CPU, so each rank keeps the single-process count"
    else:
        workers = w
        reason = "each rank keeps the single-process count"
    mem = result.usable_memory
    if mem and rec.pss_workers and workers:
        per_worker = max(rec.pss_workers)
        fits = math.floor((0.6 * mem / procs_per_node - rec.pss_main) / per_worker)
        if fits < workers:
            workers = max(0, fits)
            reason += f"; capped so that {procs_per_node} ranks' workers stay within 60% of memory (PSS)"
    config = replace(
        rec.config,
        num_workers=workers,
        prefetch_factor=(rec.config.prefetch_factor or 2) if workers else None,
        persistent_workers=rec.config.persistent_workers if workers else False,
    )
    kwargs = config.loader_kwargs()
    return {
        "procs_per_node": procs_per_node,
        "kwargs": kwargs,
        "advice": f"With {procs_per_node} processes per node (DDP): num_workers={workers} per rank; {reason}.",
    }


def recommend(
    result: SweepResult, *, tolerance: float = 0.05, stall_target: float = 0.05, procs_per_node: int = 1
) -> Recommendation:
    """The recommended DataLoader settings for a sweep, and a diagnosis of what limits the loader.

    Args:
        result (SweepResult): from :func:`fastdata.bench.sweep`.
        tolerance (float): a point within this fraction of the best throughput counts as as good.
            Defaults to 0.05.
        stall_target (float): with a step time, the largest acceptable fraction of time the training
            loop waits for data. Defaults to 0.05.
        procs_per_node (int): training processes per machine (DDP); > 1 adds per-rank advice.
            Defaults to 1.

    Returns:
        Recommendation: ``kwargs`` to paste into ``DataLoader(...)``, and ``diagnosis`` sentences.
    """
    check_positive("procs_per_node", procs_per_node)
    rec = pick(result, tolerance=tolerance, stall_target=stall_target)
    best = result.best()
    if rec is None or best is None:
        errors = sorted({p.error or "no throughput" for p in result.points})
        return Recommendation(None, {}, None, None, "unknown", ["Every configuration failed: " + "; ".join(errors)])
    fair_best = max(fair_points(result), key=lambda p: p.samples_per_s)
    kind, sentences = diagnose(result, rec, fair_best, stall_target=stall_target)
    if fair_best is not best:
        gain = best.samples_per_s / fair_best.samples_per_s - 1
        sentences.append(
            f"{best.config.num_workers} workers measured {gain:.0%} faster than "
            f"{fair_best.config.num_workers}, with more CPU-bound workers than the {result.usable_cores}"
            " usable cores: that gain is CPU taken from other programs, so it is not recommended."
        )
    config = rec.config
    share = startup_share(result, rec)
    if config.num_workers and not config.persistent_workers and share is not None and share >= STARTUP_NOTE:
        config = replace(config, persistent_workers=True)
    ranks = (
        per_rank(result, rec, kind if kind != "unknown" else classify(rec), procs_per_node)
        if procs_per_node > 1
        else None
    )
    return Recommendation(config, config.loader_kwargs(), rec, best, kind, sentences, ranks)


__all__ = ["Recommendation", "fair_points", "per_rank", "pick", "recommend"]
