"""The member side of the protocol: registration, the command channel, owners and offsets.

States (:class:`MemberState`); only the member thread changes them, through ``_set_state``::

    NEW ──start()──▶ JOINED ──evict──▶ EVICTED ──rejoin──▶ JOINED
                     JOINED ──session lost──▶ SESSION_LOST ──connected──▶ JOINED
    EVICTED, SESSION_LOST ──another process holds the instance id──▶ FENCED
    NEW, JOINED, EVICTED, SESSION_LOST, FENCED ──leave──▶ CLOSED

JOINED: registered under ``ids/``, applying commands. EVICTED: left without committing
(the application stopped polling); registers again only when asked. SESSION_LOST: the
session expired; its partitions were reported lost; it registers again once connected.
FENCED: a static member whose instance id another live process registered; it does nothing
more (``start()`` raises :class:`FencedInstanceIdError` instead of entering it).

Static membership
-----------------
With a ``group_instance_id`` the consumer id is ``<group>_static-<instance id>`` in every
process that carries it (:mod:`coordinator.static` says what the coordinator keeps for it
while it is away). Only one live session holds its registration: a process that finds the
registration held by another session waits for that session to end — at most twice the
holder's ``session_timeout_ms``, the longest a crashed process's session can outlive it —
and raises :class:`FencedInstanceIdError` if it does not (the holder is alive). Its own dead
session's registration (KAFKA-1387) is replaced at once. A static member starts every
registration from nothing applied, so the start-fetcher the coordinator re-sends at the
group's current generation applies; its channel is never touched by a fenced process.

Threads and locks
-----------------
* The **member thread** handles every :class:`Event` in order (commands, connection changes,
  eviction, rejoining, leaving). It alone writes ``_state``, ``_applied``, ``generation``,
  ``rebalances`` and ``_unserved``, and it alone adds or removes owned partitions.
* **kazoo's threads** (watches, the connection listener, async completions) only queue events
  or record: ``_connected`` (an Event) and the lease deadline.
* **Any thread** may call :meth:`commit` (the application, the consumer's commit-async thread,
  the member thread when it revokes or leaves). ``_commit_lock`` makes whole commits (read a
  token, write, record the new token) one at a time, so two writes never race with one token.
* ``_lock`` guards ``_owned``, ``_tokens``, ``_uncertain``, ``_owned_session`` and
  ``_lease_until``. Lock order: ``_commit_lock`` before ``_lock``; no ZooKeeper call under ``_lock``.

Guarantees
----------
* A partition is fetched only after this member created its ephemeral owner node; a node still
  held by someone else is waited for. Owner nodes are released only once the application is
  between batches and the positions are committed (the listener's ``revoke``).
* **Fencing token.** Claiming a partition also rewrites its ``offsets/<topic>/<partition>``
  znode (creating it, empty, if absent) in the same transaction, compare-and-set on the
  version read just before; the member remembers the new version. Every commit is a
  ``set_data`` at exactly that version. So once another member has claimed the partition,
  no commit of this one can land, whatever it was doing (paused, cut off, late), and the new
  owner starts from the last offset committed before its claim. Each partition has its own
  token: a commit writes the partitions still held and refuses the others by name. A write
  whose answer was lost is checked before the partition is written again (``_settle_uncertain``):
  the token is dropped only on proof that the partition was lost.
* **Bounded writes.** A claim, a commit or a release of many partitions is written in
  transactions of at most :data:`CLAIM_PARTITIONS` partitions (:data:`COMMIT_PARTITIONS` for
  a commit), one after the other, each fenced as above for its partitions; the acks and the
  registration go with the last. ZooKeeper handles every client's writes one at a time: one
  transaction of thousands of operations would hold every other session's requests back.
* Readers outside the group (a Spark query reading its topics) commit through
  :func:`commit_unowned`: only forward, only where no live member owns the partition, and
  compare-and-set on the same znode, so a claim in between wins.
* **Lease.** Records of owned partitions may be handed out (:meth:`holds_lease`) only within
  ``LEASE_FRACTION`` of the session timeout after a round trip that proved the session that
  owns them alive (the registration znode's ephemeral owner is that session, or a claim
  succeeded on it). The ZooKeeper server cannot expire that session, and so no other member
  can own those partitions, before a full session timeout after that round trip. A process
  that was frozen (GC, SIGSTOP, a VM pause) finds its lease lapsed and hands out nothing until
  a new round trip confirms the same session. While the connection is suspended nothing is
  handed out either (:meth:`wait_connected`).
* Commands are applied in channel order; which apply is :func:`consumer.commands.decide`.
  When a stop-fetcher and a start-fetcher are both waiting, only partitions that really move
  are released. Commands that do not apply are acked and change nothing. Every partition a
  claim took is handed to the listener, also when a newer command or an error cut the claim
  short, so none is owned and never fetched.
* A partition the listener cannot serve once claimed (its data cannot be opened) is released
  at once, nothing committed, never kept half-applied: the coordinator finds it not owned at
  its next check and assigns it again (``GroupMember._release_unserved()`` says why this
  and not another member).
* After a session expiry the member reports its partitions lost and registers again, coping
  with its own registration still held by the dead session (KAFKA-1387).
* Static: one live process per instance id (above); the others get
  :class:`FencedInstanceIdError`, and what they own is nothing.
* Calls that need ZooKeeper while it is unreachable raise :class:`ZooKeeperUnavailable`
  (within a session timeout), never anything else.

Not provided: protection against a process paused between the lease check and the moment
``poll()`` returns to the application (a few microseconds); commits stay fenced in that case.
"""
from __future__ import annotations

import enum
import logging
import os
import socket
import threading
import time
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Set, Tuple, Union

from kazoo.exceptions import (ConnectionClosedError, ConnectionLoss, KazooException, NoAuthError, NodeExistsError,
                              NoNodeError)
from kazoo.protocol.states import KazooState

from coordinator import protocol
from coordinator.config import DEFAULT_SESSION_TIMEOUT_MS
from coordinator.errors import (AuthFailed, CommitFailedError, CorruptZnode, FencedInstanceIdError, InvalidConfig,
                               ZooKeeperUnavailable)
from coordinator.protocol import Command, Registration
from coordinator.zkclient import LOST_CONNECTION, UNREACHABLE, TransactionFailed, commit, session_id, wait_in_order
from consumer import commands as channel
from consumer.records import TopicPartition

log = logging.getLogger("zkgroups.member")

#: Records are handed out only this fraction of the session timeout after the session was last
#: proved alive (the server expires it no sooner than a whole session timeout after that).
LEASE_FRACTION = 0.5
#: A member with no assignment this long after joining checks whether any coordinator runs.
NO_COORDINATOR_WARNING_S = 5.0
#: The member thread's housekeeping interval while nothing happens.
HOUSEKEEPING_S = 1.0
#: A claim creates the owner nodes of at most this many partitions per transaction (and
#: writes as many offsets znodes), one transaction after the other. ZooKeeper runs the writes
#: of all its clients one at a time, so one transaction of thousands of operations holds up
#: every other session's requests, heartbeats included, and costs it more per operation than
#: several small ones (10 members claiming 900 new partitions each: one transaction each, other
#: sessions waited 2-3 s; 100 partitions a transaction, 0.2-0.3 s, and all was claimed sooner).
CLAIM_PARTITIONS = 100
#: A commit writes the offsets of at most this many partitions per transaction.
COMMIT_PARTITIONS = 2 * CLAIM_PARTITIONS

#: Why a commit of a partition is refused (:func:`refusal` fills in the verb).
CLAIMED_SINCE = "{was} claimed by another member after this one"
NOT_OWNED = "{is} not owned by this member"
HOLD_LOST = "{is} no longer held by this member (its owner node was deleted or taken over)"
SESSION_ENDED = "{was} owned by a ZooKeeper session that ended"
#: A refusal names at most this many partitions per reason.
REFUSALS_NAMED = 10


def refusal(refused: Dict[TopicPartition, str], written: int = 0) -> CommitFailedError:
    """The CommitFailedError for ``refused`` ({partition: one of the reasons above}); ``written``:
    how many partitions of the same commit were written."""
    reasons = []
    for why in sorted(set(refused.values())):
        partitions = sorted(tp for tp, w in refused.items() if w == why)
        names = ", ".join(str(tp) for tp in partitions[:REFUSALS_NAMED])
        if len(partitions) > REFUSALS_NAMED:
            names += f" and {len(partitions) - REFUSALS_NAMED} more"
        one = len(partitions) == 1
        reasons.append(f"{names} " + why.format(was="was" if one else "were", **{"is": "is" if one else "are"}))
    others = f" ({written} other partition{'s' if written != 1 else ''} committed)" if written else ""
    return CommitFailedError(f"commit refused: {'; '.join(reasons)}{others}", refused)


def new_consumer_id(group: str) -> str:
    """``<group>_<host>-<ms>-<8 hex>`` (unique per process and registration)."""
    return f"{group}_{socket.gethostname()}-{protocol.now_ms()}-{os.urandom(4).hex()}"


def decode_commands(gets) -> List[Tuple[str, Union[Command, str]]]:
    """``gets``: (path, its async get) of a channel's commands, in channel order. Returns
    (path, Command or why it cannot be read) for each, skipping the ones already gone."""
    commands: List[Tuple[str, Union[Command, str]]] = []
    for path, a in gets:
        try:
            raw, _ = a.get()
        except NoNodeError:
            continue
        try:
            commands.append((path, Command.decode(raw, path)))
        except CorruptZnode as e:
            commands.append((path, e.problem))
    return commands


def _children(pending) -> List[str]:
    """A get_children answer; [] if the directory is gone (it is made before a claim: gone
    means nothing is held, no offsets znode exists)."""
    try:
        return pending.get()
    except NoNodeError:
        return []


def partition_numbers(names) -> Set[int]:
    """The partition numbers among the child names of an owners/ or offsets/ directory
    (anything else found there is no partition of ours)."""
    return {int(n) for n in names if n.isascii() and n.isdigit()}


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
        member releases them (see ``GroupMember._release_unserved()``)."""
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


_TRANSITIONS = {
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


class GroupMember:
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
        self._lease_s = self._session_timeout_s * LEASE_FRACTION
        self._events = _Events()
        self._state = MemberState.NEW
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._owned: Dict[TopicPartition, str] = {}             # partition -> stream id
        self._owned_session: Optional[int] = None               # the session that holds their owner nodes
        self._tokens: Dict[TopicPartition, int] = {}            # offsets znode version after our last write
        self._uncertain: Dict[TopicPartition, Tuple[bytes, int]] = {}  # (data, version) of a write with no answer
        self._lease_until = 0.0                                 # monotonic
        self._renewing = False
        self._known_offset_dirs: Set[str] = set()
        self._unserved: Set[TopicPartition] = set()   # claimed, refused by the listener, release pending
        # Per topic: the partitions whose offsets znodes the last listing of offsets/<topic>
        # showed (and the ones this member created since). A claim reads the offsets znodes
        # of these with its listings; a new partition has none to read. Member thread only.
        self._offsets_listed: Dict[str, Set[int]] = {}
        self._applied = channel.NOTHING_APPLIED
        self._epoch_path: Optional[str] = None   # this group's shard epoch znode, once known
        # The number of the last command seen in the channel (-1: a channel we made, none yet;
        # None: not known), and whether its last listing found it empty. Member thread only.
        self._last_command: Optional[int] = None
        self._channel_empty = False
        self._thread: Optional[threading.Thread] = None
        self._joined_at = 0.0
        self._warned_no_coordinator = False
        self._closed = threading.Event()
        # Cleared while the connection is suspended: the session, and with it the owner
        # nodes, may already be gone, so the consumer hands out no records until it is back.
        self._connected = threading.Event()
        self._connected.set()
        self._registered_session: Optional[int] = None  # the session our registration was last created in
        self.fenced: Optional[FencedInstanceIdError] = None
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
        if self._state is not MemberState.NEW:
            raise RuntimeError("a GroupMember starts once")
        # Listening first: a session that expires while the member joins is noticed (the
        # member thread registers again), never left with its registration gone.
        self.client.add_listener(self._on_connection_state)
        try:
            self._join(report_every)
        except BaseException:
            self.client.remove_listener(self._on_connection_state)
            raise
        self._thread = threading.Thread(target=self._run, name=f"member-{self.consumer_id[-8:]}", daemon=True)
        self._thread.start()
        return self

    def _join(self, report_every: float) -> None:
        """:meth:`_join_once` until it is done; a lost connection is waited out (one line per
        ``report_every`` seconds), anything else ZooKeeper answers ends it."""
        g, waiting_since, next_report = self.group, None, 0.0
        while True:
            if self.client.connected:
                try:
                    self._join_once()
                    return
                except NoAuthError:
                    raise AuthFailed(f"cannot join group {g}: ZooKeeper refused this identity (the group is bound "
                                     "to another one, or none was given)") from None
                except LOST_CONNECTION as e:
                    cause = type(e).__name__
                except KazooException as e:
                    raise ZooKeeperUnavailable(f"cannot join group {g}: {type(e).__name__}") from None
            else:
                cause = "not connected"
            now = time.monotonic()
            waiting_since = waiting_since or now
            if now >= next_report:
                log.warning("member %s: cannot join group %s yet: ZooKeeper connection lost (%s); waiting for it "
                            "(%.0f s so far)", self.consumer_id, g, cause, now - waiting_since)
                next_report = now + report_every
            time.sleep(0.1)

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
        self._ensure_paths([protocol.ids_path(g), protocol.channel_path(g), protocol.owners_path(g),
                            protocol.offsets_path(g)]
                           + [d for t in topics for d in (protocol.owners_path(g, t), protocol.offsets_path(g, t))],
                           listed=topics)
        self._known_offset_dirs.update(topics)
        new_channel = channel_async.get() is None
        self._last_command = -1 if new_channel else None
        self._learn_epoch_path(shards)
        self._register(create_channel=new_channel)

    def close(self, timeout: float = 30.0) -> None:
        """Leave the group: revoke (commit), release owners, deregister — one transaction. Once."""
        if self._closed.is_set():
            return
        self._events.put(Event.LEAVE)
        if self._thread:
            self._thread.join(timeout)
        self._closed.set()
        self.client.remove_listener(self._on_connection_state)

    def evict(self) -> None:
        """Leave the group without committing (the application stopped polling)."""
        self._events.put(Event.EVICT)

    def rejoin(self) -> None:
        self._events.put(Event.REJOIN)

    @property
    def state(self) -> MemberState:
        return self._state

    @property
    def registered(self) -> bool:
        return self._state is MemberState.JOINED

    def wait_connected(self, timeout: float) -> bool:
        """True once the connection to ZooKeeper is not suspended (at once if it is not)."""
        return self._connected.wait(timeout)

    def owned(self) -> Dict[TopicPartition, str]:
        with self._lock:
            return dict(self._owned)

    def _set_state(self, new: MemberState) -> None:
        old = self._state
        if new is old:
            return
        if new not in _TRANSITIONS[old]:
            raise AssertionError(f"member {self.consumer_id}: illegal transition {old.value} -> {new.value}")
        self._state = new
        log.debug("member %s: %s -> %s", self.consumer_id, old.value, new.value)

    # ------------------------------------------------------------ the lease (any thread)

    def holds_lease(self) -> bool:
        """Whether records of owned partitions may be handed out now (no I/O). Past half the
        lease a renewal is sent in the background, so a polling member rarely waits for one."""
        current = session_id(self.client)  # None while not connected
        with self._lock:
            if not self._owned:
                return True
            if current != self._owned_session:
                return False
            left = self._lease_until - time.monotonic()
            if left > 0 and left < self._lease_s / 2 and not self._renewing:
                self._renewing = True
                renew = True
            else:
                renew = False
        if renew:
            self._send_renewal(background=True)
        return left > 0

    def renew_lease(self, timeout: float) -> bool:
        """One round trip (at most ``timeout`` seconds) proving the session that owns our
        partitions alive; True if the lease holds afterwards."""
        if self.holds_lease():
            return True
        return self._send_renewal(background=False, timeout=timeout)

    def _send_renewal(self, background: bool, timeout: float = 0.0) -> bool:
        with self._lock:
            session = self._owned_session
        sent = time.monotonic()
        try:
            pending = self.client.exists_async(protocol.ids_path(self.group, self.consumer_id))
        except Exception:  # the client is closed or closing
            with self._lock:
                self._renewing = False
            return False
        if background:
            pending.rawlink(lambda result: self._renewed(sent, session, result))  # kazoo thread: record only
            return False
        try:
            stat = pending.get(timeout=max(timeout, 0.001))
        except Exception:  # no answer in time, connection lost, session expired
            return False
        return self._record_lease(sent, session, stat)

    def _renewed(self, sent: float, session: Optional[int], result) -> None:
        stat = result.value if result.successful() else None
        self._record_lease(sent, session, stat)

    def _record_lease(self, sent: float, session: Optional[int], stat) -> bool:
        with self._lock:
            self._renewing = False
            if session is None or session != self._owned_session or stat is None or stat.ephemeralOwner != session:
                return False
            self._lease_until = max(self._lease_until, sent + self._lease_s)
            return True

    # ------------------------------------------------------------ callbacks (kazoo thread: queue only)

    def _watch_channel(self, _event):
        # A one-shot watch, re-armed by every read of the channel (and after reconnects).
        if not self._closed.is_set():
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
            event = self._events.get(HOUSEKEEPING_S)
            if event is None:
                self._housekeeping()
                continue
            if event is Event.CHANNEL and self._events.pending(Event.CHANNEL):
                continue  # coalesce: the later one reads everything
            try:
                if event is Event.LEAVE:
                    self._leave(commit_offsets=True)
                    self._set_state(MemberState.CLOSED)
                    return
                self._handle(event)
            except (KazooException, ZooKeeperUnavailable) as e:
                if isinstance(e, ConnectionClosedError) or self._closed.is_set():
                    return  # the client was stopped under us (close() gave up waiting for ZooKeeper)
                log.warning("member %s: ZooKeeper error handling %s (%s); will retry", self.consumer_id,
                            event.value, type(e).__name__)
                time.sleep(0.1)
                if event in (Event.CHANNEL, Event.CONNECTED, Event.REJOIN):
                    self._events.put(event)
            except Exception:
                log.exception("member %s: unexpected error handling %s", self.consumer_id, event.value)

    def _handle(self, event: Event) -> None:
        state = self._state
        if event is Event.EVICT:
            if state is MemberState.JOINED:
                self._leave(commit_offsets=False)
                self._set_state(MemberState.EVICTED)
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

    def _housekeeping(self) -> None:
        """Retry releasing partitions it cannot serve; say once when a member that joined a while
        ago has no assignment and no coordinator runs."""
        if self._unserved and self._state is MemberState.JOINED and self._connected.is_set():
            try:
                self._release_unserved()
            except (KazooException, ZooKeeperUnavailable):
                pass  # tried again at the next round
        if (self._state is MemberState.JOINED and self.generation < 0 and not self._warned_no_coordinator
                and time.monotonic() - self._joined_at > NO_COORDINATOR_WARNING_S and self._connected.is_set()):
            try:
                leader = self.client.exists(protocol.LEADER)
            except KazooException:
                return
            if leader is None:
                self._warned_no_coordinator = True
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
            self.fenced = e
            self._set_state(MemberState.FENCED)
            self.listener.fenced(e)
            return False

    def _register(self, create_channel: bool = False) -> None:
        """Create the registration (with ``create_channel``, the command channel too, in the
        same transaction, so a member is never listed without one)."""
        path = protocol.ids_path(self.group, self.consumer_id)
        data = self.registration.encode()
        session = self._session()
        static = bool(self.registration.group_instance_id)
        while True:
            try:
                if create_channel:
                    if self._create_with_channel(path, data):
                        break
                    create_channel = False  # the channel appeared meanwhile: register alone
                    continue
                self.client.create(path, data, ephemeral=True)
                break
            except NodeExistsError:
                try:
                    raw, stat = self.client.get(path)
                except NoNodeError:
                    continue  # it just went: create again
            if stat.ephemeralOwner == session:
                break  # ours already (a create whose answer was lost)
            if static and stat.ephemeralOwner != self._registered_session:
                if self._wait_for_holder(path, raw, stat.ephemeralOwner):
                    continue
            # Our own registration, still held by our dead session (KAFKA-1387): replace it.
            log.info("member %s: replacing registration left by an expired session", self.consumer_id)
            try:
                self.client.delete(path, version=stat.version)
            except NoNodeError:
                pass
        self._registered_session = session
        if static:  # the coordinator re-sends the current generation's start-fetcher to a returning member
            self._applied = channel.NOTHING_APPLIED
        self._joined_at = time.monotonic()
        self._set_state(MemberState.JOINED)

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

    def _wait_for_holder(self, path: str, raw: bytes, holder: int) -> bool:
        """Another session holds this static member's registration: wait for it to end (True),
        at most twice the holder's session timeout; FencedInstanceIdError if it does not."""
        try:
            held = Registration.decode(raw, path)
            timeout_s, host = (held.session_timeout_ms / 1000.0) or self._session_timeout_s, held.host
        except CorruptZnode:
            timeout_s, host = self._session_timeout_s, "?"
        deadline = time.monotonic() + 2 * timeout_s
        log.info("member %s: instance id %s is registered by session 0x%x (host %s); waiting up to %.1f s for it "
                 "to end", self.consumer_id, self.registration.group_instance_id, holder, host, 2 * timeout_s)
        gone = threading.Event()
        while True:
            gone.clear()
            stat = self.client.exists(path, watch=lambda _event: gone.set())  # kazoo thread: record only
            if stat is None or stat.ephemeralOwner != holder:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed.is_set():
                raise FencedInstanceIdError(
                    f"group instance id {self.registration.group_instance_id!r} of group {self.group} is in use "
                    f"by another live consumer (host {host}, ZooKeeper session 0x{holder:x}); this one is fenced")
            gone.wait(min(remaining, 0.5))

    def _on_lost(self) -> None:
        lost = set(self.owned())
        if lost:
            # Reported before they are forgotten: until then holds_lease() stays false for them.
            log.warning("member %s: ZooKeeper session lost; %d partitions lost", self.consumer_id, len(lost))
            self.listener.lost(lost)
        with self._lock:
            self._forget_all_locked()
        self._set_state(MemberState.SESSION_LOST)

    def _forget_all_locked(self) -> None:
        self._owned.clear()
        self._tokens.clear()
        self._uncertain.clear()
        self._owned_session = None

    def _leave(self, commit_offsets: bool) -> None:
        owned = self.owned()
        offsets = self.listener.revoke(set(owned)) if (owned and commit_offsets) else None
        if owned and not commit_offsets:
            self.listener.lost(set(owned))
        # A fenced member's channel is the live holder's: leave it alone.
        leaving = self._channel_commands() if self._state is not MemberState.FENCED else []
        if self._state is MemberState.JOINED:
            leaving.append(protocol.ids_path(self.group, self.consumer_id))
        try:
            self._release(offsets or {}, set(owned), leaving, "leaving the group")
        except KazooException as e:
            log.warning("member %s: could not leave cleanly (%s); the session end will", self.consumer_id,
                        type(e).__name__)
        with self._lock:
            self._forget_all_locked()

    def _release(self, offsets: Dict[TopicPartition, int], release: Set[TopicPartition], deletes: List[str],
                 what: str) -> None:
        """Commit ``offsets`` (fenced), release the owner nodes of ``release`` and delete
        ``deletes`` (acks, the registration): one transaction, or one per
        :data:`CLAIM_PARTITIONS` released partitions, one after the other, ``deletes`` in the
        last. A partition's owner node is deleted in the transaction that writes its offset, or
        together with a check of its token, so a member that lost a partition never deletes its
        new owner's node. If a transaction cannot apply, the commit of what is left is tried
        alone and the rest is done piece by piece: nothing stays held because one part failed."""
        with self._commit_lock:
            self._settle_uncertain(set(offsets) | set(release))
            try:
                writes, refused = self._fenced_offsets(offsets)
            except ZooKeeperUnavailable as e:
                log.warning("member %s: %s without committing: %s", self.consumer_id, what, e)
                writes, refused = [], {}
            if refused:
                log.warning("member %s: %s: %s", self.consumer_id, what, refusal(refused))
            tokens = self._tokens_of(release)
            done: Set[TopicPartition] = set()   # released, or written, by a transaction that applied
            for t, part_writes, part in self._release_parts(writes, tokens, deletes):
                try:
                    if t.operations:
                        commit(t, timeout=self._session_timeout_s)
                    self._written(part_writes)
                    done |= set(part) | {tp for tp, _, _ in part_writes}
                except TransactionFailed as e:
                    failed = "a commit was refused" if e.index < len(part_writes) else \
                        "a node was gone or a partition was claimed"
                    break
            else:
                return
            log.info("member %s: %s did not apply atomically (%s); going on step by step", self.consumer_id,
                     what, failed)
            left = {tp: offset for tp, offset in offsets.items() if tp not in done and tp not in refused}
            if writes and left:
                try:
                    self._commit_locked(left)
                except (CommitFailedError, ZooKeeperUnavailable) as e:
                    log.warning("member %s: %s: %s", self.consumer_id, what, e)
            pending = []
            for tp, token in self._tokens_of(set(release) - done).items():
                t = self.client.transaction()
                t.check(protocol.offsets_path(self.group, tp.topic, tp.partition), token)
                t.delete(protocol.owners_path(self.group, tp.topic, tp.partition))
                pending.append(t.commit_async())
            pending += [self.client.delete_async(path) for path in deletes]
            for a in pending:  # what is gone, or no longer ours, is left alone
                try:
                    a.get(timeout=self._session_timeout_s)
                except UNREACHABLE:
                    pass

    def _release_parts(self, writes, tokens: Dict[TopicPartition, int], deletes: List[str]):
        """The transactions of a release: (transaction, the offsets writes in it, the partitions
        it releases) each; every transaction's writes come first (a refusal's index says it)."""
        by_partition = {w[0]: w for w in writes}
        released = list(tokens)
        chunks = [released[i:i + CLAIM_PARTITIONS] for i in range(0, len(released), CLAIM_PARTITIONS)] or [[]]
        parts = []
        for k, chunk in enumerate(chunks):
            t = self.client.transaction()
            part_writes = [by_partition[tp] for tp in chunk if tp in by_partition]
            if k == 0:  # offsets of partitions kept are written with the first
                part_writes = [w for w in writes if w[0] not in tokens] + part_writes
            self._add_writes(t, part_writes)
            for tp in chunk:
                if tp not in by_partition:
                    t.check(protocol.offsets_path(self.group, tp.topic, tp.partition), tokens[tp])
                t.delete(protocol.owners_path(self.group, tp.topic, tp.partition))
            if k == len(chunks) - 1:
                for path in deletes:
                    t.delete(path)
            parts.append((t, part_writes, chunk))
        return parts

    def _tokens_of(self, partitions) -> Dict[TopicPartition, int]:
        """The tokens of ``partitions`` that this member still holds (a partition whose token
        was found taken over is left to its new owner)."""
        with self._lock:
            return {tp: self._tokens[tp] for tp in partitions if tp in self._tokens}

    def _delete_all(self, paths: List[str]) -> None:
        """Delete ``paths`` (pipelined); ones already gone or failing are left to the session end."""
        pending = [self.client.delete_async(path) for path in paths]
        for a in pending:
            try:
                a.get(timeout=self._session_timeout_s)
            except UNREACHABLE:
                pass

    def _channel_commands(self) -> List[str]:
        base = protocol.channel_path(self.group, self.consumer_id)
        try:
            return [f"{base}/{c}" for c in sorted(self.client.get_children(base))]
        except NoNodeError:
            return []

    # ------------------------------------------------------------ commands

    def _read_channel(self):
        """The channel's commands (decoded, or why not), then the epoch and the group's
        generation as read after them.

        One pipelined round trip when the channel was empty at its last listing and its last
        command is known: the next ones are numbered after it (:func:`protocol.command_path`),
        so the listing (which re-arms the watch), the gets of the two commands a coordinator
        writes at once (a stop and a start) and the reads of the epoch and the state go out
        together. ZooKeeper answers one session's requests in order, so the epoch and the
        state are read after the commands. Commands the guess missed take a second round
        trip, with the epoch and the state read again after them. (A non-empty last listing
        means this wake-up is most likely our own acks: no guess, no wasted gets.)"""
        base = protocol.channel_path(self.group, self.consumer_id)
        listing = self.client.get_children_async(base, watch=self._watch_channel)
        guessed = {}
        if self._channel_empty and self._last_command is not None:
            guessed = {path: self.client.get_async(path) for path in
                       (protocol.command_path(self.group, self.consumer_id, self._last_command + i) for i in (1, 2))}
        after = self._epoch_and_state_async() if guessed else None
        if after is not None:
            wait_in_order([after[1]])  # the state: read last
        try:
            paths = [f"{base}/{c}" for c in sorted(listing.get())]
        except NoNodeError:
            paths = []
        self._channel_empty = not paths
        if not paths:
            return [], None, None
        self._last_command = protocol.command_sequence(paths[-1])
        missing = [p for p in paths if p not in guessed]
        if missing or after is None:
            guessed.update((p, self.client.get_async(p)) for p in missing)
            after = self._epoch_and_state_async()
            wait_in_order([after[1]])
        commands = decode_commands([(p, guessed[p]) for p in paths])
        return (commands,) + self._epoch_and_generation(*after)

    def _epoch_and_state_async(self):
        """Ask for the shard epoch znode's stat and the group state (answers: see :meth:`_epoch_and_generation`)."""
        epoch_path = self._shard_epoch_path()
        return (self.client.exists_async(epoch_path) if epoch_path else None,
                self.client.get_async(protocol.state_path(self.group)))

    def _epoch_and_generation(self, epoch_async, state_async) -> Tuple[Optional[int], Optional[int]]:
        stat = epoch_async.get() if epoch_async is not None else None
        epoch = stat.version if stat is not None else None
        try:
            raw, _ = state_async.get()
            generation = protocol.GroupState.decode(raw, protocol.state_path(self.group)).generation
        except (NoNodeError, CorruptZnode):
            generation = None  # not checked: the epoch check still applies
        return epoch, generation

    def _shard_epoch_path(self) -> Optional[str]:
        """The epoch znode of this group's shard (its version bounds the epoch of any command a
        coordinator could have written); None while no coordinator has created the shards."""
        if self._epoch_path is None:
            self._learn_epoch_path(self.client.get_async(protocol.SHARDS))
        return self._epoch_path

    def _learn_epoch_path(self, shards) -> None:
        """Record the shard epoch path from a read of the shards znode (``shards``: its async get)."""
        try:
            raw, _ = shards.get()
            count = protocol.ShardsInfo.decode(raw).count
        except (NoNodeError, CorruptZnode):
            return
        self._epoch_path = protocol.shard_epoch_path(protocol.shard_of(self.group, count))

    def _ensure_paths(self, paths: List[str], listed: Iterable[str] = ()) -> None:
        """Create those of ``paths`` that are missing, looking at all of them in one round trip.
        The offsets directories of the topics ``listed`` are listed rather than looked at, for
        the first claim of their partitions (``_offsets_listed``)."""
        listings = {protocol.offsets_path(self.group, t): t for t in listed}
        looks = [(path, self.client.get_children_async(path) if path in listings else self.client.exists_async(path))
                 for path in paths]
        wait_in_order([a for _, a in looks])
        for path, a in looks:
            try:
                answer = a.get()
            except NoNodeError:
                answer = None
            if answer is None:
                self.client.ensure_path(path)
            elif path in listings:
                self._offsets_listed[listings[path]] = partition_numbers(answer)

    def _process_channel(self) -> None:
        if self._state is not MemberState.JOINED:
            return
        if self._unserved:
            self._release_unserved()
        commands, epoch, generation = self._read_channel()
        if not commands:
            return
        decision = channel.decide(commands, self.consumer_id, self._applied, epoch, generation)
        for ignored in decision.ignored:
            level = logging.INFO if ignored.stale else logging.WARNING
            log.log(level, "member %s: ignoring command %s: %s", self.consumer_id,
                    ignored.path.rsplit("/", 1)[-1], ignored.reason)
        if decision.target is None:
            self._delete_all(decision.ignored_paths)
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
                self._set_state(MemberState.EVICTED)
                return True
            if not added and start_path:  # nothing to claim: ack the start in the same write
                acks, start_path = acks + [start_path], None
            self._release(offsets, revoked, acks, "revoking partitions")
            self._forget(revoked)
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
            self._release_unserved(set(added), "starting them failed")  # never half-applied
            raise
        if refused:
            self._release_unserved(set(refused), "; ".join(sorted({str(e) for e in refused.values()})))

    def _release_unserved(self, partitions: Set[TopicPartition] = frozenset(), why: str = "") -> None:
        """Give up partitions just claimed that the listener cannot serve, nothing committed
        (with none given: retry those whose release did not go through). They stay owned until
        their release went through, so a stop-fetcher for them still releases them, and none is
        left held by this session unknown to it; a ZooKeeper error is retried by the member
        thread (the next channel read, or housekeeping).

        Released rather than kept (parked, as a failed fetch is): a partition kept would stay
        owned by a member that cannot read it, and neither the coordinator nor any other member
        could tell. Released, its owner node is gone, so the coordinator's next check
        (``check_interval_ms``; verification records the owner nodes) finds it not owned and
        gives it out again: once the cause is gone (permissions restored, the broker back) it is
        consumed, and until then every attempt is reported again. Reporting the partition to the
        coordinator instead, so that it could place it on another member, would need a new kind
        of znode and assignors that honour it, for a cause (a shared disk's permissions, a
        cluster's reachability) that most often strikes every member alike."""
        if partitions:
            log.info("member %s: releasing %s, which it cannot serve (%s); the coordinator assigns %s again at "
                     "its next check", self.consumer_id, ", ".join(str(tp) for tp in sorted(partitions)), why,
                     "it" if len(partitions) == 1 else "them")
            self._unserved |= partitions
        pending = self._unserved & set(self.owned())  # revoked or lost since: released already
        self._unserved = pending
        if pending:
            self._release({}, pending, [], "releasing partitions it cannot serve")
            self._forget(pending)
            self._unserved -= pending

    def _forget(self, partitions: Set[TopicPartition]) -> None:
        """No longer own ``partitions`` (their owner nodes were released)."""
        with self._lock:
            for tp in partitions:
                self._owned.pop(tp, None)
                self._tokens.pop(tp, None)
                self._uncertain.pop(tp, None)

    def _claim(self, added: Dict[TopicPartition, str], acks: List[str],
               committed: Dict[TopicPartition, Optional[int]]) -> bool:
        """Claim ``added`` and delete ``acks``; True once done, False if a newer decision or a
        shutdown interrupted the claim. ``committed`` gets the committed offset of each
        partition as soon as it is claimed (also when the claim is interrupted or fails later).

        Each round looks at which of the partitions are still held (a listing of
        owners/<topic> per topic, whose watch wakes us when an owner node goes) and at their
        offsets znodes (after the listing, so a partition released before it has its final
        commit in them: see :meth:`_look_at`), in one round trip; then it claims those that are
        free, :data:`CLAIM_PARTITIONS` a transaction, one transaction after the other: each
        creates the owner nodes of its partitions and rewrites their offsets znodes at the
        versions just read, or creates the ones that do not exist (the fencing token). The
        transaction that claims the last of them deletes the acks too."""
        session = self._session()
        for topic in {tp.topic for tp in added}:
            self._ensure_dirs(topic)
        waiting = dict(added)
        released = threading.Event()

        def watch(_event):
            released.set()  # kazoo's thread: record only

        while True:
            released.clear()
            held, current = self._look_at(waiting, watch)
            free = [tp for tp in waiting if tp not in held]
            last = len(free) == len(waiting)  # also when there is nothing to claim: just ack
            if free or last:
                parts = [free[i:i + CLAIM_PARTITIONS] for i in range(0, len(free), CLAIM_PARTITIONS)] or [[]]
                try:
                    for k, part in enumerate(parts):
                        self._claim_part({tp: waiting[tp] for tp in part}, current,
                                         acks if last and k == len(parts) - 1 else [], session, committed)
                        for tp in part:
                            del waiting[tp]
                    if last:
                        return True
                    continue  # claim the others as they are released
                except TransactionFailed as e:
                    if isinstance(e.error, NoNodeError) and e.index >= 2 * len(part):  # an ack already gone
                        acks = [p for p in acks if self.client.exists(p)]
                    # else an owner node was taken or an offset written since we looked: look again
            if self._superseded(acks):
                return False
            if not free and not released.wait(0.25):
                self._adopt_own(waiting, session, committed)  # quiet for a while: is one of them ours?

    def _claim_part(self, claim: Dict[TopicPartition, str], current, acks: List[str], session: int,
                    committed: Dict[TopicPartition, Optional[int]]) -> None:
        """One transaction: create the owner nodes of ``claim``, write their offsets znodes
        (compare-and-set at the versions in ``current``, or create), delete ``acks``; record
        the partitions as owned. TransactionFailed if any of it could not apply (nothing did)."""
        t = self.client.transaction()
        for tp, stream in claim.items():
            t.create(protocol.owners_path(self.group, tp.topic, tp.partition), stream.encode(), ephemeral=True)
        for tp in claim:
            raw, version = current[tp]
            path = protocol.offsets_path(self.group, tp.topic, tp.partition)
            if version is None:
                t.create(path, protocol.NO_OFFSET)
            else:
                t.set_data(path, raw, version=version)
        for path in acks:
            t.delete(path)
        sent = time.monotonic()
        if t.operations:
            commit(t)
        claimed = {tp: current[tp] for tp in claim}
        tokens = {tp: 0 if version is None else version + 1 for tp, (_, version) in claimed.items()}
        for tp in claim:
            self._offsets_listed.setdefault(tp.topic, set()).add(tp.partition)
        self._record_claim(claim, claimed, tokens, session, sent, committed)

    def _look_at(self, waiting: Dict[TopicPartition, str], watch):
        """Which of ``waiting`` hold an owner node (listings of owners/<topic> watched by
        ``watch``), and {partition: (data, version)} of their offsets znodes, version None
        where there is none: all read after the owner listings.

        One pipelined round trip: the owner listings, a listing of offsets/<topic> and reads of
        the offsets znodes the last listing showed. A partition that has none (new in a topic
        that grew: most of a growth's) costs no read; the claim creates its znode, and fails if
        it appeared since. Only znodes made since the last listing are read in a second round
        trip."""
        topics = sorted({tp.topic for tp in waiting})
        owners = [(t, self.client.get_children_async(protocol.owners_path(self.group, t), watch=watch)) for t in topics]
        offsets_dirs = [(t, self.client.get_children_async(protocol.offsets_path(self.group, t))) for t in topics]
        known = [tp for tp in waiting if tp.partition in self._offsets_listed.get(tp.topic, ())]
        reads = self._read_offsets_async(known)
        wait_in_order([a for _, a in owners + offsets_dirs] + [a for _, a in reads])
        held = {TopicPartition(t, p) for t, a in owners for p in partition_numbers(_children(a))}
        for topic, a in offsets_dirs:
            self._offsets_listed[topic] = partition_numbers(_children(a))
        current = {tp: (protocol.NO_OFFSET, None) for tp in waiting}
        current.update(self._offsets_answers(reads))
        read = set(known)
        missed = [tp for tp in waiting if tp not in read and tp.partition in self._offsets_listed[tp.topic]]
        if missed:
            current.update(self._read_offsets(missed))
        return held, current

    def _read_offsets(self, partitions) -> Dict[TopicPartition, Tuple[bytes, Optional[int]]]:
        """{tp: (data, znode version)} of the offsets znodes; version None when absent."""
        gets = self._read_offsets_async(partitions)
        wait_in_order([a for _, a in gets])
        return self._offsets_answers(gets)

    def _read_offsets_async(self, partitions):
        return [(tp, self.client.get_async(protocol.offsets_path(self.group, tp.topic, tp.partition)))
                for tp in partitions]

    @staticmethod
    def _offsets_answers(gets) -> Dict[TopicPartition, Tuple[bytes, Optional[int]]]:
        out = {}
        for tp, a in gets:
            try:
                raw, stat = a.get()
                out[tp] = (raw, stat.version)
            except NoNodeError:
                out[tp] = (protocol.NO_OFFSET, None)
        return out

    def _record_claim(self, claimed: Dict[TopicPartition, str], offsets, tokens: Dict[TopicPartition, int],
                      session: int, sent: float, committed: Dict[TopicPartition, Optional[int]]) -> None:
        """Record partitions this session now owns, with their tokens and committed offsets."""
        for tp, (raw, _) in offsets.items():
            committed[tp] = self._decode_committed(tp, raw)
        with self._lock:
            for tp, stream in claimed.items():
                self._owned[tp] = stream
                self._tokens[tp] = tokens[tp]
            if claimed:
                if self._owned_session != session:
                    self._owned_session, self._lease_until = session, 0.0
                self._lease_until = max(self._lease_until, sent + self._lease_s)  # the claim proved the session

    def _decode_committed(self, tp: TopicPartition, raw: bytes) -> Optional[int]:
        path = protocol.offsets_path(self.group, tp.topic, tp.partition)
        try:
            return protocol.decode_offset(raw, path)
        except CorruptZnode as e:
            log.error("member %s: %s; treating it as no committed offset", self.consumer_id, e)
            return None

    def _superseded(self, acks: List[str]) -> bool:
        """Whether a newer decision or a shutdown waits, so the claim should give way. Our own
        acks fire the channel watch too: a channel event counts only if the channel holds a
        command beyond the ones being applied."""
        if self._events.pending(Event.LEAVE) or self._events.pending(Event.LOST):
            return True
        return self._events.pending(Event.CHANNEL) and bool(set(self._channel_commands()) - set(acks))

    def _adopt_own(self, waiting: Dict[TopicPartition, str], session: int,
                   committed: Dict[TopicPartition, Optional[int]]) -> None:
        """Take over owner nodes this session holds but did not know of (a claim whose answer
        was lost to a connection error): without this we would wait for ourselves. That claim
        rewrote the offsets znode too, so its current version is our token."""
        sent = time.monotonic()
        checks = [(tp, self.client.exists_async(protocol.owners_path(self.group, tp.topic, tp.partition)))
                  for tp in waiting]
        mine = {}
        for tp, a in checks:
            stat = a.get()
            if stat is not None and stat.ephemeralOwner == session:
                mine[tp] = waiting[tp]
        if not mine:
            return
        offsets = self._read_offsets(mine)
        tokens = {}
        for tp, (raw, version) in offsets.items():
            if version is None:  # cannot happen after our own claim; recreate the token anyway
                self.client.create(protocol.offsets_path(self.group, tp.topic, tp.partition), protocol.NO_OFFSET)
                version = 0
            tokens[tp] = version
            del waiting[tp]
        self._record_claim(mine, offsets, tokens, session, sent, committed)

    def _ensure_dirs(self, topic: str) -> None:
        if topic not in self._known_offset_dirs:
            self._ensure_paths([protocol.owners_path(self.group, topic), protocol.offsets_path(self.group, topic)],
                               listed=[topic])
            self._known_offset_dirs.add(topic)

    # ------------------------------------------------------------ offsets (any thread)

    def committed(self, tp: TopicPartition) -> Optional[int]:
        """The group's committed offset of ``tp`` (None: none yet)."""
        path = protocol.offsets_path(self.group, tp.topic, tp.partition)
        if not self._connected.is_set():
            raise ZooKeeperUnavailable(f"cannot read the committed offset of {tp}: not connected to ZooKeeper")
        try:
            raw, _ = self.client.get_async(path).get(timeout=self._session_timeout_s)
        except NoNodeError:
            return None
        except UNREACHABLE as e:
            raise ZooKeeperUnavailable(f"cannot read the committed offset of {tp}: {type(e).__name__}") from None
        return self._decode_committed(tp, raw)

    def commit(self, offsets: Dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` (next offset to consume), fenced by this member's tokens.

        Partitions this member does not own, or that another member claimed since this one
        did, are refused: CommitFailedError naming them (its ``partitions``), raised once the
        others are written. ZooKeeperUnavailable when ZooKeeper cannot be reached (within a
        session timeout; whether such a write applied is found out and accounted for at the
        next commit). More than :data:`COMMIT_PARTITIONS` offsets are written in parts: those
        of the parts before a lost answer stay written."""
        if offsets:
            with self._commit_lock:
                self._commit_locked(offsets)

    def _commit_locked(self, offsets: Dict[TopicPartition, int]) -> None:
        """Write ``offsets`` in transactions of at most :data:`COMMIT_PARTITIONS`, one after
        the other (see :data:`CLAIM_PARTITIONS` for why). A transaction refused for one
        partition applied nothing: it is sent again without that partition. A lost answer
        stops there: the parts before it are written, and each partition holds either its new
        offset or the one before, as always."""
        writes, refused = self._fenced_offsets(offsets)
        written = 0
        for i in range(0, len(writes), COMMIT_PARTITIONS):
            part = writes[i:i + COMMIT_PARTITIONS]
            while part:
                t = self.client.transaction()
                self._add_writes(t, part)
                try:
                    commit(t, timeout=self._session_timeout_s)
                except TransactionFailed as e:
                    refused[part[e.index][0]] = CLAIMED_SINCE
                    part = part[:e.index] + part[e.index + 1:]
                    continue
                except UNREACHABLE as e:  # no answer: the write may or may not have applied
                    with self._lock:
                        for tp, data, version in part:
                            self._uncertain[tp] = (data, version)
                    raise ZooKeeperUnavailable(f"commit failed: {type(e).__name__}") from None
                self._written(part)
                written += len(part)
                break
        if refused:
            raise refusal(refused, written)

    def _add_writes(self, t, writes: List[Tuple[TopicPartition, bytes, int]]) -> None:
        """Add a compare-and-set write to ``t`` for each (tp, data, expected version) of ``writes``."""
        for tp, data, version in writes:
            t.set_data(protocol.offsets_path(self.group, tp.topic, tp.partition), data, version=version)

    def _fenced_offsets(self, offsets: Dict[TopicPartition, int]):
        """([(tp, data, the version to write at)], {tp: why it is refused}): the writes of those
        of ``offsets`` this member may commit, and the others. ZooKeeperUnavailable: nothing
        may be written now. Caller holds ``_commit_lock``."""
        if not offsets:
            return [], {}
        sid = session_id(self.client)
        if sid is None or not self._connected.is_set():
            raise ZooKeeperUnavailable("commit failed: not connected to ZooKeeper")
        with self._lock:
            owned_session = self._owned_session
        if owned_session is not None and owned_session != sid:
            return [], {tp: SESSION_ENDED for tp in offsets}
        try:
            self._settle_uncertain(set(offsets))
        except UNREACHABLE as e:  # unsettled writes stay uncertain until a check is answered
            raise ZooKeeperUnavailable(f"commit failed: {type(e).__name__} (checking an unanswered write)") from None
        writes, refused = [], {}
        with self._lock:
            for tp, offset in offsets.items():
                if tp in self._owned and tp in self._tokens:
                    writes.append((tp, protocol.encode_offset(offset), self._tokens[tp]))
                else:
                    refused[tp] = HOLD_LOST if tp in self._owned else NOT_OWNED
        return writes, refused

    def _settle_uncertain(self, partitions: Set[TopicPartition]) -> None:
        """Find out what became of writes that got no answer, and so what the tokens of their
        partitions are: :meth:`_read_holds` tells. While this session's owner node of a
        partition stands, no one else has written its offsets znode since this member claimed
        it (another claim needs that node gone; a reader's commit or a reset, no owner at all),
        so the znode's version is the result of this member's own writes, whichever applied:
        the token. Only an owner node gone, or another session's, proves the partition lost:
        then the token is dropped. A version older than the write's (a server behind, which a
        sync rules out) settles nothing: the write stays uncertain."""
        with self._lock:
            partitions = set(partitions) & set(self._uncertain)
            session = self._owned_session
        if not partitions:
            return
        found = self._read_holds(partitions)
        with self._lock:
            for tp, (version, holder) in found.items():
                if tp not in self._uncertain:
                    continue  # forgotten meanwhile
                _, expected = self._uncertain[tp]
                if holder is not None and holder == session and version is not None:
                    if version < expected:
                        continue
                    if tp in self._tokens:
                        self._tokens[tp] = version
                else:
                    self._tokens.pop(tp, None)  # the hold ended: lost
                del self._uncertain[tp]

    def _read_holds(self, partitions) -> Dict[TopicPartition, Tuple[Optional[int], Optional[int]]]:
        """{tp: (its offsets znode's version, None if there is none; the session holding its
        owner node, None if there is none)}, in one round trip: a sync first, so the server
        answering is as new as ZooKeeper's leader was then (a session reconnected after a lost
        answer may be on a server that has not applied that write yet: it is only as new as
        what the session saw), then the offsets znodes, then the owner nodes."""
        synced = self.client.sync_async(protocol.offsets_path(self.group))
        versions = self._read_offsets_async(partitions)
        owners = [(tp, self.client.exists_async(protocol.owners_path(self.group, tp.topic, tp.partition)))
                  for tp in partitions]
        wait_in_order([synced] + [a for _, a in versions + owners])
        synced.get()
        read = self._offsets_answers(versions)
        found = {}
        for tp, a in owners:
            stat = a.get()
            found[tp] = (read[tp][1], stat.ephemeralOwner if stat is not None else None)
        return found

    def _written(self, writes) -> None:
        with self._lock:
            for tp, _, version in writes:
                if tp in self._tokens:
                    self._tokens[tp] = version + 1


# ---------------------------------------------------------------- commits of an outside reader

#: How often :func:`commit_unowned` re-reads and retries after another writer got in between.
UNOWNED_COMMIT_ATTEMPTS = 3


def commit_unowned(client, group: str, offsets: Dict[TopicPartition, int]) -> Dict[TopicPartition, str]:
    """Commit ``offsets`` to ``group`` for a reader that is not a member of it (a Spark query
    reading the group's topics); returns {partition: why it was not written} for the refused ones.

    A partition is written only while no live member owns it (no owner node) and only forward:
    an offset at or past ``offsets[tp]`` is left as it is (not a refusal). Every write is a
    compare-and-set on the offsets znode's version read *before* the owner node was found
    absent (or a create where there was none); a member's claim rewrites that znode in the same
    transaction that creates its owner node, so a claim in between makes the write fail instead
    of landing under the new owner. Writes go in one transaction; one that another writer got
    in first is read again and retried, at most :data:`UNOWNED_COMMIT_ATTEMPTS` times.
    ZooKeeper errors (unreachable, ``NoAuthError``) are raised."""
    refused: Dict[TopicPartition, str] = {}
    pending = dict(offsets)
    for _ in range(UNOWNED_COMMIT_ATTEMPTS):
        paths = {tp: protocol.offsets_path(group, tp.topic, tp.partition) for tp in pending}
        stored = {tp: client.get_async(path) for tp, path in paths.items()}  # first: the version that fences
        owners = {tp: client.exists_async(protocol.owners_path(group, tp.topic, tp.partition)) for tp in pending}
        t, order = client.transaction(), []
        for tp, target in sorted(pending.items()):
            if owners[tp].get() is not None:
                refused[tp] = "a live member of the group owns it"
                continue
            try:
                raw, stat = stored[tp].get()
            except NoNodeError:
                raw, stat = None, None
            try:
                current = None if raw is None else protocol.decode_offset(raw, paths[tp])
            except CorruptZnode:
                current = None  # overwritten, as a reset does
            if current is not None and current >= target:
                continue
            if stat is None:
                client.ensure_path(protocol.offsets_path(group, tp.topic))
                t.create(paths[tp], protocol.encode_offset(target))
            else:
                t.set_data(paths[tp], protocol.encode_offset(target), version=stat.version)
            order.append(tp)
        if not order:
            return refused
        try:
            commit(t)
            return refused
        except TransactionFailed as e:
            pending = {tp: pending[tp] for tp in order}  # the others need nothing more
            log.info("commit to group %s: %s changed meanwhile; reading it again", group, order[e.index])
    for tp in pending:
        refused[tp] = "its committed offset kept changing (a member claimed it, or another writer)"
    return refused
