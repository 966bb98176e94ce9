"""Fakes for the pure-logic tests of runtime modules (no server): a monotonic clock the test
moves, and an async answer as kazoo's ``*_async`` calls return one."""
from __future__ import annotations


class Clock:
    """Stands in for a module's ``time`` (``monkeypatch.setattr(module, "time", clock)``): its
    ``monotonic()`` is ``now``, which only the test moves."""

    def __init__(self, now: float = 100.0):
        self.now = now

    def monotonic(self) -> float:
        return self.now


class Answer:
    """An answered kazoo async request: ``get()`` returns ``value`` or raises ``error``."""

    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def get(self, timeout=None):
        if self.error is not None:
            raise self.error
        return self.value
