"""Which file goes into which shard, under which sample key: decided up front, from the corpus and the
options alone, so that an interrupted conversion rerun with the same command writes the same shards
(and a parallel one the same shards as a serial one).

Sample keys: one sample per source file. WebDataset ends a key at the first dot of a member's name,
so ``a.v2.jpg`` cannot keep ``a.v2`` as its key, and ``a.jpg`` and ``a.png`` in one folder would merge
into one sample. A key is the file's path below the corpus root without its extension, every ``.``
replaced by ``_`` (``cat/a.v2.jpg`` -> ``cat/a_v2``, member ``cat/a_v2.jpg``); when two files would
get the same key, each of them gets its extension appended (``a_jpg``, ``a_png``), then a number if
that is still taken. Keys never depend on the shard plan, so ``--shuffle`` changes the order only.

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
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from fastdata.convert._corpus import Corpus, Item
from fastdata.core.errors import ConfigError
from fastdata.formats import IMAGE_EXTS
from fastdata.formats.tar import BLOCK

DEFAULT_EXT = "bin"  # for files without an extension
LABEL_EXT = "cls"


def split_ext(relpath: str) -> tuple[str, str]:
    """``("dir/stem", "ext")``: the extension is what follows the last dot of the file name, lower-cased."""
    folder, _, name = relpath.rpartition("/")
    dot = name.rfind(".")
    stem, ext = (name[:dot], name[dot + 1 :].lower()) if dot > 0 and dot < len(name) - 1 else (name, DEFAULT_EXT)
    return (f"{folder}/{stem}" if folder else stem), ext


def sample_names(items: list[Item]) -> list[tuple[str, str]]:
    """``(key, ext)`` for each item: unique keys without dots (see the module's docstring)."""
    # split_ext and the dot replacement inlined: this runs once per file before any shard is written
    # (0.15 s of a 20,000-file conversion's serial start as separate calls)
    base, exts = [], []
    for item in items:
        rel = item.relpath
        name_at = rel.rfind("/") + 1
        dot = rel.rfind(".")
        if dot > name_at and dot < len(rel) - 1:
            base.append(rel[:dot].replace(".", "_"))
            exts.append(rel[dot + 1 :].lower())
        else:
            base.append(rel.replace(".", "_"))
            exts.append(DEFAULT_EXT)
    if len(set(base)) == len(base):  # the usual case: every key is unique as it is
        return list(zip(base, exts))
    parts = list(zip(base, exts))
    counts = Counter(base)
    taken = {b for b in base if counts[b] == 1}
    out = []
    for b, ext in parts:
        if counts[b] == 1:
            out.append((b, ext))
            continue
        suffix = re.sub(r"[^0-9A-Za-z_-]", "_", ext)
        key, n = f"{b}_{suffix}", 1
        while key in taken:
            key, n = f"{b}_{suffix}_{n}", n + 1
        taken.add(key)
        out.append((key, ext))
    return out


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


def cut(entries: list[Entry], cost: list[int], *, shard_size: int | None, shard_count: int | None) -> list[list[Entry]]:
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
    shards: list[list[Entry]] = []
    current: list[Entry] = []
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
    if shuffle:
        random.Random(seed).shuffle(entries)  # Python's shuffle: the same order in every version
    cost = [tar_bytes(e.size, labelled) for e in entries] if shard_size is not None else []
    shards = cut(entries, cost, shard_size=shard_size, shard_count=shard_count)
    options: dict[str, object] = {
        "format": "tar",
        "shard_size": shard_size,
        "shard_count": shard_count,
        "shuffle": shuffle,
        "seed": seed if shuffle else None,
        "prefix": prefix,
    }
    return Plan(shard_names(prefix, len(shards), "tar"), shards, options, problems)


def plan_entries(corpus: Corpus) -> tuple[list[Entry], list[str]]:
    """One entry per usable file of ``corpus`` (in corpus order), and the files that cannot be used."""
    labelled = bool(corpus.classes)
    names = sample_names(corpus.items)
    target = image_ext([ext for _, ext in names])
    if target is None and not (labelled and any(ext == LABEL_EXT for _, ext in names)):  # the usual case
        return [
            Entry(item.path, item.relpath, key, ext, item.label, item.size, item.mtime, ext)
            for item, (key, ext) in zip(corpus.items, names)
        ], []
    entries: list[Entry] = []
    problems: list[str] = []
    for item, (key, ext) in zip(corpus.items, names):
        if labelled and ext == LABEL_EXT:
            problems.append(
                f"{item.path}: a '.{LABEL_EXT}' file in a labelled corpus would clash with the "
                f"label member '{key}.{LABEL_EXT}'; rename it"
            )
            continue
        member = target if target is not None and ext in IMAGE_EXTS else ext
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
