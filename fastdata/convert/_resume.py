"""What makes a conversion resumable: a state folder ``OUT/.fastdata-convert/`` holding

* ``state.json``: the options and the plan's fingerprint, written before the first shard;
* ``done/NAME.json``: one record per finished shard (samples, bytes, sha256 ...), written atomically
  after the shard itself was renamed into place;
* ``lock``: held (``flock``) while a conversion runs, so two runs never write one folder.

A shard counts as finished only when its record exists and the shard has the recorded size; anything
else (a temporary file, a shard without a record) is redone. Since the plan is deterministic, redoing
a shard writes the same bytes. A rerun with other options, or over a corpus that changed, is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

from fastdata.convert._plan import Plan, shard_names
from fastdata.core.errors import ConfigError
from fastdata.formats import MANIFEST
from fastdata.formats.tar import write_atomic

STATE_DIR = ".fastdata-convert"
_FLAGS = {
    "shard_size": "--shard-size",
    "shard_count": "--shard-count",
    "shuffle": "--shuffle",
    "seed": "--seed",
    "prefix": "--prefix",
    "format": "--format",
    "decode": "--decode",
    "size": "--size",
    "skip_bad": "--skip-bad",
}


class ConversionState:
    """The state folder of one output folder. Use :func:`open_state`."""

    def __init__(self, out: str, fsync: bool, lock_fd: int = -1) -> None:
        self.out = out
        self.lock_fd = lock_fd
        self.root = os.path.join(out, STATE_DIR)
        self.done_dir = os.path.join(self.root, "done")
        self.fsync = fsync

    # -- records of finished shards ---------------------------------------------------------------
    def record_path(self, name: str) -> str:
        return os.path.join(self.done_dir, name + ".json")

    def records(self, plan: Plan) -> dict[str, dict[str, Any]]:
        """Every readable record of a planned shard, by shard name, whether or not the shard is on disk."""
        out: dict[str, dict[str, Any]] = {}
        for name in plan.names:
            try:
                with open(self.record_path(name), "rb") as f:
                    record = json.load(f)
                if record["name"] == name and isinstance(record["bytes"], int):
                    out[name] = record
            except (OSError, ValueError, KeyError, TypeError):
                continue  # missing or half-written: the shard is redone
        return out

    def finished(self, plan: Plan) -> dict[str, dict[str, Any]]:
        """Records of the planned shards that are complete on disk, by shard name."""
        out: dict[str, dict[str, Any]] = {}
        sidecar = plan.options.get("format", "tar") == "tar"
        for name, record in self.records(plan).items():
            try:
                if os.stat(os.path.join(self.out, name)).st_size == record["bytes"] and (
                    not sidecar or os.path.isfile(os.path.join(self.out, name + ".idx"))
                ):
                    out[name] = record
            except OSError:
                continue  # missing or stale: the shard is redone
        return out

    def save_record(self, record: dict[str, Any]) -> None:
        write_atomic(self.record_path(record["name"]), json.dumps(record).encode(), fsync=self.fsync)
        if self.fsync:
            sync_dir(self.done_dir)

    # -- the run's options ------------------------------------------------------------------------
    def check_or_start(self, plan: Plan, *, src: str, restart: bool) -> bool:
        """Compare ``plan`` with the interrupted run's; start afresh when there is none.

        Returns:
            bool: True when resuming an earlier run.

        Raises:
            ConfigError: the folder holds other files, or an earlier run with other options or over a
                corpus that has changed since (unless ``restart``).
        """
        state_file = os.path.join(self.root, "state.json")
        fingerprint = plan.fingerprint()
        try:
            with open(state_file, "rb") as f:
                earlier = json.load(f)
        except FileNotFoundError:
            earlier = None
        except (OSError, ValueError):
            earlier = {}  # damaged: treat as a run with unknown options
        if earlier is not None and not restart and earlier.get("fingerprint") != fingerprint:
            raise ConfigError(self._mismatch(earlier, plan))
        if earlier is not None and not restart:
            return True
        if earlier is not None:  # restart: forget the earlier run and remove what it wrote
            for entry in os.listdir(self.done_dir) if os.path.isdir(self.done_dir) else []:
                os.unlink(os.path.join(self.done_dir, entry))
            options = earlier.get("options", {})
            prefix, ext = options.get("prefix"), "h5" if options.get("format") == "hdf5" else "tar"
            old = shard_names(prefix, int(earlier.get("shards", 0)), ext) if prefix else []
            for name in [MANIFEST, *old, *(n + ".idx" for n in old)]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.out, name))
        os.makedirs(self.done_dir, exist_ok=True)
        state = {
            "version": 1,
            "fingerprint": fingerprint,
            "options": plan.options,
            "src": src,
            "shards": len(plan.names),
            "samples": plan.samples,
        }
        write_atomic(state_file, json.dumps(state, indent=1).encode(), fsync=self.fsync)
        return False

    def _mismatch(self, earlier: dict[str, Any], plan: Plan) -> str:
        before = earlier.get("options", {})
        diffs = [
            f"{_FLAGS.get(k, k)} was {before.get(k)!r}, now {v!r}"
            for k, v in plan.options.items()
            if before.get(k) != v
        ]
        why = "; ".join(diffs) if diffs else "the corpus changed since (files added, removed, renamed or resized)"
        return (
            f"{self.out}: holds an interrupted conversion that this run does not match: {why}. "
            "Rerun the same command over the same corpus to resume it, or pass --restart "
            "(restart=True) to discard it, or convert into another folder"
        )

    def forget(self) -> None:
        """Remove the state of a run that stopped before writing anything (and ``out`` if that leaves it
        empty), so that the folder is as the user left it."""
        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(self.out)

    def clean_temporaries(self) -> int:
        """Delete temporary files that a killed run left behind; return how many."""
        n = 0
        for folder in (self.out, self.root, self.done_dir):
            try:
                entries = os.listdir(folder)
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.startswith(".") and entry.endswith(".tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(folder, entry))
                        n += 1
        return n


@contextlib.contextmanager
def open_state(out: str, *, fsync: bool) -> Iterator[ConversionState]:
    """The state of output folder ``out`` (created if needed), locked for the duration.

    Raises:
        ConfigError: another conversion is writing ``out`` right now.
    """
    root = os.path.join(out, STATE_DIR)
    if not os.path.isdir(root):
        others = os.listdir(out) if os.path.isdir(out) else []
        if others:
            raise ConfigError(
                f"{out}: is not empty ({len(others)} entries, like {sorted(others)[0]!r}) and "
                "holds no interrupted conversion; convert into an empty or new folder"
            )
    os.makedirs(root, exist_ok=True)
    lock_path = os.path.join(out, STATE_DIR, "lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{out}: another 'fastdata convert' is writing this folder now; wait for it to finish, or stop it"
            ) from None
        yield ConversionState(out, fsync, fd)
    finally:
        os.close(fd)  # releases the lock


def sync_dir(folder: str) -> None:
    """fsync a folder, so the renames into it survive a power loss."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
