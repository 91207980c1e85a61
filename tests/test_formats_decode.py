"""Decoding by extension (fastdata.formats._decode): values by member extension, errors naming sample and
member, options checked at construction."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from fastdata.core.errors import ConfigError, DecodeFailed
from fastdata.formats._decode import Decoder
from tests.datagen import jpeg_bytes


def sample_with(**members: bytes) -> dict:
    return {"__key__": "k1", "__url__": "shard.tar", **members}


@pytest.mark.parametrize("backend", ["pil", "cv2"])
def test_decoder_turns_members_into_values_by_extension(backend: str) -> None:
    arr = np.arange(6, dtype=np.int16)
    npy = io.BytesIO()
    np.save(npy, arr)
    raw = sample_with(
        jpg=jpeg_bytes(np.random.default_rng(0), (8, 6)),
        cls=b"3",
        json=b'{"a": 1}',
        txt="héllo".encode(),
        npy=npy.getvalue(),
        bin=b"\x00\x01",
    )
    out = Decoder("torch", backend)(dict(raw))
    assert isinstance(out["jpg"], torch.Tensor) and out["jpg"].shape == (3, 6, 8) and out["jpg"].dtype == torch.uint8
    assert out["cls"] == 3 and out["json"] == {"a": 1} and out["txt"] == "héllo"
    assert np.array_equal(out["npy"], arr) and out["bin"] == b"\x00\x01"
    assert Decoder("numpy", backend)(dict(raw))["jpg"].shape == (6, 8, 3)
    assert Decoder("raw")(dict(raw)) == raw


def test_corrupt_member_names_sample_and_member() -> None:
    with pytest.raises(DecodeFailed, match=r"shard.tar: sample 'k1', member '.jpg'"):
        Decoder("numpy")(sample_with(jpg=b"not a jpeg"))


def test_decoder_options_are_checked_at_construction() -> None:
    with pytest.raises(ConfigError, match="'raw', 'pil', 'numpy', 'torch'"):
        Decoder("tensor")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="image_backend"):
        Decoder("pil", "cv2")
