"""The coordinator node (seed 001): every node contends; the elected one rebalances groups.

Lifecycle of a node: ``start()`` connects and enters kazoo's election under
``/consumers/coordinator/election`` (each contender watches only its predecessor). The winner
bumps the epoch, publishes ``/consumers/coordinator/leader``, watches topics and groups, queues
every group for a check, and hands requests to a small pool of handler threads. ``close()``
abandons the current attempt, resigns (the next contender leads at once) and disconnects.

With ``bootstrap_servers`` configured, the leader also runs a :class:`~coordinator.mirror.TopicMirror`
for its term: the topics of that (KRaft) Kafka cluster are mirrored into ``/brokers/topics``,
and a group whose members name a topic the registry lacks asks it for a refresh at once.

Guarantees: every leader write is fenced by the epoch in the same transaction; a group is
never handled by two threads at once and change events are coalesced per group; watch and
connection callbacks never call ZooKeeper (they only record and queue). A leader that is
SUSPENDED stops at once and steps down if the connection is not back within a grace shorter
than the session timeout; on LOST it drops everything and contends again.
"""
from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from typing import Callable, Dict, Optional, Set

import tenacity
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError, BadVersionError
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from coordinator import config as cfg
from coordinator import protocol, read
from coordinator.errors import ConsumerRebalanceFailedException, CorruptZnode, InvalidName
from coordinator.mirror import TopicMirror
from coordinator.topics import TopicRegistry
from coordinator.config import CoordinatorConfig
from coordinator.rebalance import Abandoned, Deposed, GroupRebalancer, Superseded, fenced_commit
from coordinator.zkclient import TransactionFailed, close_client, commit, start_client

log = logging.getLogger("zkgroups.coordinator")

#: Tries of the epoch compare-and-set before the node gives up the election and contends again.
EPOCH_BUMP_ATTEMPTS = 5
#: Version bumps per transaction when a deleted epoch znode is restored.
EPOCH_RESTORE_BATCH = 1000


def highest_recorded_epoch(client) -> int:
    """The highest epoch any group state or the leader znode records (0 if none)."""
    groups = read.groups(client)
    reads = [(protocol.state_path(g), client.get_async(protocol.state_path(g))) for g in groups]
    leader = client.get_async(protocol.LEADER)
    highest = 0
    for path, a in reads + [(protocol.LEADER, leader)]:
        try:
            raw, _ = a.get()
            decode = protocol.LeaderInfo.decode if path == protocol.LEADER else protocol.GroupState.decode
            highest = max(highest, decode(raw, path).epoch)
        except (NoNodeError, CorruptZnode):
            continue
    return highest


class RebalanceRequests:
    """The blocking queue of groups to rebalance (seed: rebalanceRequestQ + groupsBeingRebalanced).

    A group is queued at most once; a request for a group that is being handled marks it
    dirty: it is queued again when the handler is done, and a handler still waiting for the
    members' acks drops that generation at once (:class:`Superseded`) instead of waiting for
    members that may have left.
    """

    def __init__(self):
        self._queue: "queue.Queue[Optional[str]]" = queue.Queue()
        self._lock = threading.Lock()
        self._queued: Set[str] = set()
        self._running: Set[str] = set()
        self._dirty: Set[str] = set()
        self._closed = False

    def request(self, group: str, changed: bool = True) -> None:
        """Queue ``group``. ``changed=False`` is a routine check: a group being handled is
        being checked already, so it is not marked dirty (which would supersede its run)."""
        with self._lock:
            if self._closed or group in self._queued:
                return
            if group in self._running:
                if changed:
                    self._dirty.add(group)
                return
            self._queued.add(group)
        self._queue.put(group)

    def take(self, timeout: float) -> Optional[str]:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def begin(self, group: str) -> None:
        with self._lock:
            self._queued.discard(group)
            self._running.add(group)
            self._dirty.discard(group)

    def changed(self, group: str) -> bool:
        """Whether ``group`` was requested again since its handling began."""
        with self._lock:
            return group in self._dirty

    def done(self, group: str) -> None:
        with self._lock:
            self._running.discard(group)
            again = group in self._dirty and not self._closed
            self._dirty.discard(group)
        if again:
            self.request(group)

    def close(self, handlers: int) -> None:
        with self._lock:
            self._closed = True
        for _ in range(handlers):
            self._queue.put(None)


class GroupIndex:
    """Which groups care about which topics (seed: consumerGroupsPerTopic, groupsWithWildcardTopics)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._static: Dict[str, Set[str]] = {}         # group -> topics named explicitly
        self._wildcards: Dict[str, list] = {}          # group -> [(compiled regex, white?)]

    def update(self, group: str, registrations) -> None:
        static, wild = set(), []
        for reg in registrations:
            if reg.pattern == protocol.PATTERN_STATIC:
                static |= set(reg.subscription)
            else:  # linear-time matching: a registration can never stall the leader's thread
                wild.append((protocol.topic_matcher(next(iter(reg.subscription))),
                             reg.pattern == protocol.PATTERN_WHITE_LIST))
        with self._lock:
            self._static[group], self._wildcards[group] = static, wild

    def groups_for(self, topic: str) -> Set[str]:
        with self._lock:
            groups = {g for g, topics in self._static.items() if topic in topics}
            groups |= {g for g, pats in self._wildcards.items()
                       if any(bool(rx.fullmatch(topic)) == white for rx, white in pats)}
        return groups


class Leadership:
    """State of one term as leader; ``end()`` may be called from any thread, once or more."""

    def __init__(self, epoch: int):
        self.epoch = epoch
        self.ended = threading.Event()
        self.suspended = False
        self.reconnected = False  # set on CONNECTED after SUSPENDED: re-read everything
        self.reason = ""

    def end(self, reason: str) -> None:
        if not self.ended.is_set():
            self.reason = reason
            self.ended.set()

    @property
    def active(self) -> bool:
        return not self.ended.is_set() and not self.suspended


class Coordinator:
    """One coordinator node. Lifecycle: ``start()`` once, ``close()`` once (a second call of
    either does nothing); a closed node is not started again.

    Threads: the election thread (:meth:`_contend`) runs the election and, while this node
    leads, the :class:`LeaderSession`; kazoo's connection listener only marks the term
    (suspended, reconnected, ended) and starts the grace timer. ``_term`` is replaced only by
    the election thread; other threads read it once into a local."""

    def __init__(self, connect: str, node_id: Optional[str] = None, config: Optional[CoordinatorConfig] = None):
        self.connect = connect
        self.host = socket.gethostname()
        self.node_id = node_id or f"{self.host}-{os.getpid()}"
        self.config = config or CoordinatorConfig()
        self.config.validate()  # a config made in code is checked as one read from a file is
        self.client = None
        self._closing = threading.Event()
        self._term: Optional[Leadership] = None
        self._thread: Optional[threading.Thread] = None
        self._election = None
        self._grace_timer: Optional[threading.Timer] = None
        self._lifecycle = threading.Lock()
        self._started = False
        self.elected = threading.Event()    # set while leading (for tests and tools)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "Coordinator":
        with self._lifecycle:
            if self._started or self._closing.is_set():
                return self
            self._started = True
        self.client = start_client(self.connect, self.config.session_timeout_ms)
        self.client.add_listener(self._on_connection_state)
        self._thread = threading.Thread(target=self._contend, name=f"election-{self.node_id}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Abandon the current attempt, resign so another node leads at once, disconnect."""
        with self._lifecycle:
            if self._closing.is_set():
                return
            self._closing.set()
        term = self._term
        if term:
            term.end("shutting down")
        if self._election:
            self._election.cancel()
        if self._thread:
            # Disconnected, the leader's last writes would wait for a reconnect: closing the
            # client fails them instead.
            self._thread.join(timeout=15 if self.client and self.client.connected else 1)
        if self.client:
            close_client(self.client)

    @property
    def is_leader(self) -> bool:
        term = self._term
        return term is not None and not term.ended.is_set()

    @property
    def epoch(self) -> Optional[int]:
        term = self._term
        return term.epoch if term else None

    # ------------------------------------------------------------ election

    def _contend(self) -> None:
        while not self._closing.is_set():
            try:
                self.client.ensure_path(protocol.ELECTION)
                self._election = self.client.Election(protocol.ELECTION, self.node_id)
                self._election.run(self._lead)
            except Exception as e:  # connection trouble while contending or resigning
                if self._closing.is_set():
                    break
                log.warning("node %s: election interrupted (%s); contending again", self.node_id, e)
                self._closing.wait(0.2)

    def _lead(self) -> None:
        if self._closing.is_set():
            return
        epoch = self._bump_epoch()
        term = self._term = Leadership(epoch)
        if self._closing.is_set():  # close() ran while we were being elected and saw no term to end
            term.end("shutting down")
        since = protocol.now_ms()
        info = protocol.LeaderInfo(self.node_id, self.host, os.getpid(), epoch, since)
        self._publish_leader(info)
        log.info("node %s elected coordinator, epoch %d", self.node_id, epoch)
        self.elected.set()
        session = LeaderSession(self, term, info)
        try:
            session.run()
        finally:
            self.elected.clear()
            session.stop()
            log.info("node %s steps down (epoch %d): %s", self.node_id, epoch, term.reason or "leadership ended")
            self._unpublish_leader(info)
            self._term = None

    @tenacity.retry(retry=tenacity.retry_if_exception_type((BadVersionError, NodeExistsError)),
                    stop=tenacity.stop_after_attempt(EPOCH_BUMP_ATTEMPTS),
                    before_sleep=tenacity.before_sleep_log(log, logging.WARNING), reraise=True)
    def _bump_epoch(self) -> int:
        """The next epoch: a compare-and-set on the epoch znode, whose version is the epoch. Only
        the elected node bumps it, so a conflict means someone else wrote it: retried a few
        times, then the election is given up and contended again."""
        try:
            _, stat = self.client.get(protocol.EPOCH)
        except NoNodeError:
            stat = self._restore_epoch()
        new = self.client.set(protocol.EPOCH, str(stat.version + 1).encode(), version=stat.version)
        return new.version

    def _restore_epoch(self):
        """Create a missing epoch znode at a version above every epoch recorded where leaders
        write (group states, the leader znode): members ignore commands of epochs below the one
        they applied, so an epoch that went back would leave every group unserved."""
        floor = highest_recorded_epoch(self.client)
        self.client.ensure_path(protocol.COORDINATOR)
        self.client.create(protocol.EPOCH, b"0")
        if floor:
            log.error("the epoch znode %s was missing although epoch %d was recorded; restoring it above that",
                      protocol.EPOCH, floor)
            while True:  # each set_data bumps the version; one transaction carries many
                _, stat = self.client.get(protocol.EPOCH)
                if stat.version >= floor:
                    break
                t = self.client.transaction()
                for _ in range(min(EPOCH_RESTORE_BATCH, floor - stat.version)):
                    t.set_data(protocol.EPOCH, b"restored")
                commit(t)
        _, stat = self.client.get(protocol.EPOCH)
        return stat

    def _publish_leader(self, info: protocol.LeaderInfo) -> None:
        """Create the leader znode, replacing one left by a leader that resigned without
        cleaning up (we hold the election lock now); fenced by our epoch like every write."""
        t = self.client.transaction()
        t.check(protocol.EPOCH, info.epoch)
        if self.client.exists(protocol.LEADER):
            t.delete(protocol.LEADER)
        t.create(protocol.LEADER, info.encode(), ephemeral=True)
        fenced_commit(t, info.epoch)

    def _unpublish_leader(self, info: protocol.LeaderInfo) -> None:
        t = self.client.transaction()
        t.check(protocol.EPOCH, info.epoch)  # never delete a newer leader's znode
        t.delete(protocol.LEADER)
        try:
            commit(t)
        except (TransactionFailed, KazooException):
            pass  # gone with our session, or already replaced

    # ------------------------------------------------------------ connection state (kazoo thread: no ZK calls)

    def _on_connection_state(self, state) -> None:
        term = self._term
        if state == KazooState.SUSPENDED:
            if term:
                term.suspended = True
                grace = self.config.session_timeout_ms * self.config.suspend_grace_ratio / 1000.0
                self._grace_timer = threading.Timer(grace, self._grace_expired, args=(term,))
                self._grace_timer.daemon = True
                self._grace_timer.start()
        elif state == KazooState.CONNECTED:
            if self._grace_timer:
                self._grace_timer.cancel()
            if term and not term.ended.is_set():
                term.suspended = False
                term.reconnected = True
        elif state == KazooState.LOST:
            if term:
                term.end("ZooKeeper session lost")

    def _grace_expired(self, term: Leadership) -> None:
        if term.suspended:
            term.end("disconnected from ZooKeeper longer than the grace period")


class LeaderSession:
    """Everything a node does while it leads: watches, the request queue and its handlers, and
    the topic mirror if one is configured (started with the term, stopped with it).

    Threads and locks: kazoo's threads run the watch callbacks, which only put events on
    ``events``. The leader thread (:meth:`run`) alone handles events, reads topics and group
    memberships and owns ``topics``, ``topic_watches``, ``group_watches`` and
    ``ignored_groups``. Handler threads (:meth:`_handle`) rebalance one group each at a time
    (``requests`` guarantees a group is never handled twice at once); ``rebalancer``,
    ``index`` and ``mirror`` are safe for them to share. ``lock`` guards what both the leader
    thread and the handlers touch: ``retry_at`` and ``unverified``. The mirror works on its own
    thread; handlers only ask it for a refresh, which never blocks.
    """

    def __init__(self, node: Coordinator, term: Leadership, info: protocol.LeaderInfo):
        self.node, self.term, self.info = node, term, info
        self.client, self.config = node.client, node.config
        self.requests = RebalanceRequests()
        # Shared by the handler threads (a group is never handled by two at once).
        self.rebalancer = GroupRebalancer(self.client, term.epoch, self.config, self._abort)
        self.index = GroupIndex()
        self.events: "queue.Queue[tuple]" = queue.Queue()
        self.topics: Dict[str, int] = {}
        self.topic_watches: Set[str] = set()
        # group -> the one watcher of its ids znode (one object per group, so kazoo holds it once)
        self.group_watches: Dict[str, Callable] = {}
        self.retry_at: Dict[str, float] = {}
        self.unverified: Set[str] = set()
        self.ignored_groups: Set[str] = set()
        self.handlers = []
        self.lock = threading.Lock()
        self.mirror: Optional[TopicMirror] = None
        if self.config.bootstrap_servers:
            self.mirror = TopicMirror(self.client, term.epoch, self.config.bootstrap_servers, self.config.kafka,
                                      self.config.mirror_interval_ms, active=lambda: self.term.active,
                                      on_deposed=lambda reason: self.term.end(f"deposed: {reason}"))

    # ------------------------------------------------------------ main loop (the leader's own thread)

    def run(self) -> None:
        client = self.client
        client.ensure_path(protocol.BROKER_TOPICS)
        client.ensure_path(protocol.GROUPS)
        self.topics = TopicRegistry(client).all_partitions()
        groups = client.get_children(protocol.GROUPS)
        self.unverified = set(groups)
        for i in range(self.config.handler_threads):
            t = threading.Thread(target=self._handle, name=f"rebalance-{i}", daemon=True)
            t.start()
            self.handlers.append(t)
        ChildrenWatch(client, protocol.BROKER_TOPICS, self._watch_topics)
        ChildrenWatch(client, protocol.GROUPS, self._watch_groups)
        if self.mirror:
            self.mirror.start()
        if not self.unverified:
            self._mark_loaded()
        next_check = time.monotonic() + self.config.check_interval_ms / 1000.0
        while not self.term.ended.is_set():
            try:
                kind, arg = self.events.get(timeout=0.1)
                self._on_event(kind, arg)
            except queue.Empty:
                pass
            now = time.monotonic()
            if self.term.reconnected:
                # Watches are hints: after a reconnect re-read what we depend on.
                self.term.reconnected = False
                self._request_all()
                if self.mirror:
                    self.mirror.request_refresh()
            for group in self._due_retries(now):
                self.requests.request(group)
            if now >= next_check:
                next_check = now + self.config.check_interval_ms / 1000.0
                self._request_all(changed=False)

    def _retry_later(self, group: str, delay_ms: int) -> None:
        with self.lock:
            self.retry_at[group] = time.monotonic() + delay_ms / 1000.0

    def _due_retries(self, now: float):
        with self.lock:
            due = [g for g, at in self.retry_at.items() if at <= now]
            for group in due:
                del self.retry_at[group]
        return due

    def stop(self) -> None:
        self.term.end(self.term.reason or "stopping")
        if self.mirror:
            self.mirror.stop()
        self.requests.close(len(self.handlers))
        for t in self.handlers:
            t.join(timeout=5)

    def _request_all(self, changed: bool = True) -> None:
        for group in list(self.group_watches):
            self.requests.request(group, changed)

    # ------------------------------------------------------------ watch callbacks (kazoo thread: record only)

    def _watch_topics(self, children):
        if self.term.ended.is_set():
            return False
        self.events.put(("topics", list(children)))

    def _watch_groups(self, children):
        if self.term.ended.is_set():
            return False
        self.events.put(("groups", list(children)))

    def _watch_topic_data(self, topic):
        def callback(data, stat):
            if self.term.ended.is_set():
                return False
            self.events.put(("topic", (topic, data)))
            if data is None:
                return False  # deleted: a topic created again gets a watch of its own
        return callback

    def _watch_members(self, group):
        def watch(_event):
            if not self.term.ended.is_set():
                self.events.put(("ids", group))
        return watch

    # ------------------------------------------------------------ events (leader thread: may call ZK)

    def _on_event(self, kind: str, arg) -> None:
        if kind == "topics":
            for topic in arg:
                if topic not in self.topic_watches:
                    self.topic_watches.add(topic)
                    DataWatch(self.client, protocol.topic_path(topic), self._watch_topic_data(topic))
        elif kind == "topic":
            topic, data = arg
            if data is None:
                self.topic_watches.discard(topic)
                if self.topics.pop(topic, None) is not None:
                    for group in self.index.groups_for(topic):  # rebalanced away from it
                        self.requests.request(group)
                return
            try:
                count = protocol.decode_topic(data, protocol.topic_path(topic))
            except CorruptZnode as e:
                log.error("ignoring topic: %s", e)
                return
            known = self.topics.get(topic, 0)
            if count < known:
                log.error("topic %s: its znode now lists %d partitions, fewer than the %d known; partitions are "
                          "never removed, so %d are kept", topic, count, known, known)
            elif count != known:
                self.topics[topic] = count
                for group in self.index.groups_for(topic):
                    self.requests.request(group)
        elif kind == "groups":
            for group in set(self.group_watches) - set(arg):
                del self.group_watches[group]  # deleted: watched afresh if it comes back
                self.index.update(group, [])
            for group in arg:
                if group not in self.group_watches:
                    try:
                        protocol.validate_name(group, "group")
                    except InvalidName as e:
                        if group not in self.ignored_groups:
                            log.error("ignoring group znode %r: %s", group, e)
                            self.ignored_groups.add(group)
                            self._verified(group)
                        continue
                    self.group_watches[group] = self._watch_members(group)
                    self._read_members(group)
        elif kind == "ids":
            if arg in self.group_watches:
                self._read_members(arg)

    def _read_members(self, group: str) -> None:
        """Re-arm the one-shot watch on the group's members and queue the group. A missing ids
        znode (the group is being created, or was deleted) gets an exists watch instead, which
        fires when it appears; there is nothing to rebalance until then."""
        path, watch = protocol.ids_path(group), self.group_watches[group]
        try:
            self.client.get_children(path, watch=watch)
        except NoNodeError:
            if self.client.exists(path, watch=watch) is not None:
                self.events.put(("ids", group))  # created in between: read it
            else:
                self._verified(group)
            return
        self.requests.request(group)

    # ------------------------------------------------------------ handlers

    def _abort(self) -> bool:
        return not self.term.active

    def _handle(self) -> None:
        while True:
            group = self.requests.take(timeout=0.5)
            if group is None:
                if self.term.ended.is_set():
                    return
                continue
            if self.config.settle_ms:
                time.sleep(self.config.settle_ms / 1000.0)  # let a burst of changes land in one request
            self.requests.begin(group)
            try:
                self._rebalance(group)
            finally:
                self.requests.done(group)

    def _rebalance(self, group: str) -> None:
        if not self.term.active:
            return
        try:
            outcome = self.rebalancer.run(group, dict(self.topics), observe=self._observe,
                                          changed=lambda: self.requests.changed(group))
            if outcome.state != "unchanged":
                log.info("group %s generation %d %s: reason=%s members=%d moved=%d duration=%.1fms%s",
                         group, outcome.generation, outcome.state, ", ".join(outcome.reasons) or "-",
                         outcome.members, outcome.moved, outcome.duration_ms,
                         f" excluded={outcome.excluded}" if outcome.excluded else "")
            if outcome.state == protocol.FAILED:
                log.error("group %s: %s", group, outcome.error)
            if outcome.unavailable:  # look again for the squatted partitions later
                self._retry_later(group, self.config.failed_retry_interval_ms)
            self._verified(group)
        except ConsumerRebalanceFailedException as e:
            log.error("ConsumerRebalanceFailedException: %s; retrying in %d ms", e,
                      self.config.failed_retry_interval_ms)
            self._retry_later(group, self.config.failed_retry_interval_ms)
            self._verified(group)
        except Deposed as e:
            self.term.end(f"deposed: {e}")
        except Abandoned:
            self.requests.request(group)  # for whoever leads next in this process, if we resume
        except Superseded:
            log.info("group %s: changed during the rebalance; computing it again", group)  # queued again by done()
        except KazooException as e:
            if self.term.active:
                log.warning("group %s: ZooKeeper error during rebalance (%s); retrying", group, type(e).__name__)
                self._retry_later(group, self.config.rebalance_backoff_ms)
        except Exception:
            log.exception("group %s: unexpected error during rebalance; retrying later", group)
            self._retry_later(group, self.config.failed_retry_interval_ms)

    def _observe(self, group: str, registrations) -> None:
        """A handler saw the group's members: index their subscriptions, and if one names a
        topic the registry lacks (or a regex matches none), ask the mirror to look at once, so
        a new Kafka topic is served in about a Metadata round trip rather than an interval."""
        registrations = list(registrations)
        self.index.update(group, registrations)
        if self.mirror:
            topics = dict(self.topics)  # a copy: the leader thread may change it meanwhile
            if any(not set(reg.subscription) <= topics.keys() if reg.pattern == protocol.PATTERN_STATIC
                   else not reg.topics(topics) for reg in registrations):
                self.mirror.request_refresh()

    def _verified(self, group: str) -> None:
        with self.lock:
            if group not in self.unverified:
                return
            self.unverified.discard(group)
            done = not self.unverified
        if done:
            self._mark_loaded()

    def _mark_loaded(self) -> None:
        self.info.loaded = True
        t = self.client.transaction()
        t.check(protocol.EPOCH, self.term.epoch)
        t.set_data(protocol.LEADER, self.info.encode())
        try:
            fenced_commit(t, self.term.epoch)
        except Deposed as e:
            self.term.end(f"deposed: {e}")
            return
        except TransactionFailed:
            return  # the leader znode went with our session
        log.info("coordinator epoch %d has verified every group", self.term.epoch)
