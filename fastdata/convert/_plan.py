"""Which file goes into which shard, under which sample key: decided up front, from the corpus and the
options alone, so that an interrupted conversion rerun with the same command writes the same shards
(and a parallel one the same shards as a serial one).

Sample keys (``sample_names`` of the corpus listing): files sharing a webdataset key (the path
up to the first dot of the file name: ``s01.jpg``, ``s01.json``, ``s01.cls``) are one sample, its files
next to each other in a shard, never split between shards or by ``--shuffle``; any other file is a sample
of its own, keyed by its path without its extension, every ``.`` replaced by ``_`` (``cat/a.v2.jpg`` ->
``cat/a_v2``, member ``cat/a_v2.jpg``). Keys never depend on the shard plan, so ``--shuffle`` changes the
order only.

Image extensions: a corpus mixing ``.jpg``, ``.jpeg`` and ``.png`` (or any two of the image extensions
readers decode) would give samples with different member names, which cannot be batched together
(``KeyError: 'jpg'`` in a collate function). Every image is then stored under one extension, the
corpus's most common image extension (ties: the first by name); decoders (PIL, OpenCV, webdataset's)
recognise the format from the bytes, not the name. Each renamed sample's original extension is kept
in the manifest (``"renamed"`` per shard, counts in ``"image_exts"``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from fastdata.convert._corpus import DEFAULT_EXT, Corpus, by_sample, sample_names
from fastdata.core.errors import ConfigError
from fastdata.formats import IMAGE_EXTS
from fastdata.formats.tar import BLOCK

LABEL_EXT = "cls"
T = TypeVar("T")


def split_ext(relpath: str) -> tuple[str, str]:
    """``("dir/stem", "ext")``: the extension is what follows the last dot of the file name, lower-cased."""
    folder, _, name = relpath.rpartition("/")
    dot = name.rfind(".")
    stem, ext = (name[:dot], name[dot + 1 :].lower()) if dot > 0 and dot < len(name) - 1 else (name, DEFAULT_EXT)
    return (f"{folder}/{stem}" if folder else stem), ext


def tar_bytes(size: int, labelled: bool) -> int:
    """Bytes a sample takes in a shard: header and padded data, plus the ``.cls`` member."""
    return BLOCK + size + (-size % BLOCK) + (2 * BLOCK if labelled else 0)


class Entry(NamedTuple):
    """One file to write: its path (or URL), key, member extension, label (-1: none), size, mtime and the
    extension it had in the corpus. A tuple: cheap to make and to send to the writing processes, tens of
    thousands at a time."""

    path: str
    relpath: str
    key: str
    ext: str
    label: int
    size: int
    mtime: int
    src_ext: str


def image_ext(exts: list[str]) -> str | None:
    """The one extension images are stored under when the corpus has several (see the module's
    docstring), or None when it has at most one."""
    counts = Counter(e for e in exts if e in IMAGE_EXTS)
    if len(counts) < 2:
        return None
    return min(counts, key=lambda e: (-counts[e], e))


def cut(entries: list[T], cost: list[int], *, shard_size: int | None, shard_count: int | None) -> list[list[T]]:
    """Cut ``entries`` (in order) into shards: before one would exceed ``shard_size`` (summing ``cost``,
    a single larger entry gets a shard of its own), or into ``shard_count`` of equal counts."""
    if (shard_size is None) == (shard_count is None):
        raise ConfigError("give exactly one of shard_size and shard_count")
    if shard_count is not None:
        if shard_count > len(entries):
            raise ConfigError(f"shard_count={shard_count} is more than the {len(entries)} files to convert")
        base, extra = divmod(len(entries), shard_count)
        cuts = [0]
        for i in range(shard_count):
            cuts.append(cuts[-1] + base + (i < extra))
        return [entries[a:b] for a, b in itertools.pairwise(cuts)]
    assert shard_size is not None
    shards: list[list[T]] = []
    current: list[T] = []
    used = 0
    for e, n in zip(entries, cost):
        if current and used + n > shard_size:
            shards.append(current)
            current, used = [], 0
        current.append(e)
        used += n
    if current:
        shards.append(current)
    return shards


@dataclass
class Plan:
    """The shards to write, each a list of entries, and what the plan depends on.

    Attributes:
        names (list[str]): shard file names.
        shards (list[list[Entry]]): what goes in each, in order.
        options (dict): the options that shape the output (compared when resuming).
        problems (list[str]): files that cannot be converted as they are (left out of the plan).
    """

    names: list[str]
    shards: list[list[Entry]]
    options: dict[str, object]
    problems: list[str] = field(default_factory=list)

    def fingerprint(self) -> str:
        """SHA-256 of everything that decides the output bytes: the options and every entry."""
        h = hashlib.sha256(json.dumps(self.options, sort_keys=True).encode())
        for name, entries in zip(self.names, self.shards):
            h.update(name.encode() + b"\0")
            h.update(
                "".join(f"{e.relpath}\0{e.key}\0{e.ext}\0{e.label}\0{e.size}\0{e.mtime}\n" for e in entries).encode(
                    "utf-8", "surrogateescape"
                )
            )
        return h.hexdigest()

    @property
    def samples(self) -> int:
        return sum(len(s) for s in self.shards)

    def shard_bytes(self, i: int) -> int:
        return sum(e.size for e in self.shards[i])


def plan_shards(
    corpus: Corpus,
    *,
    shard_size: int | None,
    shard_count: int | None,
    shuffle: bool,
    seed: int,
    prefix: str,
) -> Plan:
    """Assign every file of ``corpus`` to a shard.

    Args:
        corpus: the scanned corpus (items sorted by path).
        shard_size (int | None): start a new shard before one would exceed this many bytes.
        shard_count (int | None): or cut into exactly this many shards of equal sample counts.
        shuffle (bool): permute the files (seeded by ``seed``) before cutting.
        seed (int): the shuffle's seed.
        prefix (str): shard names are ``PREFIX-NNNNNN.tar``.
    """
    if (shard_size is None) == (shard_count is None):
        raise ConfigError("give exactly one of shard_size and shard_count")
    labelled = bool(corpus.classes)
    entries, problems = plan_entries(corpus)
    units = _samples(entries)  # the files of one sample are shuffled and cut together
    if shuffle:
        random.Random(seed).shuffle(units)  # Python's shuffle: the same order in every version
    cost = [sum(tar_bytes(e.size, labelled) for e in u) - 2 * BLOCK * labelled * (len(u) - 1) for u in units]
    cuts = cut(units, cost if shard_size is not None else [], shard_size=shard_size, shard_count=shard_count)
    shards = [[e for u in shard for e in u] for shard in cuts]
    options: dict[str, object] = {
        "format": "tar",
        "shard_size": shard_size,
        "shard_count": shard_count,
        "shuffle": shuffle,
        "seed": seed if shuffle else None,
        "prefix": prefix,
    }
    return Plan(shard_names(prefix, len(shards), "tar"), shards, options, problems)


def _samples(entries: list[Entry]) -> list[list[Entry]]:
    """``entries`` (a sample's files next to each other) as one list per sample."""
    out: list[list[Entry]] = []
    for e in entries:
        if out and out[-1][0].key == e.key:
            out[-1].append(e)
        else:
            out.append([e])
    return out


def plan_entries(corpus: Corpus) -> tuple[list[Entry], list[str]]:
    """One entry per usable file of ``corpus`` (in corpus order), and the files that cannot be used."""
    labelled = bool(corpus.classes)
    items = by_sample(corpus.items)
    names = sample_names(items)
    target = image_ext([ext for _, ext in names])
    if target is None and not (labelled and any(ext == LABEL_EXT for _, ext in names)):  # the usual case
        return [
            Entry(item.path, item.relpath, key, ext, item.label, item.size, item.mtime, ext)
            for item, (key, ext) in zip(items, names)
        ], []
    entries: list[Entry] = []
    problems: list[str] = []
    images = Counter(key for key, ext in names if ext in IMAGE_EXTS)  # a sample of two images keeps both names
    for item, (key, ext) in zip(items, names):
        if labelled and ext == LABEL_EXT:
            problems.append(
                f"{item.path}: a '.{LABEL_EXT}' file in a labelled corpus would clash with the "
                f"label member '{key}.{LABEL_EXT}'; rename it"
            )
            continue
        member = target if target is not None and ext in IMAGE_EXTS and images[key] == 1 else ext
        entries.append(Entry(item.path, item.relpath, key, member, item.label, item.size, item.mtime, ext))
    return entries, problems


def shard_names(prefix: str, count: int, ext: str) -> list[str]:
    """``PREFIX-000000.EXT`` ... for ``count`` shards."""
    return [f"{prefix}-{i:06d}.{ext}" for i in range(count)]


def brace_pattern(names: list[str]) -> str:
    """``prefix-{000000..000009}.tar`` for consecutive shard names (or the one name)."""
    if len(names) == 1:
        return names[0]
    head, first = names[0].rsplit("-", 1)
    number, ext = first.split(".", 1)
    last = names[-1].rsplit("-", 1)[1].split(".", 1)[0]
    return f"{head}-{{{number}..{last}}}.{ext}"
