"""Every ```python block of README.md and docs/*.md runs as a test (Sybil), on data made here.

A page is read like a script: its blocks run in order in one namespace, in a folder of its own that
holds the small, seeded data its examples name (``shards/``, ``data/``, ``videos/`` ...), with an S3
server behind the standard AWS environment for the pages that read ``s3://``. A block that cannot run
here (``torchrun``, NCCL, a DDP model) is a *fragment*: its info string is ``python fragment`` and its
first line a comment saying so (``# fragment: ...``), so the reader sees it; Sybil runs only blocks
whose info string is exactly ``python``, and ``tests/test_docs.py`` checks that every block is one or
the other.

The root ``conftest.py`` imports the collector and the fixture from here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

from tests.datagen import make_image_folder, make_shards
from tests.s3_server import MotoServer, upload_files

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/*.md")


def _shards(folder: str, prefix: str, count: int) -> list[str]:
    # 3 decodable JPEG samples a shard: the examples decode with decode="torch"
    return make_shards(folder, shards=count, per_shard=3, jpeg=True, prefix=prefix)


def _h5(folder: str, names: list[str]) -> None:
    from tests.hdf5_datagen import make_h5

    os.makedirs(folder, exist_ok=True)
    for k, name in enumerate(names):
        make_h5(os.path.join(folder, name), 40, first_key=40 * k, seed=k, blob=False)


def _photo_shards(folder: str, count: int, shards: int, prefix: str = "shard") -> None:
    """A photo folder as users have one (JPEG and PNG, 200-600 px, a few grayscale), converted into
    ``folder`` by ``fastdata convert``, manifest included."""
    from fastdata.convert import convert
    from tests.photogen import make_photo_folder

    make_photo_folder("photos-src", count=count, sizes=(200, 400))
    convert("photos-src", folder, shard_count=shards, prefix=prefix, progress=False, fsync=False)


def _readme(s3: Callable[[], Any]) -> None:
    _photo_shards("shards", count=100, shards=100)
    _h5("data", ["part-0.h5", "part-1.h5"])


def _bad_input(s3: Callable[[], Any]) -> None:
    make_shards("shards", shards=4, per_shard=3, prefix="train")  # keys s000000 .. s000011


def _bench(s3: Callable[[], Any]) -> None:
    _shards("data", "train", 100)
    make_image_folder("photos", classes=2, per_class=2)


def _distributed(s3: Callable[[], Any]) -> None:
    make_shards("data", shards=100, per_shard=6, prefix="train")  # 600 samples: the resume example skips 512
    _h5("data", ["books-0.h5", "books-1.h5"])  # 80 samples: the mixing example's second source


def _frameworks(s3: Callable[[], Any]) -> None:
    _shards("data", "train", 10)  # 30 samples


def _hdf5(s3: Callable[[], Any]) -> None:
    from tests.photogen import make_photo_folder

    _h5("data", ["train-0.h5", "train-1.h5"])
    make_photo_folder("photos", count=8, classes=2)


def _tar(s3: Callable[[], Any]) -> None:
    from tests.photogen import make_photo_folder

    make_photo_folder("data/train", count=18)  # real photos: JPEG and PNG of many sizes, a few grayscale
    s3().client().create_bucket(Bucket="my-bucket")


def _s3(s3: Callable[[], Any]) -> None:
    from fastdata.convert import convert

    server = s3()
    client = server.client()
    client.create_bucket(Bucket="bucket")
    make_image_folder("corpus", classes=2, per_class=8)
    upload_files(client, "bucket", {f"images/{p.relative_to('corpus')}": p for p in Path("corpus").rglob("*.jpg")})
    for shard in _shards("train", "train", 100):
        upload_files(client, "bucket", {os.path.basename(shard): shard})
    convert("corpus", "out", shard_count=4, progress=False, fsync=False)  # what ShardUploader uploads


def _convert(s3: Callable[[], Any]) -> None:
    make_image_folder("data/train", classes=3, per_class=6)


def _video(s3: Callable[[], Any]) -> None:
    from tests.videogen import make_videos

    make_videos("videos", count=4, frames=40)
    for c, name in enumerate(("jump", "run")):  # class folders: kinetics/<class>/<video>.mp4
        make_videos(f"kinetics/{name}", count=2, frames=20, seed=c)
    client = s3().client()
    client.create_bucket(Bucket="my-videos")
    upload_files(
        client, "my-videos", {f"train/{p.relative_to('kinetics')}": p for p in Path("kinetics").rglob("*.mp4")}
    )


def _inspect(s3: Callable[[], Any]) -> None:
    pass


def _monitor(s3: Callable[[], Any]) -> None:
    _shards("shards", "shard", 10)


def _performance(s3: Callable[[], Any]) -> None:
    _photo_shards("shards", count=18, shards=6, prefix="train")


# page -> what its examples read, made in the page's folder (the current directory)
DATA: dict[str, Callable[[Callable[[], Any]], None]] = {
    "README.md": _readme,
    "docs/bad-input.md": _bad_input,
    "docs/bench.md": _bench,
    "docs/convert.md": _convert,
    "docs/distributed.md": _distributed,
    "docs/frameworks.md": _frameworks,
    "docs/hdf5.md": _hdf5,
    "docs/inspect.md": _inspect,
    "docs/monitor.md": _monitor,
    "docs/performance.md": _performance,
    "docs/s3.md": _s3,
    "docs/tar.md": _tar,
    "docs/video.md": _video,
}


@pytest.fixture(scope="session")
def docs_s3_server() -> Iterator[MotoServer]:
    """A moto server for the pages that read or write ``s3://``, started only when one runs."""
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="module")
def docs_page(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The current directory while one page's blocks run (a module here is a page): a fresh folder
    holding the data the page's examples name. ``FASTDATA_CACHE_DIR`` points into it (video index,
    conversion staging), and for S3 pages the AWS environment points at ``docs_s3_server``."""
    page = Path(request.node.path).resolve().relative_to(ROOT).as_posix()
    folder = tmp_path_factory.mktemp(page.replace("/", "-").replace(".", "-"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("FASTDATA_CACHE_DIR", str(folder / ".cache"))

        def s3() -> MotoServer:
            server: MotoServer = request.getfixturevalue("docs_s3_server")
            for name, value in server.env().items():
                mp.setenv(name, value)
            return server

        if page not in DATA:
            raise AssertionError(f"{page} has Python examples but no data in tests/docs_examples.py DATA")
        DATA[page](s3)
        yield folder


def _teardown(namespace: dict[str, Any]) -> None:
    namespace.clear()  # drop the page's datasets and loaders (their handles, workers) with the page


sybil = Sybil(
    parsers=[PythonCodeBlockParser()],
    path=str(ROOT),
    patterns=list(PAGES),
    fixtures=["docs_page"],
    teardown=_teardown,
)
pytest_collect_file = sybil.pytest()

__all__ = ["docs_page", "docs_s3_server", "pytest_collect_file"]
