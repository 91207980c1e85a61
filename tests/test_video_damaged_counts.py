"""A damaged file gives the same clips, and the same counts, whichever decoder reads it and for any
``num_workers``: the clips one decoder refuses where PyAV decodes them are read by the fallback (PyAV),
and every clip of the epoch is either read or skipped (read + skipped = clips)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from tests.test_video_readers import need
from tests.videogen import damage, make_videos


def epoch(path: str, decoder: str, num_workers: int) -> tuple[list[int], dict[str, int], int]:
    """The first frames of the clips one epoch gives, in order, the dataset's counters, and its length."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = fd.VideoClipDataset(
            path, clip_len=4, clips_per_video="all", decoder=decoder, on_error="skip", index_cache=False
        )
        loader = DataLoader(
            ds, batch_size=3, sampler=ds.sampler(shuffle=False), num_workers=num_workers, collate_fn=list
        )
        got = [int(s["frames"][0]) for batch in loader for s in batch]
    return got, ds.counters(), len(ds)


@pytest.mark.parametrize("codec", ["h264", "mp4v"])
def test_a_damaged_file_gives_the_same_clips_and_counts_for_every_decoder_and_num_workers(
    tmp_path: Path, codec: str
) -> None:
    good = make_videos(tmp_path, count=1, frames=48, codec=codec)[0]
    bad = damage(good, tmp_path / f"bad{Path(good).suffix}")
    want, counts, n = epoch(bad, "pyav", 0)
    assert n == 12 and 0 < counts["skipped"] < n  # the damage hits some clips, not all
    assert len(want) - counts["substituted"] + counts["skipped"] == n  # read + skipped = clips
    for decoder in ("pyav", "opencv", "decord"):
        need(decoder)
        for num_workers in (0, 2):
            got, seen, _ = epoch(bad, decoder, num_workers)
            assert got == want, f"{decoder}, num_workers={num_workers}"
            assert (seen["skipped"], seen["substituted"], seen["reads"]) == (
                counts["skipped"],
                counts["substituted"],
                n,
            ), f"{decoder}, num_workers={num_workers}: {seen}"
