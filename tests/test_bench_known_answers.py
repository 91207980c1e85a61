"""The known-answer suite: one real loader per label (tests/known_answers.py), each labelled right
while another program keeps one core busy, and the same label from a --quick and (where a longer run sees
more: ``Case.full``) a fuller measurement; and users' workloads (tests/user_workloads.py: plain torch datasets
waiting on a loopback HTTP server, sleeps, a lock, the disk; Python and JPEG decoding in loader threads), each
also live, under the monitor inside a training loop, which must give the same label as the offline sweep.

Real DataLoaders, real worker processes, real page-cached JPEG decode from tar, real video decode on the
watchdog's helper thread, the local S3 server behind the fault proxy. The assertions are the labels and
the evidence each label must name, never a rate.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.known_answers import CASES, FULL, QUICK, Case, busy_core

# what each label's evidence must say: the measurement that decided it
EVIDENCE: dict[str, str | tuple[str, ...]] = {
    "cpu": ("busy", "uses", "using"),  # the cores it uses, as measured
    "sleep": "sleeping",
    "lock": "waiting on a lock",
    "shuffle-fill": "a shuffle buffer",
    "fork": "copies the page tables",
    "worker-init": "set-up before its first sample",
    "main-process": "rebuilding received batches",
    "ipc": "costs more than making them",
    "step": "waits for data",
    "memory": "(PSS)",
    "storage": ("waiting on the network", "waiting on the disk", "it waits for bytes"),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("known-answers")


@pytest.fixture
def s3(request: pytest.FixtureRequest) -> Iterator[Any]:
    case: Case = request.node.callspec.params["case"]
    if not case.needs_s3:
        yield None
        return
    server = request.getfixturevalue("s3_server")
    proxy = request.getfixturevalue("fault_proxy")
    bucket = request.getfixturevalue("s3_bucket")
    yield server, proxy, bucket


# every case at --quick's timing; at the fuller one only where it measures something the quick run may not
RUNS = [(c, QUICK, "quick") for c in CASES] + [(c, FULL, "full") for c in CASES if c.full]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "timing"), [r[:2] for r in RUNS], ids=[f"{r[2]}-{r[0].expected}:{r[0].name}" for r in RUNS]
)
def test_each_label_is_right_under_one_busy_core(case: Case, timing: dict[str, Any], data: Path, s3: Any) -> None:
    with busy_core():
        rec = case.run(data, timing, s3=s3)
    assert rec.bottleneck == case.expected, rec.text()
    assert rec.evidence, rec.text()
    said = EVIDENCE[case.expected]
    words = (said,) if isinstance(said, str) else said
    assert any(w in " ".join(rec.diagnosis) for w in words), rec.text()
    if case.name.startswith("video"):
        # the decoding is seen on the helper thread, not lost with the main thread's idleness
        assert "'fastdata-decode'" in rec.diagnosis[0], rec.text()
    for said in case.says:  # a sentence's first letter is capitalised in the report
        assert said.lower() in " ".join(rec.diagnosis).lower(), (said, rec.text())
    if case.live is not None:
        # the same loader inside a training loop, under the monitor: the same label
        with busy_core():
            report = case.live(data, timing)
        assert report.label == case.expected, (report.label, report.evidence, rec.text())
        assert any(w in " ".join(report.evidence) for w in words), report.evidence
        for said in case.says:
            assert said.lower() in " ".join(report.evidence + report.advice).lower(), (said, report.advice)
    if case.name.startswith("plain dataset over a loopback HTTP"):
        assert "waiting on the network" in rec.diagnosis[0] and "(poll" in rec.diagnosis[0], rec.text()
    if case.name.startswith("plain dataset reading with the page cache"):
        assert "waiting on the disk" in rec.diagnosis[0], rec.text()
    if case.expected == "shuffle-fill":
        # measured with persistent workers: the advice is a smaller window, not persistent workers
        assert rec.kwargs["persistent_workers"] is True
        assert any("refilled at every epoch" in s for s in rec.diagnosis), rec.text()
