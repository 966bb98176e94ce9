"""A coordinator node (seed 001, seed 000's "every broker coordinates a subset of the groups").

Every node runs two roles (see :mod:`coordinator.shards` for why):

* **Controller candidate.** All nodes contend in kazoo's election under
  ``/consumers/coordinator/election`` (each contender watches only its predecessor). The winner
  bumps the controller epoch, publishes ``/consumers/coordinator/leader`` (fenced) and runs the
  :class:`~coordinator.controller.Controller` for its term: it places shards on live nodes
  and mirrors a KRaft Kafka cluster's topics when configured. SIGTERM (``close()``) resigns at
  once.
* **Shard leader** (:class:`GroupCoordinator`). The node registers itself under
  ``/consumers/coordinator/nodes`` and leads the groups of every shard the controller placed on
  it: watches topics and those groups' members, queues a group once per change on the
  blocking :class:`RebalanceRequests`, and hands requests to a small pool of handler threads
  running the read → compute → diff → write → wait pipeline (:mod:`coordinator.rebalance`).
  A shard it takes is verified first for all its groups at once: a group whose recorded
  verification still matches its zxids is verified by four pipelined reads
  (:func:`~coordinator.rebalance.still_as_recorded`); the others are run in full first (no
  commands where ownership is already right), then the verified ones (to learn their members'
  subscriptions). A shard it loses (moved, or its epoch bumped) stops at once. Every
  ``check_interval_ms`` the groups it leads are checked by zxids, every tenth time in full.

One node alone is the controller and leads every shard: it runs everything.

Guarantees: every write of a group is fenced by its shard's epoch in the same transaction, and
every controller write by the controller epoch, so a group has at most one coordinator able to
write at a time; a group is never handled by two threads at once and change events are
coalesced per group; watch and connection callbacks never call ZooKeeper (they only record and
queue). A node whose connection is SUSPENDED stops writing at once and gives up its shards and
the controller role if the connection is not back within a grace shorter than the session
timeout; on LOST it drops everything, registers again and leads what the controller gives it.
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
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import EventType, KazooState
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from coordinator import protocol, read
from coordinator.config import CoordinatorConfig
from coordinator.controller import Controller, restore_epoch
from coordinator.errors import ConsumerRebalanceFailedException, CorruptZnode, InvalidName
from coordinator.metrics import CoordinatorMetrics
from coordinator.rebalance import (Abandoned, Deposed, GroupDeleted, GroupRebalancer, Superseded, fenced,
                                   fenced_commit, still_as_recorded)
from coordinator.shards import Fence, ShardTerm, Term
from coordinator.timeline import TimelineRecorder
from coordinator.topics import TopicRegistry
from coordinator.zkclient import TransactionFailed, close_client, commit, session_id, start_client, wait_in_order

log = logging.getLogger("zkgroups.coordinator")

#: Tries of the controller epoch's compare-and-set before the node gives up the election and contends again.
EPOCH_BUMP_ATTEMPTS = 5
#: A node whose id is held by another session waits for it this long (x the session timeout) before saying so.
NODE_ID_WAIT_FACTOR = 1.5
#: Every this many periodic checks, every group is read in full (owner nodes included), not just its versions.
FULL_CHECK_EVERY = 10


def highest_recorded_epoch(client) -> int:
    """The highest controller epoch recorded (the leader znode's; 0 if none)."""
    try:
        info = read.leader(client)
    except CorruptZnode:
        return 0
    return info.epoch if info else 0


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

    def queued(self) -> int:
        """How many groups wait for a handler thread."""
        with self._lock:
            return len(self._queued)

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


class Leadership(Term):
    """State of one term as controller; ``end()`` may be called from any thread, once or more."""

    def __init__(self, epoch: int):
        super().__init__()
        self.epoch = epoch
        self.suspended = False
        self.reconnected = False  # set on CONNECTED after SUSPENDED: re-read everything

    def _suspended(self) -> bool:
        return self.suspended


class Coordinator:
    """One coordinator node. Lifecycle: ``start()`` once, ``close()`` once (a second call of
    either does nothing); a closed node is not started again.

    Threads: the election thread (``_contend()``) runs the election and, while this node is
    the controller, the :class:`~coordinator.controller.Controller`; the
    :class:`GroupCoordinator` has an event thread and handler threads of its own; kazoo's
    connection listener only marks state (suspended, reconnected, ended) and starts the grace
    timer. ``_term`` (the controller term) is replaced only by the election thread; other
    threads read it once into a local."""

    def __init__(self, connect: str, node_id: Optional[str] = None, config: Optional[CoordinatorConfig] = None,
                 metrics: Optional[CoordinatorMetrics] = None):
        self.connect = connect
        self.host = socket.gethostname()
        self.node_id = node_id or f"{self.host}-{os.getpid()}"
        protocol.validate_name(self.node_id, "node id")
        self.config = config or CoordinatorConfig()
        self.config.validate()  # a config made in code is checked as one read from a file is
        self.client = None
        self.groups: Optional[GroupCoordinator] = None
        self._closing = threading.Event()
        self._term: Optional[Leadership] = None
        self._controller: Optional[Controller] = None
        self._thread: Optional[threading.Thread] = None
        self._election = None
        self._grace_timer: Optional[threading.Timer] = None
        self._lifecycle = threading.Lock()
        self._started = False
        self.elected = threading.Event()    # set while this node is the controller (for tests and tools)
        self.metrics = metrics or CoordinatorMetrics()  # its own registry: serve it with coordinator.metrics
        self.metrics.attach(self)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "Coordinator":
        with self._lifecycle:
            if self._started or self._closing.is_set():
                return self
            self._started = True
        self.client = start_client(self.connect, self.config.session_timeout_ms, auth=self.config.zk_auth,
                                   roles=("coordinator", "admin"))
        self.metrics.count_requests(self.client)
        self.client.add_listener(self._on_connection_state)
        self.groups = GroupCoordinator(self).start()
        self._thread = threading.Thread(target=self._contend, name=f"election-{self.node_id}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Abandon the current attempts, resign so another node leads at once, give up the
        shards (the controller places them elsewhere), disconnect."""
        with self._lifecycle:
            if self._closing.is_set():
                return
            self._closing.set()
        term = self._term
        if term:
            term.end("shutting down")
        if self._election:
            self._election.cancel()
        if self.groups:
            self.groups.stop()
        if self._thread:
            # Disconnected, the last writes would wait for a reconnect: closing the client fails them instead.
            self._thread.join(timeout=15 if self.client and self.client.connected else 1)
        if self.client:
            close_client(self.client)

    @property
    def is_leader(self) -> bool:
        """Whether this node is the controller now."""
        term = self._term
        return term is not None and not term.ended.is_set()

    @property
    def epoch(self) -> Optional[int]:
        """The controller epoch, while this node is the controller."""
        term = self._term
        return term.epoch if term else None

    def shards(self) -> Dict[int, int]:
        """{shard: epoch} of the shards this node leads now."""
        return self.groups.held() if self.groups else {}

    def request_mirror_refresh(self) -> None:
        """Ask the topic mirror to look at Kafka now (the controller's; from any node)."""
        controller = self._controller
        if controller is not None and self.is_leader:
            controller.request_mirror_refresh()
        elif self.client is not None:
            self.client.ensure_path_async(protocol.MIRROR_REFRESH).rawlink(
                lambda _: self.client.set_async(protocol.MIRROR_REFRESH, b""))

    # ------------------------------------------------------------ the controller election

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
        self.metrics.elected()  # before the term shows: a scrape never sees a controller not counted
        term = self._term = Leadership(epoch)
        if self._closing.is_set():  # close() ran while we were being elected and saw no term to end
            term.end("shutting down")
        info = protocol.LeaderInfo(self.node_id, self.host, os.getpid(), epoch, protocol.now_ms())
        self._publish_leader(info)
        log.info("node %s elected controller, epoch %d", self.node_id, epoch,
                 extra={"node": self.node_id, "epoch": epoch, "reason": "elected controller"})
        self.elected.set()
        controller = self._controller = Controller(self.client, self.config, self.node_id, term)
        try:
            controller.run()
        finally:
            self.elected.clear()
            controller.stop()
            self._controller = None
            log.info("node %s steps down as controller (epoch %d): %s", self.node_id, epoch,
                     term.reason or "term ended",
                     extra={"node": self.node_id, "epoch": epoch, "reason": term.reason or "term ended"})
            self._unpublish_leader(info)
            self._term = None

    @tenacity.retry(retry=tenacity.retry_if_exception_type((BadVersionError, NodeExistsError)),
                    stop=tenacity.stop_after_attempt(EPOCH_BUMP_ATTEMPTS),
                    before_sleep=tenacity.before_sleep_log(log, logging.WARNING), reraise=True)
    def _bump_epoch(self) -> int:
        """The next controller epoch: a compare-and-set on the epoch znode, whose version is the
        epoch. Only the elected node bumps it, so a conflict means someone else wrote it:
        retried a few times, then the election is given up and contended again. A missing
        epoch znode is restored above the last recorded one first."""
        stat = self.client.exists(protocol.EPOCH)
        if stat is None:
            restore_epoch(self.client, protocol.EPOCH, highest_recorded_epoch(self.client), "the controller's")
            stat = self.client.exists(protocol.EPOCH)
        new = self.client.set(protocol.EPOCH, str(stat.version + 1).encode(), version=stat.version)
        return new.version

    def _publish_leader(self, info: protocol.LeaderInfo) -> None:
        """Create the leader znode, replacing one left by a controller that resigned without
        cleaning up (we hold the election lock now); fenced by our epoch like every write."""
        fence = Fence(protocol.EPOCH, info.epoch)
        t = fenced(self.client, fence)
        if self.client.exists(protocol.LEADER):
            t.delete(protocol.LEADER)
        t.create(protocol.LEADER, info.encode(), ephemeral=True)
        fenced_commit(t, fence)

    def _unpublish_leader(self, info: protocol.LeaderInfo) -> None:
        t = fenced(self.client, Fence(protocol.EPOCH, info.epoch))  # never delete a newer controller's znode
        t.delete(protocol.LEADER)
        try:
            commit(t)
        except (TransactionFailed, KazooException):
            pass  # gone with our session, or already replaced

    # ------------------------------------------------------------ connection state (kazoo thread: no ZK calls)

    def _on_connection_state(self, state) -> None:
        term, groups = self._term, self.groups
        if state == KazooState.SUSPENDED:
            if term:
                term.suspended = True
            if groups:
                groups.suspended = True
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
            if groups:
                groups.suspended = False
                groups.events.put(("connected", None))
        elif state == KazooState.LOST:
            if term:
                term.end("ZooKeeper session lost")
            if groups:
                groups.session_lost()

    def _grace_expired(self, term: Optional[Leadership]) -> None:
        groups = self.groups
        if groups is None or not groups.suspended:
            return
        reason = "disconnected from ZooKeeper longer than the grace period"
        if term:
            term.end(reason)
        groups.end_all(reason)


#: A node that cannot start leading groups (ZooKeeper errors) tries again after this, doubling up to the max.
START_RETRY_S, START_RETRY_MAX_S = 0.2, 5.0


class GroupCoordinator:
    """Leads the groups of the shards the controller placed on this node.

    It registers the node under ``/consumers/coordinator/nodes`` (an ephemeral znode reporting
    the shards it leads and whether each is verified), follows every shard's assignment, and
    holds a :class:`~coordinator.shards.ShardTerm` per shard placed on it at the epoch given.
    Groups of shards it does not lead are not watched and not handled.

    Threads and locks: kazoo's threads run the watch callbacks, which only put events on
    ``events``. The event thread (``_run()``) alone handles events, reads topics and group
    memberships, starts and ends shard terms and owns ``topics``, ``topic_watches``,
    ``group_watches``, ``all_groups``, ``ignored_groups``, ``taking_over`` and ``count``.
    Handler threads (``_handle()``) rebalance one group each at a time (``requests`` guarantees a group is
    never handled twice at once); ``rebalancer`` and ``index`` are safe for them to share.
    ``lock`` guards what both sides touch: ``terms``, ``unverified`` and ``retry_at``.
    ``suspended`` is written by the connection listener and read by everyone (a stale read
    delays a stop by one check; writes are fenced anyway).
    """

    def __init__(self, node: Coordinator):
        self.node, self.client, self.config, self.node_id = node, node.client, node.config, node.node_id
        self.info = protocol.NodeInfo(node.node_id, node.host, os.getpid(), protocol.now_ms())
        self.requests = RebalanceRequests()
        self.rebalancer = GroupRebalancer(self.client, self.config)
        self.timeline = TimelineRecorder(self.client, self.node_id)
        self.index = GroupIndex()
        self.events: "queue.Queue[tuple]" = queue.Queue()
        self.lock = threading.Lock()
        self.terms: Dict[int, ShardTerm] = {}
        self.unverified: Dict[int, Set[str]] = {}
        self.retry_at: Dict[str, float] = {}
        self.count: Optional[int] = None
        self.topics: Dict[str, int] = {}
        self.topic_watches: Set[str] = set()
        # group -> the one watcher of its ids znode (one object per group, so kazoo holds it once)
        self.group_watches: Dict[str, Callable] = {}
        self.all_groups: Set[str] = set()
        self.ignored_groups: Set[str] = set()
        self.taking_over: list = []          # groups of shards just placed here, not yet followed
        self.suspended = False
        self.registered = False
        self.checks = 0                      # periodic checks done (event thread)
        self.stopped = threading.Event()
        self.handlers = []
        self.thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "GroupCoordinator":
        for i in range(self.config.handler_threads):
            t = threading.Thread(target=self._handle, name=f"rebalance-{i}", daemon=True)
            t.start()
            self.handlers.append(t)
        self.thread = threading.Thread(target=self._run, name=f"groups-{self.node_id}", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.end_all("shutting down")
        self.requests.close(len(self.handlers))
        for t in self.handlers + ([self.thread] if self.thread else []):
            t.join(timeout=5)
        if self.registered and self.client.connected:
            try:  # give the shards up now rather than at session expiry
                self.client.delete(protocol.node_path(self.node_id))
            except KazooException:
                pass

    def loaded(self) -> bool:
        """Whether this node knows the shard count and has verified every group of every shard
        placed on it (a node leading nothing has nothing to load); any thread."""
        with self.lock:
            return self.registered and self.count is not None and not self.taking_over \
                and not any(self.unverified.values())

    def held(self) -> Dict[int, int]:
        with self.lock:
            return {s: t.epoch for s, t in self.terms.items() if not t.ended.is_set()}

    def end_all(self, reason: str) -> None:
        with self.lock:
            terms = list(self.terms.values())
        for term in terms:
            term.end(reason)

    def session_lost(self) -> None:
        """kazoo's thread: the session expired; the node znode is gone with it."""
        self.registered = False
        self.end_all("ZooKeeper session lost")
        self.events.put(("lost", None))

    # ------------------------------------------------------------ the event thread

    def _start_watching(self) -> bool:
        """Register the node, read the topics and set the watches everything else follows.
        A ZooKeeper error (a session that expired on a busy machine, a server going away) is
        tried again, with a bounded backoff and one line each time, until it works or the node
        stops: giving up would leave a node that is registered, or soon is, leading nothing.
        Each watch is set once (they re-arm themselves across reconnects and new sessions).
        False when the node stopped first."""
        client, delay = self.client, START_RETRY_S
        watches = [(DataWatch, protocol.SHARDS, self._watch_shards_info),
                   (ChildrenWatch, protocol.BROKER_TOPICS, self._watch_topics),
                   (ChildrenWatch, protocol.GROUPS, self._watch_groups)]
        while not self.stopped.is_set():
            try:
                client.ensure_path(protocol.BROKER_TOPICS)
                client.ensure_path(protocol.GROUPS)
                client.ensure_path(protocol.NODES)
                self._register()
                self.topics = TopicRegistry(client).all_partitions()
                while watches:
                    recipe, path, callback = watches[0]
                    recipe(client, path, callback)
                    watches.pop(0)
                return not self.stopped.is_set()
            except KazooException as e:
                if self.stopped.is_set():
                    break
                log.warning("node %s: cannot start leading groups yet (%s); trying again in %.1f s", self.node_id,
                            type(e).__name__, delay)
                self.stopped.wait(delay)
                delay = min(delay * 2, START_RETRY_MAX_S)
        return False

    def _run(self) -> None:
        if not self._start_watching():
            return
        next_check = time.monotonic() + self.config.check_interval_ms / 1000.0
        while not self.stopped.is_set():
            try:
                kind, arg = self.events.get(timeout=0.1)
                with self.node.metrics.handling(kind):
                    self._on_event(kind, arg)
                if self.taking_over and self.events.empty():
                    self._take_over()
            except queue.Empty:
                pass
            except KazooException as e:
                if not self.stopped.is_set():
                    log.warning("node %s: ZooKeeper error (%s) handling an event; looking again", self.node_id,
                                type(e).__name__)
                    self.events.put(("connected", None))  # re-read what we depend on
                    self.stopped.wait(0.2)
            now = time.monotonic()
            for group in self._due_retries(now):
                self.requests.request(group)
            if now >= next_check:
                next_check = now + self.config.check_interval_ms / 1000.0
                self.checks += 1
                try:
                    self._periodic_check(full=self.checks % FULL_CHECK_EVERY == 0)
                except KazooException:
                    self._request_held(changed=False)

    def _register(self) -> None:
        """Create this node's ephemeral znode; if another session holds it (our own previous
        one, or another process with the same node id) wait for it to go."""
        path = protocol.node_path(self.node_id)
        waited_since, said = time.monotonic(), False
        while not self.stopped.is_set():
            sid = session_id(self.client)
            if sid is not None:
                try:
                    self.client.create(path, self.info.encode(), ephemeral=True)
                    self.registered = True
                    return
                except NodeExistsError:
                    stat = self.client.exists(path)
                    if stat is not None and stat.ephemeralOwner == sid:
                        self.registered = True
                        return
            limit = NODE_ID_WAIT_FACTOR * self.config.session_timeout_ms / 1000.0
            if not said and time.monotonic() - waited_since > limit:
                said = True
                log.error("node %s: another ZooKeeper session still holds %s; is another coordinatord running "
                          "with --node-id %s? Waiting for it to end", self.node_id, path, self.node_id)
            gone = threading.Event()
            if self.client.exists(path, watch=lambda _event: gone.set()) is None:
                continue
            gone.wait(0.5)

    def _publish(self) -> None:
        """Report the shards we lead (and which are verified) in our node znode."""
        with self.lock:
            self.info.shards = {s: {"epoch": t.epoch, "verified": not self.unverified.get(s)}
                                for s, t in self.terms.items() if not t.ended.is_set()}
            data = self.info.encode()
        if self.registered:
            self.client.set_async(protocol.node_path(self.node_id), data)

    # ---- watch callbacks (kazoo thread: record only)

    def _watch_shards_info(self, data, stat):
        if self.stopped.is_set():
            return False
        if data is not None:
            self.events.put(("shards", data))

    def _watch_assignment(self, shard: int):
        def callback(data, stat):
            if self.stopped.is_set():
                return False
            self.events.put(("assignment", (shard, data)))
        return callback

    def _watch_topics(self, children):
        if self.stopped.is_set():
            return False
        self.events.put(("topics", list(children)))

    def _watch_groups(self, children):
        if self.stopped.is_set():
            return False
        self.events.put(("groups", list(children)))

    def _watch_topic_data(self, topic):
        def callback(data, stat):
            if self.stopped.is_set():
                return False
            self.events.put(("topic", (topic, data)))
            if data is None:
                return False  # deleted: a topic created again gets a watch of its own
        return callback

    def _watch_members(self, group):
        def watch(event):
            if not self.stopped.is_set():
                self.events.put(("ids", group) if event.type == EventType.CHILD else ("ids-znode", group))
        return watch

    # ---- events (event thread: may call ZooKeeper)

    def _on_event(self, kind: str, arg) -> None:
        if kind == "shards":
            self._on_shards(arg)
        elif kind == "assignment":
            self._on_assignment(*arg)
            if self.taking_over:  # a shard came: those placed in the same write come with it
                self._read_assignments()
        elif kind == "topics":
            for topic in arg:
                if topic not in self.topic_watches:
                    self.topic_watches.add(topic)
                    DataWatch(self.client, protocol.topic_path(topic), self._watch_topic_data(topic))
        elif kind == "topic":
            self._on_topic(*arg)
        elif kind == "groups":
            self._on_groups(arg)
        elif kind == "ids":  # a member came or went: its run reads the members and sets the watch again
            if arg in self.group_watches:
                self._request(arg)
        elif kind == "ids-znode":  # ids/ itself made or deleted (the group is being made or deleted)
            if arg in self.group_watches:
                self._read_members([arg])
        elif kind == "lost":
            pass  # terms ended already; "connected" follows with a new session
        elif kind == "connected":
            # Watches are hints: after a reconnect re-read what we depend on.
            if not self.registered:
                self._register()
            self._read_assignments()
            self._periodic_check(full=False)  # groups that changed meanwhile, or never verified, run again

    def _read_assignments(self) -> None:
        """Read every shard's placement (pipelined) and act on it."""
        if self.count is None:
            return
        reads = [(s, self.client.get_async(protocol.shard_path(s))) for s in range(self.count)]
        wait_in_order([a for _, a in reads])
        for s, a in reads:
            try:
                self._on_assignment(s, a.get()[0])
            except NoNodeError:
                self._on_assignment(s, None)

    def _on_shards(self, data: bytes) -> None:
        try:
            count = protocol.ShardsInfo.decode(data).count
        except CorruptZnode as e:
            log.error("node %s: %s; waiting for the controller to repair it", self.node_id, e)
            return
        if self.count is None:
            self.count = count
            for s in range(count):
                DataWatch(self.client, protocol.shard_path(s), self._watch_assignment(s))
        elif count != self.count:
            log.error("node %s: the shard count changed from %d to %d under a running node; restart it",
                      self.node_id, self.count, count)

    def _on_assignment(self, shard: int, data: Optional[bytes]) -> None:
        try:
            assignment = protocol.ShardAssignment.decode(data or b"", protocol.shard_path(shard))
        except CorruptZnode as e:
            log.error("node %s: %s; waiting for the controller to repair it", self.node_id, e)
            assignment = protocol.ShardAssignment("", 0)
        mine = assignment.node_id == self.node_id and self.registered and not self.stopped.is_set()
        with self.lock:
            term = self.terms.get(shard)
        if mine and term is not None and term.epoch >= assignment.epoch and not term.ended.is_set():
            return  # nothing new (or an older read of it, delivered late: epochs never go back)
        if term is not None:
            term.end(f"shard {shard} moved to {assignment.node_id or 'nobody'}" if not mine else
                     f"shard {shard} is at epoch {assignment.epoch} now")
            with self.lock:
                del self.terms[shard]
                self.unverified.pop(shard, None)
            for group in [g for g in self.group_watches if self._shard(g) == shard]:
                del self.group_watches[group]  # its next watch event is ignored
            if not mine:
                log.info("node %s no longer leads shard %d (now %s)", self.node_id, shard, assignment.node_id or "-")
        if mine:
            new = ShardTerm(shard, assignment.epoch, suspended=lambda: self.suspended)
            groups = {g for g in self.all_groups if self._shard(g) == shard}
            with self.lock:
                self.terms[shard] = new
                self.unverified[shard] = set(groups)
            log.info("node %s leads shard %d at epoch %d (%d groups)", self.node_id, shard, assignment.epoch,
                     len(groups))
            self.taking_over += sorted(groups)  # once the events queued meanwhile are handled
        self._publish()

    def _on_topic(self, topic: str, data: Optional[bytes]) -> None:
        if data is None:
            self.topic_watches.discard(topic)
            if self.topics.pop(topic, None) is not None:
                for group in self.index.groups_for(topic):  # rebalanced away from it
                    self._request(group)
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
                self._request(group)

    def _on_groups(self, children) -> None:
        valid = set()
        for group in children:
            try:
                protocol.validate_name(group, "group")
            except InvalidName as e:
                if group not in self.ignored_groups:
                    log.error("ignoring group znode %r: %s", group, e)
                    self.ignored_groups.add(group)
                continue
            valid.add(group)
        for group in self.all_groups - valid:  # deleted: followed afresh if it comes back
            self.group_watches.pop(group, None)
            self.index.update(group, [])
            self.rebalancer.forget(group)
            self._verified(group)
        self.all_groups = valid
        self._follow([g for g in sorted(valid - set(self.group_watches)) if self._term_of(g) is not None])

    def _take_over(self) -> None:
        """The groups of the shards just placed on this node (all of them, when several shards
        came at once): those whose recorded verification still holds are verified at once (all
        read together, see :func:`still_as_recorded`); then every group is followed and run,
        those needing work first (the others' runs only learn their members' subscriptions
        and find nothing to do). ``taking_over`` is emptied only once this succeeded."""
        groups = [g for g in self.taking_over if self._term_of(g) is not None]
        fingerprints = still_as_recorded(self.client, groups)  # reads the topics itself (a fresh view)
        for group, known in fingerprints.items():
            self.rebalancer.verified[group] = known
            self._verified(group)
        self._follow([g for g in groups if g not in fingerprints] + [g for g in groups if g in fingerprints])
        self.taking_over = []

    def _follow(self, groups) -> None:
        """Watch the members of groups we lead, and check them (the watches set pipelined)."""
        for group in groups:
            if group not in self.group_watches:
                self.group_watches[group] = self._watch_members(group)
        self._read_members(groups)

    def _read_members(self, groups) -> None:
        """Re-arm the one-shot watch on each group's members and queue the group. A missing
        ids znode (the group is being created, or was deleted) gets an exists watch instead,
        which fires when it appears; there is nothing to rebalance until then."""
        reads = [(g, self.client.get_children_async(protocol.ids_path(g), watch=self.group_watches[g]))
                 for g in groups]
        wait_in_order([a for _, a in reads])
        for group, pending in reads:
            try:
                pending.get()
            except NoNodeError:
                path = protocol.ids_path(group)
                if self.client.exists(path, watch=self.group_watches[group]) is not None:
                    self.events.put(("ids", group))  # created in between: read it
                else:
                    self._verified(group)
                continue
            self._request(group)

    # ---- which groups are ours

    def leads(self, group: str) -> bool:
        """Whether this node leads ``group`` now (any thread)."""
        return group in self.all_groups and self._term_of(group) is not None

    def _shard(self, group: str) -> Optional[int]:
        return None if self.count is None else protocol.shard_of(group, self.count)

    def _term_of(self, group: str) -> Optional[ShardTerm]:
        shard = self._shard(group)
        with self.lock:
            term = self.terms.get(shard) if shard is not None else None
        return term if term is not None and not term.ended.is_set() else None

    def _request(self, group: str, changed: bool = True) -> None:
        if self._term_of(group) is not None:
            self.requests.request(group, changed)

    def _request_held(self, changed: bool = True) -> None:
        for group in list(self.group_watches):
            self._request(group, changed)

    def _periodic_check(self, full: bool) -> None:
        """The safety net under the watches. A light check reads only the versions of each
        group's znodes (pipelined) and runs the groups that changed since they were last
        verified, or were never verified; a full check runs every group."""
        if full:
            self.rebalancer.read_in_full(list(self.group_watches))
            self._request_held(changed=False)
            return
        pending = []
        for group in list(self.group_watches):
            if self._term_of(group) is None:
                continue
            known = self.rebalancer.verified.get(group)
            if known is None:
                self._request(group, changed=False)
            else:
                pending.append((group, known, [self.client.exists_async(p) for p in known.paths(group)]))
        wait_in_order([a for *_, stats in pending for a in stats])
        for group, known, stats in pending:
            if not known.matches([a.get() for a in stats], self.topics):
                self._request(group, changed=False)

    def _retry_later(self, group: str, delay_ms: int) -> None:
        with self.lock:
            self.retry_at[group] = time.monotonic() + delay_ms / 1000.0

    def _due_retries(self, now: float):
        with self.lock:
            due = [g for g, at in self.retry_at.items() if at <= now]
            for group in due:
                del self.retry_at[group]
        return due

    # ------------------------------------------------------------ handlers

    def _handle(self) -> None:
        while True:
            group = self.requests.take(timeout=5.0)  # stop() wakes every handler at once
            if group is None:
                if self.stopped.is_set():
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
        term = self._term_of(group)
        if term is None or not term.active:
            return
        try:
            with self.node.metrics.rebalance(group, self.rebalancer.generations) as counted:
                outcome = counted.outcome = self.rebalancer.run(
                    group, lambda: dict(self.topics), term.fence, abort=lambda: not term.active, observe=self._observe,
                    changed=lambda: self.requests.changed(group), members_watch=self.group_watches.get(group))
            fields = {"group": group, "generation": outcome.generation, "reason": ", ".join(outcome.reasons) or "-",
                      "members": outcome.members, "moved": outcome.moved, "duration_ms": round(outcome.duration_ms, 1)}
            if outcome.state != "unchanged":
                log.info("group %s generation %d %s: reason=%s members=%d moved=%d duration=%.1fms%s",
                         group, outcome.generation, outcome.state, ", ".join(outcome.reasons) or "-",
                         outcome.members, outcome.moved, outcome.duration_ms,
                         f" excluded={outcome.excluded}" if outcome.excluded else "", extra=fields)
            if outcome.state == protocol.FAILED:
                log.error("group %s: %s", group, outcome.error, extra={**fields, "reason": outcome.error})
            if outcome.state != "unchanged" or outcome.recheck_ms is not None:  # a generation, or a static hold
                self.timeline.record(group, term.fence, outcome)
            if outcome.unavailable:  # look again for the squatted partitions later
                self._retry_later(group, self.config.failed_retry_interval_ms)
            if outcome.recheck_ms is not None:  # a static member is away: look again when its grace ends
                self._retry_later(group, outcome.recheck_ms)
            self._verified(group)
        except ConsumerRebalanceFailedException as e:
            log.error("ConsumerRebalanceFailedException: %s; retrying in %d ms", e,
                      self.config.failed_retry_interval_ms,
                      extra={"group": group, "generation": self.rebalancer.generations.get(group, 0),
                             "reason": str(e)})
            self._retry_later(group, self.config.failed_retry_interval_ms)
            self.timeline.record(group, term.fence, failed=True)
            self._verified(group)
        except Deposed as e:
            term.end(f"deposed: {e}")
            log.info("node %s: shard %d: %s", self.node_id, term.shard, e)
        except Abandoned:
            self._request(group)  # for whoever leads it next in this node, if we resume
        except Superseded:
            log.info("group %s: changed during the rebalance; computing it again", group)  # queued again by done()
            self.timeline.record(group, term.fence, superseded=True)
        except GroupDeleted as e:
            log.log(logging.INFO if e.first else logging.DEBUG, "%s; nothing left to rebalance", e,
                    extra={"group": group, "reason": "group deleted"})
            self._verified(group)
        except KazooException as e:
            if term.active:
                log.warning("group %s: ZooKeeper error during rebalance (%s); retrying", group, type(e).__name__)
                self._retry_later(group, self.config.rebalance_backoff_ms)
        except Exception:
            log.exception("group %s: unexpected error during rebalance; retrying later", group)
            self._retry_later(group, self.config.failed_retry_interval_ms)

    def _observe(self, group: str, registrations) -> None:
        """A handler saw the group's members: index their subscriptions, and if one names a
        topic the registry lacks (or a regex matches none), ask the topic mirror to look at
        once, so a new Kafka topic is served in about a Metadata round trip, not an interval."""
        registrations = list(registrations)
        self.index.update(group, registrations)
        if self.config.bootstrap_servers:
            topics = dict(self.topics)  # a copy: the event thread may change it meanwhile
            if any(not set(reg.subscription) <= topics.keys() if reg.pattern == protocol.PATTERN_STATIC
                   else not reg.topics(topics) for reg in registrations):
                self.node.request_mirror_refresh()

    def _verified(self, group: str) -> None:
        shard = self._shard(group)
        with self.lock:
            waiting = self.unverified.get(shard)
            if not waiting or group not in waiting:
                return
            waiting.discard(group)
            done = not waiting
            term = self.terms.get(shard)
        if done and term is not None:
            log.info("node %s has verified every group of shard %d (epoch %d)", self.node_id, shard, term.epoch)
            self._publish()


