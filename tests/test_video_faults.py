"""Faults: decodes that never return, readers inherited through fork, file-descriptor limits.

Nothing here sleeps to synchronise: a stuck decode is a real ``open(2)`` on a FIFO nobody writes to
(released at the end of each test by opening its write end), and a hang of a whole process is caught
by running it as a subprocess with a timeout.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import BadSampleWarning
from fastdata.core.process._handles import open_files
from fastdata.formats.video import DecodeTimeout
from fastdata.formats.video._pyav import PyAVReader
from fastdata.formats.video._watchdog import stuck_calls
from tests.test_video_readers import DECODERS, _available, need
from tests.videogen import damage, make_videos, read_stamp

TIMEOUT = 0.5  # seconds: the watchdog limit in these tests (the default is 60)


def release(fifo: str | os.PathLike[str]) -> None:
    """Unblock every thread stuck on the FIFO, then wait until every call the watchdog gave up on returns.

    Opening the FIFO read-write (never blocks on Linux) wakes the threads blocked opening it; removing
    it makes later opens fail at once; closing it gives the woken readers end-of-file.
    """
    if Path(fifo).exists():
        fd_ = os.open(fifo, os.O_RDWR)
        os.unlink(fifo)
        os.close(fd_)
    for job in stuck_calls():
        # (a call still stuck would hold OpenCV's open lock in every process forked later)
        assert job.returned.wait(timeout=60), "a decoder call stayed stuck after its FIFO was released"


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "stalled.mp4"
    os.mkfifo(path)
    yield path
    release(path)


def run_script(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``python -c script`` in its own process group; on timeout kill the whole group (its
    DataLoader workers too, which would otherwise outlive it if they hang) and fail the test."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the script hung (killed after {timeout:g} s)")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def dump_stacks_if_stuck(worker_id: int) -> None:
    """``worker_init_fn``: a worker still running after 100 s prints every thread's stack and exits, so
    that a deadlock fails the test with the place where it happened instead of hanging the run."""
    faulthandler.dump_traceback_later(100, exit=True)


class BlockingReader(PyAVReader):
    """PyAV, except that reading a video beside which a ``.block`` FIFO exists blocks in ``open(2)``
    on that FIFO, as a decoder stuck on a stalled mount would."""

    def _read(self, wanted: list[int]) -> np.ndarray:
        block = self.path + ".block"
        if Path(block).exists():
            with open(block, "rb") as f:
                f.read()
        return super()._read(wanted)


def test_watchdog_abandons_a_stuck_decode_and_the_reader_stays_usable(tmp_path: Path) -> None:
    paths = make_videos(tmp_path, count=3, frames=20)
    options: dict[str, Any] = {
        "clip_len": 4,
        "clips_per_video": 2,
        "decoder": BlockingReader,
        "decode_timeout": TIMEOUT,
        "index_cache": False,
    }
    strict = fd.VideoClipDataset(paths, **options)
    skipping = fd.VideoClipDataset(paths, on_error="skip", **options)
    block = paths[1] + ".block"
    os.mkfifo(block)  # from now on, reading video 1 blocks
    try:
        with pytest.raises(DecodeTimeout, match=re.escape(Path(paths[1]).name)):
            strict[2]
        assert strict.counters()["timeouts"] == 1
        sample = strict[0]  # the same process goes on reading other videos
        assert [read_stamp(f)[0] for f in sample["clip"].numpy()] == [0] * 4
        loader = DataLoader(
            skipping,
            batch_size=2,
            sampler=skipping.sampler(shuffle=True),
            num_workers=2,
            multiprocessing_context=multiprocessing.get_context("fork"),
            worker_init_fn=dump_stacks_if_stuck,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BadSampleWarning)
            videos = sorted(v for batch in loader for v in batch["video"].tolist())
        assert videos == [0, 0, 2, 2]
        assert skipping.skipped == 2 and skipping.counters()["timeouts"] == 2
    finally:
        release(block)
        strict.close()


@pytest.mark.parametrize("decoder", DECODERS)
def test_opening_a_stalled_file_times_out_at_construction(tmp_path: Path, fifo: Path, decoder: str) -> None:
    """A FIFO nobody writes to blocks every decoder inside FFmpeg's open: the probe is abandoned, the
    file is skipped (or named in the error), and the other videos are read."""
    need(decoder)
    good = make_videos(tmp_path, count=1, frames=12)[0]
    options: dict[str, Any] = {"clip_len": 4, "decoder": decoder, "decode_timeout": TIMEOUT, "index_cache": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadSampleWarning)
        ds = fd.VideoClipDataset([good, str(fifo)], on_error="skip", **options)
    assert len(ds) == 1 and ds.skipped == 1 and ds.counters()["timeouts"] == 1
    # (every decoder's probe finds the stream through PyAV first, so the stuck open is PyAV's, and
    # OpenCV's process-wide open lock is not held by it)
    assert read_stamp(ds[0]["clip"].numpy()[0])[0] == 0
    ds.close()
    with pytest.raises(DecodeTimeout, match=r"stalled\.mp4"):
        fd.VideoClipDataset([str(fifo), good], **options)


FORK_SCRIPT = """
import json, sys
import fastdata as fd
from torch.utils.data import DataLoader
decoders, paths = sys.argv[1].split(","), sys.argv[2:]
results = {}
for decoder in decoders:
    for busy in (False, True):
        ds = fd.VideoClipDataset(paths, clip_len=4, clips_per_video="all", decoder=decoder, index_cache=False)
        ds[0]  # the user checks a sample: a reader now lives in the parent
        assert ds.open_readers == 1
        loader = DataLoader(ds, batch_size=2, sampler=ds.sampler(shuffle=True), num_workers=2,
                            multiprocessing_context="fork")
        if busy:  # as if another thread were reading at the fork: the reader stays open, the workers inherit it
            ds.pool._busy.acquire()
        batches = iter(loader)  # forks the workers
        if busy:
            ds.pool._busy.release()
            assert ds.open_readers == 1
        else:
            assert ds.open_readers == 0  # closed in the parent just before the fork
        keys = sorted((v, f[0]) for b in batches for v, f in zip(b["video"].tolist(), b["frames"].tolist()))
        ds[1]  # and the parent goes on reading
        results[f"{decoder} busy={busy}"] = {"read": len(keys), "distinct": len(set(keys)), "clips": len(ds)}
print(json.dumps(results))
"""


def test_reader_made_in_parent_then_forked_workers_do_not_hang(tmp_path: Path) -> None:
    """decord (and torchcodec) readers hang a forked child that uses or destroys them. Idle readers are
    closed in the parent just before a fork; a reader busy at that moment is inherited and must be
    left alone by the workers (checked: making them close it instead hangs this script). Run in a
    subprocess, so that a hang fails instead of blocking."""
    decoders = [d for d in ("decord", "torchcodec") if not _available(d)]
    assert "decord" in decoders, _available("decord")  # installed with the [test] extra
    paths = make_videos(tmp_path, count=3, frames=24)
    out = run_script(FORK_SCRIPT, ",".join(decoders), *paths, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    want = {"read": 18, "distinct": 18, "clips": 18}
    assert result == {f"{d} busy={b}": want for d in decoders for b in (False, True)}


GC_SCRIPT = """
import gc, json, sys
import fastdata as fd
from fastdata.formats.video import open_video
from torch.utils.data import DataLoader
good, bad = sys.argv[1:3]
gc.disable()  # so that nothing below is collected before the fork: the workers' collection decides

def compare():  # a user compares decoders on a damaged video; decord fails (opening it, or reading on)
    try:
        reader = open_video(bad, "decord")
        reader.get_frames([30, 31])
    except Exception as e:
        error = e  # the traceback holds this frame, which holds the error: the reader is in a cycle
    return "failed"

compare()
kept = open_video(good, "decord")
kept.get_frames([0, 1])
kept.me = kept  # a reader in a reference cycle, dropped
del kept
looked = fd.VideoClipDataset([good, bad], clip_len=4, clips_per_video="all", decoder="decord", on_error="skip",
                             index_cache=False)
for i in range(len(looked)):  # the user looks at every clip, some of them damaged
    looked[i]
ds = fd.VideoClipDataset([good], clip_len=4, clips_per_video=2, index_cache=False)
loader = DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork",
                    worker_init_fn=lambda _: gc.collect())
read = sum(len(b["clip"]) for b in loader)
gc.collect()  # in the parent, the garbage is freed as usual
import decord
decord_alive = [o for o in gc.get_objects() if isinstance(o, decord.VideoReader)]
print(json.dumps({"read": read, "skipped": looked.skipped, "decord_alive": len(decord_alive)}))
"""


def test_decord_garbage_from_the_parent_is_never_finalised_in_a_forked_worker(tmp_path: Path) -> None:
    """A decord reader that failed on a damaged video in the main process (or sits in a reference cycle)
    is garbage the parent has not collected yet; a forked worker's garbage collector would run decord's
    destructor, which deadlocks there. Every worker collects garbage first thing; run in a subprocess,
    so that a hang fails instead of blocking."""
    need("decord")
    good = make_videos(tmp_path, count=1, frames=60, codec="h264")[0]
    bad = damage(good, tmp_path / "damaged.mp4")
    out = run_script(GC_SCRIPT, good, bad, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["read"] == 2 and result["skipped"] > 0
    assert result["decord_alive"] == 0  # the parent keeps nothing alive


class CountOpen:
    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        sample["open_files"] = open_files(self.folder).total()
        return sample


@pytest.mark.parametrize("decoder", DECODERS)
def test_open_readers_per_worker_never_exceed_max_open(tmp_path: Path, decoder: str) -> None:
    need(decoder)
    folder = tmp_path / "many"
    paths = make_videos(folder, count=10, frames=12, codec="mjpg")
    ds = fd.VideoClipDataset(
        paths,
        clip_len=2,
        clips_per_video=3,
        max_open=3,
        decoder=decoder,
        index_cache=False,
        transform=CountOpen(str(folder)),
    )
    loader = DataLoader(
        ds,
        batch_size=3,
        sampler=ds.sampler(shuffle=True),
        num_workers=2,
        multiprocessing_context=multiprocessing.get_context("fork"),
        worker_init_fn=dump_stacks_if_stuck,
    )
    counts = [n for batch in loader for n in batch["open_files"].tolist()]
    assert len(counts) == 30
    assert max(counts) == 3  # the bound is reached, and never passed


ULIMIT_SCRIPT = """
import json, resource, sys, warnings
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))
import fastdata, fastdata.datasets.video._dataset
libs = sorted(m for m in ("av", "decord", "cv2", "torchcodec") if m in sys.modules)
from torch.utils.data import DataLoader
paths = sys.argv[2:]
ds = fastdata.VideoClipDataset(paths, clip_len=2, index_cache=False)
read = sum(len(b["clip"]) for b in DataLoader(ds, batch_size=8, sampler=ds.sampler(), num_workers=2))
unbounded = fastdata.VideoClipDataset(paths, clip_len=2, index_cache=False, max_open=100_000)
try:
    for i in range(len(unbounded)):
        unbounded[i]
    error = None
except Exception as e:
    error = f"{type(e).__name__}: {e}"
print(json.dumps({"libs": libs, "read": read, "clips": len(ds), "unbounded_error": error}))
"""


@pytest.mark.slow
def test_more_videos_than_ulimit_allows_open(tmp_path: Path) -> None:
    """100 videos under ``ulimit -n 64``: the bounded reader cache reads them all with 2 workers; with
    the bound lifted, the same process runs out of descriptors (so the limit really bites) and says so.
    Also checks that importing fastdata's video modules loads no decoder library."""
    paths = make_videos(tmp_path, count=100, frames=3, codec="mjpg")
    out = run_script(ULIMIT_SCRIPT, "64", *paths, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["libs"] == []
    assert result["read"] == result["clips"] == 100
    assert result["unbounded_error"] is not None and "too many open files" in result["unbounded_error"]
