"""Running a conversion's shard tasks on a Ray cluster: ``fastdata convert SRC OUT --engine ray``.

The driver (the process running ``fastdata convert``) lists the corpus, makes the same deterministic
plan as a local conversion, and submits one Ray task per shard still to do, a bounded number at a time
(twice the cluster's CPUs). Each task runs ``TarTask`` on whichever node
Ray picks: it reads the shard's files (a shared filesystem, or ``s3://`` objects), writes the shard and
its sidecar under a temporary name, and publishes them:

* into ``OUT`` itself when it is a folder that every node sees (NFS, Lustre ...), saving the shard's
  record into ``OUT/.fastdata-convert/done/`` as a local worker does;
* or, for ``OUT = s3://bucket/prefix``, into a temporary folder on its node, uploaded from there
  (verified by size and SHA-256, skipped when an intact copy is already there); the driver records it.

The driver writes the manifest last, once every shard is recorded. Killing the driver ends the job and
its tasks (Ray stops a dead driver's workers); a rerun keeps the recorded shards and redoes the rest. A
task whose worker dies is retried by Ray (``max_retries``); a failed shard is written again whole, under
a new temporary name, so nothing is duplicated. The shards' bytes equal a local conversion's: the same
plan, the same writer.

Ray is imported only here (``pip install 'fastdata[ray]'``); fastdata must be importable on every node
(installed in the nodes' environment, or shipped with ``runtime_env``).
"""

from __future__ import annotations

import collections
import socket
from collections.abc import Callable
from typing import Any

from fastdata.convert._plan import Entry, Plan
from fastdata.convert._pool import ShardTask
from fastdata.core.errors import ConfigError, FastdataError

PROBE_S = 5.0  # seconds to wait for the cluster's port to answer
MAX_RETRIES = 3
"""Times Ray runs a shard task again after its worker died (a node lost, a process killed)."""


def _write_shard(task: ShardTask, name: str, entries: list[Entry]) -> dict[str, Any]:
    """The Ray task: write one shard, return its record."""
    return task.write(name, entries).result()


def _ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError as e:
        raise ImportError(f"engine='ray' needs {e.name}; install it with pip install 'fastdata[ray]'") from e
    return ray


def check_cluster(address: str | None) -> None:
    """Fail early, before any work: Ray missing, or nothing listening at ``address`` (``HOST:PORT``; Ray
    itself retries an unreachable address for minutes). Other address forms (``auto``, ``ray://``) are
    left to Ray."""
    _ray()
    if address is None or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_S):
            pass
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"--address {address}: no Ray cluster answers there ({e}); start one ('ray start --head "
            "--port PORT') or give the head's address"
        ) from None


def connect(address: str | None) -> bool:
    """Connect to the cluster at ``address`` unless this process is connected already; True if we did."""
    ray = _ray()
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    except ConnectionError as e:
        raise ConfigError(
            f"cannot reach a Ray cluster at {address or '$RAY_ADDRESS'} ({e}); start one ('ray start --head') "
            "or give its address (--address HOST:PORT)"
        ) from e
    return True


def run_ray(
    task: ShardTask,
    plan: Plan,
    todo: list[int],
    *,
    address: str | None,
    on_record: Callable[[dict[str, Any]], None],
    max_retries: int = MAX_RETRIES,
) -> None:
    """Write the shards ``todo`` as Ray tasks; ``on_record`` gets each record in this process as it comes.

    Raises:
        the first error a task raised (the tasks still running are cancelled), or FastdataError when
        a task's worker died more than ``max_retries`` times.
    """
    ray = _ray()
    started = connect(address)
    try:
        write = ray.remote(_write_shard).options(num_cpus=1, max_retries=max_retries, retry_exceptions=False)
        task_ref = ray.put(task)
        limit = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
        left = collections.deque(todo)
        pending: dict[Any, str] = {}
        try:
            while left or pending:
                while left and len(pending) < limit:
                    i = left.popleft()
                    pending[write.remote(task_ref, plan.names[i], plan.shards[i])] = plan.names[i]
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    name = pending.pop(ref)
                    on_record(_get(ray, ref, name))
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
    finally:
        if started:
            ray.shutdown()


def _get(ray: Any, ref: Any, name: str) -> dict[str, Any]:
    from ray.exceptions import RayTaskError, WorkerCrashedError

    try:
        record: dict[str, Any] = ray.get(ref)
        return record
    except RayTaskError as e:
        if isinstance(e.cause, (FastdataError, OSError)):
            raise e.cause from None  # the task's own error (a file that cannot be read, a full disk ...)
        raise
    except WorkerCrashedError as e:
        raise FastdataError(
            f"{name}: the Ray worker writing it died {MAX_RETRIES + 1} times ({e}); check the nodes' memory "
            "and logs, then rerun the same command to resume"
        ) from None
