"""The lifecycle helper (coordinator.lifecycle): the table, compare-and-set moves, the one policy
for illegal moves, start-once/close-once. Pure, no server."""
import enum
import threading

import pytest

from coordinator.errors import ZkGroupsError
from coordinator.lifecycle import IllegalTransition, Lifecycle


class State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


class Service(Lifecycle[State]):
    """The pattern as the module docstring writes it: NEW --start()--> RUNNING --close()--> CLOSED,
    NEW --close()--> CLOSED."""

    TRANSITIONS = {State.NEW: {State.RUNNING, State.CLOSED}, State.RUNNING: {State.CLOSED}, State.CLOSED: set()}

    def __init__(self):
        super().__init__(State.NEW)
        self.started = self.closed = 0

    def start(self):
        if self._set_state(State.RUNNING, expect={State.NEW}):
            self.started += 1
        return self

    def close(self):
        if self._set_state(State.CLOSED):
            self.closed += 1


def test_a_legal_move_changes_the_state_and_says_so():
    s = Service()
    assert s.state is State.NEW
    assert s._set_state(State.RUNNING) is True and s.state is State.RUNNING


def test_expect_is_a_compare_and_set():
    s = Service()
    assert s._set_state(State.CLOSED, expect={State.RUNNING}) is False and s.state is State.NEW
    assert s._set_state(State.CLOSED, expect={State.NEW}) is True and s.state is State.CLOSED


def test_a_move_to_the_current_state_changes_nothing():
    s = Service().start()
    assert s._set_state(State.RUNNING) is False and s.state is State.RUNNING


def test_an_illegal_move_is_a_bug_not_a_user_error():
    s = Service()
    s.close()
    with pytest.raises(IllegalTransition, match="Service: illegal transition CLOSED -> RUNNING") as caught:
        s._set_state(State.RUNNING)
    assert isinstance(caught.value, AssertionError) and not isinstance(caught.value, ZkGroupsError)
    assert s.state is State.CLOSED


def test_every_state_must_be_in_the_table():
    class Forgetful(Lifecycle[State]):
        TRANSITIONS = {State.NEW: {State.RUNNING}, State.RUNNING: set()}

    with pytest.raises(IllegalTransition, match="no entry for CLOSED"):
        Forgetful(State.NEW)


def test_start_once_and_close_once_even_from_many_threads():
    s = Service()
    go = threading.Barrier(8)

    def both():
        go.wait()
        s.start()
        s.close()

    threads = [threading.Thread(target=both) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert s.state is State.CLOSED and s.closed == 1 and s.started <= 1


def test_a_closed_object_is_not_started_again():
    s = Service()
    s.close()
    s.start()
    assert s.state is State.CLOSED and s.started == 0


def test_wait_state_wakes_on_the_move_or_times_out():
    s = Service()
    assert s._wait_state({State.RUNNING}, timeout=0.01) is False
    threading.Timer(0.05, s.start).start()
    assert s._wait_state({State.RUNNING, State.CLOSED}, timeout=5) is True and s.state is State.RUNNING


def test_start_once_is_the_one_rule_a_second_start_does_nothing_a_start_after_close_raises():
    import enum

    from coordinator.errors import IllegalStateError
    from coordinator.lifecycle import Lifecycle

    class S(enum.Enum):
        NEW, RUNNING, CLOSED = "new", "running", "closed"

    class Thing(Lifecycle[S]):
        TRANSITIONS = {S.NEW: {S.RUNNING, S.CLOSED}, S.RUNNING: {S.CLOSED}, S.CLOSED: set()}

        def __init__(self):
            super().__init__(S.NEW)

    thing = Thing()
    assert thing._start_once(S.RUNNING) is True
    assert thing._start_once(S.RUNNING) is False and thing.state is S.RUNNING
    thing._set_state(S.CLOSED)
    with pytest.raises(IllegalStateError, match="is closed: it is not started again"):
        thing._start_once(S.RUNNING)
