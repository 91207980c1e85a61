"""The tar datasets: :class:`TarShardDataset` (streamed, ``_shards``) and :class:`IndexedTarDataset`
(random access, ``_indexed``), the shards they share (``_source``), remote shards read through the
node-local cache (``_cached_shards``), and their side of the resume protocol (``_resume``, and ``_elastic``
for another number of ranks)."""
