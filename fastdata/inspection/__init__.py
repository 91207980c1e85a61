"""``fastdata inspect PATH``: what a shard, a brace pattern of shards, a folder or an S3 prefix holds.

For each tar shard: samples, bytes, member extensions, bad members (named, with the reason), and
whether its sidecar index matches; for each HDF5 file: its fields (shapes, dtypes, lengths, chunking,
compression), attributes (classes) and problems such as fields of unequal lengths; for each video: its
codec, frame count, frame rate and size as the video index probes them, or why it cannot be read. For a
folder or prefix with a ``manifest.json``: the manifest's summary and where the files disagree with it;
for an ``s3://`` prefix also its object count and bytes. ``--write-manifest`` writes ``manifest.json``
and ``.idx`` sidecars for shards made by other tools (webdataset's ``ShardWriter``, ``tar``), so
fastdata plans epochs without scanning them.

Laid out like :mod:`fastdata.convert`: :mod:`~fastdata.inspection.report` (what one file holds),
one inspector per format (:mod:`~fastdata.inspection.tar`, :mod:`~fastdata.inspection.media` for HDF5
and video), chosen by suffix in :mod:`~fastdata.inspection.registry`; :mod:`~fastdata.inspection.paths`
walks files, folders and prefixes and checks manifests; :mod:`~fastdata.inspection.command` is the CLI.
"""
