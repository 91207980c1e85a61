"""A conversion run as its own process, paused mid-way for a test to kill it.

    python -m tests.convert_driver SRC OUT AFTER '{"shard_count": 8, ...}'

runs ``fastdata.convert.convert(SRC, OUT, **options)`` with an ``on_shard`` hook that, once AFTER shards
are finished, prints ``MID <records>`` on stdout and then blocks reading stdin: the run cannot get further
than the shards already handed out, so the test that waits for the line kills it mid-way, every time
(no sleeps, no race with a conversion that finishes first). ``"engine": "ray"`` connects to the cluster
in ``$RAY_ADDRESS``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fastdata.convert import ConversionPlan, Corpus, convert
from fastdata.convert._run import run


def convert_listed(corpus: Corpus, out: str, **options: Any) -> dict[str, Any]:
    """``convert(corpus.root, out, **options)`` over a corpus listed before (changed since, by the test)."""
    return run(ConversionPlan(corpus.root, out, **options), corpus)


def main() -> None:
    src, out, after, options = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    seen: list[str] = []

    def on_shard(record: dict[str, object]) -> None:
        seen.append(str(record["name"]))
        if len(seen) == after:
            print(f"MID {len(seen)}", flush=True)
            sys.stdin.read()  # held here until killed

    convert(src, out, progress=False, on_shard=on_shard, **options)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()


# -- used by the tests -------------------------------------------------------------------------------
def start_paused(
    src: str, out: str, after: int, options: dict[str, object], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start the driver and return once it is paused after ``after`` finished shards."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.convert_driver", src, out, str(after), json.dumps(options)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=root,
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    if not line.startswith(b"MID"):
        proc.kill()
        raise AssertionError(f"the conversion did not pause mid-way: {line!r} {proc.stderr.read()[-2000:]!r}")
    return proc


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (its conversion workers)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver, then wait (polling /proc, bounded) until its workers are gone too."""
    kids = children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while any(_alive(k) for k in kids):
        assert time.monotonic() < deadline, f"workers {kids} outlived their killed parent"
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"  # a zombie has stopped: only its exit status is left for init to collect
