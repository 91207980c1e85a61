"""SamplePipeline, the one decode -> transform -> error policy -> stage timing of every dataset: bad
samples raised or counted and warned once per file, the transform after decoding, stage laps recorded
only when the benchmark probes."""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from fastdata.core import stages
from fastdata.core._pipeline import SKIP, SamplePipeline
from fastdata.core.errors import BadSampleWarning, DecodeFailed, ErrorPolicy, TransformFailed
from fastdata.core.process._shared import SharedState


def decode(sample: dict[str, Any]) -> dict[str, Any]:
    """Parses ``txt`` as an int; ``"bad"`` is a damaged member."""
    if sample["txt"] == b"bad":
        raise DecodeFailed(f"{sample['__url__']}: cannot decode", sample["__url__"])
    return {**sample, "txt": int(sample["txt"])}


def samples(*values: bytes, url: str = "a.tar") -> list[dict[str, Any]]:
    return [{"__url__": url, "txt": v} for v in values]


def pipeline(on_error: Any = "raise", transform: Any = None) -> tuple[SamplePipeline, SharedState]:
    shared = SharedState()
    return SamplePipeline(decode, transform, ErrorPolicy(on_error, shared)), shared


@pytest.fixture
def probed() -> Iterator[None]:
    stages.enable()
    try:
        yield
    finally:
        stages.disable()


def test_a_bad_sample_raises_under_raise() -> None:
    run, shared = pipeline("raise")
    assert run.batch(samples(b"1", b"2")) == [{"__url__": "a.tar", "txt": 1}, {"__url__": "a.tar", "txt": 2}]
    with pytest.raises(DecodeFailed, match=r"a\.tar: cannot decode"):
        run.batch(samples(b"1", b"bad"))
    assert shared.total("skipped") == 0


def test_a_bad_sample_is_skipped_counted_and_warned_once_per_file() -> None:
    run, shared = pipeline("skip")
    with pytest.warns(BadSampleWarning) as caught:
        out = run.batch(samples(b"1", b"bad", b"3", b"bad"))
        out += run.batch(samples(b"bad", b"5", url="b.tar"))
        one, _ = run(samples(b"bad")[0])
    assert [s["txt"] for s in out] == [1, 3, 5] and one is SKIP
    assert shared.total("skipped") == 4
    assert len(caught) == 2 and all(sum(f in str(w.message) for w in caught) == 1 for f in ("a.tar", "b.tar"))


def test_batch_kept_names_the_positions_that_survived() -> None:
    run, _ = pipeline("skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadSampleWarning)
        out, kept = run.batch_kept(samples(b"bad", b"1", b"bad", b"3"))
    assert [s["txt"] for s in out] == [1, 3] and kept == [1, 3]
    plain = SamplePipeline(None, None, ErrorPolicy("raise", SharedState()))
    assert plain.batch_kept(samples(b"x", b"y")) == (samples(b"x", b"y"), [0, 1])


def test_the_transform_sees_the_decoded_sample() -> None:
    run, _ = pipeline(transform=lambda s: s["txt"] * 10)
    assert run.batch(samples(b"1", b"2")) == [10, 20]
    only = SamplePipeline(None, lambda s: len(s["txt"]), ErrorPolicy("raise", SharedState()))
    assert only.batch(samples(b"abc")) == [3]


def test_a_failing_transform_names_its_sample_and_chains_the_error() -> None:
    def crop(s: dict[str, Any]) -> Any:
        return s["png"]  # the user's mistake: the member is "txt"

    run, shared = pipeline("raise", transform=crop)
    with pytest.raises(TransformFailed) as caught:
        run.batch([{"__url__": "a.tar", "__key__": "cat/001", "txt": b"1"}])
    message = str(caught.value)
    assert message.startswith("a.tar: sample (key 'cat/001'): transform")
    assert "crop raised KeyError: 'png'" in message and "'txt'" in message  # the keys the sample has
    assert isinstance(caught.value.__cause__, KeyError) and caught.value.source == "a.tar"
    with pytest.raises(TransformFailed, match=r"index 7"):
        run({"__index__": 7, "txt": b"1"})
    assert shared.total("skipped") == 0


def test_a_failing_transform_is_skipped_and_counted_like_a_failed_decode() -> None:
    run, shared = pipeline("skip", transform=lambda s: 1 // (s["txt"] - 2))
    with pytest.warns(BadSampleWarning, match=r"ZeroDivisionError"):
        out = run.batch(samples(b"1", b"2", b"bad", b"3"))
        one, _ = run(samples(b"2")[0])
    assert out == [-1, 1] and one is SKIP
    assert shared.total("skipped") == 3  # the transform's two and the decode's one


def test_a_transform_that_raises_a_bad_sample_is_handled_as_it_is() -> None:
    def reject(s: dict[str, Any]) -> Any:
        raise DecodeFailed("a.tar: too small", "a.tar")

    run, _ = pipeline("raise", transform=reject)
    with pytest.raises(DecodeFailed, match=r"^a\.tar: too small$"):
        run.batch(samples(b"1"))


def row_three(sample: Any) -> tuple[str, str]:
    return "f.h5", "f.h5: row 3"


def pick_x(sample: dict[str, Any]) -> Any:
    return sample["x"]


def test_a_datasets_description_names_where_the_sample_is() -> None:
    run = SamplePipeline(None, pick_x, ErrorPolicy("raise", SharedState()), describe=row_three)
    with pytest.raises(TransformFailed, match=r"^f\.h5: row 3: transform"):
        run({"txt": 1})
    again = pickle.loads(pickle.dumps(run))  # the description travels into spawn workers
    with pytest.raises(TransformFailed, match=r"^f\.h5: row 3"):
        again({"txt": 1})


def test_without_decoder_or_transform_a_batch_passes_untouched() -> None:
    raw = samples(b"1", b"bad")
    run = SamplePipeline(None, None, ErrorPolicy("raise", SharedState()))
    assert run.passthrough and run.batch(raw) is raw  # the same list: no per-sample work
    assert not pipeline()[0].passthrough


def test_stage_laps_are_recorded_when_probing(probed: None) -> None:
    run, _ = pipeline("skip", transform=lambda s: s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadSampleWarning)
        out = run.batch(samples(b"1", b"bad", b"3"), stages.clock())
    totals = stages.totals()
    assert len(out) == 2
    assert totals["decode"][1] == 3 and totals["decode"][0] > 0  # a failed decode is decoding time too
    assert totals["transform"][1] == 2 and totals["transform"][0] > 0
    assert totals["fetch"] == (0.0, 0.0)  # fetch is the dataset's to time


def test_nothing_is_recorded_when_not_probing() -> None:
    run, _ = pipeline(transform=lambda s: s)
    assert not stages.enabled()
    sample, t = run(samples(b"1")[0], stages.clock())
    assert sample["txt"] == 1 and t == 0.0
    stages.enable()
    try:
        run.batch(samples(b"1", b"2"), 0.0)  # a clock started while probing was off is not timed
        assert stages.totals() == {name: (0.0, 0.0) for name in stages.STAGES}
    finally:
        stages.disable()


def test_a_pipeline_and_its_skip_marker_survive_pickling() -> None:
    run, _ = pipeline("skip", transform=None)
    again = pickle.loads(pickle.dumps(run))
    assert again.decoder is decode and again.policy.on_error == "skip"
    assert pickle.loads(pickle.dumps(SKIP)) is SKIP
