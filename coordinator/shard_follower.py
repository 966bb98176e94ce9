"""Following the shards placed on a node: its event thread (half of
:class:`~coordinator.groups.GroupCoordinator`; the other half is
:mod:`coordinator.rebalance_handlers`).

It registers the node under ``/consumers/coordinator/nodes``, follows every shard's assignment,
and holds a :class:`~coordinator.fencing.ShardTerm` per shard placed on it (in the
:class:`~coordinator.shard_terms.ShardTerms` both halves share). For the groups of those shards
it watches the topics and the members, and queues a group once per change on the blocking
:class:`~coordinator.requests.RebalanceRequests` that the handlers take from. Groups of shards it
does not lead are not watched.

A shard it takes is verified first for all its groups at once: a group whose recorded
verification still matches its zxids is verified by four pipelined reads
(:func:`~coordinator.verify.still_as_recorded`); the others are run in full first (no commands
where ownership is already right), then the verified ones (to learn their members'
subscriptions). A shard it loses (moved, or its epoch bumped) stops at once. Every
``check_interval_ms`` the groups it leads are checked by zxids, every tenth time in full.
"""
from __future__ import annotations

import enum
import logging
import os
import queue
import threading
import time
from typing import Callable, Dict, Optional, Set, Tuple

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.protocol.states import EventType
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from coordinator import protocol
from coordinator.errors import CorruptZnode, InvalidName
from coordinator.fencing import ShardTerm
from coordinator.lifecycle import Lifecycle
from coordinator.rebalance import GroupRebalancer
from coordinator.requests import GroupIndex, RebalanceRequests
from coordinator.shard_terms import ShardTerms
from coordinator.topics import TopicRegistry
from coordinator.verify import still_as_recorded
from coordinator.zkclient import WAIT, Holder, create_ephemeral, wait_in_order

log = logging.getLogger("zkgroups.coordinator")  # the node's lines, whichever half writes them

#: A node whose id is held by another session waits for it this long (x the session timeout) before saying so.
NODE_ID_WAIT_FACTOR = 1.5
#: Every this many periodic checks, every group is read in full (owner nodes included), not just its versions.
FULL_CHECK_EVERY = 10
#: A node that cannot start leading groups (ZooKeeper errors) tries again after this, doubling up to the max.
START_RETRY_S, START_RETRY_MAX_S = 0.2, 5.0


class Event(enum.Enum):
    """What the event thread is told (kazoo's threads only put these on its queue, with an
    argument). The values are the ``kind`` labels of ``zkgroups_watch_event_handling_seconds``."""
    SHARDS = "shards"            # the shards znode (the shard count): its data
    ASSIGNMENT = "assignment"    # a shard's placement changed: (shard, its data)
    TOPICS = "topics"            # the topics listed: their names
    TOPIC = "topic"              # a topic's znode changed: (topic, its data, None if deleted)
    GROUPS = "groups"            # the groups listed: their names
    IDS = "ids"                  # a group's members changed: the group
    IDS_ZNODE = "ids-znode"      # a group's ids/ znode was made or deleted: the group
    LOST = "lost"                # the session expired (terms ended already)
    CONNECTED = "connected"      # the connection is back, or a read failed: re-read what we depend on


class GroupsState(enum.Enum):
    NEW = "new"
    REGISTERING = "registering"  # creating the node's znode (at start, and after a session expired)
    LEADING = "leading"          # registered: it leads the shards the controller places on it
    STOPPED = "stopped"


class ShardFollower(Lifecycle[GroupsState]):
    """The event thread of a node's groups: registration, shard terms, watches, requests.

    States (:class:`GroupsState`)::

        NEW --start()--> REGISTERING --node znode created (event thread)--> LEADING
        LEADING --session expired (kazoo's thread)--> REGISTERING
        any --stop()--> STOPPED

    ``start()`` and ``stop()`` by compare-and-set: a second call does nothing (``stop()``
    then returns False); a ``start()`` after ``stop()`` raises IllegalStateError.

    Threads: kazoo's threads run the watch callbacks, which only put events on ``events``
    (:meth:`session_lost` and :meth:`reconnected` too). The event thread (``_run()``) alone
    handles events, reads topics and memberships, begins and ends shard terms, and owns
    ``topics``, ``topic_watches``, ``group_watches``, ``all_groups``, ``ignored_groups``,
    ``taking_over`` and ``checks``; it writes ``rebalancer.verified`` only while taking a shard
    over, before any of the shard's groups is queued (so no handler runs them then), and asks
    the rebalancer to ``forget`` deleted groups and ``read_in_full`` on full checks (both
    thread-safe). Handler threads call :meth:`request`, :meth:`verified`, :meth:`publish` and
    read ``topics`` (copied) and ``group_watches`` (one ``get``): those touch only the shared
    :class:`~coordinator.shard_terms.ShardTerms`, the requests queue and the node znode.
    """

    TRANSITIONS = {
        GroupsState.NEW: {GroupsState.REGISTERING, GroupsState.STOPPED},
        GroupsState.REGISTERING: {GroupsState.LEADING, GroupsState.STOPPED},
        GroupsState.LEADING: {GroupsState.REGISTERING, GroupsState.STOPPED},
        GroupsState.STOPPED: set(),
    }

    def __init__(self, node, terms: ShardTerms, requests: RebalanceRequests, rebalancer: GroupRebalancer,
                 index: GroupIndex):
        super().__init__(GroupsState.NEW)
        self.node, self.client, self.config, self.node_id = node, node.client, node.config, node.node_id
        self.info = protocol.NodeInfo(node.node_id, node.host, os.getpid(), protocol.now_ms())
        self.terms, self.requests, self.rebalancer, self.index = terms, requests, rebalancer, index
        self.events: "queue.Queue[Tuple[Event, object]]" = queue.Queue()
        self.topics: Dict[str, int] = {}
        self.topic_watches: Set[str] = set()
        # group -> the one watcher of its ids znode (one object per group, so kazoo holds it once)
        self.group_watches: Dict[str, Callable] = {}
        self.all_groups: Set[str] = set()
        self.ignored_groups: Set[str] = set()
        self.taking_over: list = []          # groups of shards just placed here, not yet followed
        self.checks = 0                      # periodic checks done
        self._left_registered = False        # registered when stop() came: leave() deletes the node znode
        self.thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------ lifecycle

    def _lifecycle_name(self) -> str:
        return f"node {self.node_id} (groups)"

    @property
    def registered(self) -> bool:
        """Whether the node's znode is this session's (the controller may place shards on it)."""
        return self.state is GroupsState.LEADING

    @property
    def stopped(self) -> bool:
        return self.state is GroupsState.STOPPED

    def start(self) -> None:
        if not self._start_once(GroupsState.REGISTERING):
            return
        self.thread = threading.Thread(target=self._run, name=f"groups-{self.node_id}", daemon=True)
        self.thread.start()

    def stop(self) -> bool:
        """Stop following and end every term; False if stopped before. :meth:`leave` finishes."""
        registered = self.registered
        if not self._set_state(GroupsState.STOPPED):
            return False
        self._left_registered = registered
        self.terms.end_all("shutting down")
        return True

    def leave(self) -> None:
        """After :meth:`stop`: wait for the event thread, and give the shards up now (delete the
        node znode) rather than at session expiry."""
        if self.thread is not None:
            self.thread.join(timeout=5)
        if self._left_registered and self.client.connected:
            try:
                self.client.delete(protocol.node_path(self.node_id))
            except KazooException:
                pass

    def session_lost(self) -> None:
        """kazoo's thread: the session expired; the node znode is gone with it."""
        self._set_state(GroupsState.REGISTERING, expect={GroupsState.LEADING})
        self.terms.end_all("ZooKeeper session lost")
        self.events.put((Event.LOST, None))

    def reconnected(self) -> None:
        """kazoo's thread: the connection is back: re-read what we depend on."""
        self.events.put((Event.CONNECTED, None))

    # ------------------------------------------------------------ any thread

    def leads(self, group: str) -> bool:
        """Whether this node leads ``group`` now."""
        return group in self.all_groups and self.terms.of(group) is not None

    def publish(self) -> None:
        """Report the shards we lead (and which are verified) in our node znode."""
        self.info.shards = self.terms.report()
        data = self.info.encode()
        if self.registered:
            self.client.set_async(protocol.node_path(self.node_id), data)

    def verified(self, group: str) -> None:
        """``group`` was verified (run, or found as recorded); once every group of its shard is,
        say so and publish it."""
        term = self.terms.verified(group)
        if term is not None:
            log.info("node %s has verified every group of shard %d (epoch %d)", self.node_id, term.shard, term.epoch)
            self.publish()

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
        while not self.stopped:
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
                return not self.stopped
            except KazooException as e:
                if self.stopped:
                    break
                log.warning("node %s: cannot start leading groups yet (%s); trying again in %.1f s", self.node_id,
                            type(e).__name__, delay)
                self._wait_state({GroupsState.STOPPED}, delay)
                delay = min(delay * 2, START_RETRY_MAX_S)
        return False

    def _run(self) -> None:
        if not self._start_watching():
            return
        next_check = time.monotonic() + self.config.check_interval_ms / 1000.0
        while not self.stopped:
            try:
                kind, arg = self.events.get(timeout=0.1)
                with self.node.metrics.handling(kind.value):
                    self._on_event(kind, arg)
                if self.taking_over and self.events.empty():
                    self._take_over()
            except queue.Empty:
                pass
            except KazooException as e:
                if not self.stopped:
                    log.warning("node %s: ZooKeeper error (%s) handling an event; looking again", self.node_id,
                                type(e).__name__)
                    self.events.put((Event.CONNECTED, None))  # re-read what we depend on
                    self._wait_state({GroupsState.STOPPED}, 0.2)
            now = time.monotonic()
            for group in self.terms.due_retries(now):
                self.requests.request(group)
            if now >= next_check:
                next_check = now + self.config.check_interval_ms / 1000.0
                self.checks += 1
                try:
                    self._periodic_check(full=self.checks % FULL_CHECK_EVERY == 0)
                except KazooException:
                    self.request_held(changed=False)

    def _register(self) -> None:
        """Create this node's ephemeral znode; if another session holds it (our own previous
        one, or another process with the same node id) wait for it to go."""
        path = protocol.node_path(self.node_id)
        waited_since, said = time.monotonic(), []
        limit = NODE_ID_WAIT_FACTOR * self.config.session_timeout_ms / 1000.0

        def held(_holder: Holder) -> str:
            if not said and time.monotonic() - waited_since > limit:
                said.append(True)
                log.error("node %s: another ZooKeeper session still holds %s; is another coordinatord running "
                          "with --node-id %s? Waiting for it to end", self.node_id, path, self.node_id)
            return WAIT

        if create_ephemeral(self.client, path, self.info.encode(), held, stopped=lambda: self.stopped):
            self._set_state(GroupsState.LEADING, expect={GroupsState.REGISTERING})

    # ---- watch callbacks (kazoo thread: record only)

    def _watch_shards_info(self, data, stat):
        if self.stopped:
            return False
        if data is not None:
            self.events.put((Event.SHARDS, data))

    def _watch_assignment(self, shard: int):
        def callback(data, stat):
            if self.stopped:
                return False
            self.events.put((Event.ASSIGNMENT, (shard, data)))
        return callback

    def _watch_topics(self, children):
        if self.stopped:
            return False
        self.events.put((Event.TOPICS, list(children)))

    def _watch_groups(self, children):
        if self.stopped:
            return False
        self.events.put((Event.GROUPS, list(children)))

    def _watch_topic_data(self, topic):
        def callback(data, stat):
            if self.stopped:
                return False
            self.events.put((Event.TOPIC, (topic, data)))
            if data is None:
                return False  # deleted: a topic created again gets a watch of its own
        return callback

    def _watch_members(self, group):
        def watch(event):
            if not self.stopped:
                self.events.put((Event.IDS if event.type == EventType.CHILD else Event.IDS_ZNODE, group))
        return watch

    # ---- events (event thread: may call ZooKeeper)

    def _on_event(self, kind: Event, arg) -> None:
        if kind is Event.SHARDS:
            self._on_shards(arg)
        elif kind is Event.ASSIGNMENT:
            self._on_assignment(*arg)
            if self.taking_over:  # a shard came: those placed in the same write come with it
                self._read_assignments()
        elif kind is Event.TOPICS:
            for topic in arg:
                if topic not in self.topic_watches:
                    self.topic_watches.add(topic)
                    DataWatch(self.client, protocol.topic_path(topic), self._watch_topic_data(topic))
        elif kind is Event.TOPIC:
            self._on_topic(*arg)
        elif kind is Event.GROUPS:
            self._on_groups(arg)
        elif kind is Event.IDS:  # a member came or went: its run reads the members and sets the watch again
            if arg in self.group_watches:
                self.request(arg)
        elif kind is Event.IDS_ZNODE:  # ids/ itself made or deleted (the group is being made or deleted)
            if arg in self.group_watches:
                self._read_members([arg])
        elif kind is Event.LOST:
            pass  # terms ended already; CONNECTED follows with a new session
        elif kind is Event.CONNECTED:
            # Watches are hints: after a reconnect re-read what we depend on.
            if not self.registered:
                self._register()
            self._read_assignments()
            self._periodic_check(full=False)  # groups that changed meanwhile, or never verified, run again

    def _read_assignments(self) -> None:
        """Read every shard's placement (pipelined) and act on it."""
        if self.terms.count is None:
            return
        reads = [(s, self.client.get_async(protocol.shard_path(s))) for s in range(self.terms.count)]
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
        if self.terms.count is None:
            self.terms.count = count
            for s in range(count):
                DataWatch(self.client, protocol.shard_path(s), self._watch_assignment(s))
        elif count != self.terms.count:
            log.error("node %s: the shard count changed from %d to %d under a running node; restart it",
                      self.node_id, self.terms.count, count)

    def _on_assignment(self, shard: int, data: Optional[bytes]) -> None:
        try:
            assignment = protocol.ShardAssignment.decode(data or b"", protocol.shard_path(shard))
        except CorruptZnode as e:
            log.error("node %s: %s; waiting for the controller to repair it", self.node_id, e)
            assignment = protocol.ShardAssignment("", 0)
        mine = assignment.node_id == self.node_id and self.registered and not self.stopped
        term = self.terms.get(shard)
        if mine and term is not None and term.epoch >= assignment.epoch and not term.ended:
            return  # nothing new (or an older read of it, delivered late: epochs never go back)
        if term is not None:
            term.end(f"shard {shard} moved to {assignment.node_id or 'nobody'}" if not mine else
                     f"shard {shard} is at epoch {assignment.epoch} now")
            self.terms.drop(shard)
            for group in [g for g in self.group_watches if self.terms.shard_of(g) == shard]:
                del self.group_watches[group]  # its next watch event is ignored
            if not mine:
                log.info("node %s no longer leads shard %d (now %s)", self.node_id, shard, assignment.node_id or "-")
        if mine:
            new = ShardTerm(shard, assignment.epoch, suspended=lambda: self.node.suspended)
            groups = {g for g in self.all_groups if self.terms.shard_of(g) == shard}
            self.terms.begin(new, groups)
            log.info("node %s leads shard %d at epoch %d (%d groups)", self.node_id, shard, assignment.epoch,
                     len(groups))
            self.taking_over += sorted(groups)  # once the events queued meanwhile are handled
        self.publish()

    def _on_topic(self, topic: str, data: Optional[bytes]) -> None:
        if data is None:
            self.topic_watches.discard(topic)
            if self.topics.pop(topic, None) is not None:
                for group in self.index.groups_for(topic):  # rebalanced away from it
                    self.request(group)
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
                self.request(group)

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
            self.verified(group)
        self.all_groups = valid
        self._follow([g for g in sorted(valid - set(self.group_watches)) if self.terms.of(g) is not None])

    def _take_over(self) -> None:
        """The groups of the shards just placed on this node (all of them, when several shards
        came at once): those whose recorded verification still holds are verified at once (all
        read together, see :func:`still_as_recorded`); then every group is followed and run,
        those needing work first (the others' runs only learn their members' subscriptions
        and find nothing to do). ``taking_over`` is emptied only once this succeeded."""
        groups = [g for g in self.taking_over if self.terms.of(g) is not None]
        fingerprints = still_as_recorded(self.client, groups)  # reads the topics itself (a fresh view)
        for group, known in fingerprints.items():
            self.rebalancer.verified[group] = known
            self.verified(group)
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
                    self.events.put((Event.IDS, group))  # created in between: read it
                else:
                    self.verified(group)
                continue
            self.request(group)

    def request(self, group: str, changed: bool = True) -> None:
        """Queue ``group``'s rebalance if this node leads it (any thread)."""
        if self.terms.of(group) is not None:
            self.requests.request(group, changed)

    def request_held(self, changed: bool = True) -> None:
        for group in list(self.group_watches):
            self.request(group, changed)

    def _periodic_check(self, full: bool) -> None:
        """The safety net under the watches. A light check reads only the versions of each
        group's znodes (pipelined) and runs the groups that changed since they were last
        verified, or were never verified; a full check runs every group."""
        if full:
            self.rebalancer.read_in_full(list(self.group_watches))
            self.request_held(changed=False)
            return
        pending = []
        for group in list(self.group_watches):
            if self.terms.of(group) is None:
                continue
            known = self.rebalancer.verified.get(group)
            if known is None:
                self.request(group, changed=False)
            else:
                pending.append((group, known, [self.client.exists_async(p) for p in known.paths(group)]))
        wait_in_order([a for *_, stats in pending for a in stats])
        for group, known, stats in pending:
            if not known.matches([a.get() for a in stats], self.topics):
                self.request(group, changed=False)
