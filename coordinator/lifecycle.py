"""One way to write a lifecycle: a state enum, a table of legal moves, one ``_set_state``.

Every stateful class of zkgroups is written this way (the coordinator node and the groups' half
of it, the controller, the topic mirror, the terms of leadership, the console's snapshot; the
group member, the consumer, the fetcher, the producer, a Spark job's death budget; the test
harness's Docker engine; ``tests/project/test_layering.py`` checks that no other class keeps a
state of its own), after kazoo's ``SetPartitioner`` (its states in the class docstring, one
``_set_state``) and Curator's ``LeaderLatch`` (``start()`` and ``close()`` by compare-and-set).
Where Curator throws on a second ``start()``, zkgroups has one rule for every class: a second
``start()`` of a running object does nothing, a ``start()`` after close raises
:class:`~coordinator.errors.IllegalStateError` (``Lifecycle._start_once``), a second
``close()`` does nothing:

.. code-block:: python

    class PollerState(enum.Enum):
        NEW = "new"
        RUNNING = "running"
        STOPPED = "stopped"


    class Poller(Lifecycle[PollerState]):
        \"\"\"...

        States: NEW --start()--> RUNNING --stop()--> STOPPED; NEW --stop()--> STOPPED.

        Threads: ... (which threads call what, which lock guards what)
        \"\"\"

        TRANSITIONS = {
            PollerState.NEW: {PollerState.RUNNING, PollerState.STOPPED},
            PollerState.RUNNING: {PollerState.STOPPED},
            PollerState.STOPPED: set(),
        }

        def __init__(self):
            super().__init__(PollerState.NEW)

        def start(self):
            if not self._start_once(PollerState.RUNNING):
                return self          # started before: start-once (after stop(): IllegalStateError)
            ...                      # the work of starting, outside the lock
            return self

        def stop(self):
            if not self._set_state(PollerState.STOPPED):
                return               # stopped already: close-once
            ...

The rules the pattern keeps:

* **The states are an enum, the moves a table.** ``TRANSITIONS`` maps every state to the
  states it may move to (a terminal state to ``set()``); every state must be a key, so a state
  added to the enum and forgotten in the table fails at construction, in any test.
* **One place changes the state**: ``Lifecycle._set_state``, under ``_state_lock``. It is a
  compare-and-set: with ``expect``, it moves only from those states and otherwise returns
  False, changing nothing. That is how a repeated or racing call is told apart from a bug:
  ``start()`` twice, ``close()`` from two threads, an ``end()`` of a term already ended all
  find the state moved on and do nothing; the class decides whether its caller hears of it
  (nothing, or :class:`~coordinator.errors.IllegalStateError` where its API says so: "consumer
  is closed").
* **One policy for illegal moves**: a move the table does not allow raises
  :class:`IllegalTransition`, an ``AssertionError``. Only the class's own code calls
  ``_set_state``, so such a move is a bug in that code, never something its caller or
  ZooKeeper did; it is not a :class:`~coordinator.errors.ZkGroupsError` because those are
  user errors, which the command-line tools print as one line without a traceback, and a bug
  must keep its traceback. It is never caught to carry on.
* **Start once, close once.** ``start()`` moves from the initial state only
  (``Lifecycle._start_once``: a second call does nothing, a call after close raises
  IllegalStateError); ``close()`` (or ``stop()``) moves to the terminal state from wherever
  the table allows and does its work only if it made the move (a second call does nothing); a
  closed object is never started again. The work itself (threads,
  connections) runs outside ``_state_lock``: the lock guards the state, not the I/O.
* **State lives in the state**, not in flags beside it (no ``_closed`` next to a ``CLOSED``).
  Readers read :attr:`Lifecycle.state` (one attribute read, no lock); a thread that must wait
  for a state uses ``Lifecycle._wait_state``.

Every move is logged at DEBUG on the ``zkgroups.lifecycle`` logger, naming the object
(``Lifecycle._lifecycle_name``).
"""
from __future__ import annotations

import enum
import logging
import threading
from typing import ClassVar, Collection, Generic, Mapping, Optional, TypeVar

from coordinator.errors import IllegalStateError

log = logging.getLogger("zkgroups.lifecycle")

S = TypeVar("S", bound=enum.Enum)


class IllegalTransition(AssertionError):
    """A state change the class's transitions table does not allow: a bug in zkgroups (see the
    module docstring for why this is not a user error)."""


class Lifecycle(Generic[S]):
    """The base of a stateful class: its current state, the table of legal moves
    (``TRANSITIONS``, set by each subclass) and the one method that changes the state.

    Threads: ``_set_state`` and ``_wait_state`` may be called from any thread; ``_state_lock``
    (re-entrant) guards the state, and a subclass may hold it around a move and the few
    assignments that must change with it (never around I/O). :attr:`state` is read without it.
    """

    #: {state: the states it may move to}; every state of the enum is a key.
    TRANSITIONS: ClassVar[Mapping[enum.Enum, Collection[enum.Enum]]] = {}

    def __init__(self, initial: S):
        missing = [s for s in type(initial) if s not in self.TRANSITIONS]
        if missing:
            raise IllegalTransition(f"{type(self).__name__}.TRANSITIONS has no entry for "
                                    f"{', '.join(s.name for s in missing)}")
        self._state: S = initial
        self._initial = initial
        self._state_lock = threading.RLock()
        self._state_changed = threading.Condition(self._state_lock)

    @property
    def state(self) -> S:
        """The current state (a snapshot: another thread may change it the next moment)."""
        return self._state

    def _lifecycle_name(self) -> str:
        """How log lines and errors name this object (override to add an id)."""
        return type(self).__name__

    def _set_state(self, new: S, expect: Optional[Collection[S]] = None) -> bool:
        """Move to ``new``; True if this call moved.

        With ``expect``, only from one of those states: from another, nothing changes and the
        answer is False (a repeated or racing call). A move to the current state changes
        nothing either (False). A move ``TRANSITIONS`` does not allow raises
        :class:`IllegalTransition`."""
        with self._state_lock:
            old = self._state
            if (expect is not None and old not in expect) or new is old:
                return False
            if new not in self.TRANSITIONS[old]:
                raise IllegalTransition(f"{self._lifecycle_name()}: illegal transition {old.name} -> {new.name}")
            self._state = new
            self._state_changed.notify_all()
        log.debug("%s: %s -> %s", self._lifecycle_name(), old.name, new.name)
        return True

    def _start_once(self, running: S) -> bool:
        """``start()``'s move from the initial state to ``running``: True if this call made it;
        False if started before (the caller does nothing more); IllegalStateError if the
        object was closed (a terminal state): it is never started again."""
        with self._state_lock:
            if self._set_state(running, expect={self._initial}):
                return True
            if not self.TRANSITIONS[self._state]:
                raise IllegalStateError(f"{self._lifecycle_name()} is {self._state.value}: it is not started again")
            return False

    def _wait_state(self, states: Collection[S], timeout: Optional[float] = None) -> bool:
        """Wait until the state is one of ``states``; False if ``timeout`` (s) passed first."""
        with self._state_lock:
            return self._state_changed.wait_for(lambda: self._state in states, timeout)
