"""``fastdata bench ... --profile``: py-spy at one DataLoader setting, its flame graph, the top frames by stage.

The loader runs in this process at the given configuration while ``py-spy record --subprocesses
--idle --threads`` samples it and its workers for a few seconds (``--idle``: a main process blocked in
``queue.get`` is the answer to "is it waiting for the workers?", so waiting stacks count too). The
collapsed stacks are grouped by process (the main process's main thread; the workers' main threads)
and by stage (decode, fetch, transform, collate, ``queue.get``, unpickle) from the leafmost frame
that names one ("step": the profiling loop's own simulated step), and saved as a flame graph (SVG,
written here: py-spy's own SVG cannot be regrouped) and as the raw stacks.

py-spy reads another process's memory through ptrace: where that is not allowed (a container
without ``CAP_SYS_PTRACE``, ``kernel.yama.ptrace_scope`` >= 2, a non-root user with
``ptrace_scope`` 1 profiling its own children is fine) the message says so and how to allow it.
py-spy comes with ``pip install 'fastdata[profile]'``.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastdata.core.errors import ConfigError

SECONDS = 4.0
RATE = 100  # samples per second
INSTALL = "pip install 'fastdata[profile]' (or pip install py-spy)"
PTRACE_HELP = (
    "py-spy could not attach: ptrace is not allowed here. Run as root, allow it with "
    "'sysctl kernel.yama.ptrace_scope=0', or, in Docker, add '--cap-add SYS_PTRACE'"
)

# this module as py-spy names its frames (from its own name: moving the file moves it): the profiling loop's
HERE = __name__.replace(".", "/") + ".py"  # own frames are the simulated training step
# frames that are the DataLoader's own plumbing: never the stage a sample is in
_PLUMBING = re.compile(r"torch/utils/data/_utils/(fetch|worker)\.py|torch/utils/data/dataloader\.py")
_STAGES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("unpickle", re.compile(r"rebuild_|_rebuild|reductions\.py|pickle|\bloads\b", re.I)),
    ("decode", re.compile(r"decode|PIL/|Image\.|cv2|/av/|decord|jpeg|imdecode|torchcodec", re.I)),
    ("transform", re.compile(r"transform", re.I)),
    ("collate", re.compile(r"collate", re.I)),
    ("fetch", re.compile(r"fastdata/storage|botocore|urllib3|boto3|\bfetch\b|\bread\b|_read|get_object", re.I)),
    (
        "queue.get",
        re.compile(r"queue|_try_get_data|_get_data|connection\.py|\bpoll\b|selectors|Condition\.wait|Event\.wait"),
    ),
)


def py_spy_path() -> str | None:
    """The py-spy executable beside this Python, or on PATH, or None."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


@dataclass
class Stack:
    pid: int
    thread: str
    frames: list[str]
    count: int


def parse_raw(text: str) -> list[Stack]:
    """py-spy's ``--format raw`` lines (``process P:"cmd";thread (T): NAME;frame;...;frame COUNT``)."""
    out = []
    for line in text.splitlines():
        body, _, count = line.rpartition(" ")
        if not body or not count.isdigit():
            continue
        parts = body.split(";")
        pid, thread = 0, ""
        while parts and parts[0].startswith("process "):  # a worker's stacks sit under its parent's frame
            m = re.match(r"process (\d+)", parts[0])
            pid = int(m.group(1)) if m else pid
            parts = parts[1:]
        if parts and parts[0].startswith("thread "):
            thread = parts[0].split(":", 1)[-1].strip()
            parts = parts[1:]
        out.append(Stack(pid, thread, parts, int(count)))
    return out


def stage_of(frames: list[str]) -> str:
    """The stage of one stack: the leafmost frame that names one (the DataLoader's plumbing skipped);
    "step" for the simulated training step of the profiling loop itself."""
    if frames and f"{HERE}:" in frames[-1]:
        return "step"
    for frame in reversed(frames):
        if _PLUMBING.search(frame):
            continue
        for name, pattern in _STAGES:
            if pattern.search(frame):
                return name
    return "other"


@dataclass
class Group:
    """The samples of one kind of process (the main process's main thread, or the workers')."""

    name: str
    samples: int = 0
    stages: Counter[str] = field(default_factory=Counter)
    leaves: Counter[str] = field(default_factory=Counter)

    def lines(self, top: int = 5) -> list[str]:
        if not self.samples:
            return [f"{self.name}: no samples"]
        by_stage = ", ".join(f"{s} {n / self.samples:.0%}" for s, n in self.stages.most_common())
        out = [f"{self.name} ({self.samples} samples): {by_stage}"]
        for frame, n in self.leaves.most_common(top):
            out.append(f"    {n / self.samples:5.1%}  {frame}")
        return out


def summarise(stacks: list[Stack], main_pid: int) -> tuple[Group, Group]:
    """(the main process's main thread, the workers' main threads), by stage and by leaf frame."""
    main, workers = Group("main process, main thread"), Group("workers, main threads")
    for s in stacks:
        if s.thread and "MainThread" not in s.thread:
            continue
        group = main if s.pid == main_pid else workers
        group.samples += s.count
        group.stages[stage_of(s.frames)] += s.count
        if s.frames:
            group.leaves[s.frames[-1]] += s.count
    return main, workers


def flame_svg(stacks: list[Stack], title: str, width: int = 1200, row: int = 16) -> str:
    """A flame graph (root at the bottom) of the collapsed stacks, as SVG; each frame's tooltip says its
    samples and share."""
    tree: dict[str, Any] = {"n": 0, "kids": {}}
    for s in stacks:
        path = [f"process {s.pid}", s.thread or "thread", *s.frames]
        node = tree
        node["n"] += s.count
        for frame in path:
            node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
            node["n"] += s.count
    total = tree["n"] or 1
    rects: list[str] = []
    depth_max = [0]

    def walk(node: dict[str, Any], x: float, depth: int) -> None:
        for name, kid in sorted(node["kids"].items()):
            w = kid["n"] / total * width
            if w >= 0.5:
                depth_max[0] = max(depth_max[0], depth)
                hue = 20 + (hash(name) % 40)
                label = html.escape(name)
                text = html.escape(name[: int(w / 7)]) if w > 21 else ""
                rects.append(
                    f"<g><title>{label} ({kid['n']} samples, {kid['n'] / total:.1%})</title>"
                    f'<rect x="{x:.1f}" y="{{Y{depth}}}" width="{w:.1f}" height="{row - 1}" '
                    f'fill="hsl({hue},85%,60%)"/>'
                    f'<text x="{x + 3:.1f}" y="{{T{depth}}}" font-size="11">{text}</text></g>'
                )
                walk(kid, x, depth + 1)
            x += w

    walk(tree, 0.0, 0)
    height = (depth_max[0] + 3) * row
    body = "\n".join(rects)
    for d in range(depth_max[0] + 1):
        y = height - (d + 1) * row
        body = body.replace(f"{{Y{d}}}", str(y)).replace(f"{{T{d}}}", str(y + row - 4))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace">'
        f'<text x="4" y="14" font-size="13">{html.escape(title)}</text>\n{body}\n</svg>\n'
    )


@dataclass
class Profile:
    """What a profile recorded: the groups, and where the files went."""

    main: Group
    workers: Group
    svg: Path
    raw: Path

    def lines(self) -> list[str]:
        return [*self.main.lines(), *self.workers.lines(), f"flame graph: {self.svg}", f"raw stacks: {self.raw}"]


def record(
    factory: Any,
    config: Any,
    out_dir: str | os.PathLike[str],
    *,
    seconds: float = SECONDS,
    sweep_kwargs: dict[str, Any] | None = None,
    py_spy: str | None = None,
) -> Profile:
    """Run the loader of ``config`` over ``factory()``'s dataset while py-spy records it and its workers.

    Raises:
        ConfigError: py-spy is missing, or may not attach (ptrace), with the fix.
    """
    from fastdata.bench._loop import make_loader
    from fastdata.loading import Dataset as FastdataDataset

    exe = py_spy or py_spy_path()
    if exe is None or not Path(exe).exists():
        raise ConfigError(f"--profile needs py-spy, which is not installed: {INSTALL}")
    kw = dict(sweep_kwargs or {})
    step = float(kw.get("step_time") or 0.0) if not callable(kw.get("step_time")) else 0.0
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "profile.txt"
    ds = factory() if callable(factory) and not hasattr(factory, "__getitem__") else factory
    loader = make_loader(
        ds,
        config,
        collate_fn=kw.get("collate_fn"),
        worker_init_fn=kw.get("worker_init_fn"),
        multiprocessing_context=kw.get("multiprocessing_context"),
    )
    proc: subprocess.Popen[str] | None = None
    log = ""

    def next_pass() -> Any:
        # a pass of its own, as a training loop's next epoch (the sweep read this dataset's epoch already:
        # the same epoch again would warn the user of a repeat the profile made)
        if isinstance(ds, FastdataDataset):
            ds.set_epoch(ds.epoch + 1)
        return iter(loader)

    try:
        it = next_pass()
        next(it)  # workers up before recording
        cmd = [exe, "record", "--pid", str(os.getpid()), "--subprocesses", "--idle", "--threads"]
        cmd += ["--rate", str(RATE), "--duration", str(max(1, round(seconds))), "--format", "raw"]
        cmd += ["--output", str(raw), "--nonblocking"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        limit = time.perf_counter() + seconds + 30
        while proc.poll() is None and time.perf_counter() < limit:
            try:
                next(it)
            except StopIteration:
                it = next_pass()
            if step:
                time.sleep(step)
        try:
            log = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            log = proc.communicate()[0]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutdown = getattr(locals().get("it"), "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        close = getattr(ds, "close", None)
        if callable(close) and ds is not factory:
            close()
    if proc is None or proc.returncode != 0 or not raw.exists():
        text = log or ""
        if re.search(r"permission|not permitted|ptrace|EPERM", text, re.I):
            raise ConfigError(f"{PTRACE_HELP}. py-spy said: {text.strip()[-300:]}")
        code = None if proc is None else proc.returncode
        raise ConfigError(f"py-spy failed (exit {code}): {text.strip()[-300:]}")
    stacks = parse_raw(raw.read_text())
    main, workers = summarise(stacks, os.getpid())
    svg = out / "profile.svg"
    svg.write_text(flame_svg(stacks, f"fastdata bench --profile: {config.label()}, {seconds:.0f} s"))
    return Profile(main, workers, svg, raw)


def profile_and_report(
    factory: Any, config: Any, out_dir: str, console: Any, *, sweep_kwargs: dict[str, Any] | None = None
) -> Profile | None:
    """:func:`record`, then print its summary; a missing py-spy or a refused ptrace is said, not raised."""
    console.print(f"profiling {config.label()} for {SECONDS:.0f} s with py-spy ...")
    try:
        prof = record(factory, config, out_dir, sweep_kwargs=sweep_kwargs)
    except ConfigError as e:
        console.print(f"profile: {e}", markup=False, highlight=False, soft_wrap=True)
        return None
    for line in prof.lines():
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return prof


__all__ = ["Group", "Profile", "flame_svg", "parse_raw", "profile_and_report", "py_spy_path", "record", "stage_of"]
