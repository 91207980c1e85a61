"""The backends the distributed and resume tests run over: one entry per dataset class.

Adding a backend is one entry in :data:`BACKENDS`: a function that writes small seeded data into a
folder and returns the identity of every sample, and a function that builds the dataset from that
folder. The torchrun worker (``tests/dist_worker.py``) and the in-process tests (``test_resume.py``,
``test_distributed_plan.py``) all build their datasets and loaders through here.

Backends on S3 (``needs_s3``) keep their objects on the test session's moto server and find it through
the standard AWS chain (``AWS_ENDPOINT_URL`` ..., set by the ``s3_env`` fixture and inherited by the
torchrun ranks and their workers); the local folder then holds only the URL of their data.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastdata as fd
from tests.datagen import make_shards

SEED = 11
BATCH = 4


@dataclass(frozen=True)
class DistBackend:
    """How the tests drive one dataset class.

    Attributes:
        prepare: ``prepare(folder) -> keys``: write the data into ``folder`` (created by the caller, once
            per test session) and return the identity of every sample. Aim for an odd count of a few dozen
            samples, so that two ranks cannot split it evenly.
        make: ``make(folder, *, seed, shuffle, remainder, batch_size, drop_last, rank, world_size)``: the
            dataset. A map-style dataset may ignore ``shuffle``/``remainder``/``batch_size``/``drop_last``
            (the Loader passes them to its ``sampler()``); an iterable one must plan with them.
        keys_of: the identities of the samples of one batch.
        iterable: True for an IterableDataset (it batches itself), False for a map-style dataset.
        needs_s3: the data lives on the S3 server of the ``s3_env`` fixture.
        slow: reading costs milliseconds a sample (a server's round trip, a video decoder): the in-process
            tests try fewer resume positions and world sizes (every one is tried on the fast backends,
            and the planning code is the same).
    """

    prepare: Callable[[Path], list[str]]
    make: Callable[..., Any]
    keys_of: Callable[[Any], list[str]]
    iterable: bool
    needs_s3: bool = False
    slow: bool = False


def _tar_data(folder: Path) -> list[str]:
    # 3 shards of 11: 33 samples, odd, and fewer shards than 2 ranks x 2 workers
    make_shards(folder, shards=3, per_shard=11, seed=1)
    return [f"s{i:06d}" for i in range(33)]


def _tar_urls(folder: Path) -> list[str]:
    return sorted(str(p) for p in Path(folder).glob("*.tar"))


def _make_tar_shards(
    folder: Path,
    *,
    seed: int,
    shuffle: bool,
    remainder: str,
    batch_size: int,
    drop_last: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
) -> Any:
    return fd.TarShardDataset(
        _tar_urls(folder),
        seed=seed,
        shuffle=shuffle,
        shuffle_window=8,
        batch_size=batch_size,
        drop_last=drop_last,
        remainder=remainder,
        rank=rank,  # type: ignore[arg-type]
        world_size=world_size,
    )


def _make_indexed_tar(
    folder: Path, *, seed: int, rank: int | None = None, world_size: int | None = None, **_: Any
) -> Any:
    return fd.IndexedTarDataset(_tar_urls(folder), seed=seed, rank=rank, world_size=world_size)


def _tar_keys(batch: Any) -> list[str]:
    return list(batch["__key__"])


def _hdf5_data(folder: Path) -> list[str]:
    from tests.hdf5_datagen import make_files

    make_files(folder, (11, 13, 9))  # 33 samples in three files of three layouts
    return [str(i) for i in range(33)]


def _make_hdf5(folder: Path, *, seed: int, rank: int | None = None, world_size: int | None = None, **_: Any) -> Any:
    files = sorted(str(p) for p in Path(folder).glob("*.h5"))
    return fd.HDF5Dataset(files, ("image", "label", "key"), seed=seed, rank=rank, world_size=world_size)


def _hdf5_keys(batch: Any) -> list[str]:
    return [str(k) for k in batch["key"].tolist()]


# 3 videos of 22 frames, clips of 2 frames every 2 frames: 11 clips each, 33 in all
VIDEO_FRAMES, CLIP_LEN = 22, 2


def _video_data(folder: Path) -> list[str]:
    from tests.videogen import make_videos

    make_videos(folder, count=3, frames=VIDEO_FRAMES, seed=2)
    _make_video(folder, seed=0)  # probes the videos once, into the index file every later build reads
    return [f"{v}:{f}" for v in range(3) for f in range(0, VIDEO_FRAMES, CLIP_LEN)]


def _make_video(folder: Path, *, seed: int, rank: int | None = None, world_size: int | None = None, **_: Any) -> Any:
    return fd.VideoClipDataset(
        sorted(str(p) for p in Path(folder).glob("*.mp4")),
        clip_len=CLIP_LEN,
        clips_per_video="all",
        index_cache=Path(folder) / "index.json",
        seed=seed,
        rank=rank,
        world_size=world_size,
    )


def _video_keys(batch: Any) -> list[str]:
    from tests.videogen import read_stamp

    keys = []
    for clip, video, frames in zip(batch["clip"], batch["video"].tolist(), batch["frames"].tolist()):
        # the pixels must be the frames the sample names
        assert [read_stamp(f) for f in clip.numpy()] == [(video, f) for f in frames], (video, frames)
        keys.append(f"{video}:{frames[0]}")
    return keys


def _s3_client() -> Any:
    import boto3

    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        raise RuntimeError("S3 backends need the test S3 server: request the s3_env fixture")
    return boto3.client("s3", endpoint_url=endpoint)


def _bucket(folder: Path) -> str:
    """One bucket per data folder (each test session's folders are new)."""
    return "dist-" + hashlib.sha1(str(Path(folder).resolve()).encode()).hexdigest()[:16]


def _s3_objects_data(folder: Path) -> list[str]:
    import numpy as np

    bucket, s3 = _bucket(folder), _s3_client()
    s3.create_bucket(Bucket=bucket)
    rng = np.random.default_rng(3)
    keys = [f"s{i:06d}" for i in range(33)]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=f"objects/{key}.bin", Body=rng.bytes(int(rng.integers(1, 300))))
    (Path(folder) / "source.txt").write_text(f"s3://{bucket}/objects/")
    return keys


def _make_s3_objects(
    folder: Path, *, seed: int, rank: int | None = None, world_size: int | None = None, **_: Any
) -> Any:
    # the prefix is listed at every build, as a training script does at every start
    return fd.S3Dataset((Path(folder) / "source.txt").read_text(), seed=seed, rank=rank, world_size=world_size)


def _s3_keys(batch: Any) -> list[str]:
    return [k.rsplit("/", 1)[-1] for k in batch["__key__"]]


def _mix_data(folder: Path) -> list[str]:
    # a tar source (33 samples in 3 shards) and an HDF5 one (33 in 3 files): by default (weights proportional
    # to the sizes, an epoch as long as both) every epoch reads each source once, every sample exactly once
    (Path(folder) / "tar").mkdir()
    (Path(folder) / "h5").mkdir()
    tar, h5 = _tar_data(Path(folder) / "tar"), _hdf5_data(Path(folder) / "h5")
    return [f"t:{k}" for k in tar] + [f"h:{k}" for k in h5]


def mix_key_of_tar(sample: dict[str, Any]) -> dict[str, Any]:
    return {"key": f"t:{sample['__key__']}"}


def mix_key_of_h5(sample: dict[str, Any]) -> dict[str, Any]:
    return {"key": f"h:{int(sample['key'])}"}


def make_mix_sources(folder: Path, *, seed: int = SEED) -> dict[str, Any]:
    """The two sources of the ``mix`` backend, their samples made alike (``{"key": ...}``)."""
    tar = fd.TarShardDataset(
        _tar_urls(Path(folder) / "tar"), seed=seed, shuffle=True, shuffle_window=8, transform=mix_key_of_tar
    )
    files = sorted(str(p) for p in (Path(folder) / "h5").glob("*.h5"))
    h5 = fd.HDF5Dataset(files, ("image", "label", "key"), seed=seed, transform=mix_key_of_h5)
    return {"tar": tar, "h5": h5}


def _make_mix(folder: Path, *, seed: int, rank: int | None = None, world_size: int | None = None, **_: Any) -> Any:
    return fd.Mix(make_mix_sources(folder, seed=seed), seed=seed, rank=rank, world_size=world_size)


def _mix_keys(batch: Any) -> list[str]:
    return list(batch["key"])


BACKENDS: dict[str, DistBackend] = {
    "tar_shards": DistBackend(_tar_data, _make_tar_shards, _tar_keys, iterable=True),
    "indexed_tar": DistBackend(_tar_data, _make_indexed_tar, _tar_keys, iterable=False),
    "hdf5": DistBackend(_hdf5_data, _make_hdf5, _hdf5_keys, iterable=False),
    "video": DistBackend(_video_data, _make_video, _video_keys, iterable=False, slow=True),
    "s3_objects": DistBackend(_s3_objects_data, _make_s3_objects, _s3_keys, iterable=False, needs_s3=True, slow=True),
    # fd.Mix of a tar and an HDF5 source: map-style, read through its own sampler like the others
    "mix": DistBackend(_mix_data, _make_mix, _mix_keys, iterable=False),
    # (TarShardDataset on S3 is left out: it cost ~12 s of torchrun and ~15 s in process, for the same planning
    # code as "tar_shards"; tests/test_s3_conformance.py reads it through DataLoader workers)
}
FAST = [name for name, backend in BACKENDS.items() if not backend.slow]


def make_dataset(
    name: str,
    folder: str | os.PathLike[str],
    *,
    seed: int = SEED,
    shuffle: bool = True,
    remainder: str = "drop",
    batch_size: int = BATCH,
    drop_last: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
) -> Any:
    """Backend ``name``'s dataset over ``folder`` (rank and world size detected unless given)."""
    return BACKENDS[name].make(
        Path(folder),
        seed=seed,
        shuffle=shuffle,
        remainder=remainder,
        batch_size=batch_size,
        drop_last=drop_last,
        rank=rank,
        world_size=world_size,
    )


def make_loader(
    name: str,
    folder: str | os.PathLike[str],
    *,
    num_workers: int,
    seed: int = SEED,
    shuffle: bool = True,
    remainder: str = "drop",
    batch_size: int = BATCH,
    drop_last: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    **dataloader_kwargs: Any,
) -> fd.Loader:
    """A :class:`fastdata.Loader` over backend ``name``, planned with the given options."""
    ds = make_dataset(
        name,
        folder,
        seed=seed,
        shuffle=shuffle,
        remainder=remainder,
        batch_size=batch_size,
        drop_last=drop_last,
        rank=rank,
        world_size=world_size,
    )
    # shuffle/remainder/drop_last go to the Loader for both kinds: for an iterable dataset it checks they
    # agree with the dataset's own
    return fd.Loader(
        ds,
        batch_size=batch_size,
        num_workers=num_workers,
        shuffle=shuffle,
        remainder=remainder,
        drop_last=drop_last,
        **dataloader_kwargs,
    )  # type: ignore[arg-type]


def make_stateful(
    name: str,
    ds: Any,
    *,
    num_workers: int,
    shuffle: bool = True,
    remainder: str = "drop",
    batch_size: int = BATCH,
    **kwargs: Any,
) -> Any:
    """A ``torchdata`` ``StatefulDataLoader`` over ``ds``, built by fastdata's builder (as ``fd.Loader``
    builds its DataLoader). ``batch_sampler=`` in ``kwargs`` replaces the dataset's ``sampler()``."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from fastdata.loading._builder import build_dataloader
    from fastdata.loading._plan import ReadPlan

    if "batch_sampler" in kwargs:
        plan = ReadPlan(batch_sampler=kwargs.pop("batch_sampler"), shuffle=shuffle)
    else:
        plan = ReadPlan(batch_size, shuffle=shuffle, remainder=remainder)
    return build_dataloader(ds, plan, num_workers=num_workers, dataloader_class=StatefulDataLoader, **kwargs)


def batch_keys(name: str, batches: Any, limit: int | None = None) -> list[list[str]]:
    """The keys of each batch from ``batches``, stopping after ``limit`` batches."""
    keys_of = BACKENDS[name].keys_of
    out: list[list[str]] = []
    if limit == 0:
        return out
    for batch in batches:
        out.append(keys_of(batch))
        if limit is not None and len(out) >= limit:
            break
    return out
