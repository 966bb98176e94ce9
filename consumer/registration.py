"""A member's registration (``ids/<consumer id>``, ephemeral) and static membership.

Static membership
-----------------
With a ``group_instance_id`` the consumer id is ``<group>_static-<instance id>`` in every
process that carries it (:mod:`coordinator.static` says what the coordinator keeps for it
while it is away). Only one live session holds its registration: a process that finds the
registration held by another session waits for that session to end — at most twice the
holder's ``session_timeout_ms``, the longest a crashed process's session can outlive it —
and raises :class:`~coordinator.errors.FencedInstanceIdError` if it does not (the holder is alive). Its own dead
session's registration (KAFKA-1387) is replaced at once. A static member starts every
registration from nothing applied, so the start-fetcher the coordinator re-sends at the
group's current generation applies; its channel is never touched by a fenced process.

Threads: the thread that starts the member, then the member thread; one at a time.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from kazoo.exceptions import NodeExistsError

from coordinator import protocol
from coordinator.errors import CorruptZnode, FencedInstanceIdError
from coordinator.protocol import Registration
from coordinator.zkclient import REPLACE, WAIT, Holder, TransactionFailed, commit, create_ephemeral

log = logging.getLogger("zkgroups.member")


class Registrar:
    """Registers ``consumer_id`` in ``group`` with ``registration``; ``stopped()`` ends a wait
    for another holder (the member is closed)."""

    def __init__(self, client, group: str, consumer_id: str, registration: Registration, session_timeout_s: float,
                 stopped: Callable[[], bool]):
        self.client, self.group, self.consumer_id, self.registration = client, group, consumer_id, registration
        self._timeout_s, self._stopped = session_timeout_s, stopped
        self.registered_session: Optional[int] = None  # the session the registration was last created in

    def register(self, session: int, create_channel: bool = False) -> None:
        """Make the registration ``session``'s (:func:`~coordinator.zkclient.create_ephemeral`):
        create it (with ``create_channel``, the command channel too, in the same transaction,
        so a member is never listed without one), find it ours already (a create whose answer
        was lost), replace our own dead session's (KAFKA-1387), or, static, wait for another
        session's to end (FencedInstanceIdError if it does not)."""
        path = protocol.ids_path(self.group, self.consumer_id)
        data = self.registration.encode()
        static = bool(self.registration.group_instance_id)
        waits = {}  # holder's session -> the deadline of our wait for it to end

        def create() -> None:
            nonlocal create_channel
            if create_channel and self._create_with_channel(path, data):
                return
            create_channel = False  # the channel appeared meanwhile: register alone
            self.client.create(path, data, ephemeral=True)

        def when_held(holder: Holder) -> str:
            if static and holder.session != self.registered_session:
                return self._wait_for_holder(holder, waits)
            log.info("member %s: replacing registration left by an expired session", self.consumer_id)
            return REPLACE

        create_ephemeral(self.client, path, data, when_held, create=create)
        self.registered_session = session

    def _create_with_channel(self, path: str, data: bytes) -> bool:
        """Create the channel and the registration in one transaction: True once done; False
        if the channel exists already (nothing was created); NodeExistsError if the
        registration exists (nothing was created either)."""
        t = self.client.transaction()
        t.create(protocol.channel_path(self.group, self.consumer_id))
        t.create(path, data, ephemeral=True)
        try:
            commit(t)
            return True
        except TransactionFailed as e:
            if e.index == 0 and isinstance(e.error, NodeExistsError):
                return False
            raise e.error from None

    def _wait_for_holder(self, holder: Holder, waits) -> str:
        """Another session holds this static member's registration: wait for it to end, at
        most twice the holder's session timeout from when it was first seen holding it;
        FencedInstanceIdError if it does not."""
        try:
            held = Registration.decode(holder.data, protocol.ids_path(self.group, self.consumer_id))
            timeout_s, host = (held.session_timeout_ms / 1000.0) or self._timeout_s, held.host
        except CorruptZnode:
            timeout_s, host = self._timeout_s, "?"
        if holder.session not in waits:
            waits[holder.session] = time.monotonic() + 2 * timeout_s
            log.info("member %s: instance id %s is registered by session 0x%x (host %s); waiting up to %.1f s for it "
                     "to end", self.consumer_id, self.registration.group_instance_id, holder.session, host,
                     2 * timeout_s)
        if time.monotonic() >= waits[holder.session] or self._stopped():
            raise FencedInstanceIdError(
                f"group instance id {self.registration.group_instance_id!r} of group {self.group} is in use "
                f"by another live consumer (host {host}, ZooKeeper session 0x{holder.session:x}); this one is fenced")
        return WAIT
