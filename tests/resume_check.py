"""The one save/load check for every resumable object: :func:`check_resume`.

For any object that can stop mid-epoch (``fd.Loader``, ``EpochSampler``, ``ChunkBatchSampler``,
``TarShardDataset``, or torchdata's ``StatefulDataLoader`` over them), it saves the state at the start, the
middle and the end of an epoch, builds a fresh object (a new dataset too: as after a restart), loads the
state through JSON, and checks that what follows, to the end of the next epoch, is exactly what an
uninterrupted run reads; with ``num_workers`` changed between save and load where the object allows it.
A :class:`Subject` says how to drive the object; the defaults fit the fastdata objects themselves.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)  # a test helper for any object: a sampler has nothing to close
    if callable(close):
        close()


@dataclass(frozen=True)
class Subject:
    """How :func:`check_resume` drives one kind of resumable object.

    Attributes:
        make: ``make(num_workers)``: a fresh object, built from scratch (its dataset too), as a training
            script builds it after a restart. Objects without workers ignore the argument.
        keys: the identity of one item the object yields (a batch's sample keys, an index list).
        workers: ``(num_workers when saving, num_workers when loading)`` pairs, taken in turn by the save
            points. Defaults to ``((0, 0),)``.
        iterate: the iterable of one pass over the current epoch. Defaults to the object itself.
        save, load: ``state_dict()`` and ``load_state_dict(state)`` by default.
        set_epoch: Defaults to ``obj.set_epoch(epoch)``.
        epoch_of: the epoch the object reports, checked after loading (None: it reports none, as a
            ``StatefulDataLoader``, whose training script keeps the epoch itself). Defaults to ``obj.epoch``.
        resumes_after_a_pass (bool): a state saved after a whole pass has run out resumes at the end of that
            epoch (fastdata's objects); False where such a state starts a new pass (``StatefulDataLoader``).
    """

    make: Callable[[int], Any]
    keys: Callable[[Any], Any]
    workers: Sequence[tuple[int, int]] = ((0, 0),)
    iterate: Callable[[Any], Iterable[Any]] = lambda obj: obj
    save: Callable[[Any], Any] = lambda obj: obj.state_dict()
    load: Callable[[Any, Any], None] = lambda obj, state: obj.load_state_dict(state)
    set_epoch: Callable[[Any, int], None] = lambda obj, epoch: obj.set_epoch(epoch)
    epoch_of: Callable[[Any], int] | None = lambda obj: obj.epoch
    resumes_after_a_pass: bool = True


def take(subject: Subject, obj: Any, limit: int | None = None) -> list[Any]:
    """The keys of the next ``limit`` items of one pass (all of them, running the pass out, when None)."""
    out: list[Any] = []
    if limit == 0:
        return out
    for item in subject.iterate(obj):
        out.append(subject.keys(item))
        if limit is not None and len(out) >= limit:
            break
    return out


def through_json(state: Any) -> Any:
    """The state as a checkpoint written as JSON gives it back."""
    return json.loads(json.dumps(state))


def check_resume(
    subject: Subject, *, epoch: int = 1, at: Callable[[int], Iterable[int]] | None = None
) -> list[dict[str, Any]]:
    """Save in epoch ``epoch``, resume in a fresh object, and check the rest equals an uninterrupted run.

    Args:
        subject: how to drive the object.
        epoch (int): the epoch stopped in; the run goes on to the end of ``epoch + 1``. Defaults to 1.
        at: ``at(n)``: where to save in an epoch of ``n`` items (0: before the first; ``n``: right after
            the last). Defaults to the start, the middle and the end: ``0, n // 2, n``. Where the subject
            resumes after a pass, a state saved after the whole pass ran out is checked too.

    Returns:
        The states saved (through JSON), in the order of the save points, for checks of their own.
    """
    reference = subject.make(0)
    full = []
    for e in (epoch, epoch + 1):
        subject.set_epoch(reference, e)
        full.append(take(subject, reference))
    _close(reference)
    n = len(full[0])
    assert n > 1, "an epoch of fewer than two items cannot be stopped in the middle"
    assert full[0] != full[1], "the two epochs must differ, or a resume into the wrong epoch would pass"
    points: list[int | None] = list(sorted(set(at(n) if at is not None else (0, n // 2, n))))
    if subject.resumes_after_a_pass:
        points.append(None)  # saved after the pass ran out, as a loop over the epoch leaves it
    states = []
    for i, k in enumerate(points):
        before, after = subject.workers[i % len(subject.workers)]
        where = "after the pass ran out" if k is None else f"after {k} of {n}"
        obj = subject.make(before)
        subject.set_epoch(obj, epoch)
        head = take(subject, obj, k)
        state = through_json(subject.save(obj))
        _close(obj)
        states.append(state)
        assert head == full[0][: len(head)] and len(head) == (n if k is None else k), f"read {where}"
        fresh = subject.make(after)
        subject.load(fresh, state)
        if subject.epoch_of is not None:
            assert subject.epoch_of(fresh) == epoch, f"the state saved {where} did not set its epoch"
        rest = []
        for e in (epoch, epoch + 1):
            subject.set_epoch(fresh, e)
            rest += take(subject, fresh)
        _close(fresh)
        assert head + rest == full[0] + full[1], (
            f"resumed from the state saved {where} (num_workers {before} -> {after}): {state}"
        )
    return states


__all__ = ["Subject", "check_resume", "take", "through_json"]
