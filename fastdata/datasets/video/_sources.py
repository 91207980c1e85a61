"""Which videos a :class:`~fastdata.VideoClipDataset` reads, and their labels.

``paths`` may name local files, folders, globs and brace ranges, and ``s3://`` objects and prefixes. A
folder (or prefix) is searched recursively for files with a video extension, in sorted order.

Labels follow the class-folder rule of images (torchvision's ``ImageFolder``, ``fastdata convert``):
when ``paths`` is one folder (or prefix) whose videos all lie in folders below it, each first-level
folder is a class, the classes sorted by name, and every video below a class folder gets its number
(``root/<class>/<video>.mp4``, Kinetics' and UCF101's layout). A folder with videos at its top level has
no labels (``labels="auto"``), or is refused (``labels=True``).

Tar shards (local ``.tar`` files, as ``fastdata convert`` writes from a video folder: one sample per video,
its bytes as ``mp4`` and its class number as ``cls``): each member with a video extension is a video,
named ``SHARD#MEMBER``, read in place through FFmpeg's ``subfile`` protocol (a byte range of the shard,
which every decoder here opens: no copy); its sample's ``cls`` member is its label, and the class names
come from the ``manifest.json`` beside the shards (else the numbers themselves).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastdata.core.errors import ConfigError, SourceNotFound
from fastdata.formats.video import VIDEO_EXTENSIONS
from fastdata.storage import expand_urls, scheme

Labels = bool | Literal["auto"]
"""``"auto"``: labels from class folders when the videos sit in them; True: class folders required;
False: no labels."""


@dataclass
class VideoSources:
    """The videos of a dataset, in order, and their labels.

    Attributes:
        paths (list[str]): local paths and ``s3://`` URLs.
        classes (list[str]): class names (folder names); label ``k`` is ``classes[k]``. Empty: no labels.
        labels (list[int]): each video's class number (empty when there are no classes).
        sizes (dict[str, int]): bytes of each remote video, as listed (local ones are asked of the disk).
        members (dict[str, tuple[str, int, int]]): each video in a tar shard (``SHARD#MEMBER``): the shard,
            the offset of its bytes and their length.
    """

    paths: list[str]
    classes: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    members: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    @property
    def remote(self) -> list[str]:
        return [p for p in self.paths if scheme(p)]


def _is_video(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in VIDEO_EXTENSIONS


def _exts() -> str:
    return ", ".join(sorted(VIDEO_EXTENSIONS))


def find_videos(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    labels: Labels = "auto",
    storage_options: dict[str, Any] | None = None,
) -> VideoSources:
    """The videos of ``paths`` and their labels (see the module's docstring).

    Raises:
        SourceNotFound: a folder or prefix without videos, a pattern matching nothing.
        ConfigError: ``labels=True`` without class folders; a scheme other than ``s3://``.
    """
    if labels not in (True, False, "auto"):
        raise ConfigError(f"labels={labels!r} must be 'auto', True or False")
    found: list[str] = []
    sizes: dict[str, int] = {}
    roots: list[tuple[str, list[str]]] = []  # (folder or prefix, its videos) for the class-folder rule
    shards = [p for p in expand_urls(paths) if p.endswith(".tar")]
    if shards:
        return _from_shards(shards, expand_urls(paths), labels)
    for path in expand_urls(paths):
        kind = scheme(path)
        if kind and kind != "s3":
            raise ConfigError(f"{path}: VideoClipDataset reads local files and s3:// objects")
        if kind:
            videos = _list_s3(path, storage_options or {}, sizes)
        elif os.path.isdir(path):
            videos = sorted(str(p) for p in Path(path).rglob("*") if _is_video(p.name) and p.is_file())
            if not videos:
                raise SourceNotFound(f"{path}: the folder holds no video files ({_exts()})")
        else:
            videos = [path]
        if len(videos) > 1 or videos != [path]:
            roots.append((path, videos))
        found.extend(videos)
    out = VideoSources(found, sizes=sizes)
    if labels is False:
        return out
    single = len(roots) == 1 and roots[0][1] == found
    classes = _class_of(*roots[0]) if single else None
    if classes is None:
        if labels is True:
            raise ConfigError(
                f"labels=True: {paths!r} is not one folder of class folders (root/<class>/<video>); put each "
                "class's videos in a folder of its own, or pass labels=False"
            )
        return out
    out.classes = sorted(set(classes))
    number = {name: k for k, name in enumerate(out.classes)}
    out.labels = [number[c] for c in classes]
    return out


def _from_shards(shards: list[str], paths: list[str], labels: Labels) -> VideoSources:
    """The videos in tar shards, each named ``SHARD#MEMBER``, with the labels of their ``cls`` members."""
    import json
    import tarfile

    if len(shards) != len(paths) or any(scheme(p) for p in shards):
        raise ConfigError(
            f"{paths[0]}: VideoClipDataset reads local tar shards of videos, not mixed with other paths or from "
            "s3:// (copy the shards to local disk, or read the videos themselves from s3://)"
        )
    out = VideoSources([])
    numbers: list[int | None] = []
    for shard in shards:
        if not os.path.isfile(shard):
            raise SourceNotFound(f"{shard}: no such shard; check the path")
        found: dict[str, tuple[str, int, int]] = {}
        cls: dict[str, int] = {}
        with tarfile.open(shard, "r:") as tar:  # headers only: the reader seeks over each member's bytes
            for m in tar:
                if not m.isfile():
                    continue
                folder, _, name = m.name.rpartition("/")
                stem, _, ext = name.partition(".")  # webdataset's key: up to the first dot of the name
                key = f"{folder}/{stem}" if folder else stem
                if _is_video(m.name):
                    found[key] = (m.name, m.offset_data, m.size)
                elif ext == "cls" and labels is not False:
                    f = tar.extractfile(m)
                    cls[key] = int((f.read() if f is not None else b"").strip() or -1)
        for key, (name, offset, size) in found.items():
            path = f"{shard}#{name}"
            out.paths.append(path)
            out.members[path] = (os.path.abspath(shard), offset, size)
            numbers.append(cls.get(key))
    if not out.paths:
        raise SourceNotFound(f"{shards[0]}: the shard(s) hold no video members ({_exts()})")
    if labels is False or any(n is None for n in numbers):
        if labels is True:
            raise ConfigError(f"labels=True: some videos in {shards[0]} ... have no .cls member; pass labels=False")
        return out
    out.labels = [int(n) for n in numbers if n is not None]
    manifest = os.path.join(os.path.dirname(shards[0]), "manifest.json")
    names: list[str] = []
    if os.path.isfile(manifest):
        try:
            names = [str(c) for c in json.loads(Path(manifest).read_text()).get("classes") or []]
        except (OSError, ValueError, AttributeError):
            names = []
    out.classes = names if len(names) > max(out.labels) else [str(k) for k in range(max(out.labels) + 1)]
    return out


def subfile(member: tuple[str, int, int]) -> str:
    """FFmpeg's name for a byte range of a file: a video inside a tar shard, opened in place."""
    shard, offset, size = member
    return f"subfile,,start,{offset},end,{offset + size},,:{shard}"


def _class_of(root: str, videos: list[str]) -> list[str] | None:
    """The class folder of each video under ``root``, or None when one lies at the top level."""
    base = root.rstrip("/") + "/" if scheme(root) else os.path.join(root, "")
    out = []
    for video in videos:
        rel = video[len(base) :] if video.startswith(base) else os.path.relpath(video, root)
        head, sep, _ = rel.replace(os.sep, "/").partition("/")
        if not sep:
            return None
        out.append(head)
    return out


def _list_s3(url: str, options: dict[str, Any], sizes: dict[str, int]) -> list[str]:
    """The videos of an ``s3://`` URL: itself when it names a video, else every video under the prefix."""
    from dataclasses import fields

    from fastdata.storage.s3 import S3Config, Stats, list_prefix

    if _is_video(url) and not url.endswith("/"):
        return [url]
    known = {f.name for f in fields(S3Config)}
    config = S3Config.from_options(options.get("config"), **{k: v for k, v in options.items() if k in known})
    urls, listed = list_prefix(url if url.endswith("/") else url + "/", config, Stats())
    videos = [(u, n) for u, n in zip(urls, listed) if _is_video(u)]
    if not videos:
        raise SourceNotFound(f"{url}: the prefix holds no video files ({_exts()})")
    sizes.update(videos)
    return [u for u, _ in videos]


__all__ = ["Labels", "VideoSources", "find_videos", "subfile"]
