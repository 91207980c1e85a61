"""The error tree and the bad-input policy shared by every backend.

::

    FastdataError                              everything fastdata raises on purpose
    ├── ConfigError (ValueError)               a bad option, caught at construction
    ├── PlanError (ValueError)                 a layout that cannot be split fairly (too few shards ...)
    ├── SourceNotFound (FileNotFoundError)     a missing file, shard, HDF5 field or S3 key
    ├── SourceUnreadable (PermissionError)     a file or key that exists but cannot be read
    ├── SourceUnavailable (ConnectionError)    a store that did not answer (S3 down, unreachable, throttling)
    ├── CacheError (OSError)                   the node-local cache folder cannot be used (not writable, full,
    │                                          a cached copy damaged again after it was fetched again)
    ├── TooManyBadSamples                      under ``"skip"``: no good sample found to stand in for bad ones
    ├── CannotBatch (RuntimeError)             samples that do not collate into one batch (images of
    │                                          different sizes, PIL images): a setting to change, never skipped
    └── BadSample                              the data itself is bad; ``on_error`` decides
        ├── CorruptShard                       a truncated tar or a damaged header
        ├── UnsafeMember                       a member name with ``..``, an absolute path, a link
        ├── DecodeFailed                       bytes that the decoder (PIL, OpenCV, json ...) rejects
        └── TransformFailed                    the user's ``transform=`` raised on a sample

``on_error="raise"`` (the default) raises the first :class:`BadSample` with a message that names the
file, member or key and says what to do. ``on_error="skip"`` drops the sample, counts it in a counter
shared by every worker of the dataset (:meth:`ErrorPolicy.counts`), and warns once per file (per
process): every distinct file, shard or key skipped is named in a warning of its own.
A missing, unreadable or unreachable source (:class:`SourceNotFound`, :class:`SourceUnreadable`,
:class:`SourceUnavailable`, when it is one object of the data) is skipped too under ``"skip"``, and counted.
A batch whose samples are all bad, and ``ds[i]`` of a bad sample, get a substitute sample instead of
nothing (the rule is in :mod:`fastdata.datasets`); :class:`TooManyBadSamples` is raised only when
no good sample stands near enough to take their place.

Every one of these errors carries ``source`` (str): the file, shard or key it is about ("" when unknown).
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, get_args

OnError = Literal["raise", "skip"]


class FastdataError(Exception):
    """Base of every error fastdata raises on purpose."""


class ConfigError(FastdataError, ValueError):
    """An option is out of range or misspelled; raised when the object is built."""


class PlanError(FastdataError, ValueError):
    """The data cannot be split over ranks and workers as asked (for example, too few shards)."""


class SourceNotFound(FastdataError, FileNotFoundError):
    """A file, shard, field or object does not exist.

    Args:
        message (str): names the file or key, and the fix.
        source (str): the file or key, for the error policy's warnings. Defaults to "".
    """

    def __init__(self, message: str, source: str = "") -> None:
        super().__init__(message)
        self.source = source


class SourceUnreadable(FastdataError, PermissionError):
    """A file or object exists but cannot be read.

    Args:
        message (str): names the file or key, and the fix.
        source (str): the file or key, for the error policy's warnings. Defaults to "".
    """

    def __init__(self, message: str, source: str = "") -> None:
        super().__init__(message)
        self.source = source


class SourceChanged(FastdataError, OSError):
    """A file changed (shrank, or was rewritten in place) while it was being read: its pages may be gone,
    or hold another file's bytes. Never skipped: what was read of it may already be wrong.

    Args:
        message (str): names the file, what changed, and the fix.
        source (str): the file. Defaults to "".
    """

    def __init__(self, message: str, source: str = "") -> None:
        super().__init__(message)
        self.source = source

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.source))  # OSError's own would lose the message in a worker


class SourceUnavailable(FastdataError, ConnectionError):
    """The store holding a file or object did not answer after every retry: down, unreachable (nothing
    listening, a DNS or TLS failure, timeouts) or throttling. Raised as it is where the data cannot be
    planned without it (listing, counting at construction); subject to ``on_error`` when it is the read
    of one object.

    Args:
        message (str): names the object, the endpoint and the fix.
        source (str): the object, for the error policy's warnings. Defaults to "".
    """

    def __init__(self, message: str, source: str = "") -> None:
        super().__init__(message)
        self.source = source


class CacheError(FastdataError, OSError):
    """The node-local cache folder of remote objects cannot be used: it cannot be written, it is full, or a
    cached copy is still damaged after it was fetched again. The message names the folder and the ways
    out (another folder, ``cache_dir=False`` to read from the store).

    Args:
        message (str): names the folder (and the object), and the fix.
        source (str): the object it is about. Defaults to "".
    """

    def __init__(self, message: str, source: str = "") -> None:
        super().__init__(message)
        self.source = source


class TooManyBadSamples(FastdataError):
    """Under ``on_error="skip"``, bad samples needed a substitute (a batch of only bad samples, or ``ds[i]``
    of a bad one) and none of the samples looked at after them was good: the data is mostly bad. The
    message names the files and the fix."""


class CannotBatch(FastdataError, RuntimeError):
    """The samples of one batch cannot be collated into one: tensors or arrays of different shapes under
    one key (photos of different sizes), or values the collate function cannot batch (PIL images). The
    message names the key, the samples and the fixes (resize as they are decoded, ``transform=``,
    ``collate_fn=``). Raised at the first such batch under any ``on_error``: skipping would not help."""


class BadSample(FastdataError):
    """The bytes of one sample (or of the file holding it) are bad. Subject to ``on_error``.

    Attributes:
        source (str): the file, shard or key that holds the bad sample.
    """

    def __init__(self, message: str, source: str = "") -> None:
        super().__init__(message)
        self.source = source


class CorruptShard(BadSample):
    """A tar shard is truncated or has a damaged header."""


class UnsafeMember(BadSample):
    """A tar member would escape its folder (``..``, absolute path) or is not a regular file."""


class DecodeFailed(BadSample):
    """A decoder rejected a member's bytes (corrupt JPEG, bad JSON, ...)."""


class TransformFailed(BadSample):
    """The user's ``transform=`` raised on a sample. The message names the file or shard, the sample's key
    and index, and the exception (chained as ``__cause__``); under ``on_error="skip"`` the sample is
    counted and left out, as a failed decode is."""


def check_choice(name: str, value: object, allowed: object) -> None:
    """Raise :class:`ConfigError` listing the allowed values when ``value`` is not one of them.

    Args:
        name (str): the option's name, for the message.
        value (object): what the user passed.
        allowed (object): a ``Literal[...]`` type or an iterable of allowed values.
    """
    choices = get_args(allowed) or tuple(allowed)  # type: ignore[call-overload,arg-type]
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")


def check_positive(name: str, value: int | float, *, allow_zero: bool = False) -> None:
    """Raise :class:`ConfigError` unless ``value`` is > 0 (or >= 0 with ``allow_zero``)."""
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name}={value!r} must be {bound}")


_collector = threading.local()


@contextmanager
def collecting() -> Iterator[list[FastdataError]]:
    """Collect, into the list this yields, the bad input that any :class:`ErrorPolicy` under ``"skip"``
    handles in this thread inside the block, instead of counting it and warning about it.

    For a search that reads samples only to find a good one (a substitute): the bad ones it meets are
    counted, and warned about, when they are read in their own turn. Under ``"raise"`` errors are raised
    as always. Blocks nest; other threads (a background fetch) count as usual.
    """
    saved = getattr(_collector, "errors", None)
    errors: list[FastdataError] = []
    _collector.errors = errors
    try:
        yield errors
    finally:
        _collector.errors = saved


def is_collecting() -> bool:
    """Whether this thread is inside :func:`collecting` (a substitute search): counters of what a read
    met (timeouts, say) are then left to the read of those samples in their own turn."""
    return getattr(_collector, "errors", None) is not None


def source_of(error: BaseException) -> str:
    """The file, shard or key an error is about: its ``source`` (or ``filename``), else its message."""
    return getattr(error, "source", "") or str(getattr(error, "filename", "") or "") or str(error)


class ErrorPolicy:
    """What a dataset does with a bad sample: raise it, or skip it and count it.

    The counters live in the dataset's shared state (:class:`fastdata.core.process.SharedState`), so the
    counts from every worker process are visible in the main process while and after it iterates.

    Args:
        on_error ("raise" | "skip"): Defaults to ``"raise"``.
        counters: a callable that returns the shared counter array (one slot per process).
    """

    def __init__(self, on_error: OnError, shared: object) -> None:
        check_choice("on_error", on_error, OnError)
        self.on_error = on_error
        self._shared = shared
        self._warned: set[str] = set()

    def __getstate__(self) -> dict[str, object]:
        # the set of files already warned about belongs to one process
        return {"on_error": self.on_error, "_shared": self._shared, "_warned": set()}

    def handle(self, error: BadSample | SourceNotFound | SourceUnreadable | SourceUnavailable) -> None:
        """Raise ``error`` under ``"raise"``; under ``"skip"`` count it and warn once per source.

        The source is the error's ``source`` (or ``filename``); an error that names none is told apart
        by its message (which names the file), so two different files are never folded into one warning.
        """
        if self.on_error == "raise":
            raise error
        collected = getattr(_collector, "errors", None)
        if collected is not None:  # a substitute search (see collecting): counted in its own turn
            collected.append(error)
            return
        self._shared.count_skip()  # type: ignore[attr-defined]
        source = getattr(error, "source", "") or str(getattr(error, "filename", "") or "")
        seen = source or str(error)
        if seen not in self._warned:
            self._warned.add(seen)
            message = _SKIP_HINT.sub("", str(error))  # its advice to pass on_error='skip' is taken already
            where = f" in {source}" if source and source not in message else ""  # most messages name it first
            warnings.warn(
                f"fastdata: skipping bad sample(s){where}: {message} "
                "(on_error='skip'; see dataset.skipped for the count)",
                BadSampleWarning,
                stacklevel=3,
            )


# the advice "(or) pass on_error='skip' (to leave ... out)" that bad-input messages end with
_SKIP_HINT = re.compile(r"[,;]?\s*(?:or\s+)?(?:pass\s+)?on_error='skip'(?:\s+to leave [^;,.]*)?(?=[,;.]|$)")


class BadSampleWarning(UserWarning):
    """Warned once per file when ``on_error="skip"`` drops a sample from it."""


class EgressWarning(UserWarning):
    """Remote data: a setting makes stored bytes be fetched more than once per epoch (the message names the
    setting that fetches each once)."""


class SubstituteWarning(BadSampleWarning):
    """Warned once per dataset when a substitute sample first stands in for bad ones (a batch of only bad
    samples, or ``ds[i]`` of a bad one, under ``on_error="skip"``; see :mod:`fastdata.datasets`)."""


__all__ = [
    "BadSample",
    "BadSampleWarning",
    "CacheError",
    "CannotBatch",
    "ConfigError",
    "CorruptShard",
    "DecodeFailed",
    "EgressWarning",
    "ErrorPolicy",
    "FastdataError",
    "OnError",
    "PlanError",
    "SourceChanged",
    "SourceNotFound",
    "SourceUnavailable",
    "SourceUnreadable",
    "SubstituteWarning",
    "TooManyBadSamples",
    "TransformFailed",
    "UnsafeMember",
    "check_choice",
    "check_positive",
    "collecting",
    "is_collecting",
    "source_of",
]
