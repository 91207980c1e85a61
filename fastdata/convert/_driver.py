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

if TYPE_CHECKING:
    from tqdm import tqdm

    from fastdata.convert._plan import Plan
    from fastdata.convert._remote import RemoteOutput


class _QuietBar:
    """What a conversion without a bar uses in its place: a quiet run does not import tqdm (~40 ms of
    start-up, a tenth of converting 10,000 small files)."""

    files = total_files = total_shards = 0

    def update(self, n: int) -> None:
        pass

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def set_description_str(self, text: str) -> None:
        pass

    def __enter__(self) -> _QuietBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def progress_bar(plan: Plan, done: set[str], *, resumed: bool, enabled: bool) -> tqdm:
    """A bar in bytes (MB/s), with files and shards done in its postfix."""
    if not enabled:
        return _QuietBar()  # type: ignore[return-value]
    from tqdm import tqdm

    total_bytes = sum(plan.shard_bytes(i) for i in range(len(plan.names)))
    done_bytes = sum(plan.shard_bytes(i) for i, n in enumerate(plan.names) if n in done)
    bar = tqdm(
        total=total_bytes,
        initial=done_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"fastdata convert{' (resumed)' if resumed and done else ''}",
        disable=not enabled,
        dynamic_ncols=True,
    )
    bar.files = sum(len(plan.shards[i]) for i, n in enumerate(plan.names) if n in done)  # type: ignore[attr-defined]
    bar.total_files, bar.total_shards = plan.samples, len(plan.names)  # type: ignore[attr-defined]
    return bar


def advance(bar: tqdm, files: int, nbytes: int, remote: RemoteOutput | None = None) -> None:
    bar.files += files  # type: ignore[attr-defined]
    uploaded = f", {remote.uploaded}/{bar.total_shards} shards uploaded" if remote is not None else ""  # type: ignore[attr-defined]
    bar.set_postfix_str(f"{bar.files}/{bar.total_files} files{uploaded}", refresh=False)  # type: ignore[attr-defined]
    bar.update(nbytes)


def run_shards(
    state: ConversionState,
    plan: Plan,
    task: ShardTask,
    todo: list[int],
    *,
    workers: int,
    engine: Engine = "local",
    address: str | None = None,
    bar: tqdm,
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
            advance(bar, files, nbytes, remote)
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
                progress=lambda f, b: advance(bar, f, b, remote),
                before_each=remote.make_room if remote is not None else None,
            )
        else:
            run_parallel(
                task,
                plan,
                todo,
                workers=min(workers, len(todo)),
                on_record=on_record,
                progress=lambda f, b: advance(bar, f, b, remote),
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
