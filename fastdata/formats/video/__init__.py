"""Video decoders behind one small interface (:class:`VideoReader`), chosen by name.

===============  ==========================================  =====================================
name             library                                     install
===============  ==========================================  =====================================
``"pyav"``       PyAV (FFmpeg bundled in the wheel)          ``pip install 'fastdata[video]'``
``"decord"``     decord 0.6 (unmaintained since 2022)        ``pip install 'fastdata[video]'``
``"opencv"``     ``cv2.VideoCapture`` (FFmpeg backend)       ``pip install 'fastdata[video]'``
``"torchcodec"`` torchcodec 0.13 + the system's FFmpeg       ``pip install 'fastdata[torchcodec]'``
===============  ==========================================  =====================================

Backends are imported on first use, so ``import fastdata`` never loads a video library. Any
:class:`VideoReader` subclass can be passed where a name is expected (tests use this to plug in
decoders that misbehave on purpose).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Literal, get_args

from fastdata.core import lazy_exports
from fastdata.core.errors import ConfigError
from fastdata.formats._suffixes import VIDEO_EXTENSIONS
from fastdata.formats.video._base import (
    DecoderFallbackWarning,
    DecoderUnavailable,
    DecodeTimeout,
    FramesMissing,
    Size,
    TooManyOpenFiles,
    VideoMeta,
    VideoReader,
    VideoTooShort,
    VideoUnreadable,
    VideoUnsupported,
)

DecoderName = Literal["pyav", "decord", "opencv", "torchcodec"]


# name -> (module, class, the extra that installs its library)
_DECODERS: dict[str, tuple[str, str, str]] = {
    "pyav": ("fastdata.formats.video._pyav", "PyAVReader", "video"),
    "decord": ("fastdata.formats.video._decord", "DecordReader", "video"),
    "opencv": ("fastdata.formats.video._opencv", "OpenCVReader", "video"),
    "torchcodec": ("fastdata.formats.video._torchcodec", "TorchCodecReader", "torchcodec"),
}


def reader_class(decoder: str | type[VideoReader]) -> type[VideoReader]:
    """The :class:`VideoReader` class for a decoder name (or the class itself), with its library
    imported now so that a missing one fails here with an install hint.

    Raises:
        ConfigError: an unknown name (the message lists the known ones).
        DecoderUnavailable: the decoder's library is not installed or cannot load (an ImportError).
    """
    if isinstance(decoder, type):
        if not issubclass(decoder, VideoReader):
            raise ConfigError(f"decoder={decoder!r} is not a VideoReader subclass")
        return decoder
    if decoder not in _DECODERS:
        raise ConfigError(f"decoder={decoder!r} is not one of {', '.join(map(repr, get_args(DecoderName)))}")
    module, name, extra = _DECODERS[decoder]
    # the library itself, loaded now: torchcodec's native libraries load with torchcodec.decoders
    library = {"pyav": "av", "opencv": "cv2", "torchcodec": "torchcodec.decoders"}.get(decoder, decoder)
    try:
        importlib.import_module(library)
    except Exception as e:
        first = str(e).strip().splitlines()[0][:200].rstrip(":") if str(e).strip() else ""
        install = f"pip install 'fastdata[{extra}]'"
        if decoder == "torchcodec":
            install = (
                f"{install}, which pins torchcodec 0.13.0 (later wheels link CUDA libraries and do not load "
                "on a CPU-only machine), and the system's FFmpeg (apt-get install ffmpeg)"
            )
        fallback = "; or use decoder='pyav' (the default)" if decoder != "pyav" else ""
        raise DecoderUnavailable(
            f"decoder={decoder!r} cannot load {library} here ({type(e).__name__}: {first}): {install}{fallback}"
        ) from e
    cls: type[VideoReader] = getattr(importlib.import_module(module), name)
    return cls


def open_video(
    path: str,
    decoder: str | type[VideoReader] = "pyav",
    *,
    threads: int = 1,
    size: Size | None = None,
    meta: VideoMeta | None = None,
) -> VideoReader:
    """Open one video with the named decoder; see :class:`VideoReader`."""
    return reader_class(decoder)(path, threads=threads, size=size, meta=meta)


if TYPE_CHECKING:
    from fastdata.formats.video._meta_cache import VideoIndex, default_index_file
    from fastdata.formats.video._pool import ReaderPool
    from fastdata.formats.video._stream import StreamInfo

__getattr__, __dir__ = lazy_exports(__name__)


__all__ = [
    "VIDEO_EXTENSIONS",
    "DecodeTimeout",
    "DecoderFallbackWarning",
    "DecoderName",
    "DecoderUnavailable",
    "FramesMissing",
    "ReaderPool",
    "Size",
    "StreamInfo",
    "TooManyOpenFiles",
    "VideoIndex",
    "VideoMeta",
    "VideoReader",
    "VideoTooShort",
    "VideoUnreadable",
    "VideoUnsupported",
    "default_index_file",
    "open_video",
    "reader_class",
]
