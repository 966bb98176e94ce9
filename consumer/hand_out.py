"""The heart of ``poll()``: hand records out only while the member can prove it still owns their
partitions, running the rebalance listener's callbacks and auto-commit on the way.

Guarantees: records are returned only while connected to ZooKeeper and within the member's
lease (the session that owns them was proved alive recently; see :mod:`consumer.lease`).
Records fetched while the lease lapsed (a process frozen in ``poll()``) are given back to the
fetcher, never returned, until a round trip confirms the session. :meth:`HandOut.wakeup` from
any thread makes the poll in progress (or the next) raise ``WakeupException``.

Thread rule: :meth:`HandOut.poll` on the application's thread only; :meth:`HandOut.wakeup`
from any thread (a flag and the fetcher's own wakeup). ``handed_out_at`` is written by
``poll()`` and read by anyone (a float: a stale read is the previous poll's).
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from coordinator.errors import ZkGroupsError

#: poll(0) still waits this long for a lease renewal's round trip (only when the lease lapsed).
LEASE_RENEWAL_MIN_WAIT_S = 0.05


class WakeupException(ZkGroupsError):
    """``poll()`` was interrupted by ``wakeup()``."""


class HandOut:
    """``poll()``'s loop over ``member`` (its connection and lease), ``changes`` (the listener's
    callbacks), ``fetcher`` and ``auto_commit`` (called before each read)."""

    def __init__(self, member, changes, fetcher, auto_commit: Callable[[], None]) -> None:
        self.member, self.changes, self.fetcher, self.auto_commit = member, changes, fetcher, auto_commit
        self.handed_out_at: Optional[float] = None
        self._wakeup = False

    def poll(self, timeout_ms: float, max_records: Optional[int], take: Callable) -> dict:
        """Up to ``max_records`` records from ``take`` (the fetcher's ``poll`` or
        ``poll_columns``) within ``timeout_ms``; ``{}`` when none came or none may be handed out."""
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            self.changes.run_callbacks()
            remaining = deadline - time.monotonic()
            if not self._may_hand_out(remaining):
                # Another member may own our partitions by now: hand out nothing.
                self._check_wakeup()
                if time.monotonic() >= deadline:
                    return {}
                continue
            self.auto_commit()
            remaining = deadline - time.monotonic()
            records = take(max_records, timeout=max(0.0, min(remaining, 0.5)))
            if records:
                handed_out_at = time.time()
                if self.member.holds_lease():
                    self.handed_out_at = handed_out_at
                    return records
                # The lease lapsed while we waited (the process may have been frozen): keep
                # them until a round trip confirms the session that owns them.
                self.fetcher.give_back(records)
                continue
            self._check_wakeup()
            if remaining <= 0:
                return {}

    def wakeup(self) -> None:
        self._wakeup = True
        self.fetcher.wakeup()

    def _may_hand_out(self, remaining: float) -> bool:
        """Whether records of owned partitions may be returned now: connected, and the session
        that owns them proved alive recently (the member's lease; renewed here if it lapsed)."""
        if not self.member.wait_connected(max(0.0, min(remaining, 0.5))):
            return False
        return self.member.holds_lease() or self.member.renew_lease(
            max(LEASE_RENEWAL_MIN_WAIT_S, min(remaining, 0.5)))

    def _check_wakeup(self) -> None:
        if self._wakeup:
            self._wakeup = False
            raise WakeupException("poll() was woken up")
