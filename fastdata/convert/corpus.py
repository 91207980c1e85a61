"""Finding the files of a small-file corpus: an ImageFolder tree (one folder per class) or a flat
folder. Shared by every conversion target (tar shards, HDF5).

Problems are collected, not raised one at a time, so the user sees all of them at once: unreadable
files, broken links, symlink loops, empty class folders. The converter decides whether they stop it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from fastdata.core.errors import ConfigError, SourceNotFound


@dataclass(frozen=True)
class Item:
    """One file of the corpus.

    Attributes:
        path (str): absolute path.
        relpath (str): path below the corpus root, with ``/`` separators.
        label (int): class number, or -1 in a flat folder.
        size (int): bytes.
    """

    path: str
    relpath: str
    label: int
    size: int


@dataclass
class Corpus:
    """The files to convert, in a deterministic order (sorted by relative path).

    Attributes:
        root (str): the corpus folder.
        items (list[Item]): readable files.
        classes (list[str]): class names (folder names), label ``k`` is ``classes[k]``; empty when flat.
        problems (list[str]): one line per file or folder that could not be used, naming it and why.
        ignored (int): hidden files (``.DS_Store`` ...) left out on purpose.
    """

    root: str
    items: list[Item] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    ignored: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(i.size for i in self.items)

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
    corpus = Corpus(str(root.resolve()))
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
    seen_dirs = {_dir_id(root)}
    if folders:
        corpus.classes = [e.name for e in folders]
        for label, entry in enumerate(folders):
            before = len(corpus.items)
            _walk(corpus, root, Path(entry.path), label, seen_dirs)
            if len(corpus.items) == before:
                corpus.problems.append(
                    f"{entry.path}: class folder has no readable file; "
                    f"class {entry.name!r} keeps label {label} but gets no samples"
                )
    else:
        _walk(corpus, root, root, -1, seen_dirs)
    if not corpus.items:
        first = f" ({len(corpus.problems)} problems, first: {corpus.problems[0]})" if corpus.problems else ""
        raise ConfigError(f"{src}: no readable file found{first}")
    corpus.items.sort(key=lambda i: i.relpath)
    return corpus


def _dir_id(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


def _walk(
    corpus: Corpus, root: Path, folder: Path, label: int, seen_dirs: set[tuple[int, int]], rel: str | None = None
) -> None:
    # plain strings and DirEntry.stat(), not Path objects and os.path.relpath: listing dominated the
    # conversion of small files (0.6 s for 10k files, as long as 'tar cf' takes for all of them)
    if rel is None:
        rel = Path(os.path.relpath(folder, root)).as_posix()
        rel = "" if rel == "." else rel
    try:
        seen_dirs.add(_dir_id(folder))
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        corpus.problems.append(f"{folder}: cannot list folder ({e.strerror})")
        return
    absolute = os.path.abspath(folder)
    items = corpus.items
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            corpus.ignored += 1
            continue
        try:
            st = entry.stat()  # follows links
        except OSError as e:
            why = "broken link" if entry.is_symlink() else e.strerror
            corpus.problems.append(f"{entry.path}: cannot be read ({why})")
            continue
        child_rel = f"{rel}/{name}" if rel else name
        if stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key in seen_dirs:
                corpus.problems.append(f"{entry.path}: symlink loop (leads back to a folder already listed); skipped")
                continue
            _walk(corpus, root, Path(entry.path), label, seen_dirs, child_rel)
        elif stat.S_ISREG(st.st_mode):
            if not os.access(entry.path, os.R_OK):
                corpus.problems.append(f"{entry.path}: cannot be read (permission denied)")
                continue
            items.append(Item(os.path.join(absolute, name), child_rel, label, st.st_size))
        else:
            corpus.problems.append(f"{entry.path}: not a regular file; skipped")
