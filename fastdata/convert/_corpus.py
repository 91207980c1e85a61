"""Finding the files of a small-file corpus: an ImageFolder tree (one folder per class) or a flat
folder. Shared by every conversion target (tar shards, HDF5). A corpus in object storage
(``s3://bucket/prefix/``) is listed by :mod:`fastdata.convert` into the same :class:`Corpus`.

Problems are collected, not raised one at a time, so the user sees all of them at once: unreadable
files, broken links, links that would convert a file twice, empty class folders. The converter decides
whether they stop it.

Samples: files sharing a key form one sample (:func:`sample_names`), webdataset's rule: the key is the
path up to the first dot of the file name, so ``s01.jpg``, ``s01.json`` and ``s01.cls`` are one sample with
members ``jpg``, ``json`` and ``cls`` (a folder written by webdataset's tools, or prepared for it). A file
alone under its key is a sample of its own (``a.v2.jpg``: key ``a_v2``, member ``jpg``), and so is each
file of a key holding two images (``a.jpg`` and ``a.png``: two pictures) or one member twice.

Symbolic links: every real file is converted once. A link whose target lies inside the corpus (a file,
a class folder, or a folder above the link: a loop) is not followed, whichever way it points: its
target is converted where it lies, under its own label, and the link is listed as a problem. A link
leading outside the corpus is followed, and its files get the label of the folder holding the link;
two links leading to one real file convert it once, and the second is listed as a problem.
"""

from __future__ import annotations

import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from fastdata.core.errors import ConfigError, SourceNotFound
from fastdata.formats import IMAGE_EXTS


class Item(NamedTuple):
    """One file of the corpus (a tuple: cheap to make, tens of thousands at a time).

    Attributes:
        path (str): absolute path (or ``s3://`` URL).
        relpath (str): path below the corpus root, with ``/`` separators.
        label (int): class number, or -1 in a flat folder.
        size (int): bytes.
        mtime (int): modification time in whole seconds (stored in tar headers).
    """

    path: str
    relpath: str
    label: int
    size: int
    mtime: int = 0


@dataclass
class Corpus:
    """The files to convert, in a deterministic order (sorted by relative path).

    Attributes:
        root (str): the corpus folder (or ``s3://bucket/prefix/``).
        items (list[Item]): readable files.
        classes (list[str]): class names (folder names), label ``k`` is ``classes[k]``; empty when flat.
        problems (list[str]): one line per file or folder that could not be used, naming it and why.
        ignored (int): hidden files (``.DS_Store`` ...) left out on purpose.
        storage_options (dict | None): for an ``s3://`` corpus, how to reach it (S3Config fields).
    """

    root: str
    items: list[Item] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    ignored: int = 0
    storage_options: dict[str, object] | None = None

    @property
    def total_bytes(self) -> int:
        return sum(i.size for i in self.items)

    def sample_fields(self) -> tuple[int, dict[str, int]]:
        """How many samples the files make (files sharing a key are one, see :func:`sample_names`), and
        how many samples hold each member (field), by extension."""
        names = sample_names(self.items)
        return len({key for key, _ in names}), dict(sorted(Counter(ext for _, ext in names).items()))

    def class_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(self.classes, 0)
        for item in self.items:
            if item.label >= 0:
                counts[self.classes[item.label]] += 1
        return counts


def scan_corpus(src: str | os.PathLike[str]) -> Corpus:
    """List the corpus at ``src``.

    A folder whose entries are all folders is an ImageFolder tree: each sub-folder is a class (sorted
    by name; files below it at any depth get its label). A folder of files is flat (no labels).

    Raises:
        SourceNotFound: ``src`` does not exist or is not a folder.
        ConfigError: ``src`` mixes files and class folders at its top level, or holds no file at all.
    """
    root = Path(src)
    if not root.is_dir():
        raise SourceNotFound(f"{src}: no such folder; give the root of an ImageFolder tree or a folder of files")
    walker = _Walker(Corpus(str(root.resolve())))
    corpus = walker.corpus
    top = sorted(os.scandir(root), key=lambda e: e.name)
    visible = [e for e in top if not e.name.startswith(".")]
    corpus.ignored += len(top) - len(visible)
    folders = [e for e in visible if e.is_dir(follow_symlinks=True)]
    files = [e for e in visible if not e.is_dir(follow_symlinks=True)]
    if folders and files:
        raise ConfigError(
            f"{src}: holds both files ({files[0].name}, ...) and class folders ({folders[0].name}, ...); "
            "move the files into a class folder, or convert a folder of files only"
        )
    if folders:
        corpus.classes = [e.name for e in folders]
        for label, entry in enumerate(folders):
            before = len(corpus.items)
            if walker.followable(entry):
                walker.walk(entry.path, label, entry.name)
            if len(corpus.items) == before:
                corpus.problems.append(
                    f"{entry.path}: class folder has no readable file; "
                    f"class {entry.name!r} keeps label {label} but gets no samples"
                )
    else:
        walker.walk(str(root), -1, "")
    if not corpus.items:
        first = f" ({len(corpus.problems)} problems, first: {corpus.problems[0]})" if corpus.problems else ""
        raise ConfigError(f"{src}: no readable file found{first}")
    corpus.items.sort(key=lambda i: i.relpath)
    return corpus


class _Walker:
    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus
        self.root = os.path.realpath(corpus.root)
        self.seen_dirs: set[tuple[int, int]] = set()  # folders listed (a loop outside the corpus ends here)
        self.linked: dict[str, str] = {}  # real path of a file reached through a link -> the first path
        self.euid = os.geteuid()
        self.groups = {os.getegid(), *os.getgroups()}

    def readable(self, st: os.stat_result) -> bool:
        """The mode bits allow us to read the file (one ``access`` call per file cost as much as the
        stat itself; ACLs are not looked at: a file that fails to open later is still named, or skipped)."""
        if self.euid == 0:
            return True
        mode = st.st_mode
        if st.st_uid == self.euid:
            return bool(mode & stat.S_IRUSR)
        if st.st_gid in self.groups:
            return bool(mode & stat.S_IRGRP)
        return bool(mode & stat.S_IROTH)

    def _inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + os.sep)

    def followable(self, entry: os.DirEntry[str]) -> bool:
        """False (and a problem listed) for a link into the corpus or a second link to one real file."""
        if not entry.is_symlink():
            return True
        real = os.path.realpath(entry.path)
        problems = self.corpus.problems
        if not Path(real).exists():
            return True  # a broken link: the stat that follows names it
        if self._inside(real):
            where = os.path.relpath(real, self.root).replace(os.sep, "/")
            loop = os.path.realpath(os.path.dirname(entry.path)).startswith(real)
            problems.append(
                f"{entry.path}: {'symlink loop: leads back to' if loop else 'symlink to'} "
                f"{'the corpus root' if where == '.' else repr(where)} inside the corpus; not followed "
                "(what it leads to is converted once, where it lies, under its own label): remove the "
                "link, or pass --skip-bad"
            )
            return False
        first = self.linked.setdefault(real, entry.path)
        if first != entry.path:
            problems.append(f"{entry.path}: leads to the same file or folder as {first}; converted once, from there")
            return False
        return True

    def walk(self, folder: str, label: int, rel: str) -> None:
        # plain strings and DirEntry.stat(), not Path objects and os.path.relpath: listing dominated the
        # conversion of small files (0.6 s for 10k files, as long as 'tar cf' takes for all of them)
        corpus = self.corpus
        try:
            st = os.stat(folder)
            key = (st.st_dev, st.st_ino)
            if key in self.seen_dirs:
                corpus.problems.append(f"{folder}: symlink loop (leads back to a folder already listed); skipped")
                return
            self.seen_dirs.add(key)
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            corpus.problems.append(f"{folder}: cannot list folder ({e.strerror})")
            return
        absolute = os.path.abspath(folder)
        items, problems = corpus.items, corpus.problems
        # bound once: this loop runs once per file of the corpus before any shard is written
        readable = self.readable if self.euid != 0 else None
        is_reg, is_dir, new_item = stat.S_ISREG, stat.S_ISDIR, Item
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                corpus.ignored += 1
                continue
            linked = entry.is_symlink()
            if linked and not self.followable(entry):
                continue
            try:
                st = entry.stat()  # follows links
            except OSError as e:
                problems.append(f"{entry.path}: cannot be read ({'broken link' if linked else e.strerror})")
                continue
            child_rel = f"{rel}/{name}" if rel else name
            mode = st.st_mode
            if is_reg(mode):
                if readable is not None and not readable(st):
                    problems.append(f"{entry.path}: cannot be read (permission denied)")
                    continue
                items.append(new_item(f"{absolute}/{name}", child_rel, label, st.st_size, int(st.st_mtime)))
            elif is_dir(mode):
                self.walk(entry.path, label, child_rel)
            else:
                problems.append(f"{entry.path}: not a regular file; skipped")


DEFAULT_EXT = "bin"  # the member of a file without an extension


def wds_key(relpath: str) -> tuple[str, str]:
    """``("dir/key", "ext")``: webdataset's rule, the key ends at the first dot of the file name and the
    member is the rest, lower-cased (``("dir/name", "")`` for a name without a dot)."""
    at = relpath.rfind("/") + 1
    dot = relpath.find(".", at)
    return (relpath[:dot], relpath[dot + 1 :].lower()) if dot > at else (relpath, "")


def sample_names(items: list[Item]) -> list[tuple[str, str]]:
    """``(key, member)`` for each item: the files that share a webdataset key (:func:`wds_key`) with
    different members are one sample under that key; any other file is a sample of its own, keyed by its
    path without its last extension. Keys hold no dot (a dot would end them when read back: ``.`` becomes
    ``_``) and are unique to their sample (two samples that would get one key each get their member
    appended, ``a_jpg`` and ``a_png``, then a number if that is still taken).

    Files of one sample need not be next to each other in ``items``; :func:`by_sample` orders them so.
    """
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
    groups = _groups(items)
    unit = list(range(len(items)))  # the sample of each item: itself, or the first item of its group
    for members in groups:
        key = wds_key(items[members[0]].relpath)[0].replace(".", "_")
        for i in members:
            unit[i] = members[0]
            base[i], exts[i] = key, wds_key(items[i].relpath)[1]
    if not groups and len(set(base)) == len(base):  # the usual case: every key is unique as it is
        return list(zip(base, exts))
    samples_of = Counter(base[i] for i in range(len(items)) if unit[i] == i)  # samples per key
    taken = {b for b, n in samples_of.items() if n == 1}
    out: list[tuple[str, str]] = []
    renamed: dict[int, str] = {}
    for i, (b, ext) in enumerate(zip(base, exts)):
        if samples_of[b] == 1:
            out.append((b, ext))
            continue
        if unit[i] != i:  # a later file of a group: the group's key
            out.append((renamed[unit[i]], ext))
            continue
        suffix = re.sub(r"[^0-9A-Za-z_-]", "_", ext)
        key, n = f"{b}_{suffix}", 1
        while key in taken:
            key, n = f"{b}_{suffix}_{n}", n + 1
        taken.add(key)
        renamed[i] = key
        out.append((key, ext))
    return out


def by_sample(items: list[Item]) -> list[Item]:
    """``items`` with the files of each sample (:func:`sample_names`) next to each other, at the place of
    the sample's first file; the order is kept otherwise."""
    groups = _groups(items)
    if not groups:
        return items
    later = {i for members in groups for i in members[1:]}
    rest = {members[0]: members[1:] for members in groups}
    out = []
    for i, item in enumerate(items):
        if i in later:
            continue
        out.append(item)
        out.extend(items[j] for j in rest.get(i, ()))
    return out


def _groups(items: list[Item]) -> list[list[int]]:
    """The items of each multi-file sample: every webdataset key with two files or more whose members
    differ (``a.jpg`` and ``a.JPG`` would be one member twice) and hold one image at most (``a.jpg`` and
    ``a.png`` are two pictures): the files of any other key stay samples of their own."""
    # the usual case, one file per key, told in one pass (a name without a dot gives a key one character
    # short here: at worst a false alarm, which the exact pass below settles)
    rels = [item.relpath for item in items]
    if len({r[: r.find(".", r.rfind("/") + 1)] for r in rels}) == len(rels):
        return []
    by_key: dict[str, list[int]] = {}
    for i, rel in enumerate(rels):
        key = _key_of(rel)
        if key is not None:
            by_key.setdefault(key, []).append(i)
    groups = []
    for members in by_key.values():
        if len(members) > 1:
            exts = [wds_key(items[i].relpath)[1] for i in members]
            # two whole images under one key (a.jpg and a.png) are two pictures, not one sample's fields
            if len(set(exts)) == len(exts) and all(exts) and sum(e in IMAGE_EXTS for e in exts) < 2:
                groups.append(members)
    return groups


def _key_of(rel: str) -> str | None:
    """:func:`wds_key`'s key, or None for a name without an extension (the key of no group)."""
    at = rel.rfind("/") + 1
    dot = rel.find(".", at)
    return rel[:dot] if dot > at else None
