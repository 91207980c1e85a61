"""Videos in tar shards (issue 33, item 7): ``fastdata convert`` shards a folder of class folders of videos
(one sample per video: its bytes and its class number), and ``VideoClipDataset`` reads clips from the shards
in place (a byte range of the shard, through FFmpeg's subfile protocol), with the labels, the same pixels as
from the files, through real DataLoader workers and with each decoder."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.cli import main
from tests.videogen import frames_for, write_h264

CLASSES = ("jump", "run", "walk")


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("videos")
    for c, name in enumerate(CLASSES):
        (root / "src" / name).mkdir(parents=True)
        for j in range(2):
            write_h264(root / "src" / name / f"v{j}.mp4", frames_for(2 * c + j, 12), gop=4)
    assert main(["convert", str(root / "src"), str(root / "out"), "--shard-count", "2"]) == 0
    return root / "src", root / "out"


def test_convert_shards_a_video_folder_one_sample_per_video_with_its_label(
    converted: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = converted
    names = []
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            names += tar.getnames()
    assert sorted(n for n in names if n.endswith(".mp4")) == sorted(str(p.relative_to(src)) for p in src.rglob("*.mp4"))
    assert len([n for n in names if n.endswith(".cls")]) == 6
    with tarfile.open(sorted(out.glob("*.tar"))[0]) as tar:
        member = tar.getmember("jump/v0.mp4")
        f = tar.extractfile(member)
        assert f is not None and f.read() == (src / "jump" / "v0.mp4").read_bytes()  # the bytes, unchanged


@pytest.mark.parametrize("decoder", ["pyav", "decord", "opencv"])
def test_clips_from_shards_equal_clips_from_files_with_labels(converted: tuple[Path, Path], decoder: str) -> None:
    src, out = converted
    shards = str(out / "shard-{000000..000001}.tar")
    common = {"clip_len": 4, "clips_per_video": "all", "index_cache": False, "decoder": decoder}
    files = fd.VideoClipDataset(str(src), **common)
    packed = fd.VideoClipDataset(shards, **common)
    assert packed.classes == files.classes == sorted(CLASSES) and len(packed) == len(files) == 6 * 3
    assert packed.paths[0] == f"{out / 'shard-000000.tar'}#jump/v0.mp4"
    want = {(Path(s["path"]).parent.name, Path(s["path"]).name, int(s["frames"][0])): s for s in files}
    workers = 2 if decoder == "pyav" else 0
    n = 0
    for batch in DataLoader(packed, batch_size=4, num_workers=workers):
        for k, path in enumerate(batch["path"]):
            member = path.rpartition("#")[2]
            expected = want[(member.split("/")[0], member.split("/")[1], int(batch["frames"][k][0]))]
            assert torch.equal(batch["clip"][k], expected["clip"])
            assert int(batch["label"][k]) == expected["label"] == packed.classes.index(member.split("/")[0])
            n += 1
    assert n == len(files)
