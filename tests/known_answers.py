"""Loaders whose bottleneck is known, one per label, for the known-answer tests
(tests/test_bench_known_answers.py) and the repeated count (benchmarks/bench_known_answers.py).

Each case builds its data (small, seeded, in a folder it is given), sweeps a small grid with real
DataLoaders and returns the recommendation; ``expected`` is the label it must get. :func:`busy_core`
keeps one core busy meanwhile (a busy-loop subprocess), as a neighbour's job would. The sleeps inside
the synthetic datasets are their workload (a wait on a slow read or a set-up), not synchronisation.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import fastdata as fd
from fastdata.bench._synthetic import (
    CheapDataset,
    HeavyBatchDataset,
    HoldMemoryDataset,
    IOWaitDataset,
    ShuffleBufferDataset,
    SlowStartDataset,
)
from fastdata.core.system._procfs import pss
from fastdata.loading.observe import Monitor, Stats
from tests.user_workloads import (
    cold_reads,
    cold_reads_live,
    decode_threads,
    decode_threads_live,
    gil_threads,
    gil_threads_live,
    http_items,
    http_live,
    locked,
    locked_live,
    sleeping,
    sleeping_live,
)

QUICK = {"seconds": 1.0, "window": 0.25, "warmup": 0.25}  # what --quick measures
FULL = {"seconds": 2.5, "window": 0.5, "warmup": 0.5}  # a fuller run (the CLI's default is 6 s)


@contextlib.contextmanager
def busy_core() -> Iterator[subprocess.Popen[bytes]]:
    """One core kept busy by another program (a busy loop) while the block runs."""
    # it asks Linux to end it with its parent, so a run killed half-way leaves no busy loop behind
    loop = "import ctypes, signal\nctypes.CDLL(None).prctl(1, signal.SIGKILL)\nwhile True: pass"
    proc = subprocess.Popen([sys.executable, "-c", loop])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def tar_shards(folder: Path, shards: int = 4, per_shard: int = 128) -> str:
    """Page-cached tar shards of photo-like 256x256 JPEGs (built once per folder)."""
    from fastdata.bench.backends._tar import write_demo_shards

    pattern = str(folder / f"demo-{{000000..{shards - 1:06d}}}.tar")
    if not (folder / f"demo-{shards - 1:06d}.tar").exists():
        write_demo_shards(folder, shards=shards, per_shard=per_shard, size=(256, 256))
    for path in folder.glob("*.tar"):
        path.read_bytes()  # in the page cache
    return pattern


def videos(folder: Path) -> str:
    from fastdata.bench.backends._video import write_demo_videos

    if not any(folder.glob("*.mp4")):
        write_demo_videos(folder, videos=4)
    return str(folder)


def cpu_decode(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """Local page-cached JPEG decode from tar, dataset-batched, with a 20 ms training step: the
    workers decode all the time and cannot keep up. Epochs of 1024 samples: restarting the workers
    is a small part of an epoch, as in training."""
    pattern = tar_shards(folder / "tar8", shards=8)
    result = fd.bench.sweep(
        lambda: fd.TarShardDataset(pattern, decode="torch", shuffle=True, batch_size=64),
        workers=[1, 2],
        batch_size=None,
        collate_fn=fd.as_is,
        step_time=0.02,
        persistent_workers=[False],
        **timing,
    )
    return fd.bench.recommend(result)


def helper_thread(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """Video clips at no workers: the decoding runs on the watchdog's helper thread
    ('fastdata-decode'), while the main thread waits for it."""
    root = videos(folder / "videos")
    index = str(folder / "video-index.json")
    result = fd.bench.sweep(
        lambda: fd.VideoClipDataset(root, clip_len=8, frame_stride=2, clips_per_video=16, index_cache=index),
        workers=[0],
        batch_size=8,
        main_threads=1,  # collate's torch.stack on two threads stalls behind the busy core (see the notes)
        **timing,
    )
    return fd.bench.recommend(result)


def shuffle_fill(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """A decode-then-shuffle pipeline (as webdataset's ``.decode().shuffle(n)``) whose buffer is three quarters of
    each worker's part of a short epoch: each epoch's first batch waits for the worker to fill it,
    persistent workers or not; the rest keeps up with the step. (fastdata's own TarShardDataset shuffles
    undecoded bytes, so its fill is cheap.)"""
    result = fd.bench.sweep(
        ShuffleBufferDataset(n=512, window=192, delay=0.002),
        workers=[2],
        batch_size=32,
        step_time=0.02,
        persistent_workers=[True],
        **timing,
    )
    return fd.bench.recommend(result)


def fork_cost(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """A 2 GiB parent (allocated and touched before the sweep), cheap items, short epochs, workers
    that do not persist: every epoch forks the workers again, copying the parent's page tables."""
    parent = bytearray(2 << 30)
    np.frombuffer(parent, dtype=np.uint8)[::4096] = 1  # touch every page: resident
    try:
        result = fd.bench.sweep(
            CheapDataset(n=256),
            workers=[2],
            batch_size=8,
            persistent_workers=[False],
            multiprocessing_context="fork",
            **timing,
        )
    finally:
        del parent
    return fd.bench.recommend(result)


def worker_init(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """Each worker's first item waits 0.3 s (an index built per process), with short epochs and
    workers that do not persist."""
    result = fd.bench.sweep(
        SlowStartDataset(n=256, setup=0.3), workers=[2], batch_size=8, persistent_workers=[False], **timing
    )
    return fd.bench.recommend(result)


def main_process(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """Batches of long Python lists: the main process unpickles them all."""
    # items that wait 10 ms: 4 workers make 100 batches/s, twice what the main process unpickles on a fast
    # core (~4.6 ms an item), so the main process is the limit with a margin (at the default 20 ms the two
    # were within 10% of each other on CI's machine, and the workers' sleep was sometimes the limit)
    ds = HeavyBatchDataset(delay=0.01)
    result = fd.bench.sweep(ds, workers=[4, 8], batch_size=4, collate_fn=ds.collate_fn, **timing)
    return fd.bench.recommend(result)


def ipc(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """Items that cost nothing: moving them to the main process costs more than making them."""
    result = fd.bench.sweep(CheapDataset(), workers=[0, 1], batch_size=64, **timing)
    return fd.bench.recommend(result)


def step_bound(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """A 100 ms step and a loader that makes a batch in ~10 ms: the step sets the pace."""
    ds = IOWaitDataset(delay=0.001, tensor=False)
    result = fd.bench.sweep(ds, workers=[1, 2], batch_size=8, collate_fn=list, step_time=0.1, **timing)
    return fd.bench.recommend(result)


def memory(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """Workers that each hold 300 MiB, with a budget of 400 MiB above what the parent holds."""
    budget = pss(__import__("os").getpid()) + (400 << 20)
    ds = HoldMemoryDataset(nbytes=300 << 20)
    result = fd.bench.sweep(ds, workers=[2], batch_size=8, memory=budget, **timing)
    return fd.bench.recommend(result)


def storage(folder: Path, timing: dict[str, Any], *, s3: Any = None, **_: Any) -> fd.bench.Recommendation:
    """Small objects on the local S3 server behind the fault proxy, 100 ms of latency added to every
    request: the workers wait for bytes."""
    if s3 is None:
        raise ValueError("the storage case needs (server, proxy, bucket)")
    server, proxy, bucket = s3
    from fastdata.storage.s3._client import S3Config

    proxy.configure(latency_ms=100)
    client = server.client()
    rng = np.random.default_rng(0)
    keys = [f"obj/{i:04d}.bin" for i in range(64)]
    listed = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="obj/").get("Contents", [])}
    for key in keys:
        if key not in listed:
            client.put_object(Bucket=bucket, Key=key, Body=rng.bytes(2048))
    client.close()
    options = {**server.options(), "endpoint_url": proxy.endpoint_url}
    urls = [f"s3://{bucket}/{k}" for k in keys]
    result = fd.bench.sweep(
        lambda: fd.S3Dataset(urls, config=S3Config(**options)), workers=[0, 2], batch_size=8, **timing
    )
    return fd.bench.recommend(result)


def gzip_hdf5(folder: Path, n: int = 2048) -> str:
    """A gzip-compressed HDF5 file of 64x64x3 images in chunks of 8 rows, in the page cache (built once per
    folder): every read decompresses inside h5py, on the CPU, under h5py's lock."""
    import h5py

    path = folder / "gzip.h5"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        with h5py.File(path, "w") as f:
            images = rng.integers(0, 64, (n, 64, 64, 3), dtype=np.uint8)  # compressible, not trivially
            f.create_dataset("image", data=images, chunks=(8, 64, 64, 3), compression="gzip", compression_opts=6)
            f.create_dataset("label", data=rng.integers(0, 10, n))
    path.read_bytes()  # in the page cache
    return str(path)


def hdf5_cached(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """A page-cached local gzip HDF5 file read by 2 workers while another program holds a core: the workers
    decompress in fetch and wait for a core, and the looks see no network, no disk. Issue 35: labelled
    "Storage-bound ... the wait is on the network or a remote store" from fetch time above CPU time alone."""
    path = gzip_hdf5(folder / "h5")
    result = fd.bench.sweep(lambda: fd.HDF5Dataset(path), workers=[2], batch_size=32, **timing)
    return fd.bench.recommend(result)


def hdf5_threads(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """The same file read by 4 loader threads of one process: h5py serialises its calls on one lock per
    process, and the threads are starved of cores besides; CPU-bound, the lock named, processes advised."""
    path = gzip_hdf5(folder / "h5")
    result = fd.bench.sweep(lambda: fd.HDF5Dataset(path), modes=["threads"], threads=[4], batch_size=32, **timing)
    return fd.bench.recommend(result)


RESTART_SETUP = 0.35  # seconds of set-up per worker and epoch (an index opened per process)
RESTART_EPOCH = 8 * 48  # samples an epoch: 48 batches of 8, about a second of 20 ms steps


def restarts(folder: Path, timing: dict[str, Any], **_: Any) -> fd.bench.Recommendation:
    """A training step of 20 ms and epochs of about a second, workers started at every epoch (the default),
    each with 0.35 s of set-up: the loop mostly keeps up, and what it waits is most of it the restarts (issue
    35's DDP case, which the monitor called "unknown"; at 0.2 s the restarts were 49% of the wait once under
    CI's busy core, at the rule's half)."""
    result = fd.bench.sweep(
        SlowStartDataset(n=RESTART_EPOCH, setup=RESTART_SETUP),
        workers=[2],
        batch_size=8,
        step_time=0.02,
        persistent_workers=[False],
        **timing,
    )
    return fd.bench.recommend(result)


def restarts_live(folder: Path, timing: dict[str, Any]) -> Stats:
    """The same inside a training loop: fd.Loader under the monitor, epochs one after another."""
    loader = fd.Loader(
        SlowStartDataset(n=RESTART_EPOCH, setup=RESTART_SETUP),
        batch_size=8,
        num_workers=2,
        monitor=Monitor(to=lambda s: None, seconds=3600),
    )
    try:
        for _ in range(4):
            for _batch in loader:
                time.sleep(0.02)  # the training step (a GPU's): the workload, not synchronisation
        stats = loader.stats(since="start")
    finally:
        loader.close()
    assert stats is not None
    return stats


@dataclass(frozen=True)
class Case:
    """A loader whose bottleneck is known.

    Attributes:
        name (str), expected (str): what it is, and the label it must get.
        run: ``run(folder, timing, s3=...)``: the offline sweep's recommendation.
        needs_s3 (bool): the case reads the local S3 server behind the fault proxy.
        live: ``live(folder, timing)``: the same loader inside a training loop under the monitor, its report
            over the run (None: the case is offline only); the label must be the same as offline.
        says (tuple[str, ...]): words the diagnosis (and the live report's evidence and advice) must hold.
        full (bool): measured again at the fuller timing too (default): where a longer run sees more, an epoch's
            restart inside the windows (start-up labels) or more looks at producers that wait (storage, sleep,
            lock, and the page-cached HDF5 file labelled storage in 3 of 4 runs before). False for labels read
            from busy shares (cpu, main-process, ipc, step, memory), which a quick window measures as well: the
            fuller run only cost time (~60 s of the file's ~215 s on 2 cores).
    """

    name: str
    expected: str
    run: Callable[..., fd.bench.Recommendation]
    needs_s3: bool = False
    live: Callable[..., Stats] | None = None
    says: tuple[str, ...] = ()
    full: bool = True


USERS = (
    Case("plain dataset over a loopback HTTP server, 5 ms a request", "storage", http_items, live=http_live),
    Case("plain dataset whose items sleep 5 ms", "sleep", sleeping, live=sleeping_live),
    Case("plain dataset waiting on a lock another thread holds", "lock", locked, live=locked_live),
    Case("GIL-bound Python in loader threads", "cpu", gil_threads, live=gil_threads_live, full=False),
    Case("GIL-releasing JPEG decode in loader threads", "cpu", decode_threads, live=decode_threads_live, full=False),
    Case("plain dataset reading with the page cache dropped", "storage", cold_reads, live=cold_reads_live),
)
"""Users' workloads (issue 22): plain torch datasets and real waits, each offline and live."""

CASES = (
    *USERS,
    Case("tar JPEG decode, 20 ms step", "cpu", cpu_decode, full=False),
    Case("video decode on a helper thread, 0 workers", "cpu", helper_thread, full=False),
    Case("shuffle window fills the first batch", "shuffle-fill", shuffle_fill),
    Case("2 GiB parent forks workers every epoch", "fork", fork_cost),
    Case("slow per-worker set-up", "worker-init", worker_init),
    Case("huge Python batches", "main-process", main_process, full=False),
    Case("trivially cheap items", "ipc", ipc, full=False),
    Case("100 ms training step", "step", step_bound, full=False),
    Case("workers over the memory budget", "memory", memory, full=False),
    Case("S3 with 100 ms of latency (fault proxy)", "storage", storage, needs_s3=True),
    Case("page-cached gzip HDF5, 2 workers, a core taken", "cpu", hdf5_cached, says=("waiting for a core",)),
    Case("gzip HDF5 in 4 loader threads: h5py's lock", "cpu", hdf5_threads, says=("lock",), full=False),
    Case(
        "workers restarted every epoch, 0.35 s set-up, 20 ms step",
        "worker-init",
        restarts,
        live=restarts_live,
        says=("persistent_workers=True would save the workers' launch, set-up",),
    ),
)

__all__ = ["CASES", "FULL", "QUICK", "USERS", "Case", "busy_core"]
