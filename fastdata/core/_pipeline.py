"""The one sample pipeline every dataset runs: decode -> transform -> error policy -> stage timing.

A dataset's format turns bytes into raw samples (a dict per sample); what happens to each one next is
the same for every backend, so it lives here, once::

    pipeline = SamplePipeline(decoder, transform, policy)
    t = stages.lap("fetch", t, len(raw))      # the dataset times its own fetch
    samples = pipeline.batch(raw, t)          # decoded, transformed; bad ones raised or counted and dropped

or, sample by sample (a dataset whose samples arrive one at a time)::

    sample, t = pipeline(raw_sample, t)
    if sample is SKIP: ...                    # bad, and the policy skipped it

A decoder that rejects a sample raises :class:`~fastdata.core.errors.BadSample` (``DecodeFailed``);
the :class:`~fastdata.core.errors.ErrorPolicy` then raises it (``on_error="raise"``) or counts it and
warns once per file (``"skip"``). An exception from the user's transform becomes
:class:`~fastdata.core.errors.TransformFailed` (the original chained as its cause), naming the file or
shard, the sample's key and index and the keys the sample has, and goes to the same policy: a bare
``KeyError: 'png'`` from inside a DataLoader worker names none of that. Where the sample is, in words,
comes from the dataset (``describe=``), or from the sample's own ``__url__``/``path``, ``__key__`` and
``__index__``. The time spent in each stage is added to :mod:`fastdata.core.stages` (nothing when
probing is off).

With neither a decoder nor a transform (raw bytes, the fastest path), :meth:`SamplePipeline.batch`
hands the list back as it is: no per-sample work. This module imports only core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from fastdata.core import stages
from fastdata.core.errors import BadSample, ErrorPolicy, TransformFailed

Sample = dict[str, Any]
Describe = Callable[[Any], "tuple[str, str]"]
"""``describe(sample) -> (source, where)``: the file or shard holding a sample, and where it is in words
(``"sample 17, key 'cat/001'"``), for error messages."""


class _Skip:
    """The type of :data:`SKIP`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SKIP"

    def __reduce__(self) -> str:
        return "SKIP"  # one marker per process, also after pickling


SKIP: Final = _Skip()
"""What :meth:`SamplePipeline.__call__` returns for a bad sample that the policy skipped."""


class SamplePipeline:
    """Decode, then transform, each sample of a dataset; bad samples go to the error policy.

    Args:
        decoder (Callable[[dict], dict] | None): turns a raw sample into a decoded one (a
            :class:`~fastdata.formats.Decoder`, a dataset's own, or the user's); raises
            :class:`~fastdata.core.errors.BadSample` for bytes it rejects. None: samples stay raw.
        transform (Callable[[dict], Any] | None): the user's function, applied after decoding.
        policy (ErrorPolicy): what to do with a bad sample (raise, or count, warn and skip).
        describe (Callable | None): ``describe(sample) -> (source, where)`` for the message of a failed
            transform (see :data:`Describe`); called only then. Defaults to None: :func:`describe_sample`.
    """

    __slots__ = ("decoder", "describe", "policy", "transform")

    def __init__(
        self,
        decoder: Callable[[Sample], Sample] | None,
        transform: Callable[[Sample], Any] | None,
        policy: ErrorPolicy,
        describe: Describe | None = None,
    ) -> None:
        self.decoder = decoder
        self.transform = transform
        self.policy = policy
        self.describe = describe

    def __getstate__(self) -> tuple[Any, Any, ErrorPolicy, Any]:
        return self.decoder, self.transform, self.policy, self.describe

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.decoder, self.transform, self.policy, self.describe = state

    def failed(self, sample: Any, error: Exception) -> BadSample:
        """The error for the user's transform raising ``error`` on ``sample`` (decoded, as it was given to
        the transform): a :class:`~fastdata.core.errors.TransformFailed` naming where the sample is, the
        transform and the exception, or ``error`` itself when it is a :class:`BadSample` already."""
        if isinstance(error, BadSample):
            return error  # the transform rejected the sample on purpose, in fastdata's terms
        try:
            source, where = (self.describe or describe_sample)(sample)
        except Exception:  # noqa: BLE001 - the message must not fail in turn
            source, where = describe_sample(sample)
        name = getattr(self.transform, "__qualname__", None) or type(self.transform).__name__
        keys = f"; the sample's keys are {', '.join(map(repr, sample))}" if isinstance(sample, dict) else ""
        message = (
            f"{where}: transform {name} raised {type(error).__name__}: {error}{keys}. Fix the transform, or pass "
            "on_error='skip' to leave out (and count) the samples it fails on"
        )
        out = TransformFailed(message, source)
        out.__cause__ = error
        return out

    @property
    def passthrough(self) -> bool:
        """Whether samples come out as they go in (no decoder, no transform)."""
        return self.decoder is None and self.transform is None

    def __call__(self, sample: Sample, t: float = 0.0) -> tuple[Any, float]:
        """One sample through the pipeline.

        Args:
            sample (dict): the raw sample.
            t (float): the stage clock (:func:`fastdata.core.stages.clock`, or the last ``lap``): when
                this sample's decoding started. Defaults to 0.0 (nothing timed).

        Returns:
            (finished sample or :data:`SKIP`, the clock after it): the sample decoded and transformed,
            or :data:`SKIP` when it was bad and the policy skipped it (counted and warned).

        Raises:
            BadSample: a bad sample under ``on_error="raise"``.
        """
        decoder = self.decoder
        if decoder is not None:
            try:
                sample = decoder(sample)
            except BadSample as e:
                self.policy.handle(e)
                return SKIP, stages.lap("decode", t)  # a failed decode is decoding time too
            t = stages.lap("decode", t)
        transform = self.transform
        if transform is not None:
            try:
                sample = transform(sample)
            except Exception as e:  # noqa: BLE001 - the user's code: any exception, named with its sample
                self.policy.handle(self.failed(sample, e))
                return SKIP, stages.lap("transform", t)
            t = stages.lap("transform", t)
        return sample, t

    def batch(self, samples: list[Sample], t: float = 0.0) -> list[Any]:
        """The finished samples of ``samples``, in order, bad ones skipped under the policy.

        Args:
            samples (list[dict]): raw samples; handed back as they are when there is nothing to do.
            t (float): the stage clock at the start of the first sample's decoding. Defaults to 0.0.
        """
        decoder, transform = self.decoder, self.transform
        if decoder is None and transform is None:
            return samples
        # the loop of __call__, written out: a call and a tuple less per sample (~4% of a trivial decode)
        lap, out = stages.lap, []
        for sample in samples:
            if decoder is not None:
                try:
                    sample = decoder(sample)
                except BadSample as e:
                    self.policy.handle(e)
                    t = lap("decode", t)
                    continue
                t = lap("decode", t)
            if transform is not None:
                try:
                    sample = transform(sample)
                except Exception as e:  # noqa: BLE001 - the user's code: any exception, named with its sample
                    self.policy.handle(self.failed(sample, e))
                    t = lap("transform", t)
                    continue
                t = lap("transform", t)
            out.append(sample)
        return out

    def batch_kept(self, samples: Sequence[Sample], t: float = 0.0) -> tuple[list[Any], list[int]]:
        """Like :meth:`batch`, and the positions in ``samples`` of the samples kept (for a dataset that
        keeps whole-batch columns beside its samples and must know which rows survived)."""
        if self.decoder is None and self.transform is None:
            return list(samples), list(range(len(samples)))
        out, kept = [], []
        for j, sample in enumerate(samples):
            done, t = self(sample, t)
            if done is not SKIP:
                out.append(done)
                kept.append(j)
        return out, kept


def describe_sample(sample: Any) -> tuple[str, str]:
    """``(source, where)`` of a sample from what it carries: its file or shard (``__url__``, ``path``),
    its key (``__key__``) and dataset index (``__index__``), or, for a video clip, its frames."""
    if not isinstance(sample, dict):
        return "", f"a sample ({type(sample).__name__})"
    source = str(sample.get("__url__") or sample.get("path") or "")
    parts = []
    if "__index__" in sample:
        parts.append(f"index {sample['__index__']}")
    if "__key__" in sample:
        parts.append(f"key {sample['__key__']!r}")
    frames = sample.get("frames")
    if frames is not None and hasattr(frames, "tolist"):
        numbers = frames.tolist()
        if numbers:
            parts.append(f"frames {numbers[0]}..{numbers[-1]}")
    where = f"sample ({', '.join(parts)})" if parts else "a sample"
    return source, f"{source}: {where}" if source else where


__all__ = ["SKIP", "Describe", "SamplePipeline", "describe_sample"]
