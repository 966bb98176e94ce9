"""The member side of the protocol: registration, the command channel, owners and offsets.

One thread per member applies everything in order (the state machine): channel commands,
session loss and reconnects, eviction and leaving. Watch and connection callbacks only queue
events for it.

Guarantees:
- A partition is fetched only after this member created its ephemeral owner node; a member
  that finds the node held by someone else waits until it is released or the holder's
  session ends. Owner nodes are released only after the application is between batches and
  the positions are committed (the listener's ``revoke`` decides what to commit).
- Commits are one transaction that checks this member's owner node of every partition, so a
  member that lost a partition can never overwrite the new owner's offset.
- Commands are applied strictly in channel order; when a stop-fetcher and a start-fetcher are
  both waiting, only partitions that really move are released (the others keep fetching).
  Commands of an older epoch or generation than one already applied are acked and ignored.
- While the connection is suspended the member cannot tell whether its owner nodes still
  exist (kazoo reports LOST only after it reconnects), so :meth:`wait_connected` tells the
  consumer to hand out nothing until the connection is back.
- After a session expiry the member reports its partitions lost and registers again, coping
  with its own registration still held by the dead session (KAFKA-1387).
"""
from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from typing import Dict, Iterable, List, Optional, Set, Tuple

from kazoo.exceptions import ConnectionClosedError, KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from coordinator import protocol
from coordinator.errors import CommitFailedError, CorruptZnode, ZooKeeperUnavailable
from coordinator.protocol import Command, Registration
from coordinator.zkclient import TransactionFailed, commit
from consumer.records import TopicPartition

log = logging.getLogger("zkgroups.member")


def new_consumer_id(group: str) -> str:
    """``<group>_<host>-<ms>-<8 hex>`` (unique per process and registration)."""
    return f"{group}_{socket.gethostname()}-{protocol.now_ms()}-{os.urandom(4).hex()}"


class MemberListener:
    """What the consumer provides; called on the member thread."""

    def revoke(self, partitions: Set[TopicPartition]) -> Optional[Dict[TopicPartition, int]]:
        """Stop returning records of ``partitions``; once the application is between batches
        return the offsets to commit, or None if the application is unresponsive (evict)."""
        return {}

    def assign(self, added: Dict[TopicPartition, str], committed: Dict[TopicPartition, Optional[int]]) -> None:
        """``added`` partitions (with their stream) are owned now; start fetching them."""

    def lost(self, partitions: Set[TopicPartition]) -> None:
        """The partitions are gone without a chance to commit (session lost, eviction)."""


class GroupMember:
    def __init__(self, client, group: str, subscription: Dict[str, int], pattern: str = protocol.PATTERN_STATIC,
                 strategies: Iterable[str] = ("range",), client_id: str = "", listener: Optional[MemberListener] = None,
                 consumer_id: Optional[str] = None):
        protocol.validate_name(group, "group")
        self.client, self.group = client, group
        self.registration = Registration(dict(subscription), pattern, list(strategies), socket.gethostname(), client_id)
        Registration.decode(self.registration.encode(), "(this consumer's subscription)")  # validate early
        self.consumer_id = consumer_id or new_consumer_id(group)
        self.listener = listener or MemberListener()
        self._events: "queue.Queue[Tuple[str, object]]" = queue.Queue()
        self._owned: Dict[TopicPartition, str] = {}          # partition -> stream id
        self._owned_session: Optional[int] = None
        self._offset_exists: Set[TopicPartition] = set()
        self._known_offset_dirs: Set[str] = set()
        self._applied = (-1, -1)                              # (epoch, generation)
        self._lock = threading.RLock()
        self._thread: Optional[threading.Thread] = None
        self._registered = False
        self._evicted = False  # left for not polling; rejoins only when asked (rejoin())
        self._closed = threading.Event()
        # Cleared while the connection is suspended: the session, and with it the owner
        # nodes, may already be gone, so the consumer hands out no records until it is back.
        self._connected = threading.Event()
        self._connected.set()
        self.generation = -1
        self.rebalances = 0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "GroupMember":
        c, g, cid = self.client, self.group, self.consumer_id
        c.ensure_path(protocol.ids_path(g))
        c.ensure_path(protocol.channel_path(g, cid))
        c.ensure_path(protocol.owners_path(g))
        c.ensure_path(protocol.offsets_path(g))
        self._register()
        c.add_listener(self._on_connection_state)
        self._thread = threading.Thread(target=self._run, name=f"member-{cid[-8:]}", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Leave the group: revoke (commit), release owners, deregister — one transaction."""
        if self._closed.is_set():
            return
        self._events.put(("leave", None))
        if self._thread:
            self._thread.join(timeout)
        self._closed.set()
        self.client.remove_listener(self._on_connection_state)

    def evict(self) -> None:
        """Leave the group without committing (the application stopped polling)."""
        self._events.put(("evict", None))

    def rejoin(self) -> None:
        self._events.put(("rejoin", None))

    @property
    def registered(self) -> bool:
        return self._registered

    def wait_connected(self, timeout: float) -> bool:
        """True once the connection to ZooKeeper is not suspended (at once if it is not)."""
        return self._connected.wait(timeout)

    def owned(self) -> Dict[TopicPartition, str]:
        with self._lock:
            return dict(self._owned)

    # ------------------------------------------------------------ callbacks (kazoo thread: queue only)

    def _watch_channel(self, _event):
        # A one-shot watch, re-armed by every read of the channel (and after reconnects).
        if not self._closed.is_set():
            self._events.put(("channel", None))

    def _on_connection_state(self, state):
        if state == KazooState.SUSPENDED:
            self._connected.clear()
        elif state == KazooState.LOST:
            self._events.put(("lost", None))
        elif state == KazooState.CONNECTED:
            self._connected.set()
            self._events.put(("connected", None))

    # ------------------------------------------------------------ the state machine

    def _run(self) -> None:
        self._events.put(("channel", None))
        while True:
            kind, _ = self._events.get()
            if kind == "channel" and self._pending("channel"):
                continue  # coalesce: a later channel event will read everything
            try:
                if kind == "leave":
                    self._leave(commit_offsets=True)
                    return
                if kind == "evict":
                    self._leave(commit_offsets=False)
                elif kind == "rejoin":
                    if not self._registered:
                        self._register()
                        self._process_channel()  # also re-arms the channel watch
                elif kind == "lost":
                    self._on_lost()
                elif kind == "connected":
                    if not self._registered and not self._evicted:
                        self._register()
                    self._process_channel()
                elif kind == "channel":
                    self._process_channel()
            except KazooException as e:
                if isinstance(e, ConnectionClosedError) or self._closed.is_set():
                    return  # the client was stopped under us (close() gave up waiting for ZooKeeper)
                log.warning("member %s: ZooKeeper error handling %s (%s); will retry", self.consumer_id, kind,
                            type(e).__name__)
                time.sleep(0.1)
                if kind in ("channel", "connected"):
                    self._events.put(("channel", None))
            except Exception:
                log.exception("member %s: unexpected error handling %s", self.consumer_id, kind)

    def _pending(self, kind: str) -> bool:
        with self._events.mutex:
            return any(k == kind for k, _ in self._events.queue)

    def _register(self) -> None:
        path = protocol.ids_path(self.group, self.consumer_id)
        data = self.registration.encode()
        session = self.client.client_id[0]
        try:
            self.client.create(path, data, ephemeral=True)
        except NodeExistsError:
            _, stat = self.client.get(path)
            if stat.ephemeralOwner != session:
                # Our own registration, still held by our dead session (KAFKA-1387): replace it.
                log.info("member %s: replacing registration left by an expired session", self.consumer_id)
                try:
                    self.client.delete(path, version=stat.version)
                except NoNodeError:
                    pass
                self.client.create(path, data, ephemeral=True)
        self._registered = True
        self._evicted = False

    def _on_lost(self) -> None:
        self._registered = False
        with self._lock:
            lost = set(self._owned)
            self._owned.clear()
        if lost:
            log.warning("member %s: ZooKeeper session lost; %d partitions lost", self.consumer_id, len(lost))
            self.listener.lost(lost)

    def _leave(self, commit_offsets: bool) -> None:
        with self._lock:
            owned = set(self._owned)
        offsets = self.listener.revoke(owned) if (owned and commit_offsets) else None
        if owned and not commit_offsets:
            self.listener.lost(owned)
        t = self.client.transaction()
        self._add_commit(t, offsets or {})
        for tp in owned:
            t.delete(protocol.owners_path(self.group, tp.topic, tp.partition))
        for path in self._channel_commands():
            t.delete(path)
        if self._registered:
            t.delete(protocol.ids_path(self.group, self.consumer_id))
        try:
            commit(t)
            self._offset_exists.update(offsets or {})
        except TransactionFailed as e:
            log.warning("member %s: leaving the group did not apply atomically (%s); cleaning up one by one",
                        self.consumer_id, e)
            for tp in owned:
                self._delete_quietly(protocol.owners_path(self.group, tp.topic, tp.partition))
            self._delete_quietly(protocol.ids_path(self.group, self.consumer_id))
        except KazooException as e:
            log.warning("member %s: could not leave cleanly (%s); the session end will", self.consumer_id, e)
        with self._lock:
            self._owned.clear()
        self._registered = False
        self._evicted = not commit_offsets

    def _delete_quietly(self, path: str) -> None:
        try:
            self.client.delete(path)
        except (NoNodeError, KazooException):
            pass

    def _channel_commands(self, watch=None) -> List[str]:
        base = protocol.channel_path(self.group, self.consumer_id)
        try:
            return [f"{base}/{c}" for c in sorted(self.client.get_children(base, watch=watch))]
        except NoNodeError:
            return []

    # ------------------------------------------------------------ commands

    def _read_commands(self) -> List[Tuple[str, Optional[Command]]]:
        paths = self._channel_commands(watch=self._watch_channel)
        gets = [(p, self.client.get_async(p)) for p in paths]
        out = []
        for path, a in gets:
            try:
                raw, _ = a.get()
                out.append((path, Command.decode(raw, path)))
            except NoNodeError:
                continue
            except CorruptZnode as e:
                log.error("member %s: dropping unreadable command: %s", self.consumer_id, e)
                out.append((path, None))
        return out

    def _process_channel(self) -> None:
        if not self._registered:
            return
        commands = self._read_commands()
        if not commands:
            return
        acks, target, start_path, newest = [], None, None, None
        for path, cmd in commands:
            if cmd is None or (cmd.epoch, cmd.generation) < self._applied:
                acks.append(path)  # unreadable or stale: ack and ignore
                continue
            if cmd.option == protocol.START_FETCHER:
                if start_path:
                    acks.append(start_path)  # superseded by a later start-fetcher
                target, start_path, newest = cmd.ownership, path, cmd
            else:
                if start_path:  # a stop after a start: that start is superseded
                    acks.append(start_path)
                    target, start_path = None, None
                acks.append(path)
                newest = newest or cmd
        if target is None:
            target_map: Dict[TopicPartition, str] = {}
        else:
            target_map = {TopicPartition(t, p): s for t, parts in target.items() for p, s in parts.items()}
        done = self._apply(target_map, acks, start_path)
        if done and newest is not None:
            self._applied = (newest.epoch, newest.generation)
            self.generation = newest.generation
            self.rebalances += 1

    def _apply(self, target: Dict[TopicPartition, str], acks: List[str], start_path: Optional[str]) -> bool:
        """Move from the owned partitions to ``target``: revoke and release what moves away,
        claim what is new, ack. Returns False if a newer command interrupted the claim."""
        with self._lock:
            owned = dict(self._owned)
        revoked = {tp for tp, s in owned.items() if target.get(tp) != s}
        added = {tp: s for tp, s in target.items() if tp not in owned or tp in revoked}
        if revoked:
            offsets = self.listener.revoke(revoked)
            if offsets is None:  # the application stopped polling: leave without committing
                self._leave(commit_offsets=False)
                return True
            if not added and start_path:  # nothing to claim: ack the start in the same write
                acks, start_path = acks + [start_path], None
            t = self.client.transaction()
            self._add_commit(t, offsets)
            for tp in revoked:
                t.delete(protocol.owners_path(self.group, tp.topic, tp.partition))
            for path in acks:
                t.delete(path)
            self._commit_or_cleanup(t, offsets, revoked, acks)
            with self._lock:
                for tp in revoked:
                    self._owned.pop(tp, None)
            acks = []
        if not self._claim(added, acks + ([start_path] if start_path else [])):
            return False
        if added:
            committed = self._read_committed(added)
            self.listener.assign(added, committed)
        return True

    def _commit_or_cleanup(self, t, offsets, revoked, acks) -> None:
        try:
            commit(t)
            self._offset_exists.update(offsets)
        except TransactionFailed as e:
            # An offset could not be fenced (owner node gone): release and ack one by one.
            log.warning("member %s: commit on revoke refused (%s); releasing without it", self.consumer_id, e)
            for tp in revoked:
                self._delete_quietly(protocol.owners_path(self.group, tp.topic, tp.partition))
            for path in acks:
                self._delete_quietly(path)

    def _claim(self, added: Dict[TopicPartition, str], acks: List[str]) -> bool:
        """Create the owner nodes of ``added`` and delete ``acks``. Nodes still held by their
        previous owner are waited for (a watch wakes us when they are released); each round
        creates every free node in one transaction, the last one with the acks."""
        session = self.client.client_id[0]
        for topic in {tp.topic for tp in added}:
            self._ensure_dirs(topic)
        waiting = dict(added)
        released = threading.Event()

        def watch(_event):
            released.set()  # kazoo's thread: record only

        free = dict(waiting)
        while True:
            last = len(free) == len(waiting)  # also when there is nothing to claim: just ack
            if free or last:
                t = self.client.transaction()
                for tp, stream in free.items():
                    t.create(protocol.owners_path(self.group, tp.topic, tp.partition), stream.encode(), ephemeral=True)
                for path in acks if last else ():
                    t.delete(path)
                try:
                    if t.operations:
                        commit(t)
                    self._record_owned(free, session)
                    for tp in free:
                        del waiting[tp]
                    if last:
                        return True
                except TransactionFailed as e:
                    if isinstance(e.error, NoNodeError):  # an ack already gone: keep the others
                        acks = [p for p in acks if self.client.exists(p)]
                    # else someone still holds one of them: look again
            if self._superseded(acks):
                return False
            # One listing per topic (not a read per partition) says which are still held, and
            # its watch wakes us when an owner node goes away.
            released.clear()
            topics = {tp.topic for tp in waiting}
            listings = [(t, self.client.get_children_async(protocol.owners_path(self.group, t), watch=watch))
                        for t in topics]
            held = {TopicPartition(t, int(p)) for t, a in listings for p in a.get()}
            free = {tp: s for tp, s in waiting.items() if tp not in held}
            if not free and not released.wait(0.25):
                self._adopt_own(waiting, session)  # quiet for a while: is one of them ours?

    def _superseded(self, acks: List[str]) -> bool:
        """Whether a newer decision or a shutdown waits, so the claim should give way. Our own
        acks fire the channel watch too: a channel event counts only if the channel holds a
        command beyond the ones being applied."""
        if self._pending("leave") or self._pending("lost"):
            return True
        return self._pending("channel") and bool(set(self._channel_commands()) - set(acks))

    def _adopt_own(self, waiting: Dict[TopicPartition, str], session: int) -> None:
        """Record owner nodes this session holds but did not know of (a claim whose answer
        was lost to a connection error); without this we would wait for ourselves."""
        checks = [(tp, self.client.exists_async(protocol.owners_path(self.group, tp.topic, tp.partition)))
                  for tp in waiting]
        for tp, a in checks:
            stat = a.get()
            if stat is not None and stat.ephemeralOwner == session:
                stream = waiting.pop(tp)
                self.client.set(protocol.owners_path(self.group, tp.topic, tp.partition), stream.encode())
                self._record_owned({tp: stream}, session)

    def _record_owned(self, added: Dict[TopicPartition, str], session: int) -> None:
        with self._lock:
            self._owned.update(added)
            self._owned_session = session

    def _ensure_dirs(self, topic: str) -> None:
        if topic not in self._known_offset_dirs:
            self.client.ensure_path(protocol.owners_path(self.group, topic))
            self.client.ensure_path(protocol.offsets_path(self.group, topic))
            self._known_offset_dirs.add(topic)

    def _read_committed(self, partitions) -> Dict[TopicPartition, Optional[int]]:
        gets = [(tp, self.client.get_async(protocol.offsets_path(self.group, tp.topic, tp.partition)))
                for tp in partitions]
        out: Dict[TopicPartition, Optional[int]] = {}
        for tp, a in gets:
            path = protocol.offsets_path(self.group, tp.topic, tp.partition)
            try:
                raw, _ = a.get()
                out[tp] = protocol.decode_offset(raw, path)
                self._offset_exists.add(tp)
            except NoNodeError:
                out[tp] = None
            except CorruptZnode as e:
                log.error("member %s: %s; treating as no committed offset", self.consumer_id, e)
                self._offset_exists.add(tp)
                out[tp] = None
        return out

    # ------------------------------------------------------------ offsets

    def committed(self, tp: TopicPartition) -> Optional[int]:
        return self._read_committed([tp])[tp]

    def commit(self, offsets: Dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` (next offset to consume), fenced by this member's owner nodes."""
        if not offsets:
            return
        t = self.client.transaction()
        self._add_commit(t, offsets)
        try:
            commit(t)
            self._offset_exists.update(offsets)
        except TransactionFailed as e:
            if isinstance(e.error, NodeExistsError) and not set(offsets) <= self._offset_exists:  # created meanwhile (e.g. by a reset): set instead
                self._offset_exists.update(offsets)
                return self.commit(offsets)
            raise CommitFailedError(
                f"commit refused: this member no longer owns {sorted(map(str, offsets))}") from None
        except KazooException as e:
            raise ZooKeeperUnavailable(f"commit failed: {type(e).__name__}") from None

    def _add_commit(self, t, offsets: Dict[TopicPartition, int]) -> None:
        """Add fenced offset writes to ``t``: check each owner node, then set (or create)."""
        with self._lock:
            owned, session = dict(self._owned), self._owned_session
        if offsets and session != self.client.client_id[0]:
            raise CommitFailedError("commit refused: the ZooKeeper session that owned these partitions ended")
        for tp, offset in offsets.items():
            if tp not in owned:
                raise CommitFailedError(f"commit refused: {tp} is not owned by this member")
            self._ensure_dirs(tp.topic)
            t.check(protocol.owners_path(self.group, tp.topic, tp.partition), 0)
            path = protocol.offsets_path(self.group, tp.topic, tp.partition)
            if tp in self._offset_exists:
                t.set_data(path, protocol.encode_offset(offset))
            else:
                t.create(path, protocol.encode_offset(offset))
