"""Backends of ``fastdata bench``: one private module per data format, listed in :data:`MODULES`.

Adding a backend is adding a file ``fastdata/bench/backends/_<name>.py`` and its name to :data:`MODULES`.
The module provides::

    NAME: str                  # optional; defaults to the module's name. What --format takes.
    PRIORITY: int              # optional; lower is asked first by auto-detection. Defaults to 50.
    EXTRA: str | None          # optional; the pip extra its libraries come from, for install hints.
    DEMO_BATCH_SIZE: int       # optional; the batch size of the demo sweep. Defaults to 64.
    DATASET_BATCHES: bool      # optional; open() takes batch_size= and the dataset batches itself (the
                               # command passes --batch-size to it). Defaults to False.
    def batches_in_dataset(spec: str, options: dict) -> bool:
        '''Optional: DATASET_BATCHES for this SPEC, where it depends on what SPEC holds (S3 shards batch
        in the dataset, S3 objects do not).'''
    DEFAULT_DECODE: str        # optional; what decode= defaults to ("raw": bytes), for the report.
    FETCH_CACHE: bool          # optional; the data is remote and open() takes cache_dir=: unless the user
                               # gives -o cache_dir=DIR (or false), the command gives the sweep a temporary
                               # fetch cache, so that each remote byte is fetched once per run. Defaults to False.

    def detect(spec: str) -> bool:
        '''True when SPEC is data of this format: a shard pattern, an HDF5 file, a folder of videos,
        an s3:// prefix ... Cheap (look at the name, or a file's first bytes), and specific: a backend
        that is not sure says False.'''

    def prepare(spec: str, options: dict) -> tuple[dict, str] | tuple[dict, str, dict]:
        '''Optional. Before the sweep, once: the options every open() of the sweep gets (a decode chosen
        so that batches batch: images of different sizes resized, say), and which decode that measures,
        in words, for the report; optionally facts for the report: ``source`` (what is read, in words),
        ``stored_bytes``, ``fetched_bytes`` (fetched by the preparation itself), ``loader_batch_size``
        (a ``-o batch_size`` the DataLoader applies). Raise ConfigError for options that cannot work.'''

    def open(spec: str, **options) -> torch.utils.data.Dataset:
        '''The dataset to benchmark. ``options`` come from ``fastdata bench -o KEY=VALUE`` (values parsed
        as JSON when they parse, else strings); unknown ones raise ConfigError.'''

    def demo(folder: pathlib.Path, scale: float = 1.0) -> contextlib.AbstractContextManager[str | tuple[str, dict]]:
        '''Build small synthetic data under ``folder`` (a few seconds' work, tens of MB at most; ``scale``
        times that much, for ``--demo --quick`` and tests; optional, for demos that cannot shrink) and
        yield its SPEC, or ``(SPEC, options)`` where ``options`` are open() options that hold only for
        this data (the endpoint of a server it started, an index file in ``folder`` ...); on exit,
        also after an error or Ctrl-C, stop whatever it started (a local S3 server, ...). The caller
        removes ``folder``. The dataset ``open(spec, **DEMO_OPTIONS, **options)`` gives is what the
        demo sweeps. Options are recorded in the demo's JSON through ``repr``/``str``: pass secrets
        inside an object whose repr hides them (an ``S3Config``), never as plain strings. When the demo
        cannot run here (a tool it needs is not installed), raise :class:`DemoUnavailable` saying how
        to install it: ``fastdata bench --demo`` then lists the backend as skipped.'''

    DEMO_OPTIONS: dict         # optional; options for open() in the demo (decode="numpy" ...).

A module that fails to import (its extra is not installed) is listed as unavailable, with the reason;
``fastdata bench --demo`` skips it and says so. A module checks that its libraries are installed with
:func:`require` (which looks for them without importing them), so that finding the backends stays cheap.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from fastdata.core.errors import ConfigError, SourceNotFound

MODULES = ("_tar", "_hdf5", "_video", "_s3")
"""The backend modules of this package (each is asked in its ``PRIORITY`` order, not this one)."""


class DemoUnavailable(ConfigError):
    """A backend's demo cannot run on this machine (a tool it needs is missing); the message says how
    to install it. ``fastdata bench --demo`` lists the backend as skipped."""


def require(*modules: str, extra: str) -> None:
    """Raise ImportError (naming the extra to install) unless every one of ``modules`` is installed.

    Looks for them with :func:`importlib.util.find_spec`, without importing them: the registry imports
    every backend module to list them, and h5py, PyAV or boto3 each take a noticeable time to import.
    """
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ImportError(f"{name} is not installed; pip install 'fastdata[{extra}]'", name=name)


def public_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` as they may be written to a report: JSON values as they are, any other object as its
    ``repr`` (never taken apart: ``dataclasses.asdict`` on a report would expose an ``S3Config``'s
    credentials, which its repr hides)."""

    def plain(v: Any) -> bool:
        if v is None or isinstance(v, (str, int, float, bool)):
            return True
        if isinstance(v, (list, tuple)):
            return all(plain(x) for x in v)
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        return False

    return {k: (v if plain(v) else repr(v)) for k, v in options.items()}


@dataclass
class DemoData:
    """What a backend's demo built: the SPEC, and the options of ``open()`` for it.

    Attributes:
        spec (str): the data, as ``fastdata bench SPEC`` takes it.
        options (dict): the backend's ``DEMO_OPTIONS`` and the options its demo yielded for this data.
    """

    spec: str
    options: dict[str, Any]


@dataclass
class Backend:
    """One backend, as found by :func:`backends`.

    Attributes:
        name (str): what ``--format`` takes.
        module (str): the module that implements it.
        priority (int): detection order (lower first).
        error (str | None): why it is unavailable (its import failed), or None.
    """

    name: str
    module: str
    priority: int = 50
    error: str | None = None
    extra: str | None = None
    _mod: ModuleType | None = field(default=None, repr=False)

    @property
    def available(self) -> bool:
        return self.error is None

    def _require(self) -> ModuleType:
        if self._mod is None:
            hint = f"; install it with pip install 'fastdata[{self.extra}]'" if self.extra else ""
            raise ConfigError(f"the {self.name} backend is unavailable: {self.error}{hint}")
        return self._mod

    def detect(self, spec: str) -> bool:
        if self._mod is None:
            return False
        try:
            return bool(self._mod.detect(spec))
        except OSError:
            return False

    def open(self, spec: str, **options: Any) -> Any:
        return self._require().open(spec, **options)

    def prepare(self, spec: str, options: dict[str, Any]) -> tuple[dict[str, Any], str | None, dict[str, Any]]:
        """The options to sweep, which decode they measure and facts for the report (the backend's
        ``prepare``, where it has one; else the options as they are, None and no facts)."""
        mod = self._require()
        prepare = getattr(mod, "prepare", None)
        if not callable(prepare):
            return dict(options), None, {}
        out, note, *facts = prepare(spec, dict(options))
        return dict(out), note, dict(facts[0]) if facts else {}

    @property
    def fetch_cache(self) -> bool:
        """The data is remote and the sweep reads it through a fetch cache (``cache_dir=``)."""
        return bool(getattr(self._mod, "FETCH_CACHE", False))

    @contextlib.contextmanager
    def demo(self, folder: Path, scale: float = 1.0) -> Iterator[DemoData]:
        """Build the backend's demo data under ``folder`` (``scale`` times the usual amount, where the
        backend's demo takes a scale); yields its :class:`DemoData`."""
        make = self._require().demo
        if scale != 1.0 and "scale" in inspect.signature(make).parameters:
            built_cm = make(folder, scale=scale)
        else:
            built_cm = make(folder)
        with built_cm as built:
            spec, extra = built if isinstance(built, tuple) else (built, {})
            yield DemoData(spec, {**self.demo_options, **extra})

    @property
    def demo_options(self) -> dict[str, Any]:
        return dict(getattr(self._mod, "DEMO_OPTIONS", {}) or {})

    @property
    def demo_batch_size(self) -> int:
        return int(getattr(self._mod, "DEMO_BATCH_SIZE", 64))

    @property
    def dataset_batches(self) -> bool:
        """The backend's dataset batches itself by default (``-o batch_size=N``; ``batch_size=null``
        reads sample by sample, batched by the DataLoader)."""
        return bool(getattr(self._mod, "DATASET_BATCHES", False))

    def batches_in_dataset(self, spec: str, options: dict[str, Any]) -> bool:
        """Whether the dataset of ``spec`` batches itself (``-o batch_size=N``), as the backend says for it."""
        decide = getattr(self._mod, "batches_in_dataset", None)
        return bool(decide(spec, dict(options))) if callable(decide) else self.dataset_batches

    @property
    def default_decode(self) -> str | None:
        """What ``decode`` defaults to for this backend, where it has the option."""
        return getattr(self._mod, "DEFAULT_DECODE", None)


def _load(module: str) -> Backend:
    short = module.rsplit(".", 1)[-1].lstrip("_")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        return Backend(short, module, error=f"{type(e).__name__}: {e}")
    for needed in ("detect", "open", "demo"):
        if not callable(getattr(mod, needed, None)):
            return Backend(getattr(mod, "NAME", short), module, error=f"{module} has no {needed}() function")
    return Backend(
        getattr(mod, "NAME", short), module, int(getattr(mod, "PRIORITY", 50)), None, getattr(mod, "EXTRA", None), mod
    )


def backends() -> list[Backend]:
    """Every backend of :data:`MODULES`, by priority."""
    found = [_load(f"{__name__}.{name}") for name in MODULES]
    return sorted(found, key=lambda b: (b.priority, b.name))


def get(name: str) -> Backend:
    """The backend called ``name``."""
    known = backends()
    for b in known:
        if b.name == name:
            return b
    raise ConfigError(f"--format {name!r} is not one of {', '.join(b.name for b in known)}")


def detect(spec: str) -> Backend:
    """The first backend (by priority) that recognises ``spec``.

    Raises:
        SourceNotFound: a folder no backend finds anything in ("holds no shards, HDF5 files or videos").
        ConfigError: data no backend recognises: pass ``--format``.
    """
    known = backends()
    for b in known:
        if b.detect(spec):
            return b
    names = ", ".join(b.name for b in known)
    if "://" not in spec and os.path.isdir(spec):
        raise SourceNotFound(
            f"{spec}: holds no shards, HDF5 files or videos that a backend recognises; give the files or a "
            f"pattern, or pass --format (one of {names})",
            spec,
        )
    raise ConfigError(f"{spec}: cannot tell its format; pass --format (one of {names})")


__all__ = [
    "MODULES",
    "Backend",
    "DemoData",
    "DemoUnavailable",
    "backends",
    "detect",
    "get",
    "public_options",
    "require",
]
