"""Fields reached through HDF5 links: which file holds a dataset's data (an external link leads to
another file, as the "master files" of detector data do), and how a link on the way to a field fails.

h5py follows soft and external links when a field is looked up, as HDF5 does (a relative external link
resolves against ``HDF5_EXT_PREFIX``, then the linking file's folder); fastdata reads what it finds there,
and reads rows straight from the file that :func:`linked_file` names.
"""

from __future__ import annotations

import os
from typing import Any

import h5py


def linked_file(ds: Any, path: str) -> str | None:
    """The file holding ``ds``'s data when it is not ``path`` (reached through an external link)."""
    if not path:
        return None
    held, mine = os.path.abspath(ds.file.filename), os.path.abspath(path)
    if held == mine:
        return None
    try:
        return None if os.path.samefile(held, mine) else held
    except OSError:
        return held


def broken_link(f: Any, name: str) -> str:
    """How the link at ``name``, or a link on the way to it, fails to resolve; "" when none does."""
    parts = name.strip("/").split("/")
    for k in range(1, len(parts) + 1):
        sub = "/".join(parts[:k])
        try:
            link = f.get(sub, getlink=True)
        except (KeyError, OSError):
            return ""
        if link is None:
            return ""
        try:
            f[sub]
            continue
        except (KeyError, OSError):  # this link is the one that does not resolve
            pass
        if isinstance(link, h5py.ExternalLink):
            return (
                f"is reached through an external link ({sub!r} -> {link.filename}:{link.path}) that HDF5 cannot "
                "follow: the linked file, or that path in it, does not exist; put the linked file where the "
                "link says (a relative link resolves against the linking file's folder) or set HDF5_EXT_PREFIX"
            )
        if isinstance(link, h5py.SoftLink):
            return (
                f"is reached through a soft link ({sub!r} -> {link.path}) to nothing; fix the link or name its target"
            )
        return ""
    return ""
