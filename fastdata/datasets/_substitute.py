"""The one rule for bad samples that cannot simply be left out under ``on_error="skip"``.

A bad sample is normally left out of its batch: the batch is smaller, and no later batch moves. Two
cases cannot do that: a batch whose samples are *all* bad (an empty batch cannot be collated, and
leaving it out would give this rank one step fewer than the others: a hang at the next collective), and
``ds[i]`` of a bad sample (``DataLoader(ds, batch_size=None)`` would yield None). Both get a
**substitute**: the first good sample after them,

* ``TarShardDataset(batch_size=...)``: in this rank's plan order, after the batch (the positions the rank
  reads next in this epoch, wrapping to the start of its part);
* map-style datasets (``IndexedTarDataset``, ``HDF5Dataset``, ``VideoClipDataset``, ``S3Dataset``): in index
  order, after the batch's last index (or after ``i`` for ``ds[i]``), wrapping from the last index to 0,
  leaving out the batch's own indices.

An all-bad batch becomes a batch of that one sample; ``ds[i]`` returns it. So every rank keeps its number
of batches, and nothing returns None. The bad samples are counted in ``skipped`` (and warned about, once
per file) as always; each substitute is counted in ``ds.counters()["substituted"]``, and the first one
is warned about (:class:`SubstituteWarning`, once per dataset).

The search is bounded: at most :data:`SUBSTITUTE_TRIES` samples are looked at, read in runs of 1, 2, 4 ...
up to :data:`MAX_RUN` (few reads when the next sample is good, few too across a whole missing shard).
The bad samples it meets are neither counted nor warned about here (they are when their own batch reads
them). When none is good, :class:`~fastdata.core.errors.TooManyBadSamples` names the files: the data is
mostly bad, and skipping cannot make an epoch of it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

from fastdata.core.errors import SubstituteWarning, TooManyBadSamples, collecting, source_of
from fastdata.core.process import SUBSTITUTE_FLAG, SharedState

SUBSTITUTE_TRIES = 65536
"""The most samples looked at to find one substitute: more than a shard of ~256 MB holds of ~30 KB samples,
so one missing or damaged shard never exhausts it."""
MAX_RUN = 256
"""The most candidates read at once (runs grow 1, 2, 4 ... up to this while they are all bad)."""
NAMED = 5  # files named in a TooManyBadSamples message; the rest are counted

Read = Callable[[list[int]], list[tuple[int, Any]]]
"""Reads candidates and returns ``(candidate, finished sample)`` for the good ones, in the order asked
(bad ones handled by the dataset's error policy as usual: under :func:`collecting`, collected)."""


def after_index(last: int, n: int, exclude: Iterable[int] = ()) -> Iterator[int]:
    """Map-style candidates: the indices after ``last`` in index order, wrapping past ``n - 1`` to 0, once
    each, without ``last`` itself and the indices in ``exclude``."""
    last %= n
    skip = {i % n for i in exclude}
    skip.add(last)
    return (j for j in ((last + k) % n for k in range(1, n)) if j not in skip)


def find_substitute(
    read: Read,
    candidates: Iterable[int],
    *,
    shared: SharedState,
    owner: str,
    bad: str,
    order: str,
    unit: str = "index",
    sources: Sequence[str] = (),
    errors_name_samples: bool = False,
) -> tuple[int, Any]:
    """The first good candidate and its sample; counted in ``substituted``, the first one warned about.

    Args:
        read (Read): reads candidates (see :data:`Read`).
        candidates (Iterable[int]): where to look, in order (see :func:`after_index`).
        shared (SharedState): the dataset's counters (with ``"substituted"``) and one-time flags.
        owner (str): the dataset, for messages (its ``repr``).
        bad (str): what was bad, for messages (``"every sample of batch 3 (8 samples)"``).
        order (str): the order looked in, for messages (``"index order"``).
        unit (str): what a candidate number is, for messages. Defaults to "index".
        sources (Sequence[str]): the files of the bad samples, for messages (read when the search fails: a
            list the reads append to names every file looked in).
        errors_name_samples (bool): the bad samples' errors name samples (keys), not files: listed apart
            from ``sources``. Defaults to False.

    Raises:
        TooManyBadSamples: none of the first :data:`SUBSTITUTE_TRIES` candidates (or of all there are) is good.
    """
    pending = iter(candidates)
    tried, run = 0, 1
    with collecting() as errors:
        while tried < SUBSTITUTE_TRIES:
            chunk = list(islice(pending, min(run, SUBSTITUTE_TRIES - tried)))
            if not chunk:
                break
            good = read(chunk)
            tried += len(chunk)
            if good:
                found = good[0]
                shared.add("substituted")
                if shared.once(SUBSTITUTE_FLAG):
                    warnings.warn(
                        f"fastdata: {owner}: {bad} was bad and skipped; the next good sample in {order} "
                        f"({unit} {found[0]}) stands in for it, so that this rank keeps its number of batches "
                        "(and nothing comes back as None). Counted in ds.counters()['substituted']; warned once",
                        SubstituteWarning,
                        stacklevel=4,
                    )
                return found
            run = min(2 * run, MAX_RUN)
    met = [source_of(e) for e in errors]
    files = list(dict.fromkeys([*sources, *([] if errors_name_samples else met)]))
    samples = f"; samples: {_named(list(dict.fromkeys(met)))}" if errors_name_samples and met else ""
    looked = f"so were the {tried} sample(s) after it in {order}" if tried else f"no other sample is left in {order}"
    raise TooManyBadSamples(
        f"{owner}: {bad} was bad, and {looked}: the data is mostly bad, so no good sample can stand in for it "
        f"under on_error='skip' (files: {_named(files) or 'unknown'}{samples}); check them with 'fastdata "
        "inspect', and replace them or leave them out"
    )


def _named(items: list[str]) -> str:
    return ", ".join(items[:NAMED]) + (f" and {len(items) - NAMED} more" if len(items) > NAMED else "")


__all__ = ["MAX_RUN", "SUBSTITUTE_TRIES", "Read", "after_index", "find_substitute"]
