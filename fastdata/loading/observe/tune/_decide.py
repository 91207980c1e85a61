"""``num_workers="auto"``: what to run next, decided from what the loader measured.

:class:`Tuner` reads one :class:`Observation` per window (about a second of training: the loop's samples per
second, its stall, the window's diagnosis label, the cores other programs used, the memory left) and
answers with a :class:`Change` or None. It reads no clock and no file, so the same observations always give
the same decisions: :func:`replay` runs it over recorded measurements (the tests do).

How it decides, in order:

1. **Limits.** Never more workers than the usable cores (affinity and cgroup quota,
   :func:`fastdata.core.system.usable_cores`) or ``max_workers`` for work that computes; while the workers
   mostly wait off the CPU (the diagnosis says on what: ``storage``, ``lock``, ``sleep``, ``wait``) up to 16 (or
   twice the cores), climbing only while throughput rises; never more than the open-file limit allows (each
   worker holds descriptors in the main process), and never more than the memory allows:
   below ``memory_reserve`` of available memory it drops as many workers as it takes to give the reserve
   back (each worker counted at its measured PSS), at once; it adds a worker only where two more would fit.
2. **Other programs.** When the cores other programs use move by ``others_change`` or more (in two of the
   last three windows), or the loop becomes ``rate_change`` slower or faster (in three of the last four),
   beyond the range of the earlier windows at the same setting, what was measured no longer holds: the
   measurements are forgotten, and if other programs took cores, one worker fewer is tried first.
3. **A trial.** The window after a change judges it against the setting it left: more workers (or more
   prefetch) are kept only if faster by ``margin``; fewer workers are kept unless slower by ``margin``
   (fewer processes for the same speed leave the cores to the training and to other programs), except a
   trial of no workers made only because they were predicted about as fast (below): kept only if faster by
   ``margin``. A trial that fails goes back, and the setting it tried (or the one a trial left, measured
   slower than it by ``margin``) is not tried again for ``recall`` seconds, even when the measurements are
   forgotten (step 2), unless other programs' cores move by ``others_change`` from what they were then.
4. **Exploring.** From the diagnosis of the window: the loop waits less than ``stall_target`` of its time
   (the step is the bottleneck): add nothing. A batch that one process makes (``data_s``, from the stage
   times) plus the step takes less than the loop's time per batch less ``margin``: try no workers (no
   hand-over); within ``margin`` of it: try them last, strictly (above). Workers starved while the main
   process is busy receiving (``main-process``, ``ipc``): try no workers, then fewer. Otherwise, while the
   loop waits, try the next worker count up the ladder 0, 1, 2, 4, 8 ... (the grid ``fastdata bench``
   sweeps; past the cores only for waiting workers, and two steps at a time for workers busy under a quarter
   of the time; a step up that measured clearly faster, by ``CLEAR``, lets the next come without waiting
   ``interval``; waiting workers are not tried at none, which cannot overlap their waits); workers that are idle
   half the time or more: try fewer. A count measured worse than the current one is not tried again, and
   nothing is tried twice until other programs or memory change (the measurements are then forgotten).
   With ``prefetch_factor="auto"``, once the count is settled and the loop still waits on workers that are
   not busy (batches come in bursts), a larger prefetch is tried the same way.
5. **Settled.** It moves to the fastest setting measured when that is faster than the current one, over
   three of its windows, by twice ``margin`` (once per setting until the machine changes).

Bounds: at most one change per ``interval`` seconds (memory pressure excepted), each setting tried once per
state of the machine, and at most ``len(ladder) + 2`` changes between two such states: a signal that flips
cannot start a restart storm. A change near the end of an epoch waits for the next pass when the workers do
not persist (they restart there anyway).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from fastdata.loading.observe.diagnose._evidence import Context
from fastdata.loading.observe.diagnose._verdict import COMPUTING, WAITING_LABELS
from fastdata.loading.observe.measure._window import Window
from fastdata.loading.observe.tune._options import AutoTune, Change, Observation, Setting

DEFAULT_WORKER_BYTES = 128 * 2**20  # what a worker adds to memory (its USS) before one is measured
WAIT_WORKERS = 16  # the most workers (at least twice the cores) while they mostly wait off the CPU
FAR = 0.25  # workers waiting busy less than this share of the time: the next count up is two ladder steps
STARVED = 0.5  # ... and the loop waiting this share of its time: the window's first quarter decides
FILES_PER_WORKER = 8  # descriptors a worker holds in the main process at least (its queues' pipes)
FILES_SHARE = 0.8  # of the open-file limit (ulimit -n), what the workers' descriptors may take
RESERVE_SHARE, RESERVE_LEAST = 0.02, 256 * 2**20  # the default memory reserve: 2% of usable memory, >= 256 MiB
BURSTY = 0.8  # workers busier than this share of the time are at capacity: more prefetch cannot help
CLEAR = 0.3  # a first part of a window that shows a setting this much faster or slower decides at once
EARLY = 0.25  # ... that part: this share of a window
# ... and no workers predicted to take this share of the loop's time per batch or less: the demo HDF5 at 2
# workers on a loaded 2-core machine gave 0.73 (1.6 of 2.2 ms; with no workers it took 0.3: the workers'
# stage times count their waits for a core), where waiting for the whole window cost ~10% of a 4-s run
CLEAR_ZERO = 0.75


@dataclass
class _Entry:
    rates: list[float] = field(default_factory=list)
    others: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0


def _quartiles(values: list[float]) -> tuple[float, float]:
    """The lower and upper quartiles of ``values``; their least and greatest when there are fewer than four."""
    if len(values) < 4:
        return min(values), max(values)
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def ladder(low: int, high: int) -> list[int]:
    """Worker counts tried: 0, 1, 2, 4, 8 ... up to ``high``, and ``high`` itself, from ``low``."""
    counts = [0, 1]
    while counts[-1] * 2 <= high:
        counts.append(counts[-1] * 2)
    counts.append(high)
    if high < low:
        return [low]
    return sorted({c for c in counts if low <= c <= high} | {low, high})


class Tuner:
    """The decisions of ``num_workers="auto"`` (see the module docstring).

    Args:
        options (AutoTune): the bounds and thresholds.
        cores (int): usable cores.
        workers (int | None): the fixed worker count, or None to tune it.
        prefetch (int | None): the fixed prefetch factor, or None to tune it (with ``options.prefetch``).
        persistent (bool): the workers persist between passes (then a change at a pass's start costs a
            restart like any other).
    """

    def __init__(
        self,
        options: AutoTune,
        cores: int,
        *,
        workers: int | None = None,
        prefetch: int | None = 2,
        persistent: bool = False,
    ) -> None:
        self.options = options
        self.cores = max(1, cores)
        self.fixed_workers = workers
        self.fixed_prefetch = prefetch
        self.persistent = persistent
        self.changes: list[Change] = []
        self.regime = 0
        self._table: dict[Setting, _Entry] = {}
        self._last_change: float | None = None
        self._trial: tuple[Setting, Setting] | None = None  # (tried, the setting it left)
        self._strict = False  # the trial is kept only if faster by the margin, fewer workers too
        self._failed: dict[Setting, tuple[float, float]] = {}  # failed trials: (when, other programs' cores)
        self._going_back = False  # the last trial judged failed
        self._settled_on: set[Setting] = set()  # settings moved to as measured faster, this state of the machine
        self._fewer_first = False  # other programs took cores: try one worker fewer first
        self._situation = ""  # ... in words
        self._changes_in_regime = 0
        self._clear_win = False  # the last trial was kept, measured CLEAR faster than the setting it left
        self.current = Setting(0)

    # -- limits -----------------------------------------------------------------------------------

    @property
    def max_workers(self) -> int:
        """The most workers for work that computes: the usable cores (or ``max_workers``)."""
        top = self.cores if self.options.max_workers is None else self.options.max_workers
        return max(self.options.min_workers, top)

    @property
    def waiting_max(self) -> int:
        """The most workers while they mostly wait off the CPU (network, disk, a lock, sleeps): ``max_workers``,
        or :data:`WAIT_WORKERS` (at least twice the cores); memory and open files bound it further."""
        top = max(WAIT_WORKERS, 2 * self.cores) if self.options.max_workers is None else self.options.max_workers
        return max(self.options.min_workers, top)

    @property
    def most_workers(self) -> int:
        """The most workers it may ever run."""
        return max(self.max_workers, self.waiting_max)

    def _waiting(self, obs: Observation) -> bool:
        """The workers mostly wait off the CPU: the diagnosis says on what, or they are busy under half the time."""
        return obs.label in WAITING_LABELS or (obs.setting.workers > 0 and obs.w.per_worker_busy < COMPUTING)

    def reserve(self, total: float) -> float:
        if self.options.memory_reserve is not None:
            return self.options.memory_reserve
        return max(RESERVE_LEAST, RESERVE_SHARE * total) if math.isfinite(total) else RESERVE_LEAST

    def cap(self, obs: Observation) -> tuple[int, str]:
        """The most workers allowed now, and why when memory or open files set it. Past the cores while the
        workers wait (and, once there, until they are seen computing: many waiting workers on few cores wait
        for a core at every wake-up, which makes them look busy, not computing)."""
        w = obs.setting.workers
        past = w > self.max_workers and obs.label != "cpu"
        top = self.waiting_max if self._waiting(obs) or past else self.max_workers
        per = obs.worker_bytes or DEFAULT_WORKER_BYTES
        reserve = self.reserve(obs.ctx.memory or math.inf)
        if obs.memory_available < reserve:
            over = math.ceil((reserve - obs.memory_available) / per)
            gib = 2**30
            why = (
                f"memory: {obs.memory_available / gib:.1f} GiB available, below the reserve of "
                f"{reserve / gib:.1f} GiB; a worker holds {per / gib:.2f} GiB"
            )
            return max(self.options.min_workers, min(top, w - over)), why
        if math.isfinite(obs.memory_available):
            # a worker is added only where one more would still fit above the reserve after it
            room = max(0, int((obs.memory_available - reserve - per) // per))
            if w + room < top:
                gib = 2**30
                why = f"memory: {obs.memory_available / gib:.1f} GiB available leaves room for {room} more"
                return max(self.options.min_workers, min(top, w + room)), why
        if obs.open_files and obs.open_files_limit:
            # each worker holds descriptors in the main process (its queues, batches' shared memory in flight)
            per = max(FILES_PER_WORKER, obs.open_files / max(1, w))
            room = max(0, int((FILES_SHARE * obs.open_files_limit - obs.open_files) // per))
            if w + room < top:
                why = (
                    f"open files: {obs.open_files} of the limit {obs.open_files_limit} (ulimit -n) leave room for "
                    f"{room} more"
                )
                return max(self.options.min_workers, min(top, w + room)), why
        if self.options.max_workers is not None:
            return top, f"max_workers={top}"
        if top == self.cores:
            return top, f"{top} usable cores" + (f": the workers compute ({obs.label})" if w > top else "")
        return top, f"{top} workers (they mostly wait)"

    def initial(self, memory_available: float = math.inf, memory_total: float = math.inf) -> Setting:
        """The setting to start with: the estimate, as many workers as cores and memory allow."""
        pf = self.fixed_prefetch if self.fixed_prefetch is not None else self.options.prefetch[0]
        if self.fixed_workers is not None:
            w = self.fixed_workers
        elif self.options.start is not None:
            w = min(max(self.options.start, self.options.min_workers), self.max_workers)
        else:
            obs = Observation(
                0.0, Setting(0), Window(), Context(self.cores, memory=memory_total), memory_available=memory_available
            )
            w = self.cap(obs)[0]
        self.current = Setting(w, pf if w else None)
        return self.current

    # -- the decision ------------------------------------------------------------------------------

    def _steps(self, top: int | None = None) -> list[int]:
        if self.fixed_workers is not None:
            return [self.fixed_workers]
        return ladder(self.options.min_workers, self.max_workers if top is None else top)

    def _setting(self, workers: int, prefetch: int | None = None) -> Setting:
        if not workers:
            return Setting(0)
        pf = prefetch if prefetch is not None else self.current.prefetch
        if pf is None:
            pf = self.fixed_prefetch if self.fixed_prefetch is not None else self.options.prefetch[0]
        return Setting(workers, pf)

    def _rate(self, s: Setting) -> float | None:
        e = self._table.get(s)
        return e.rate if e is not None and e.rates else None

    def _forget(self, keep: _Entry | None) -> None:
        self.regime += 1
        self._table = {self.current: keep} if keep is not None else {}
        self._trial = None
        self._changes_in_regime = 0
        self._settled_on = set()

    def _moved(self, entry: _Entry, obs: Observation) -> str:
        """Whether the machine changed under this setting: other programs took or gave back
        ``others_change`` cores in two of the last three windows, or the loop became ``rate_change`` slower or
        faster in three of the last four (the latest among them each time), beyond the range of the earlier
        windows at this setting (their quartiles: a signal that flips back and forth has a wide range, and
        never leaves it). Returns the change in words ("" when none)."""
        lim, rlim = self.options.others_change, self.options.rate_change
        now = f"now {obs.w.others_cores:.1f} of {obs.ctx.cores}"
        if len(entry.others) >= 5:
            low, high = _quartiles(entry.others[-13:-3])
            recent = entry.others[-3:]
            up = [o - high for o in recent if o - high >= lim]
            down = [low - o for o in recent if low - o >= lim]
            if len(up) >= 2 and recent[-1] - high >= lim:
                return f"other programs took {min(up):.1f} cores ({now})"
            if len(down) >= 2 and low - recent[-1] >= lim:
                return f"other programs gave back {min(down):.1f} cores ({now})"
        if len(entry.rates) >= 6:
            low, high = _quartiles(entry.rates[-14:-4])
            recent = entry.rates[-4:]
            took = obs.w.others_cores - statistics.median(entry.others[-14:-4])
            others = f"other programs use {obs.w.others_cores:.1f} of {obs.ctx.cores} cores, {took:+.1f}"
            slower = [r for r in recent if r <= low * (1 - rlim)]
            faster = [r for r in recent if r >= high * (1 + rlim)]
            if low > 0 and len(slower) >= 3 and slower[-1] is recent[-1]:
                return f"the loop became {1 - max(slower) / low:.0%} slower ({others})"
            if high > 0 and len(faster) >= 3 and faster[-1] is recent[-1]:
                return f"the loop became {min(faster) / high - 1:.0%} faster ({others})"
        return ""

    def _moving(self, entry: _Entry) -> bool:
        """The latest window is beyond the range of the earlier ones by the thresholds of :meth:`_moved`, not
        yet for long enough to be sure: wait for the next before exploring."""
        if len(entry.others) < 3:
            return False
        low, high = _quartiles(entry.others[-11:-1])
        o = entry.others[-1]
        if o - high >= self.options.others_change or low - o >= self.options.others_change:
            return True
        low, high = _quartiles(entry.rates[-11:-1])
        r, rlim = entry.rates[-1], self.options.rate_change
        return (low > 0 and r <= low * (1 - rlim)) or (high > 0 and r >= high * (1 + rlim))

    def wants_early(self) -> bool:
        """The current setting is not measured yet: its window's first quarter may already decide."""
        return self.current not in self._table

    def _early(self, obs: Observation) -> Change | None:
        cur = obs.setting
        if cur in self._table:
            return None
        if self._trial is not None and self._trial[0] == cur:
            r_old = self._rate(self._trial[1])
            if r_old and abs(obs.w.samples_per_s / r_old - 1) >= CLEAR:
                return self.observe(replace(obs, early=False))
            return None
        clear_zero = obs.w.data_s is not None and obs.w.data_s + obs.w.batch_step_s < obs.w.batch_s * CLEAR_ZERO
        if cur.workers and self.fixed_workers is None and self.options.min_workers == 0 and clear_zero:
            return self.observe(replace(obs, early=False))
        # workers seen waiting off the CPU nearly all the time while the loop waits for them: clearly too few
        starved = obs.label in WAITING_LABELS and 0 < obs.w.per_worker_busy < FAR and obs.w.stall >= STARVED
        if cur.workers and self.fixed_workers is None and starved:
            return self.observe(replace(obs, early=False))
        return None

    def observe(self, obs: Observation) -> Change | None:
        """Read one window; return the change to make, or None to keep the setting."""
        if obs.early:
            return self._early(obs)
        opts = self.options
        cur = obs.setting
        self.current = cur
        entry = self._table.setdefault(cur, _Entry())
        entry.rates.append(obs.w.samples_per_s)
        entry.others.append(obs.w.others_cores)
        top, why_top = self.cap(obs)
        if cur.workers > top:
            memory = why_top.startswith("memory")
            return self._change(obs, self._setting(top), why_top, urgent=memory)
        moved = self._moved(entry, obs)
        if moved:
            # what was measured no longer holds: keep only this setting's last window (the one before it may
            # have held the moment the other program started)
            took = obs.w.others_cores - statistics.median(entry.others[-13:-3] or entry.others[:1])
            self._forget(_Entry(entry.rates[-1:], entry.others[-1:]))
            # other programs take cores: try fewer workers first (the rule, kept only if not slower)
            self._fewer_first = took >= opts.others_change / 2 and self.fixed_workers is None
            self._situation = moved
        elif self._moving(entry) and self._trial is None:
            return None  # one window beyond the thresholds: wait for the next to confirm it
        if self._trial is not None and self._trial[0] == cur:
            trial = self._trial
            verdict = self._judge(obs)
            if verdict is not None:
                return verdict
            if self._trial is None and self._going_back:
                self._trial = trial  # going back must wait for the interval: judge again next window
                return None
        if self._changes_in_regime >= len(self._steps(self.most_workers)) + 2:
            return None  # bounded: enough changes for one state of the machine
        proposal = self._propose(obs, top)
        if proposal is not None:
            after, why, strict = proposal
            if self._situation and why != self._situation:
                why = f"{self._situation}; {why}"
            change = self._change(obs, after, why, trial=True)
            if change is not None:
                self._strict = strict
                self._fewer_first = False
                self._situation = ""
            return change
        best = self._best(top)
        if best is not None and best != cur and best not in self._settled_on and len(entry.rates) >= 3:
            # measured faster than the current setting over three of its windows: by twice the margin, and
            # once per setting for one state of the machine (noisy windows cannot make it flip back and forth)
            rb, rc = self._rate(best), self._rate(cur)
            if rb is not None and rc is not None and rb > rc * (1 + 2 * opts.margin):
                change = self._change(obs, best, f"{best} measured {rb / rc - 1:.0%} faster ({rb:,.0f} samples/s)")
                if change is not None:
                    self._settled_on.add(best)
                return change
        return None

    def _judge(self, obs: Observation) -> Change | None:
        """The window after a change judged it: keep it, or go back."""
        assert self._trial is not None
        tried, left = self._trial
        self._trial = None
        r_new, r_old = self._rate(tried), self._rate(left)
        if r_new is None or r_old is None or r_old <= 0:
            return None
        m = self.options.margin
        if tried.workers < left.workers and not self._strict:
            keep = r_new >= r_old * (1 - m)
        else:
            keep = r_new > r_old * (1 + m)
        self._going_back = not keep
        self._clear_win = keep and r_new >= r_old * (1 + CLEAR) and tried.workers > left.workers
        if keep:
            self._failed.pop(tried, None)
            if r_new > r_old * (1 + m):
                self._fail(left, obs)  # the setting it left lost to it: as good as a failed trial
            return None
        self._fail(tried, obs)
        ratio = r_new / r_old
        why = f"{tried} measured {ratio:.2f}x of {left} ({r_new:,.0f} against {r_old:,.0f} samples/s)"
        return self._change(obs, left, why)

    def _tried_worse(self, candidate: int, cur: Setting) -> bool:
        """A count at or beyond ``candidate`` (seen from the current one) was measured and did not pay: more
        workers no faster by ``margin``, or fewer slower by more than ``margin``."""
        rc = self._rate(cur)
        if rc is None:
            return False
        m = self.options.margin
        for s, e in self._table.items():
            if not e.rates or s.workers == cur.workers:
                continue
            if candidate > cur.workers and s.workers >= candidate and e.rate <= rc * (1 + m):
                return True
            if candidate < cur.workers and s.workers <= candidate and e.rate < rc * (1 - m):
                return True
        return False

    def _fail(self, s: Setting, obs: Observation) -> None:
        entry = self._table.get(s)
        self._failed[s] = (obs.t, statistics.median(entry.others) if entry and entry.others else obs.w.others_cores)

    def _recalled(self, s: Setting, obs: Observation) -> bool:
        """``s`` failed a trial less than ``recall`` seconds ago, and other programs' cores have not moved by
        ``others_change`` since: what made it worse still holds, whatever else changed (a program that
        starts can move the loop's rate several times; each would otherwise try the same loser again)."""
        failed = self._failed.get(s)
        if failed is None:
            return False
        t, others = failed
        if obs.t - t >= self.options.recall or abs(obs.w.others_cores - others) >= self.options.others_change:
            del self._failed[s]
            return False
        return True

    def _propose(self, obs: Observation, top: int) -> tuple[Setting, str, bool] | None:
        opts = self.options
        cur = obs.setting
        w = cur.workers
        if self.fixed_workers is None:
            grid = self.waiting_max if self._waiting(obs) else self.max_workers  # the ladder; memory may cap it
            steps = [s for s in self._steps(grid) if s <= top]
            up = next((s for s in steps if s > w), None)
            if up is not None and up > self.max_workers and obs.label not in WAITING_LABELS:
                up = None  # past the cores only for workers seen waiting off the CPU: never for work that computes
            if up is not None and obs.label in WAITING_LABELS and 0 < obs.w.per_worker_busy < FAR and w:
                # workers busy a few percent of the time: a doubling is far too little; two steps up the ladder
                up = next((s for s in steps if s >= 4 * w), steps[-1]) if steps[-1] > up else up
            down = next((s for s in reversed(steps) if s < w), None)
            loop_bound = obs.w.step and obs.w.stall < opts.stall_target
            candidates: list[tuple[int, str]] = []
            if self._fewer_first and down is not None:
                candidates.append((down, self._situation))
            alone = None if obs.w.data_s is None else obs.w.data_s + obs.w.batch_step_s
            zero: tuple[int, str] | None = None
            # workers that wait off the CPU: no workers cannot overlap the waits (unless the stage times say a
            # batch is made faster alone than received: then it is tried as ever)
            waits = (obs.label in WAITING_LABELS or w > self.max_workers) and alone is None
            if w and steps[0] == 0 and not waits and (alone is None or alone < obs.w.batch_s * (1 + opts.margin)):
                # no workers, no hand-over: the main process may make batches (between its steps) faster than
                # it receives them
                made = f"{1000 * obs.w.data_s:.1f} ms" if obs.w.data_s is not None else "an unknown time"
                zero = (0, f"a batch takes {made} to make, against {1000 * obs.w.batch_s:.1f} ms per batch now")
                if alone is None or alone < obs.w.batch_s * (1 - opts.margin):
                    candidates.append(zero)
                    zero = None
                # else about as fast: a neighbour worth one strict trial, once nothing better is to be tried
            if obs.label in ("main-process", "ipc") and w and down is not None:
                idle = 1 - obs.w.per_worker_busy
                why = f"the main process is the limit ({obs.label}) with workers idle {idle:.0%} of the time"
                # past the cores the workers wait: none could not overlap their waits; a step down may do
                candidates += [(down, why)] if w > self.max_workers else [(steps[0], why), (down, why)]
            if loop_bound:
                pass  # the step is the bottleneck: more workers would not train faster
            elif up is not None and obs.label not in ("main-process", "ipc"):
                candidates.append((up, f"the loop waits for data {obs.w.stall:.0%} of the time ({obs.label})"))
            if w and down is not None and obs.w.per_worker_busy < COMPUTING and obs.label not in WAITING_LABELS:
                candidates.append((down, f"workers idle {1 - obs.w.per_worker_busy:.0%} of the time: fewer may do"))
            strict = len(candidates)
            if zero is not None and not (self._fewer_first and down == 0):
                candidates.append(zero)
            for k, (count, why) in enumerate(candidates):
                s = self._setting(count)
                if s not in self._table and not self._tried_worse(count, cur) and not self._recalled(s, obs):
                    return s, why, k >= strict
        if self.fixed_prefetch is None and w and cur.prefetch is not None:
            more = next((p for p in opts.prefetch if p > cur.prefetch), None)
            bursty = obs.w.step and obs.w.stall >= opts.stall_target and obs.w.per_worker_busy < BURSTY
            if more is not None and bursty:
                s = Setting(w, more)
                if s not in self._table:
                    why = (
                        f"the loop waits {obs.w.stall:.0%} of the time while each worker is busy only "
                        f"{obs.w.per_worker_busy:.0%}: batches come in bursts"
                    )
                    return s, why, False
        return None

    def _best(self, top: int) -> Setting | None:
        """The fastest setting measured (within ``top`` workers); among those within ``margin`` of it, the
        fewest workers."""
        measured = [(e.rate, s) for s, e in self._table.items() if e.rates and s.workers <= top]
        if not measured:
            return None
        fastest = max(r for r, _ in measured)
        near = [s for r, s in measured if r >= fastest * (1 - self.options.margin)]
        return min(near, key=lambda s: (s.workers, s.prefetch or 0))

    def _change(
        self, obs: Observation, after: Setting, reason: str, *, trial: bool = False, urgent: bool = False
    ) -> Change | None:
        if after == obs.setting:
            return None
        quick = self._clear_win and trial  # the last trial won clearly: the next step up need not wait
        recent = self._last_change is not None and obs.t - self._last_change < self.options.interval
        if not urgent and recent and not quick:
            return None
        self._clear_win = False
        at: Literal["now", "next pass"] = "now"
        if not self.persistent and obs.batches_left is not None and not urgent:
            cost = max(obs.restart_s, 0.05)
            if obs.batches_left * obs.w.batch_s < 2 * cost:
                at = "next pass"  # the workers restart there anyway
        self._trial = (after, obs.setting) if trial else None
        self._last_change = obs.t
        self._changes_in_regime += 1
        change = Change(obs.t, obs.setting, after, reason, at, obs.epoch, obs.batch)
        self.changes.append(change)
        self.current = after
        return change


def replay(
    observations: Iterable[Observation], options: AutoTune | None = None, cores: int = 2, **tuner: object
) -> tuple[Tuner, list[Change | None]]:
    """Run a :class:`Tuner` over recorded observations, in order (each as measured, its setting included);
    return the tuner and its answer to each."""
    t = Tuner(options or AutoTune(), cores, **tuner)  # type: ignore[arg-type]
    return t, [t.observe(o) for o in observations]


__all__ = ["CLEAR", "EARLY", "WAIT_WORKERS", "Tuner", "ladder", "replay"]
