"""SharedState (fastdata.core.shared): pickled by value outside spawning."""

from __future__ import annotations

import pickle

from fastdata.core.shared import SharedState


def test_shared_state_pickles_by_value_outside_spawning() -> None:
    state = SharedState(("skipped",))
    state.epoch = 3
    state.add("skipped", 2)
    clone = pickle.loads(pickle.dumps(state))
    clone.epoch = 9
    assert state.epoch == 3 and clone.total("skipped") == 2
