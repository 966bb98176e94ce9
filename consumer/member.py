"""The member side of the protocol: registration, the command channel, owners and offsets.

Its pieces: :mod:`consumer.joining` makes the group's directories and waits out a connection
lost while it joins, :mod:`consumer.registration` registers it (and fences static members),
:mod:`consumer.channel` reads its command channel and :mod:`consumer.commands` decides which
commands apply, :mod:`consumer.claims` claims and releases partitions with the transactions
:mod:`consumer.ownership` builds, :mod:`consumer.offsets` holds what the member owns and
fences its commits, :mod:`consumer.lease` says whether records may be handed out; this module
runs them in one ordered state machine.

States (:class:`MemberState`), changed through one ``_set_state``
(:mod:`coordinator.lifecycle`)::

    NEW ──start()──▶ JOINED ──evict──▶ EVICTED ──rejoin──▶ JOINED
                     JOINED ──session lost──▶ SESSION_LOST ──connected──▶ JOINED
    EVICTED, SESSION_LOST ──another process holds the instance id──▶ FENCED
    NEW, JOINED, EVICTED, SESSION_LOST, FENCED ──leave, or close()──▶ CLOSED

The member thread makes every move but one: ``close()`` moves to CLOSED itself when the member
never started or its thread did not finish leaving in time; a move the member thread makes
after that finds the state CLOSED and changes nothing (compare-and-set).

JOINED: registered under ``ids/``, applying commands. EVICTED: left without committing
(the application stopped polling); registers again only when asked. SESSION_LOST: the
session expired; its partitions were reported lost; it registers again once connected.
FENCED: a static member whose instance id another live process registered; it does nothing
more (``start()`` raises :class:`FencedInstanceIdError` instead of entering it).
Static membership: :mod:`consumer.registration`.

Threads and locks
-----------------
* The **member thread** handles every :class:`Event` in order (commands, connection changes,
  eviction, rejoining, leaving). It alone writes ``_applied``, ``generation``,
  ``rebalances`` and (in :class:`~consumer.claims.Claims`) the partitions it cannot serve,
  moves the state (but for ``close()``'s move above), and it alone adds or removes owned
  partitions.
* **kazoo's threads** (watches, the connection listener, async completions) only queue events
  or record: ``_connected`` (an Event) and the lease deadline.
* **Any thread** may call :meth:`GroupMember.commit` (the application, the consumer's
  commit-async thread, the member thread when it revokes or leaves) and read the lease; the
  locks of what it owns and of its commits are :class:`consumer.offsets.Holdings`' (whose
  docstring says their order).

Guarantees
----------
* A partition is fetched only after this member created its ephemeral owner node; a node still
  held by someone else is waited for. Owner nodes are released only once the application is
  between batches and the positions are committed (the listener's ``revoke``).
* **Fencing token.** Claiming a partition also rewrites its ``offsets/<topic>/<partition>``
  znode in the same transaction; every commit is a compare-and-set at the version that write
  left, so once another member has claimed the partition no commit of this one can land
  (:mod:`consumer.offsets` says how, and how a write whose answer was lost is settled).
* **Bounded writes.** A claim, a commit or a release of many partitions is written in
  transactions of at most :data:`~consumer.ownership.CLAIM_PARTITIONS` partitions
  (:data:`~consumer.offsets.COMMIT_PARTITIONS` for a commit), one after the other, each
  fenced as above for its partitions; the acks and the registration go with the last.
  ZooKeeper handles every client's writes one at a time: one transaction of thousands of
  operations would hold every other session's requests back.
* Readers outside the group (a Spark query reading its topics) commit through
  :func:`consumer.offsets.commit_unowned`.
* **Lease** (:mod:`consumer.lease`). Records of owned partitions are handed out
  (:meth:`holds_lease`) only within a fraction of the session timeout after a round trip
  that proved the session that owns them alive; while the connection is suspended nothing is
  handed out either (:meth:`~consumer.member.GroupMember.wait_connected`).
* Commands are applied in channel order; which apply is :func:`consumer.commands.decide`.
  When a stop-fetcher and a start-fetcher are both waiting, only partitions that really move
  are released. Commands that do not apply are acked and change nothing. Every partition a
  claim took is handed to the listener, also when a newer command or an error cut the claim
  short, so none is owned and never fetched.
* A partition the listener cannot serve once claimed (its data cannot be opened) is released
  at once, nothing committed, never kept half-applied: the coordinator finds it not owned at
  its next check and assigns it again (``Claims.release_unserved()`` says why this
  and not another member).
* After a session expiry the member reports its partitions lost and registers again, coping
  with its own registration still held by the dead session (KAFKA-1387).
* Static: one live process per instance id (above); the others get
  :class:`FencedInstanceIdError`, and what they own is nothing.
* Calls that need ZooKeeper while it is unreachable raise :class:`ZooKeeperUnavailable`
  (within a session timeout), never anything else.
"""
from __future__ import annotations

import enum
import logging
import os
import socket
import threading
import time
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Set

from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, KazooException
from kazoo.protocol.states import KazooState

from coordinator import protocol
from coordinator.config import DEFAULT_SESSION_TIMEOUT_MS
from coordinator.errors import (CorruptZnode, FencedInstanceIdError, IllegalStateError, InvalidConfig,
                                ZooKeeperUnavailable)
from coordinator.lifecycle import Lifecycle
from coordinator.protocol import Registration
from coordinator.zkclient import session_id
from consumer import commands as channel
from consumer.channel import CommandChannel
from consumer.claims import Claims
from consumer.joining import GroupDirectories, join_waiting_out_lost_connections
from consumer.lease import Lease
from consumer.offsets import Holdings
from consumer.records import TopicPartition
from consumer.registration import Registrar

log = logging.getLogger("zkgroups.member")

#: A member with no assignment this long after joining checks whether any coordinator runs.
NO_COORDINATOR_WARNING_S = 5.0
#: The member thread's housekeeping interval while nothing happens.
HOUSEKEEPING_S = 1.0


def new_consumer_id(group: str) -> str:
    """``<group>_<host>-<ms>-<8 hex>`` (unique per process and registration)."""
    return f"{group}_{socket.gethostname()}-{protocol.now_ms()}-{os.urandom(4).hex()}"


class MemberListener:
    """What the consumer provides; called on the member thread."""

    def revoke(self, partitions: Set[TopicPartition]) -> Optional[Dict[TopicPartition, int]]:
        """Stop returning records of ``partitions``; once the application is between batches
        return the offsets to commit, or None if the application is unresponsive (evict)."""
        return {}

    def assign(self, added: Dict[TopicPartition, str],
               committed: Dict[TopicPartition, Optional[int]]) -> Optional[Dict[TopicPartition, BaseException]]:
        """``added`` partitions (with their stream) are owned now; start fetching them. Return
        those that cannot be served (the data plane cannot open them), each with why: the
        member releases them (see ``Claims.release_unserved()``)."""
        return None

    def lost(self, partitions: Set[TopicPartition]) -> None:
        """The partitions are gone without a chance to commit (session lost, eviction)."""

    def fenced(self, error: FencedInstanceIdError) -> None:
        """Another live process holds this static member's instance id: stop."""


class MemberState(enum.Enum):
    NEW = "new"
    JOINED = "joined"
    EVICTED = "evicted"
    SESSION_LOST = "session lost"
    FENCED = "fenced"
    CLOSED = "closed"


_TRANSITIONS: Dict[MemberState, Set[MemberState]] = {
    MemberState.NEW: {MemberState.JOINED, MemberState.CLOSED},
    MemberState.JOINED: {MemberState.EVICTED, MemberState.SESSION_LOST, MemberState.CLOSED},
    MemberState.EVICTED: {MemberState.JOINED, MemberState.FENCED, MemberState.CLOSED},
    MemberState.SESSION_LOST: {MemberState.JOINED, MemberState.FENCED, MemberState.CLOSED},
    MemberState.FENCED: {MemberState.CLOSED},
    MemberState.CLOSED: set(),
}


class Event(enum.Enum):
    CHANNEL = "channel"        # the channel changed (a watch fired) or must be read again
    CONNECTED = "connected"    # the connection is back (same or new session)
    LOST = "lost"              # the session expired
    EVICT = "evict"            # leave without committing: the application stopped polling
    REJOIN = "rejoin"          # register again after an eviction
    LEAVE = "leave"            # leave the group for good


class _Events:
    """The member thread's queue; :meth:`pending` tells whether an event kind is waiting."""

    def __init__(self):
        self._items: Deque[Event] = deque()
        self._cv = threading.Condition()

    def put(self, event: Event) -> None:
        with self._cv:
            self._items.append(event)
            self._cv.notify()

    def get(self, timeout: float) -> Optional[Event]:
        with self._cv:
            if not self._items and not self._cv.wait(timeout):
                return None
            return self._items.popleft() if self._items else None

    def pending(self, event: Event) -> bool:
        with self._cv:
            return event in self._items


#: The states a move of the member thread starts from: any but CLOSED (close() may have moved there).
_OPEN = frozenset(MemberState) - {MemberState.CLOSED}


class GroupMember(Lifecycle[MemberState]):
    """One member of a group (see the module docstring: states, threads, guarantees)."""

    TRANSITIONS = _TRANSITIONS

    def __init__(self, client, group: str, subscription: Dict[str, int], pattern: str = protocol.PATTERN_STATIC,
                 strategies: Iterable[str] = ("sticky", "range"), client_id: str = "", listener: Optional[MemberListener] = None,
                 consumer_id: Optional[str] = None, session_timeout_ms: Optional[int] = None,
                 group_instance_id: Optional[str] = None, static_grace_ms: Optional[int] = None):
        protocol.validate_name(group, "group")
        self.client, self.group = client, group
        timeout_ms = session_timeout_ms or getattr(client, "_session_timeout", DEFAULT_SESSION_TIMEOUT_MS)
        if group_instance_id:
            if consumer_id:
                raise InvalidConfig("give consumer_id or group_instance_id, not both (a static member's consumer "
                                    "id comes from its instance id)")
            consumer_id = protocol.static_consumer_id(group, group_instance_id)
        self.registration = Registration(dict(subscription), pattern, list(strategies), socket.gethostname(), client_id,
                                         group_instance_id=group_instance_id or "",
                                         session_timeout_ms=int(timeout_ms) if group_instance_id else 0,
                                         static_grace_ms=int(static_grace_ms or timeout_ms) if group_instance_id else 0)
        try:  # validate early, with the coordinator's own rules
            Registration.decode(self.registration.encode(), "subscription")
        except CorruptZnode as e:
            raise InvalidConfig(f"subscription of group {group}: {e.problem}") from None
        self.consumer_id = consumer_id or new_consumer_id(group)
        self.listener = listener or MemberListener()
        self._session_timeout_s = timeout_ms / 1000.0
        super().__init__(MemberState.NEW)
        self._events = _Events()
        # Cleared while the connection is suspended: the session, and with it the owner
        # nodes, may already be gone, so the consumer hands out no records until it is back.
        self._connected = threading.Event()
        self._connected.set()
        # What it owns, with the tokens that fence its commits; the lease of those partitions.
        self._holdings = Holdings(client, group, self.consumer_id, self._session_timeout_s, self._connected)
        self._lease = Lease(client, protocol.ids_path(group, self.consumer_id), self._holdings, self._session_timeout_s)
        self._claims = Claims(client, group, self.consumer_id, self._holdings, self._lease, self._session_timeout_s)
        self._directories = GroupDirectories(client, group, self._claims.offsets_listed)
        self._applied = channel.NOTHING_APPLIED
        self._channel = CommandChannel(client, group, self.consumer_id, self._watch_channel)
        self._thread: Optional[threading.Thread] = None
        self._joined_at = 0.0
        self._coordinator_checked = False  # looked for a leader once (warned, or saw one)
        self._registrar = Registrar(client, group, self.consumer_id, self.registration, self._session_timeout_s,
                                    stopped=lambda: self.state is MemberState.CLOSED)
        self._fenced_by: Optional[FencedInstanceIdError] = None  # why it is FENCED (set before the move)
        self.generation = -1
        self.rebalances = 0

    # ------------------------------------------------------------ lifecycle

    def start(self, report_every: float = 10.0) -> "GroupMember":
        """Register and start the member thread (once).

        A connection lost meanwhile is waited out, as the member does while it runs: it tries
        again once the client has reconnected (kazoo reconnects by itself, to a new session if
        the old one expired), saying so once every ``report_every`` seconds. Raises AuthFailed
        if ZooKeeper refuses this identity, FencedInstanceIdError (static membership),
        ZooKeeperUnavailable if the client was closed or ZooKeeper refused the join otherwise."""
        if self.state is not MemberState.NEW:  # the lifecycle's one rule (Lifecycle._start_once)
            if self.state is MemberState.CLOSED:
                raise IllegalStateError(f"{self._lifecycle_name()} is closed: it is not started again")
            return self  # started before: start-once
        # Listening first: a session that expires while the member joins is noticed (the
        # member thread registers again), never left with its registration gone.
        self.client.add_listener(self._on_connection_state)
        try:
            join_waiting_out_lost_connections(self.client, self.group, self.consumer_id, self._join_once, report_every)
        except BaseException:
            self.client.remove_listener(self._on_connection_state)
            raise
        self._thread = threading.Thread(target=self._run, name=f"member-{self.consumer_id[-8:]}", daemon=True)
        self._thread.start()
        return self

    def _join_once(self) -> None:
        """Make the group's directories that are missing and register. Every step may be done
        again: a lost connection retries all of it."""
        c, g, cid = self.client, self.group, self.consumer_id
        # The group's directories (and those of the topics it names) usually exist: look at
        # all, at this member's channel and at the shard count in one round trip, create the
        # missing directories; a new channel is created with the registration, in one write.
        shards = c.get_async(protocol.SHARDS)
        topics = sorted(self.registration.subscription) if self.registration.pattern == protocol.PATTERN_STATIC \
            else []
        channel_async = c.exists_async(protocol.channel_path(g, cid))
        self._directories.make_for_join(topics)
        new_channel = channel_async.get() is None
        self._channel.last_command = -1 if new_channel else None
        self._channel.learn_epoch_path(shards)
        self._register(create_channel=new_channel)

    def close(self, timeout: float = 30.0) -> None:
        """Leave the group: revoke (commit), release owners, deregister — one transaction. Once."""
        if self.state is MemberState.CLOSED:
            return
        self._events.put(Event.LEAVE)
        if self._thread:
            self._thread.join(timeout)
        self._set_state(MemberState.CLOSED)  # never started, or its thread is still leaving: it is done
        self.client.remove_listener(self._on_connection_state)

    def evict(self) -> None:
        """Leave the group without committing (the application stopped polling)."""
        self._events.put(Event.EVICT)

    def rejoin(self) -> None:
        self._events.put(Event.REJOIN)

    @property
    def fenced(self) -> Optional[FencedInstanceIdError]:
        """Why this member is FENCED (what the consumer's ``poll()`` raises); None while it is not."""
        return self._fenced_by if self.state is MemberState.FENCED else None

    @property
    def registered(self) -> bool:
        return self.state is MemberState.JOINED

    def wait_connected(self, timeout: float) -> bool:
        """True once the connection to ZooKeeper is not suspended (at once if it is not)."""
        return self._connected.wait(timeout)

    def owned(self) -> Dict[TopicPartition, str]:
        return self._holdings.owned_now()

    def _lifecycle_name(self) -> str:
        return f"member {self.consumer_id}"

    def _move(self, new: MemberState) -> None:
        """A move of the member thread: none once ``close()`` moved to CLOSED."""
        self._set_state(new, expect=_OPEN)

    # ------------------------------------------------------------ the lease (any thread): consumer.lease

    def holds_lease(self) -> bool:
        """Whether records of owned partitions may be handed out now (no I/O; see :mod:`consumer.lease`)."""
        return self._lease.holds()

    def renew_lease(self, timeout: float) -> bool:
        """One round trip (at most ``timeout`` seconds) proving the session that owns our
        partitions alive; True if the lease holds afterwards."""
        return self._lease.renew(timeout)

    # ------------------------------------------------------------ callbacks (kazoo thread: queue only)

    def _watch_channel(self, _event):
        # A one-shot watch, re-armed by every read of the channel (and after reconnects).
        if self.state is not MemberState.CLOSED:
            self._events.put(Event.CHANNEL)

    def _on_connection_state(self, state):
        if state == KazooState.SUSPENDED:
            self._connected.clear()
        elif state == KazooState.LOST:
            self._events.put(Event.LOST)
        elif state == KazooState.CONNECTED:
            self._connected.set()
            self._events.put(Event.CONNECTED)

    # ------------------------------------------------------------ the member thread

    def _run(self) -> None:
        self._events.put(Event.CHANNEL)
        while True:
            event = self._events.get(self._housekeeping_timeout())
            if event is None:
                self._housekeeping()
                continue
            if event is Event.CHANNEL and self._events.pending(Event.CHANNEL):
                continue  # coalesce: the later one reads everything
            try:
                if event is Event.LEAVE:
                    self._leave(commit_offsets=True)
                    self._move(MemberState.CLOSED)
                    return
                self._handle(event)
            except (KazooException, ZooKeeperUnavailable) as e:
                if isinstance(e, ConnectionClosedError) or self.state is MemberState.CLOSED:
                    return  # the client was stopped under us (close() gave up waiting for ZooKeeper)
                log.warning("member %s: ZooKeeper error handling %s (%s); will retry", self.consumer_id,
                            event.value, type(e).__name__)
                time.sleep(0.1)
                if event in (Event.CHANNEL, Event.CONNECTED, Event.REJOIN):
                    self._events.put(event)
            except Exception:
                log.exception("member %s: unexpected error handling %s", self.consumer_id, event.value)

    def _handle(self, event: Event) -> None:
        state = self.state
        if event is Event.EVICT:
            if state is MemberState.JOINED:
                self._leave(commit_offsets=False)
                self._move(MemberState.EVICTED)
        elif event is Event.REJOIN:
            if state is MemberState.EVICTED and self._register_or_fence():
                self._process_channel()  # also re-arms the channel watch
        elif event is Event.LOST:
            if state is MemberState.JOINED:
                self._on_lost()
        elif event is Event.CONNECTED:
            if state is MemberState.SESSION_LOST and not self._register_or_fence():
                return
            self._process_channel()
        elif event is Event.CHANNEL:
            self._process_channel()

    def _housekeeping_timeout(self) -> Optional[float]:
        """How long the member thread may wait for an event: for ever when housekeeping has
        nothing to do (a thousand idle members waking each second cost their process a core)."""
        if self._claims.unserved or (self.generation < 0 and not self._coordinator_checked):
            return HOUSEKEEPING_S
        return None

    def _housekeeping(self) -> None:
        """Retry releasing partitions it cannot serve; say once when a member that joined a while
        ago has no assignment and no coordinator runs."""
        if self._claims.unserved and self.state is MemberState.JOINED and self._connected.is_set():
            try:
                self._claims.release_unserved()
            except (KazooException, ZooKeeperUnavailable):
                pass  # tried again at the next round
        if (self.state is MemberState.JOINED and self.generation < 0 and not self._coordinator_checked
                and time.monotonic() - self._joined_at > NO_COORDINATOR_WARNING_S and self._connected.is_set()):
            try:
                leader = self.client.exists(protocol.LEADER)
            except KazooException:
                return
            # Once: a member still waiting for its first assignment under a running leader must
            # not ask again every second (10,000 such members made 10,000 requests a second).
            self._coordinator_checked = True
            if leader is None:
                log.warning("no coordinator is running for group %s (nothing at %s): start bin/coordinatord",
                            self.group, protocol.LEADER)

    def _session(self) -> int:
        """The client's current session id; ConnectionLoss (retried by the member thread) if none."""
        sid = session_id(self.client)
        if sid is None:
            raise ConnectionLoss("not connected to ZooKeeper")
        return sid

    def _register_or_fence(self) -> bool:
        """Register again; False (now FENCED, the listener told) if another live process holds
        this static member's instance id."""
        try:
            self._register()
            return True
        except FencedInstanceIdError as e:
            # The application hears of it from poll(); this line says when it happened.
            log.warning("member %s: fenced: another live process holds its group instance id", self.consumer_id)
            self._fenced_by = e
            self._move(MemberState.FENCED)
            self.listener.fenced(e)
            return False

    def _register(self, create_channel: bool = False) -> None:
        """Create the registration (with ``create_channel``, the command channel too, in the
        same transaction, so a member is never listed without one): :class:`~consumer.registration.Registrar`."""
        self._registrar.register(self._session(), create_channel)
        if self.registration.group_instance_id:  # the coordinator re-sends the current generation's start-fetcher
            self._applied = channel.NOTHING_APPLIED  # to a returning member
        self._joined_at = time.monotonic()
        self._move(MemberState.JOINED)

    def _on_lost(self) -> None:
        lost = set(self.owned())
        if lost:
            # Reported before they are forgotten: until then holds_lease() stays false for them.
            log.warning("member %s: ZooKeeper session lost; %d partitions lost", self.consumer_id, len(lost))
            self.listener.lost(lost)
        with self._holdings.lock:
            self._holdings.forget_all_locked()
        self._move(MemberState.SESSION_LOST)

    def _leave(self, commit_offsets: bool) -> None:
        owned = self.owned()
        offsets = self.listener.revoke(set(owned)) if (owned and commit_offsets) else None
        if owned and not commit_offsets:
            self.listener.lost(set(owned))
        # A fenced member's channel is the live holder's: leave it alone.
        leaving = self._channel.paths() if self.state is not MemberState.FENCED else []
        if self.state is MemberState.JOINED:
            leaving.append(protocol.ids_path(self.group, self.consumer_id))
        try:
            self._claims.release(offsets or {}, set(owned), leaving, "leaving the group")
        except KazooException as e:
            log.warning("member %s: could not leave cleanly (%s); the session end will", self.consumer_id,
                        type(e).__name__)
        with self._holdings.lock:
            self._holdings.forget_all_locked()

    def _process_channel(self) -> None:
        if self.state is not MemberState.JOINED:
            return
        if self._claims.unserved:
            self._claims.release_unserved()
        commands, epoch, generation = self._channel.read()
        if not commands:
            return
        decision = channel.decide(commands, self.consumer_id, self._applied, epoch, generation)
        for ignored in decision.ignored:
            level = logging.INFO if ignored.stale else logging.WARNING
            log.log(level, "member %s: ignoring command %s: %s", self.consumer_id,
                    ignored.path.rsplit("/", 1)[-1], ignored.reason)
        if decision.target is None:
            self._claims.delete_all(decision.ignored_paths)
            return
        target = {TopicPartition(t, p): s for t, parts in decision.target.items() for p, s in parts.items()}
        started, before = time.monotonic(), set(self.owned())
        if self._apply(target, decision.ignored_paths + decision.acks, decision.start_path):
            self._applied = decision.applied
            self.generation = decision.applied[1]
            self.rebalances += 1
            owned, took = set(self.owned()), (time.monotonic() - started) * 1000.0
            log.info("member %s applied generation %d: owns %d partitions, %d moved, in %.1f ms", self.consumer_id,
                     self.generation, len(owned), len(before ^ owned), took,
                     extra={"group": self.group, "generation": self.generation, "member": self.consumer_id,
                            "reason": "command applied", "partitions": len(owned), "moved": len(before ^ owned),
                            "duration_ms": round(took, 1)})

    def _apply(self, target: Dict[TopicPartition, str], acks: List[str], start_path: Optional[str]) -> bool:
        """Move from the owned partitions to ``target``: revoke and release what moves away,
        claim what is new, ack. Returns False if a newer command interrupted the claim (the
        partitions claimed before that are handed to the listener all the same)."""
        owned = self.owned()
        revoked = {tp for tp, s in owned.items() if target.get(tp) != s}
        added = {tp: s for tp, s in target.items() if tp not in owned or tp in revoked}
        if revoked:
            offsets = self.listener.revoke(revoked)
            if offsets is None:  # the application stopped polling: leave without committing
                self._leave(commit_offsets=False)
                self._move(MemberState.EVICTED)
                return True
            if not added and start_path:  # nothing to claim: ack the start in the same write
                acks, start_path = acks + [start_path], None
            self._claims.release(offsets, revoked, acks, "revoking partitions")
            self._holdings.forget(revoked)
            acks = []
        committed: Dict[TopicPartition, Optional[int]] = {}
        try:
            return self._claim(added, acks + ([start_path] if start_path else []), committed)
        finally:
            # What was claimed is handed over however the claim ended (a newer command or an
            # error may cut it short): a partition owned and never handed over is never fetched,
            # and the next command, which sees it owned, would neither hand it over nor revoke it.
            if committed:
                self._hand_over({tp: added[tp] for tp in committed}, committed)

    def _hand_over(self, added: Dict[TopicPartition, str], committed: Dict[TopicPartition, Optional[int]]) -> None:
        """Tell the listener of partitions just claimed; release those it cannot serve."""
        try:
            refused = self.listener.assign(added, committed)
        except Exception:
            self._claims.release_unserved(set(added), "starting them failed")  # never half-applied
            raise
        if refused:
            self._claims.release_unserved(set(refused), "; ".join(sorted({str(e) for e in refused.values()})))

    def _claim(self, added: Dict[TopicPartition, str], acks: List[str],
               committed: Dict[TopicPartition, Optional[int]]) -> bool:
        """Claim ``added`` and delete ``acks`` (:meth:`consumer.claims.Claims.claim`); False if a
        newer decision or a shutdown cut the claim short."""
        session = self._session()
        for topic in {tp.topic for tp in added}:
            self._directories.make_for_claim(topic)
        return self._claims.claim(added, acks, session, committed, self._superseded)

    def _superseded(self, acks: List[str]) -> bool:
        """Whether a newer decision or a shutdown waits, so the claim should give way. Our own
        acks fire the channel watch too: a channel event counts only if the channel holds a
        command beyond the ones being applied."""
        if self._events.pending(Event.LEAVE) or self._events.pending(Event.LOST):
            return True
        return self._events.pending(Event.CHANNEL) and bool(set(self._channel.paths()) - set(acks))

    # ------------------------------------------------------------ offsets (any thread): consumer.offsets

    def committed(self, tp: TopicPartition) -> Optional[int]:
        """The group's committed offset of ``tp`` (None: none yet)."""
        return self._holdings.committed(tp)

    def commit(self, offsets: Dict[TopicPartition, int],
               completed: Optional[Dict[TopicPartition, bytes]] = None) -> None:
        """Commit ``offsets`` (next offset to consume), fenced by this member's tokens; with
        ``completed`` ({partition: encoded Completed}) their completed znodes in the same
        transactions (a parallel consumer's offsets finished above the committed one).

        Partitions this member does not own, or that another member claimed since this one
        did, are refused: CommitFailedError naming them (its ``partitions``), raised once the
        others are written. ZooKeeperUnavailable when ZooKeeper cannot be reached (within a
        session timeout; whether such a write applied is found out and accounted for at the
        next commit). More than :data:`~consumer.offsets.COMMIT_PARTITIONS` offsets are written
        in parts: those of the parts before a lost answer stay written."""
        self._holdings.commit(offsets, completed)
