"""The part of a conversion every format and engine shares: the progress bar, handing the shards still
to do to an engine (this process, worker processes, a Ray cluster), and what happens to each finished
shard's record (uploaded for an ``s3://`` output, passed to the caller's ``on_shard``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastdata.convert._options import Engine, OnShard
from fastdata.convert._pool import ShardTask, run_parallel, run_serial
from fastdata.convert._resume import ConversionState
from fastdata.convert._space import DiskFull, disk_full, is_full
from fastdata.core import Bar, progress_bar

if TYPE_CHECKING:
    from fastdata.convert._plan import Plan
    from fastdata.convert._remote import RemoteOutput


class ConversionBar:
    """The bar of a conversion (:func:`fastdata.core.progress_bar`, in bytes and MB/s), named after the files
    and (``s3://`` output) shards uploaded so far. Use as a context manager."""

    def __init__(self, plan: Plan, done: set[str], *, resumed: bool, enabled: bool) -> None:
        done_shards = [i for i, n in enumerate(plan.names) if n in done]
        self.files = sum(len(plan.shards[i]) for i in done_shards)
        self.total_files, self.total_shards = plan.samples, len(plan.names)
        self.name = f"fastdata convert{' (resumed)' if resumed and done else ''}"
        total = sum(plan.shard_bytes(i) for i in range(len(plan.names)))
        done_bytes = sum(plan.shard_bytes(i) for i in done_shards)
        self._cm = progress_bar(self.name, unit="bytes", total=total, completed=done_bytes, enabled=enabled)

    def __enter__(self) -> ConversionBar:
        self.bar: Bar = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)

    def advance(self, files: int, nbytes: int, remote: RemoteOutput | None = None) -> None:
        self.files += files
        up = f", {remote.uploaded}/{self.total_shards} shards uploaded" if remote is not None else ""
        self.bar.advance(nbytes, description=f"{self.name}: {self.files}/{self.total_files} files{up}")

    def waiting_for_uploads(self) -> None:
        self.bar.advance(0, description="fastdata convert: waiting for the uploads")


def run_shards(
    state: ConversionState,
    plan: Plan,
    task: ShardTask,
    todo: list[int],
    *,
    workers: int,
    engine: Engine = "local",
    address: str | None = None,
    bar: ConversionBar,
    remote: RemoteOutput | None = None,
    staged: list[dict[str, Any]] | None = None,
    on_shard: OnShard | None = None,
) -> None:
    """Write the planned shards ``todo`` with ``engine``; each record goes to ``remote`` (upload) and to
    ``on_shard`` as it arrives.

    Raises:
        DiskFull: the output's disk filled up (the unfinished shards' temporary files are removed).
        whatever a shard task raised (a file that cannot be read ...).
    """
    sizes = {plan.names[i]: (len(plan.shards[i]), plan.shard_bytes(i)) for i in todo}
    left = [sum(b for _, b in sizes.values())]

    def on_record(record: dict[str, Any]) -> None:
        if engine == "ray":  # Ray tasks report whole shards only
            files, nbytes = sizes.get(record["name"], (0, 0))
            bar.advance(files, nbytes, remote)
        left[0] -= sizes.get(record["name"], (0, 0))[1]
        if remote is not None:
            remote.shard_written(record)
        if on_shard is not None:
            on_shard(record)

    def uploads_from_before() -> None:
        # only once the writers exist: under fork they must start before any upload thread does
        for record in staged or []:
            assert remote is not None
            remote.shard_written(record)

    try:
        if engine == "ray":
            from fastdata.convert._ray_engine import run_ray

            uploads_from_before()
            run_ray(task, plan, todo, address=address, on_record=on_record)
        elif workers == 1 or len(todo) <= 1:
            uploads_from_before()
            run_serial(
                task,
                plan,
                todo,
                on_record=on_record,
                progress=lambda f, b: bar.advance(f, b, remote),
                before_each=remote.make_room if remote is not None else None,
            )
        else:
            run_parallel(
                task,
                plan,
                todo,
                workers=min(workers, len(todo)),
                on_record=on_record,
                progress=lambda f, b: bar.advance(f, b, remote),
                room=remote.room if remote is not None else None,
                make_room=remote.make_room if remote is not None else None,
                started=uploads_from_before,
                lock_fd=state.lock_fd,
            )
        state.clean_temporaries()  # left by a worker that died and whose shard was written again
    except OSError as e:
        if not is_full(e):
            raise
        state.clean_temporaries()
        if isinstance(e, DiskFull):
            raise
        raise disk_full(state.out, e, left[0]) from e
