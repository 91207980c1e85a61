"""The HDF5 and video backends of ``fastdata bench``: detection of every SPEC form, open() and its
options, the demo data, and the stage hooks the datasets report to the harness. Real HDF5 files and
real H.264 videos, made here."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.bench import backends
from fastdata.bench._loop import make_loader
from fastdata.bench._result import Config
from fastdata.bench.backends import _hdf5 as hdf5_backend
from fastdata.bench.backends import _video as video_backend
from fastdata.core import stages
from fastdata.core.errors import ConfigError


@pytest.fixture
def probing() -> Iterator[None]:
    """Stage probes on in this process (as ``fastdata bench`` turns them on in each worker)."""
    stages.enable()
    try:
        yield
    finally:
        stages.disable()


def counted(stage: str) -> float:
    """Items the stage has counted in this process since the probes were turned on."""
    return stages.totals()[stage][1]


# -- HDF5 -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h5_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return hdf5_backend.write_demo_file(tmp_path_factory.mktemp("h5") / "demo.h5", samples=300)


def test_hdf5_is_detected_by_name_signature_or_folder(h5_file: str, tmp_path: Path) -> None:
    for spec in (h5_file, "data/*.h5", "data/part-{0..3}.hdf5", "data/x.HDF5"):
        assert backends.detect(spec).name == "hdf5", spec
    plain = tmp_path / "data.bin"  # no extension: HDF5's signature tells
    shutil.copy(h5_file, plain)
    assert backends.detect(str(plain)).name == "hdf5"
    assert backends.detect(str(Path(h5_file).parent)).name == "hdf5"  # a folder of .h5 files
    other = tmp_path / "notes.bin"
    other.write_bytes(b"not an HDF5 file at all, just some bytes" * 100)
    assert not hdf5_backend.detect(str(other))
    assert not hdf5_backend.detect(str(tmp_path / "missing"))
    # an HDF5 name on S3 is the hdf5 backend's, whose dataset says to copy it to local disk
    with pytest.raises(ConfigError, match="local files only"):
        backends.detect("s3://bucket/train.h5").open("s3://bucket/train.h5")


def test_hdf5_open_finds_the_fields_and_checks_the_options(tmp_path: Path) -> None:
    n = 12
    path = tmp_path / "custom.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(n * 3, dtype=np.float32).reshape(n, 3))
        f.create_dataset("group/y", data=np.arange(n, dtype=np.int64))
        f.create_dataset("meta", data=np.arange(5))  # another length: not a field of the samples
    ds = hdf5_backend.open(str(path))
    assert ds.fields == ("group/y", "x") and len(ds) == n  # in HDF5's (name) order
    assert hdf5_backend.open(str(path), fields="x").fields == ("x",)  # -o fields=x
    assert hdf5_backend.open(str(tmp_path)).fields == ("group/y", "x")  # the folder's files
    with pytest.raises(ConfigError, match=r"unknown option\(s\) chunks.*known: decode"):
        hdf5_backend.open(str(path), chunks=4)
    with pytest.raises(fd.SourceNotFound, match=r"missing\.h5"):
        hdf5_backend.open(str(tmp_path / "missing.h5"))


def test_hdf5_demo_data_reads_through_its_collate_and_reports_fetch(tmp_path: Path, probing: None) -> None:
    backend = backends.get("hdf5")
    with backend.demo(tmp_path, scale=0.02) as data:
        ds = backend.open(data.spec, **data.options)
    assert Path(data.spec).is_file() and len(ds) == round(hdf5_backend.DEMO_SAMPLES * 0.02)
    assert ds.fields == ("image", "label")
    # the harness collates with the dataset's own collate, as its docs tell users to
    loader = make_loader(ds, Config(0, None, False, False, 16))
    assert loader.collate_fn is fd.HDF5Dataset.collate
    batch = next(iter(loader))
    assert tuple(batch["image"].shape) == (16, *hdf5_backend.DEMO_SHAPE) and batch["label"].shape == (16,)
    assert counted("fetch") == 16 and counted("decode") == 0  # raw arrays: nothing to decode
    with_transform = fd.HDF5Dataset(data.spec, transform=lambda s: s["label"])
    assert len(with_transform.__getitems__([3, 1, 2])) == 3
    assert counted("fetch") == 19 and counted("transform") == 3


# -- video ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("videos")
    video_backend.write_demo_videos(folder / "class_a", videos=2, frames=30, size=(32, 48), gop=10)
    return folder


def test_video_is_detected_by_extension_or_a_folder_of_videos(videos: Path, tmp_path: Path) -> None:
    for spec in ("clips/v000.mp4", "clips/*.mkv", "clips/v{000..009}.AVI", str(videos / "class_a")):
        assert backends.detect(spec).name == "video", spec
    assert backends.detect(str(videos)).name == "video"  # videos one level down (class folders)
    (tmp_path / "readme.txt").write_text("no videos here")
    assert not video_backend.detect(str(tmp_path))
    with pytest.raises(ConfigError, match="cache_dir=False cannot work"):  # s3:// videos: through the cache
        backends.detect("s3://bucket/v.mp4").open("s3://bucket/v.mp4", index_cache=False, cache_dir=False)


def test_video_open_takes_json_lists_and_checks_the_options(videos: Path, tmp_path: Path) -> None:
    ds = video_backend.open(str(videos), clip_len=4, size=[16, 24], stagger=[0, 0], index_cache=False)
    assert len(ds) == 2 and tuple(ds[0]["clip"].shape) == (4, 16, 24, 3)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) fps.*known: .*clip_len"):
        video_backend.open(str(videos), fps=10)


def test_video_demo_builds_clips_and_reports_fetch_decode_transform(tmp_path: Path, probing: None) -> None:
    backend = backends.get("video")
    with backend.demo(tmp_path, scale=0.05) as data:
        ds = backend.open(data.spec, **data.options)
    index = Path(data.options["index_cache"])
    assert index.parent == tmp_path and index.exists()  # the probes went there, not to the user's cache
    n_videos = len(list(Path(data.spec).glob("*.mp4")))
    assert n_videos == 2 and len(ds) == n_videos * video_backend.DEMO_OPTIONS["clips_per_video"]
    batch = next(iter(DataLoader(ds, batch_size=3, sampler=ds.sampler())))
    assert tuple(batch["clip"].shape) == (3, 8, *video_backend.DEMO_SIZE, 3)
    assert counted("fetch") == 3 and counted("decode") == 3 and counted("transform") == 0
    shaped = fd.VideoClipDataset(data.spec, clip_len=2, index_cache=index, transform=lambda s: s["frames"])
    assert len(shaped.__getitems__([0, 1])) == 2
    assert counted("decode") == 5 and counted("transform") == 2
