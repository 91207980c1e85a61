"""SharedState (fastdata.core.process._shared): pickled by value outside spawning."""

from __future__ import annotations

import pickle

from fastdata.core.process._shared import SharedState


def test_shared_state_pickles_by_value_outside_spawning() -> None:
    state = SharedState(("skipped",))
    state.epoch = 3
    state.add("skipped", 2)
    clone = pickle.loads(pickle.dumps(state))
    clone.epoch = 9
    assert state.epoch == 3 and clone.total("skipped") == 2


def test_pass_log_says_whether_the_epoch_was_set_and_every_worker_of_a_pass_hears_the_same() -> None:
    state = SharedState(("reads",))
    first = state.begin_pass(0, token=11)
    assert (first.epoch_set, first.repeated, first.new) == (False, False, True)
    assert state.begin_pass(0, token=11) == type(first)(False, False, False), "another worker of the pass"
    again = state.begin_pass(0, token=12)  # a new pass, the epoch never set
    assert again.repeated and not again.epoch_set
    state.epoch = 0  # set again, to the same value: the user asks for that epoch
    assert state.begin_pass(0, token=13).epoch_set
    assert state.begin_pass(0, token=13).epoch_set
    other = state.begin_pass(1, token=13)  # another log (a sampler's): its own record
    assert other.new and other.epoch_set
    state.epoch = 1
    assert state.begin_pass(0, token=14) == type(first)(True, False, True)
    assert state.once(0) and not state.once(0) and state.once(1)
    state.add("reads", 5)
    assert state.reads_this_epoch() == 5
    state.epoch = 2
    state.add("reads", 2)
    assert state.reads_this_epoch() == 2
