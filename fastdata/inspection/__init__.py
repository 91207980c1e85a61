"""``fastdata inspect PATH``: what a shard, a brace pattern of shards, a folder or an S3 prefix holds.

For each tar shard: samples, bytes, member extensions, bad members (named, with the reason), and
whether its sidecar index matches; for each HDF5 file: its fields (shapes, dtypes, lengths, chunking,
compression), attributes (classes) and problems such as fields of unequal lengths; for each video: its
codec, frame count, frame rate and size as the video index probes them, or why it cannot be read. For a
folder or prefix with a ``manifest.json``: the manifest's summary and where the files disagree with it;
for an ``s3://`` prefix also its object count and bytes. ``--write-manifest`` writes ``manifest.json``
and ``.idx`` sidecars for shards made by other tools (webdataset's ``ShardWriter``, ``tar``), so
fastdata plans epochs without scanning them.

Laid out like :mod:`fastdata.convert`: ``_report`` (what one file holds), one inspector per format
(``_tar``, ``_media`` for HDF5 and video), chosen in ``_registry``; ``_paths`` walks files, folders and
prefixes and checks manifests; ``_command`` is the CLI."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.inspection._paths import inspect_paths, write_manifest
    from fastdata.inspection._registry import register_inspector
    from fastdata.inspection._report import FileReport

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = ["FileReport", "inspect_paths", "register_inspector", "write_manifest"]
