"""Where fastdata keeps what it makes for itself on this node (video indexes, conversion staging, remote
shards it had to download to index them): one folder, chosen by the environment."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$FASTDATA_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastdata``, else ``~/.cache/fastdata``."""
    if os.environ.get("FASTDATA_CACHE_DIR"):
        return Path(os.environ["FASTDATA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastdata"


__all__ = ["default_cache_dir"]
