"""``max_poll_interval_ms`` (Kafka's KIP-62): when the application last called ``poll()``, and
the watchdog thread that makes a member leave its group when the application stops calling it
(its partitions move on; the next ``poll()`` rejoins).

Thread rule: the application's thread calls :meth:`PollInterval.entered` and
:meth:`PollInterval.left` around each ``poll()``; the watchdog thread and the member thread read
:attr:`PollInterval.in_poll`, :meth:`PollInterval.overdue` and
:meth:`PollInterval.seconds_since_poll` without a lock (a stale read delays an eviction by one
check).
"""
from __future__ import annotations

import threading
import time
from typing import Callable


class PollInterval:
    """How long the application has been away from ``poll()``; ``start()`` runs the watchdog,
    which calls ``evict()`` once ``poll()`` is overdue, until ``running()`` is False."""

    def __init__(self, max_poll_interval_ms: int, evict: Callable[[], None], running: Callable[[], bool]) -> None:
        self.limit_s = max_poll_interval_ms / 1000.0
        self._evict, self._running = evict, running
        self._last = time.monotonic()
        self._in = False

    def start(self) -> None:
        threading.Thread(target=self._watch, name="poll-watchdog", daemon=True).start()

    def entered(self) -> None:
        self._last = time.monotonic()
        self._in = True

    def left(self) -> None:
        self._in = False
        self._last = time.monotonic()

    @property
    def in_poll(self) -> bool:
        """Whether the application's thread is inside ``poll()`` now."""
        return self._in

    def overdue(self) -> bool:
        """Whether ``poll()`` was last called more than ``max_poll_interval_ms`` ago (and is not
        running now)."""
        return not self._in and time.monotonic() - self._last > self.limit_s

    def seconds_since_poll(self) -> float:
        """Seconds since ``poll()`` last returned; 0 while in ``poll()``."""
        return 0.0 if self._in else max(0.0, time.monotonic() - self._last)

    def _watch(self) -> None:
        while self._running():
            time.sleep(min(1.0, self.limit_s / 4))
            if self.overdue():
                self._evict()
