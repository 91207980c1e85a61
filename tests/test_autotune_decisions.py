"""The decisions of ``num_workers="auto"`` as a pure function of what was measured (:class:`Tuner`).

Each test feeds observations, either recorded (a run's windows, as measured) or made by a model of a
loader whose measured rate follows the tuner's own settings, and checks what the tuner decides: where it
starts, where it settles, how it reacts to other programs and to memory, and that a signal that flips
cannot make it restart over and over (hysteresis, one change per interval, a bounded number of changes).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest

from fastdata.core.errors import ConfigError
from fastdata.loading.observe import Context, Process, Window
from fastdata.loading.observe.measure._window import STEP_SHARE
from fastdata.loading.observe.tune import AutoTune, Change, Observation, Setting, Tuner, ladder, replay

GIB = 2**30


def observed(
    t: float,
    setting: Setting,
    samples_per_s: float,
    *,
    stall: float = 1.0,
    step: bool = False,
    worker_busy: float = 0.0,
    others: float = 0.0,
    cores: int = 1,
    batch_s: float = 0.0,
    step_s: float = 0.0,
    data_s: float | None = None,
    memory_total: float | None = None,
    worker_bytes: float = 0.0,
    **rest: object,
) -> Observation:
    """An observation whose window holds the counters that give the figures asked for (as the tuner reads
    them from a measured window): per worker busy ``worker_busy``, other programs' ``others`` cores, ``batch_s``
    of the loop per batch (about 0 when not given), the step's ``step_s`` of it, ``data_s`` from the stage times."""
    batches = 1000
    loop = batch_s * batches or 1e-9  # a rate needs some loop time; "no batch time" reads as about 0
    workers = [Process(cpu_s=worker_busy, pid=k + 1, uss=worker_bytes) for k in range(setting.workers)]
    w = Window(
        seconds=1.0,
        loop_s=loop,
        batches=batches,
        samples=samples_per_s * loop,  # type: ignore[arg-type]
        wait_s=stall * loop,
        step_s=step_s * batches or (STEP_SHARE * loop if step else 0.0),
        workers=workers,
        machine_cpu_s=others + worker_busy * len(workers),
        stages={"fetch": (data_s * batches, samples_per_s * loop)} if data_s is not None else {},
    )
    return Observation(t, setting, w, Context(cores, memory=memory_total), **rest)  # type: ignore[arg-type]


def simulate(
    rate: Callable[[Setting, float], float],
    *,
    options: AutoTune | None = None,
    cores: int = 2,
    windows: int = 40,
    every: float = 1.0,
    tuner: Tuner | None = None,
    **fields: Callable[[Setting, float], object],
) -> tuple[Tuner, list[Observation], list[Change]]:
    """Run a tuner against a model: each window's observation is ``rate(setting, t)`` (and the ``fields``
    given, each a function of the setting and the time), at the setting the tuner chose."""
    t_ = tuner or Tuner(options or AutoTune(), cores)
    setting = t_.initial()
    seen, changes = [], []
    for k in range(windows):
        t = (k + 1) * every
        extra = {name: fn(setting, t) for name, fn in fields.items()}
        extra.setdefault("cores", cores)
        obs = observed(t, setting, rate(setting, t), **extra)  # type: ignore[arg-type]
        seen.append(obs)
        change = t_.observe(obs)
        if change is not None:
            changes.append(change)
            setting = change.after
    return t_, seen, changes


def table(rates: dict[int, float]) -> Callable[[Setting, float], float]:
    return lambda s, t: rates[s.workers]


def test_the_ladder_is_the_grid_a_sweep_measures() -> None:
    assert ladder(0, 2) == [0, 1, 2]
    assert ladder(0, 6) == [0, 1, 2, 4, 6]
    assert ladder(1, 8) == [1, 2, 4, 8]
    assert ladder(3, 2) == [3]


def test_it_starts_from_as_many_workers_as_cores_and_memory_allow() -> None:
    assert Tuner(AutoTune(), cores=4).initial() == Setting(4, 2)
    # 8 GiB usable: a reserve of 256 MiB; each worker counted at 128 MiB until one is measured, and added only
    # where one more would still fit
    assert Tuner(AutoTune(), cores=4).initial(1 * GIB, 8 * GIB) == Setting(4, 2)
    assert Tuner(AutoTune(), cores=4).initial(0.6 * GIB, 8 * GIB) == Setting(1, 2)
    assert Tuner(AutoTune(), cores=4).initial(0.1 * GIB, 8 * GIB) == Setting(0)
    assert Tuner(AutoTune(start=3), cores=4).initial() == Setting(3, 2)
    assert Tuner(AutoTune(max_workers=2, prefetch=(4, 8)), cores=16, prefetch=None).initial() == Setting(2, 4)
    assert Tuner(AutoTune(), cores=4, workers=3, prefetch=None).initial() == Setting(3, 2)  # prefetch only


def test_cheap_items_end_with_no_workers_and_stay_there() -> None:
    # items cheaper to make than to receive from a worker (the demo's HDF5): no workers is 4x faster
    rates = {0: 230_000.0, 1: 35_000.0, 2: 55_000.0}
    tuner, _seen, changes = simulate(
        table(rates),
        label=lambda s, t: "cpu",
        worker_busy=lambda s, t: 0.6,
        batch_s=lambda s, t: 256 / rates[s.workers],
        data_s=lambda s, t: 0.0008,
    )
    assert changes[0].after == Setting(0) and changes[0].t == 1.0  # from the first window
    assert "to make" in changes[0].reason
    assert len(changes) == 1 and tuner.current == Setting(0)  # and it stays


def test_decode_heavy_items_keep_the_cores_busy() -> None:
    rates = {0: 3_900.0, 1: 2_900.0, 2: 5_400.0}
    tuner, _, changes = simulate(
        table(rates),
        label=lambda s, t: "cpu",
        worker_busy=lambda s, t: 0.95,
        batch_s=lambda s, t: 64 / rates[s.workers],
        data_s=lambda s, t: 0.026,  # a batch takes 26 ms to make, one at a time: no workers would be slower
    )
    assert changes == [] and tuner.current == Setting(2, 2)


def test_it_stops_adding_workers_once_the_step_is_the_bottleneck() -> None:
    # a batch takes 60 ms to make and the step 20 ms: 3 workers keep up, more would not train faster
    def stall(s: Setting, t: float) -> float:
        return max(0.0, 1 - 20 / (60 / s.workers)) if s.workers else 0.75

    def rate(s: Setting, t: float) -> float:
        return 64 / max(0.020, 0.060 / max(s.workers, 1))

    tuner, _seen, changes = simulate(
        rate,
        cores=16,
        options=AutoTune(start=1),
        step=lambda s, t: True,
        stall=stall,
        label=lambda s, t: "step" if stall(s, t) < 0.05 else "cpu",
        worker_busy=lambda s, t: 0.9,
        data_s=lambda s, t: 0.06,
        step_s=lambda s, t: 0.02,
        batch_s=lambda s, t: 64 / rate(s, t),
    )
    assert [c.after.workers for c in changes] == [2, 4]  # up the ladder while the loop waits
    assert tuner.current == Setting(4, 2)  # 4 keep up (stall 0): never 8 or 16
    assert "waits for data" in changes[0].reason


def test_other_programs_taking_cores_mean_one_worker_fewer_kept_when_it_costs_little() -> None:
    def others(s: Setting, t: float) -> float:
        return 0.1 if t < 10 else 1.2  # a program takes a core at t=10

    def rate(s: Setting, t: float) -> float:
        if t < 10:
            return {0: 3_900.0, 1: 2_900.0, 2: 5_400.0}[s.workers]
        return {0: 2_000.0, 1: 2_950.0, 2: 3_000.0}[s.workers]  # fewer workers cost 2% now

    tuner, _, changes = simulate(
        rate, others=others, label=lambda s, t: "cpu", worker_busy=lambda s, t: 0.95, data_s=lambda s, t: 0.026
    )
    assert changes[0].before == Setting(2, 2) and changes[0].after == Setting(1, 2)
    assert changes[0].t <= 12.0  # two windows to confirm
    assert "other programs took 1.1 cores" in changes[0].reason
    assert len(changes) == 1 and tuner.current == Setting(1, 2)  # kept: within the margin


def test_fewer_workers_that_cost_much_under_interference_are_undone() -> None:
    def rate(s: Setting, t: float) -> float:
        if t < 10:
            return {0: 3_900.0, 1: 2_900.0, 2: 5_400.0}[s.workers]
        return {0: 2_000.0, 1: 2_100.0, 2: 3_000.0}[s.workers]  # one worker fewer costs 30%

    _tuner, _, changes = simulate(
        rate,
        others=lambda s, t: 0.1 if t < 10 else 1.2,
        label=lambda s, t: "cpu",
        worker_busy=lambda s, t: 0.95,
        data_s=lambda s, t: 0.026,
    )
    assert [c.after for c in changes] == [Setting(1, 2), Setting(2, 2)]
    assert "measured 0.70x" in changes[1].reason
    assert changes[1].t - changes[0].t >= AutoTune().interval


def test_a_flipping_signal_starts_no_restart_storm() -> None:
    """Other programs' cores and the rate flip every window (or every other): never two windows in a row
    beyond the thresholds the same way, so nothing is re-measured and nothing restarts."""
    for period in (1, 2):

        def flip(s: Setting, t: float, period: int = period) -> float:
            return 1.5 if (int(t) // period) % 2 else 0.0

        _, _, changes = simulate(
            lambda s, t, period=period: 5_000.0 * (0.6 if (int(t) // period) % 2 else 1.0),
            windows=100,
            others=flip,
            label=lambda s, t: "cpu",
            worker_busy=lambda s, t: 0.95,
            data_s=lambda s, t: 0.026,
        )
        # every other window: never two in a row; two on, two off: the first two on, then the range is wide
        assert len(changes) <= (0 if period == 1 else 2), (period, changes)


def test_noisy_windows_make_few_changes_and_never_two_within_the_interval() -> None:
    rng = random.Random(5)
    true = {0: 3_900.0, 1: 2_900.0, 2: 4_400.0}
    options = AutoTune(interval=3.0)
    tuner, _, changes = simulate(
        lambda s, t: true[s.workers] * rng.uniform(0.7, 1.3),  # +-30%: this machine's windows under load
        options=options,
        windows=200,
        every=0.5,
        others=lambda s, t: rng.uniform(0.0, 0.8),
        label=lambda s, t: "cpu",
        worker_busy=lambda s, t: 0.9,
        data_s=lambda s, t: 0.026,
    )
    times = [c.t for c in changes]
    assert all(b - a >= options.interval for a, b in itertools.pairwise(times))
    assert len(changes) <= (1 + tuner.regime) * (len(ladder(0, 2)) + 2)
    assert len(changes) <= 10  # over 100 s


def test_a_recorded_run_replayed_gives_the_same_decisions() -> None:
    # windows measured at 2 workers on this 2-core machine, CPU-bound items, other helpers loading it; then a
    # program taking both cores (the last six)
    recorded = [
        (3304, 0.73),
        (3100, 0.73),
        (3950, 0.51),
        (3371, 0.66),
        (2456, 1.06),
        (3013, 0.87),
        (3643, 0.6),
        (4102, 0.4),
        (2870, 1.02),
        (1755, 1.52),
        (1620, 1.61),
        (1690, 1.58),
        (1702, 1.55),
        (1588, 1.62),
        (1650, 1.6),
    ]
    observations = [
        observed(0.5 * (k + 1), Setting(2, 2), r, others=o, label="cpu", worker_busy=0.95, cores=2, data_s=0.02)
        for k, (r, o) in enumerate(recorded)
    ]
    _first, answers = replay(observations)
    _again, answers_again = replay(observations)
    assert answers == answers_again  # a pure function of the measurements
    made = [a for a in answers if a is not None]
    assert len(made) == 1 and made[0].after == Setting(1, 2)  # the noise before: nothing; the program: one fewer
    assert answers.index(made[0]) == 10  # the second window of the program's cores confirms it
    assert "other programs took" in made[0].reason


def test_memory_pressure_drops_workers_at_once() -> None:
    options = AutoTune(interval=100.0)
    tuner = Tuner(options, cores=8)
    setting = tuner.initial()
    assert setting == Setting(8, 2)
    base = {"label": "cpu", "worker_busy": 0.9, "cores": 8, "memory_total": 64 * GIB, "worker_bytes": 1 * GIB}
    # the reserve is 2% of 64 GiB (1.3 GiB); 0.5 GiB left: give 0.8 GiB back, one worker of 1 GiB
    change = tuner.observe(observed(1.0, setting, 1000.0, memory_available=0.5 * GIB, **base))  # type: ignore[arg-type]
    assert change is not None and change.after == Setting(7, 2) and change.at == "now"
    assert "memory" in change.reason
    # still short a second later: despite the interval, at once (and by as many workers as it takes)
    change = tuner.observe(observed(2.0, change.after, 1000.0, memory_available=-2.5 * GIB, **base))  # type: ignore[arg-type]
    assert change is not None and change.after == Setting(3, 2)


def test_it_adds_a_worker_only_where_memory_allows() -> None:
    rates = {0: 100.0, 1: 200.0, 2: 300.0, 4: 400.0, 6: 450.0}
    tuner, _, changes = simulate(
        table(rates),
        cores=6,
        options=AutoTune(start=1),
        label=lambda s, t: "cpu",
        worker_busy=lambda s, t: 0.95,
        data_s=lambda s, t: 0.5,
        memory_total=lambda s, t: 16 * GIB,
        worker_bytes=lambda s, t: 1 * GIB,
        memory_available=lambda s, t: (4.5 - s.workers) * GIB,  # each worker takes 1 GiB of 4.5
    )
    # with 2 workers, 2.5 GiB left: a third would leave 1.5 GiB, more than the 0.33 GiB reserve and one worker
    assert max(c.after.workers for c in changes) <= 3
    assert tuner.current.workers >= 2


def test_one_change_per_interval_even_when_every_window_asks_for_one() -> None:
    options = AutoTune(interval=5.0, start=1)
    # a loader that always seems to want more workers and always measures a little faster with them (never
    # CLEAR faster: a trial won clearly lets the next step up come sooner, see the test below)
    _tuner, _, changes = simulate(
        lambda s, t: 100.0 * (1 + 0.2 * math.log2(1 + s.workers)),
        cores=64,
        options=options,
        windows=60,
        every=0.5,
        label=lambda s, t: "cpu",
        worker_busy=lambda s, t: 0.95,
        data_s=lambda s, t: 1.0,
    )
    times = [c.t for c in changes]
    assert len(changes) >= 4
    assert all(b - a >= 5.0 for a, b in itertools.pairwise(times))


def test_a_change_near_the_end_of_an_epoch_waits_for_the_next_pass() -> None:
    obs = observed(
        1.0, Setting(2, 2), 5000.0, label="ipc", worker_busy=0.3, batches_left=3, batch_s=0.01, restart_s=0.2
    )
    change = Tuner(AutoTune(), cores=2).observe(obs)
    assert change is not None and change.after == Setting(0) and change.at == "next pass"
    # persistent workers pay a restart at the next pass too: no reason to wait
    change = Tuner(AutoTune(), cores=2, persistent=True).observe(obs)
    assert change is not None and change.at == "now"
    # far from the end: now
    far = observed(1.0, Setting(2, 2), 5000.0, label="ipc", batches_left=500, batch_s=0.01, restart_s=0.2)
    change = Tuner(AutoTune(), cores=2).observe(far)
    assert change is not None and change.at == "now"


def test_prefetch_auto_tries_more_prefetch_when_batches_come_in_bursts() -> None:
    def rate(s: Setting, t: float) -> float:
        return {2: 40.0, 4: 48.0, 8: 49.0}[s.prefetch or 2]

    tuner = Tuner(AutoTune(), cores=4, workers=2, prefetch=None)
    _, _, changes = simulate(
        rate,
        tuner=tuner,
        step=lambda s, t: True,
        stall=lambda s, t: 0.3,
        label=lambda s, t: "cpu",
        worker_busy=lambda s, t: 0.5,  # workers idle half the time, yet the loop waits: bursts
    )
    assert [c.after for c in changes] == [Setting(2, 4), Setting(2, 8), Setting(2, 4)]
    assert "bursts" in changes[0].reason and "measured 1.02x" in changes[2].reason


def test_a_trial_of_fewer_workers_is_kept_unless_slower_by_the_margin_and_more_only_if_faster() -> None:
    tuner = Tuner(AutoTune(), cores=4, workers=None)
    s = tuner.initial()
    assert s == Setting(4, 2)
    idle: dict[str, object] = {"label": "cpu", "worker_busy": 0.3, "cores": 4, "data_s": 1.0}
    busy: dict[str, object] = {**idle, "worker_busy": 0.9}
    change = tuner.observe(observed(1.0, s, 1000.0, **idle))  # type: ignore[arg-type]
    assert change is not None and change.after == Setting(2, 2) and "idle" in change.reason
    assert tuner.observe(observed(4.0, change.after, 960.0, **busy)) is None  # 4% slower: kept  # type: ignore[arg-type]
    # more workers: kept only if faster by the margin
    tuner = Tuner(AutoTune(start=2), cores=4)
    s = tuner.initial()
    change = tuner.observe(observed(1.0, s, 1000.0, **busy))  # type: ignore[arg-type]
    assert change is not None and change.after == Setting(4, 2) and "waits for data" in change.reason
    back = tuner.observe(observed(4.0, change.after, 1040.0, **busy))  # type: ignore[arg-type]
    assert back is not None and back.after == Setting(2, 2) and "measured 1.04x" in back.reason


def test_an_early_look_decides_only_when_it_is_clear() -> None:
    tuner = Tuner(AutoTune(), cores=2)
    s = tuner.initial()
    early = observed(0.25, s, 50_000.0, label="cpu", worker_busy=0.6, batch_s=0.005, data_s=0.004, early=True)
    assert tuner.observe(early) is None  # no workers would take 4 of 5 ms: not clear, wait for the window
    assert tuner.wants_early()
    clear = observed(0.25, s, 50_000.0, label="cpu", worker_busy=0.6, batch_s=0.005, data_s=0.001, early=True)
    change = tuner.observe(clear)
    assert change is not None and change.after == Setting(0)


def test_an_early_look_moves_cheap_items_to_no_workers() -> None:
    # the demo HDF5's first quarter-window at 2 workers, as recorded: 1.08 ms to make a batch and 0.5 ms of
    # the loop's own, against 2.15 ms per batch
    tuner = Tuner(AutoTune(), cores=2)
    s = tuner.initial()
    early = observed(
        0.35, s, 118_835.0, label="cpu", worker_busy=0.55, batch_s=0.00215, data_s=0.00108, step_s=0.0005, early=True
    )
    change = tuner.observe(early)
    assert change is not None and change.after == Setting(0) and "1.1 ms to make" in change.reason


def _as_fast(rates: dict[int, float]) -> tuple[Tuner, list[Change]]:
    """2 workers on 2 busy cores; one process alone would make a batch in about the loop's time per batch."""
    tuner, _, changes = simulate(
        table(rates),
        label=lambda s, t: "cpu",
        worker_busy=lambda s, t: 0.95,
        batch_s=lambda s, t: 64 / rates[s.workers],
        data_s=lambda s, t: 0.0155,  # at 2 workers 16 ms a batch (4,000 samples/s): within the margin
    )
    return tuner, changes


def test_no_workers_predicted_about_as_fast_are_tried_once_and_kept_only_if_faster() -> None:
    # as measured on the tar demo under load: no workers 4,769 samples/s, 2 workers 4,001
    tuner, changes = _as_fast({0: 4_700.0, 1: 3_900.0, 2: 4_000.0})
    assert [c.after for c in changes] == [Setting(0)] and tuner.current == Setting(0)
    assert "15.5 ms to make, against 16.0 ms" in changes[0].reason
    # as fast (3% faster: within the margin): back to 2 workers, and no second trial
    tuner, changes = _as_fast({0: 4_120.0, 1: 3_900.0, 2: 4_000.0})
    assert [c.after for c in changes] == [Setting(0), Setting(2, 2)] and tuner.current == Setting(2, 2)
    assert "measured 1.03x" in changes[1].reason


def _interfered(after: Callable[[float], tuple[float, float]]) -> list[Change]:
    """A busy loop takes a core at t=10 (others 0.2 -> 1.5; 1 worker now best); at t=25 ``after(t)`` gives
    (others, the rates' factor)."""

    def state(t: float) -> tuple[float, float]:
        return (0.2, 1.0) if t < 10 else (1.5, 1.0) if t < 25 else after(t)

    def rate(s: Setting, t: float) -> float:
        quiet = {0: 3_000.0, 1: 4_900.0, 2: 5_700.0}
        hog = {0: 2_970.0, 1: 5_000.0, 2: 3_900.0}
        others, factor = state(t)
        return (quiet if others < 1 else hog)[s.workers] * factor

    _, _, changes = simulate(
        rate,
        windows=40,  # within ``recall`` (30 s) of the measurement at t=12
        others=lambda s, t: state(t)[0],
        label=lambda s, t: "cpu",
        worker_busy=lambda s, t: 0.95,
        batch_s=lambda s, t: 64 / rate(s, t),
        data_s=lambda s, t: 0.026,
    )
    return changes


def test_a_setting_measured_worse_is_not_tried_again_until_other_programs_change() -> None:
    # at t=25 the loop becomes 35% slower at every setting, other programs as before: the measurements are
    # forgotten, but 2 workers lost to 1 at t=12 under the same interference: not tried again
    changes = _interfered(lambda t: (1.5, 0.65))
    assert [(c.before, c.after) for c in changes] == [(Setting(2, 2), Setting(1, 2))]
    assert "other programs took" in changes[0].reason and changes[0].t <= 12.0
    # the busy loop ends at t=25: other programs gave back a core, so 2 workers are worth a new trial
    changes = _interfered(lambda t: (0.2, 1.0))
    assert [c.after for c in changes] == [Setting(1, 2), Setting(2, 2)]
    assert "gave back" in changes[1].reason
    # and once ``recall`` seconds have passed, whatever the cause
    _, _, late = simulate(
        lambda s, t: 1000.0 * (0.65 if t >= 25 else 1.0) * (1.3 if s.workers == 1 else 1.0),
        options=AutoTune(recall=10.0),
        windows=45,
        others=lambda s, t: 0.2 if t < 10 else 1.5,
        label=lambda s, t: "cpu",
        worker_busy=lambda s, t: 0.95,
        data_s=lambda s, t: 0.026,
    )
    assert [c.after for c in late] == [Setting(1, 2), Setting(2, 2), Setting(1, 2)]


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="max_workers"):
        AutoTune(min_workers=3, max_workers=2)
    with pytest.raises(ConfigError, match="prefetch"):
        AutoTune(prefetch=(4, 2))
    with pytest.raises(ConfigError, match="interval"):
        AutoTune(interval=0)
    with pytest.raises(ConfigError, match="recall"):
        AutoTune(recall=-1)
    assert math.isclose(AutoTune().margin, 0.05)


def waiting_items(ceiling: float) -> dict[str, Callable[[Setting, float], object]]:
    """A model of items that wait 5 ms each (a round trip, a sleep): each worker makes 200 a second and is busy
    5% of the time; the main process takes at most ``ceiling`` a second."""
    rate = lambda s, t: min(200.0 * s.workers, ceiling) if s.workers else 190.0  # noqa: E731
    return {
        "rate": rate,
        "label": lambda s, t: "sleep",
        "worker_busy": lambda s, t: 0.05,
        "batch_s": lambda s, t: 8 / rate(s, t),
        "data_s": lambda s, t: 0.04,  # 8 items of 5 ms, one process at a time: no workers would be slower
    }


def test_workers_that_wait_are_added_past_the_core_count_while_throughput_rises() -> None:
    model = waiting_items(ceiling=3600.0)
    tuner, _seen, changes = simulate(model.pop("rate"), cores=2, windows=20, **model)  # type: ignore[arg-type]
    # busy 5% of the time: two ladder steps at a time, 2 -> 8 -> 16 (the most while they wait, on 2 cores)
    assert [c.after.workers for c in changes] == [8, 16], [(c.t, str(c.after), c.reason) for c in changes]
    assert tuner.current.workers == 16
    # each a clear win: the climb does not wait the interval (2 s) between its steps
    assert changes[1].t - changes[0].t < AutoTune().interval
    assert "waits for data" in changes[0].reason and "sleep" in changes[0].reason


def test_past_the_core_count_only_while_throughput_keeps_rising() -> None:
    model = waiting_items(ceiling=1650.0)  # 16 workers no faster than 8 (the main process is the limit)
    tuner, _seen, changes = simulate(model.pop("rate"), cores=2, windows=30, **model)  # type: ignore[arg-type]
    assert [c.after.workers for c in changes][:3] == [8, 16, 8]  # tried, measured no faster, went back
    assert tuner.current.workers == 8


def test_workers_that_compute_never_pass_the_core_count() -> None:
    # CPU-bound items on a machine where more processes than cores still measure faster (they take the CPU
    # of other programs): never more workers than the 2 cores
    tuner, _seen, changes = simulate(
        lambda s, t: 1000.0 * (1 + s.workers),
        cores=2,
        windows=30,
        label=lambda s, t: "cpu",
        worker_busy=lambda s, t: 0.95,
        data_s=lambda s, t: 0.03,
        batch_s=lambda s, t: 0.01,
    )
    assert all(c.after.workers <= 2 for c in changes) and tuner.current.workers <= 2


def test_past_the_core_count_memory_open_files_and_the_users_cap_bound_the_workers() -> None:
    model = waiting_items(ceiling=10_000.0)
    rate = model.pop("rate")
    # memory for 4 workers (1 GiB each, 5.5 GiB available at none, a reserve of 0.33 GiB)
    tuner, _, _ = simulate(
        rate,  # type: ignore[arg-type]
        cores=2,
        memory_total=lambda s, t: 16 * GIB,
        worker_bytes=lambda s, t: 1 * GIB,
        memory_available=lambda s, t: (5.5 - s.workers) * GIB,
        **model,
    )
    assert tuner.current.workers <= 5
    # open files: 40 descriptors a worker against a limit of 256
    tuner, _, changes = simulate(
        rate,  # type: ignore[arg-type]
        cores=2,
        open_files=lambda s, t: 20 + 40 * s.workers,
        open_files_limit=lambda s, t: 256,
        **model,
    )
    assert tuner.current.workers <= 4 and any("open files" in c.reason or c.after.workers == 4 for c in changes)
    # the user's cap
    tuner, _, changes = simulate(rate, cores=2, options=AutoTune(max_workers=6), **model)  # type: ignore[arg-type]
    assert all(c.after.workers <= 6 for c in changes) and tuner.current.workers == 6


def test_past_the_core_count_a_noisy_window_does_not_send_waiting_workers_back_to_the_cores() -> None:
    """16 workers that wait, on 2 cores: every fourth window reads otherwise (busy 60% each, as 16 processes
    waiting for a core at each wake-up look; the main process the limit). It stays past the cores: never back
    to the 2 cores' count, never to none, which cannot overlap the waits."""
    model = waiting_items(ceiling=3600.0)
    rate = model.pop("rate")
    odd = lambda t: int(t) % 4 == 3  # noqa: E731
    model["label"] = lambda s, t: "main-process" if odd(t) and s.workers > 8 else "sleep"
    model["worker_busy"] = lambda s, t: 0.6 if odd(t) else 0.05
    tuner, _seen, changes = simulate(rate, cores=2, windows=40, **model)  # type: ignore[arg-type]
    assert all(c.after.workers >= 8 for c in changes), [(c.t, str(c.after), c.reason) for c in changes]
    assert tuner.current.workers == 16
