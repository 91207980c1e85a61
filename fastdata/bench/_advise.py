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
import os
from dataclasses import dataclass, field, replace
from typing import Any

from fastdata.bench._diagnose import (
    Check,
    checks,
    diagnose,
    estimate,
    oversubscribed,
)
from fastdata.bench._result import Config, Point, SweepResult
from fastdata.core.errors import ConfigError, check_positive
from fastdata.loading.observe import Label

# labels whose workers compute: each needs a core of its own
COMPUTING_LABELS = ("cpu", "main-process", "fork", "worker-init", "shuffle-fill", "uncertain", "unknown")


@dataclass
class Recommendation:
    """What to use and why.

    Attributes:
        config (Config | None): the recommended configuration (None when every point failed).
        kwargs (dict): ``DataLoader`` keyword arguments, ready to paste.
        point (Point | None): what the recommended configuration measured.
        best (Point | None): the fastest point measured.
        bottleneck: the headline label (:data:`fastdata.loading.observe.diagnose.Label`): "storage", "cpu",
            "main-process", "ipc", "fork", "worker-init", "shuffle-fill", "memory", "step" (the training
            step is the limit), "uncertain" or "unknown".
        diagnosis (list[str]): plain-language sentences, most important first.
        per_rank (dict | None): with ``procs_per_node`` > 1, the keyword arguments for each rank of
            a DDP job, and why.
        evidence (list[str]): the measurements behind the label.
        checks (list[Check]): the rule-of-thumb checks, marked where they fire.
        estimate (tuple[int, str] | None): ``min(cores, data time / step time)``, and how it was got.
    """

    config: Config | None
    kwargs: dict[str, Any]
    point: Point | None
    best: Point | None
    bottleneck: Label
    diagnosis: list[str] = field(default_factory=list)
    per_rank: dict[str, Any] | None = None
    evidence: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    estimate: tuple[int, str] | None = None

    @property
    def ratio_to_best(self) -> float | None:
        """The recommended point's throughput over the best's."""
        if not self.point or not self.best or not self.best.samples_per_s:
            return None
        return self.point.samples_per_s / self.best.samples_per_s

    def code(self) -> str:
        """``DataLoader(dataset, ...)`` with the recommended keyword arguments, or ``fd.Loader(dataset,
        ...)`` where only the Loader runs the recommended mode (threads, the hybrid, the slot transport)."""
        if self.config is None:
            return ""  # nothing ran: nothing to paste
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        if self.config.uses_loader():
            return f"fd.Loader(dataset, {args})"  # the Loader batches a dataset that batches itself as is
        if "batch_size" in self.kwargs and self.kwargs["batch_size"] is None:
            args += ", collate_fn=fd.as_is"  # the dataset yields whole batches: nothing to convert
        return f"DataLoader(dataset, {args})"

    @property
    def mode(self) -> str | None:
        """Who reads in the recommended configuration: "processes", "threads" or "hybrid"."""
        return None if self.config is None else self.config.mode

    def text(self) -> str:
        """The recommendation and the diagnosis as a paragraph of plain text."""
        lines = [self.code()] if self.config is not None else []
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
            "mode": self.mode,
            "code": self.code(),
            "samples_per_s": self.point.samples_per_s if self.point else None,
            "best_samples_per_s": self.best.samples_per_s if self.best else None,
            "ratio_to_best": self.ratio_to_best,
            "bottleneck": self.bottleneck,
            "evidence": self.evidence,
            "diagnosis": self.diagnosis,
            "checks": [{"name": c.name, "fires": c.fires, "text": c.text} for c in self.checks],
            "estimate": None if self.estimate is None else {"workers": self.estimate[0], "how": self.estimate[1]},
            "per_rank": self.per_rank,
        }


def fair_points(result: SweepResult) -> list[Point]:
    """The points that succeeded, less the oversubscribed CPU-bound ones (unless nothing else is left)."""
    ok = sorted(result.ok_points(), key=lambda p: p.config.cost())
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


def procs_from_environment() -> int | None:
    """Training processes on this node as torchrun tells them (``LOCAL_WORLD_SIZE``), or None."""
    value = os.environ.get("LOCAL_WORLD_SIZE")
    try:
        return int(value) if value else None
    except ValueError:
        raise ConfigError(f"LOCAL_WORLD_SIZE={value!r} is not an integer; unset it or pass --procs-per-node") from None


def per_rank(result: SweepResult, rec: Point, kind: Label, procs_per_node: int) -> dict[str, Any]:
    """Workers per rank (per GPU) when ``procs_per_node`` training processes share this machine.

    Every rank's training process keeps a physical core of its own (the reserve); the workers of all the
    ranks share the rest: ``ranks x (workers + 1) <= physical cores`` for workers that compute. Workers
    that mostly wait (storage-bound, or a loader that keeps up) are budgeted by the CPU they were
    measured to use. SMT siblings count once: two hyperthreads of one core do not decode twice as fast.
    """
    phys = int(result.machine.get("physical_cores") or result.usable_cores)
    cpus = result.usable_cores
    w = rec.config.num_workers
    threads = rec.config.mode == "threads"  # loader threads: their CPU is the main process's
    spare = max(0, phys - procs_per_node)
    warnings: list[str] = []
    if kind == "ipc":
        workers, reason = 0, "items are cheaper to make than to move between processes"
    elif kind in COMPUTING_LABELS:
        workers = min(w, spare // procs_per_node)
        reason = "its workers compute, so each needs a physical core of its own"
    else:
        used = rec.window.main_cores if threads else sum(rec.window.worker_cores)
        per_worker = max(0.05, (used / w) if w else 0.0)
        fits = math.floor(spare / (procs_per_node * per_worker)) if spare else 0
        workers = min(w, fits)
        reason = (
            f"its workers mostly wait ({per_worker:.2f} cores each, measured), so they are budgeted by the CPU they use"
        )
    if procs_per_node > phys:
        warnings.append(
            f"{procs_per_node} ranks on {phys} physical cores oversubscribe before any worker starts: the "
            "training processes themselves compete for cores; use fewer ranks per node or a machine with more cores"
        )
    if w and procs_per_node * (w + 1) > phys and kind in COMPUTING_LABELS:
        warnings.append(
            f"the single-process answer ({w} worker{'s' if w != 1 else ''}) on every rank would run "
            f"{procs_per_node} x ({w} + 1) = "
            f"{procs_per_node * (w + 1)} computing processes on {phys} physical cores: oversubscribed"
        )
    mem = result.usable_memory
    if mem and rec.pss_workers and workers:
        per_worker_mem = max(rec.pss_workers)
        fits = math.floor((0.6 * mem / procs_per_node - rec.window.main.pss) / per_worker_mem)
        if fits < workers:
            workers = max(0, fits)
            reason += f"; capped so that {procs_per_node} ranks' workers stay within 60% of memory (PSS)"
    config = replace(
        rec.config,
        num_workers=workers,
        mode=rec.config.mode if workers else "processes",
        prefetch_factor=(rec.config.prefetch_factor or 2) if workers else None,
        persistent_workers=rec.config.persistent_workers if workers else False,
    )
    smt = f" ({cpus} usable CPUs, SMT siblings counted once)" if cpus != phys else ""
    advice = (
        f"Per GPU (per rank), with {procs_per_node} ranks on this node: num_workers={workers}. "
        f"{procs_per_node} x ({workers} + 1) = {procs_per_node * (workers + 1)} processes on {phys} physical "
        f"cores{smt}, one per rank kept for its training process; {reason}."
    )
    if warnings:
        advice += " Warning: " + "; ".join(warnings) + "."
    return {
        "procs_per_node": procs_per_node,
        "physical_cores": phys,
        "kwargs": config.loader_kwargs(),
        "warnings": warnings,
        "advice": advice,
    }


def recommend(
    result: SweepResult,
    *,
    tolerance: float = 0.05,
    stall_target: float = 0.05,
    procs_per_node: int | None = None,
) -> Recommendation:
    """The recommended DataLoader settings for a sweep, and a diagnosis of what limits the loader.

    Only measured settings are recommended: the keyword arguments are those of the recommended point.

    Args:
        result (SweepResult): from :func:`fastdata.bench.sweep`.
        tolerance (float): a point within this fraction of the best throughput counts as as good.
            Defaults to 0.05.
        stall_target (float): with a step time, the largest acceptable fraction of time the training
            loop waits for data. Defaults to 0.05.
        procs_per_node (int | None): training processes per machine (DDP); > 1 adds per-rank advice.
            Defaults to torchrun's ``LOCAL_WORLD_SIZE`` where set, else 1.

    Returns:
        Recommendation: ``kwargs`` to paste into ``DataLoader(...)``, and ``diagnosis`` sentences.
    """
    procs = procs_per_node if procs_per_node is not None else (procs_from_environment() or 1)
    check_positive("procs_per_node", procs)
    rec = pick(result, tolerance=tolerance, stall_target=stall_target)
    best = result.best()
    if rec is None or best is None:
        errors = sorted({p.error or "no throughput" for p in result.points})
        text = "Every configuration failed, so nothing is recommended: " + "; ".join(errors)
        return Recommendation(None, {}, None, None, "unknown", [text])
    fair_best = max(fair_points(result), key=lambda p: p.samples_per_s)
    found = diagnose(result, rec, fair_best, stall_target=stall_target)
    sentences = found.sentences()
    if fair_best is not best:
        gain = best.samples_per_s / fair_best.samples_per_s - 1
        sentences.append(
            f"{best.config.describe()} measured {gain:.0%} faster than "
            f"{fair_best.config.describe()}, with more CPU-bound workers than the {result.usable_cores}"
            " usable cores: that gain is CPU taken from other programs, so it is not recommended."
        )
    ranks = per_rank(result, rec, found.label, procs) if procs > 1 else None
    return Recommendation(
        rec.config,
        rec.config.loader_kwargs(),
        rec,
        best,
        found.label,
        sentences,
        ranks,
        evidence=found.evidence,
        checks=checks(result, rec),
        estimate=estimate(result, rec),
    )


__all__ = ["Recommendation", "fair_points", "per_rank", "pick", "procs_from_environment", "recommend"]
