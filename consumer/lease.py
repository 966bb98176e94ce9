"""A member's lease: whether records of the partitions it owns may be handed out now.

Records of owned partitions may be handed out (:meth:`Lease.holds`) only within
:data:`LEASE_FRACTION` of the session timeout after a round trip that proved the session that
owns them alive (the registration znode's ephemeral owner is that session, or a claim
succeeded on it). The ZooKeeper server cannot expire that session, and so no other member can
own those partitions, before a full session timeout after that round trip. A process that was
frozen (GC, SIGSTOP, a VM pause) finds its lease lapsed and hands out nothing until a new round
trip confirms the same session.

Not provided: protection against a process paused between the lease check and the moment
``poll()`` returns to the application (a few microseconds); commits stay fenced in that case
(:mod:`consumer.offsets`).

Threads: any thread may call :meth:`Lease.holds` and :meth:`Lease.renew`; kazoo's thread
records a background renewal's answer. The holdings' lock (:class:`consumer.offsets.Holdings`)
guards the deadline too, so that it changes together with the session that owns the partitions.
"""
from __future__ import annotations

import time
from typing import Optional

from coordinator.zkclient import session_id

#: Records are handed out only this fraction of the session timeout after the session was last
#: proved alive (the server expires it no sooner than a whole session timeout after that).
LEASE_FRACTION = 0.5


class Lease:
    """The lease of the partitions in ``holdings``, proved by reading ``path`` (the member's
    registration) with ``client``."""

    def __init__(self, client, path: str, holdings, session_timeout_s: float):
        self.client, self._path, self._holdings = client, path, holdings
        self.length_s = session_timeout_s * LEASE_FRACTION
        self._until = 0.0          # monotonic
        self._renewing = False

    def holds(self) -> bool:
        """Whether records of owned partitions may be handed out now (no I/O). Past half the
        lease a renewal is sent in the background, so a polling member rarely waits for one."""
        current = session_id(self.client)  # None while not connected
        h = self._holdings
        with h.lock:
            if not h.owned:
                return True
            if current != h.session:
                return False
            left = self._until - time.monotonic()
            if left > 0 and left < self.length_s / 2 and not self._renewing:
                self._renewing = True
                renew = True
            else:
                renew = False
        if renew:
            self._send_renewal(background=True)
        return left > 0

    def renew(self, timeout: float) -> bool:
        """One round trip (at most ``timeout`` seconds) proving the session that owns our
        partitions alive; True if the lease holds afterwards."""
        if self.holds():
            return True
        return self._send_renewal(background=False, timeout=timeout)

    def proved_locked(self, session: int, sent: float) -> None:
        """A claim sent at ``sent`` succeeded on ``session``: the session that owns the
        partitions now, alive then (caller holds the holdings' lock)."""
        h = self._holdings
        if h.session != session:
            h.session, self._until = session, 0.0
        self._until = max(self._until, sent + self.length_s)

    def _send_renewal(self, background: bool, timeout: float = 0.0) -> bool:
        with self._holdings.lock:
            session = self._holdings.session
        sent = time.monotonic()
        try:
            pending = self.client.exists_async(self._path)
        except Exception:  # the client is closed or closing
            with self._holdings.lock:
                self._renewing = False
            return False
        if background:
            pending.rawlink(lambda result: self._renewed(sent, session, result))  # kazoo thread: record only
            return False
        try:
            stat = pending.get(timeout=max(timeout, 0.001))
        except Exception:  # no answer in time, connection lost, session expired
            return False
        return self._record(sent, session, stat)

    def _renewed(self, sent: float, session: Optional[int], result) -> None:
        stat = result.value if result.successful() else None
        self._record(sent, session, stat)

    def _record(self, sent: float, session: Optional[int], stat) -> bool:
        with self._holdings.lock:
            self._renewing = False
            if session is None or session != self._holdings.session or stat is None or stat.ephemeralOwner != session:
                return False
            self._until = max(self._until, sent + self.length_s)
            return True
