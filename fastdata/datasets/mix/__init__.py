"""``Mix``: samples drawn from several fastdata datasets in set proportions (``_mix``), reading each source
by draw number (``_sources``), the next mixed batch read ahead (``_ahead``) and its small parts (``_parts``)."""
