"""Every valid video is read, by the chosen decoder or, where it cannot be exact, by the fallback; and
``size=`` gives the same pixels whichever decoder decoded (one resize, after decode, for all)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import av
import numpy as np
import pytest

import fastdata as fd
from fastdata.formats.video import DecoderFallbackWarning, VideoUnsupported, open_video
from tests.test_video_readers import DECODERS, need
from tests.videogen import frames_for, read_stamp, write_h264, write_opencv, write_pyav, write_scene_cuts

N = 60


def keyframes(path: str) -> list[int]:
    """The stream's keyframes, by frame number (in presentation order)."""
    with av.open(path) as container:
        packets = sorted((p for p in container.demux(video=0) if p.pts is not None), key=lambda p: p.pts)
        return [i for i, p in enumerate(packets) if p.is_keyframe]


def test_decord_reads_x264_scene_cut_keyframes_it_does_not_list(tmp_path: Path) -> None:
    need("decord")
    import decord

    path = write_scene_cuts(tmp_path / "cuts.mp4", N)
    listed = [int(k) for k in decord.VideoReader(path).get_key_indices()]
    assert set(listed) < set(keyframes(path))  # the case: decord leaves a scene-cut I-frame out
    with warnings.catch_warnings():
        warnings.simplefilter("error", DecoderFallbackWarning)
        ds = fd.VideoClipDataset(path, clip_len=6, clips_per_video="all", decoder="decord", index_cache=False)
    assert ds.counters()["fallbacks"] == 0 and ds.fallback_videos == []
    assert len(ds) == N // 6
    for i in range(len(ds)):
        sample = ds[i]
        assert [read_stamp(f)[1] for f in sample["clip"].numpy()] == sample["frames"].tolist()


def test_a_video_the_decoder_refuses_is_read_by_the_fallback_and_counted(tmp_path: Path) -> None:
    need("decord")
    good = write_h264(tmp_path / "a.mp4", frames_for(0, 40))
    # x265's open GOPs: decord's keyframes are not the stream's, and it would read other frames after a seek
    hevc = write_pyav(tmp_path / "b.mp4", [frames_for(1, 40)], codec="libx265", bframes=4)
    with pytest.raises(VideoUnsupported, match=r"b\.mp4: decord does not read this video.*decoder='pyav'"):
        fd.VideoClipDataset([good, hevc], clip_len=4, decoder="decord", fallback=None, index_cache=False)
    with pytest.warns(DecoderFallbackWarning, match=r"1 of 2 videos are read with decoder='pyav'.*b\.mp4"):
        ds = fd.VideoClipDataset([good, hevc], clip_len=4, clips_per_video="all", decoder="decord", index_cache=False)
    assert ds.counters()["fallbacks"] == 1 and ds.fallback_videos == [hevc] and ds.skipped == 0
    seen = {0: 0, 1: 0}
    for i in range(len(ds)):
        sample = ds[i]
        stamps = [read_stamp(f) for f in sample["clip"].numpy()]
        assert stamps == [(sample["video"], int(f)) for f in sample["frames"]]
        seen[sample["video"]] += 1
    assert seen == {0: 10, 1: 10}


def test_a_decoder_that_cannot_load_gives_fastdatas_error_naming_the_fallback(tmp_path: Path) -> None:
    # torchcodec 0.14+ on a CPU-only machine: its native library fails to load with an OSError at import
    fake = tmp_path / "site" / "torchcodec"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise OSError('libnvrtc.so.13: cannot open shared object file: No such file or directory')\n"
    )
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(fake.parent)!r})
        import fastdata as fd
        from fastdata.formats.video import DecoderUnavailable
        try:
            fd.VideoClipDataset({str(tmp_path)!r}, decoder="torchcodec")
        except DecoderUnavailable as e:
            assert isinstance(e, ImportError)
            print(e)
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "decoder='torchcodec' cannot load torchcodec.decoders here (OSError: libnvrtc.so.13" in out
    assert "torchcodec 0.13.0" in out and "use decoder='pyav'" in out


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("resize")
    return {
        "h264": write_h264(root / "a.mp4", frames_for(0, 30, size=(320, 240))),
        "mp4v": write_opencv(root / "b.mp4", frames_for(1, 30, size=(320, 240))),
    }


@pytest.mark.parametrize("size", [(112, 112), (64, 96), (200, 300), (300, 400)])
@pytest.mark.parametrize("decoder", [d for d in DECODERS if d != "pyav"])
def test_size_gives_the_same_pixels_from_every_decoder(stored: dict[str, str], decoder: str, size: tuple) -> None:
    need(decoder)
    clip = [0, 5, 11, 17, 29]
    for path in stored.values():
        with open_video(path, "pyav", size=size) as reference, open_video(path, decoder, size=size) as reader:
            want, got = reference.get_frames(clip).astype(np.int16), reader.get_frames(clip).astype(np.int16)
        assert got.shape == want.shape == (len(clip), *size, 3)
        # the decoders' own RGB conversions differ by a level or two at native size; before the one
        # resize, OpenCV's frames differed from PyAV's by up to 150 levels here, decord's by 54
        assert np.abs(got - want).max() <= 4, f"{decoder} at {size} on {Path(path).name}"


def test_batching_clips_of_different_sizes_names_size_not_decode(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from fastdata.core.errors import CannotBatch
    from fastdata.loading.transport._collate import checked_default_collate

    small = write_h264(tmp_path / "a.mp4", frames_for(0, 20))
    large = write_h264(tmp_path / "b.mp4", frames_for(1, 20, size=(128, 80)))
    ds = fd.VideoClipDataset([small, large], clip_len=4, index_cache=False)
    with pytest.raises(CannotBatch, match=r"videos of different sizes.*pass size=\(112, 112\).*VideoClipDataset") as e:
        next(iter(DataLoader(ds, batch_size=2, collate_fn=checked_default_collate)))
    assert "decode=" not in str(e.value)
