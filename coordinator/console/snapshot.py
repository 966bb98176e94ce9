"""What the console shows, kept in memory and current by ZooKeeper watches.

:class:`ClusterSnapshot` follows, with one-shot watches re-armed by every read:

* every group (``/consumers/groups`` children) and, of each, its ``state`` (data), its members
  (``ids`` children, each registration read once when it appears) and its ``timeline``;
* the controller (``leader``), the election's contenders, the live nodes and their reports,
  the shard count and every shard's placement;
* every topic and its partition count;
* every share group, through :class:`~coordinator.console.share_snapshot.ShareGroupsReader`
  (read whole when any of its znodes changes, at most once a second a group).

A page or an API call reads this memory, never ZooKeeper. Every change costs one read of what
changed (pipelined with the others waiting); after a reconnect, and every
``resync_interval_s`` as a safety net, everything is read again (watches are hints).

ZooKeeper cost per node: three watches per group (state, ids, timeline) plus one per live
node, shard and topic; loading 10,000 groups is about 30,000 pipelined reads at start (share
groups: :mod:`coordinator.console.share_snapshot`).

Lifecycle (:class:`LoadState`): ``STARTING`` → ``LOADING`` (first full read) → ``LIVE`` →
``CLOSED``; ``close()`` from any state ends it.

Threads: kazoo's threads run the watch callbacks, which only queue what changed; the
snapshot's own thread reads ZooKeeper and replaces entries whole under ``_lock`` (entries are
never changed in place), so readers on HTTP threads copy the dicts under the lock and use
them without it.
"""
from __future__ import annotations

import enum
import logging
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.protocol.states import KazooState

from coordinator import protocol
from coordinator.errors import CorruptZnode
from coordinator.lifecycle import Lifecycle
from coordinator.protocol import GroupState, LeaderInfo, NodeInfo, RebalanceRecord, Registration, ShardAssignment
from coordinator.console.share_snapshot import DEFAULT_SHARE_INTERVAL_S, ShareGroupsReader
from coordinator.read import ShareGroupView, shard_leaders_of
from coordinator.zkclient import wait_in_order

log = logging.getLogger("zkgroups.console")

#: Reads sent at once before waiting for their answers (bounds one step's memory and latency).
BATCH = 2000
DEFAULT_RESYNC_INTERVAL_S = 300.0
_CONTENDER = re.compile(r"__lock__(-?\d{10})$")


class LoadState(enum.Enum):
    STARTING = "starting"
    LOADING = "loading"
    LIVE = "live"
    CLOSED = "closed"


@dataclass(frozen=True)
class GroupView:
    """One group as last read. ``state`` None with ``state_error``: its state znode is unreadable."""
    name: str
    state: Optional[GroupState] = None
    state_error: Optional[str] = None
    ids: Tuple[str, ...] = ()
    members: Dict[str, Registration] = field(default_factory=dict)
    unreadable: Dict[str, str] = field(default_factory=dict)
    timeline: Tuple[RebalanceRecord, ...] = ()
    timeline_error: Optional[str] = None

    @property
    def last_rebalance_ms(self) -> Optional[int]:
        if self.timeline:
            return self.timeline[-1].at
        return self.state.updated or None if self.state else None


def contender_order(children) -> List[str]:
    """The election's children in kazoo's order (by sequence), as ``Election.contenders`` sorts them."""
    found = [(m.group(1), c) for c in children for m in [_CONTENDER.search(c)] if m]
    return [c for _, c in sorted(found)]


class _Watcher:
    """One callable per watched thing, so kazoo keeps it once however often it is re-armed."""
    __slots__ = ("events", "key")

    def __init__(self, events: "queue.Queue", key: tuple):
        self.events, self.key = events, key

    def __call__(self, _event=None):  # kazoo's thread: record only
        self.events.put(self.key)


class ClusterSnapshot(Lifecycle[LoadState]):
    """See the module docstring. ``start()`` once; ``close()`` once (more calls do nothing).

    States (:class:`LoadState`)::

        STARTING --start()--> LOADING --first full read--> LIVE; any --close()--> CLOSED
    """

    TRANSITIONS = {
        LoadState.STARTING: {LoadState.LOADING, LoadState.CLOSED},
        LoadState.LOADING: {LoadState.LIVE, LoadState.CLOSED},
        LoadState.LIVE: {LoadState.CLOSED},
        LoadState.CLOSED: set(),
    }

    def __init__(self, client, resync_interval_s: float = DEFAULT_RESYNC_INTERVAL_S,
                 share_interval_s: float = DEFAULT_SHARE_INTERVAL_S):
        super().__init__(LoadState.STARTING)
        self.client = client
        self.resync_interval_s = resync_interval_s
        self.share_interval_s = share_interval_s
        self.events: "queue.Queue[tuple]" = queue.Queue()
        self._lock = threading.Lock()   # the snapshot's contents
        self._watchers: Dict[tuple, _Watcher] = {}
        self._missing: List[Tuple[str, _Watcher]] = []   # znodes found missing by the last reads
        self._groups: Dict[str, GroupView] = {}
        self._topics: Dict[str, Optional[int]] = {}
        self._topic_errors: Dict[str, str] = {}
        self._leader: Optional[LeaderInfo] = None
        self._contenders: List[str] = []
        self._nodes: Dict[str, NodeInfo] = {}
        self._shard_count: Optional[int] = None
        self._assignments: Dict[int, ShardAssignment] = {}
        self.shares = ShareGroupsReader(self, share_interval_s)   # the share groups (own thread)
        self.connection = "CONNECTED"
        self.version = 0               # bumped by every change (caches key on it)
        self.loaded_at: Optional[float] = None
        self._thread: Optional[threading.Thread] = None
        self._stopped = threading.Event()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "ClusterSnapshot":
        with self._state_lock:
            if self._state is not LoadState.STARTING or self._thread is not None:
                return self
            self._thread = threading.Thread(target=self._run, name="console-snapshot", daemon=True)
        self.client.add_listener(self._on_connection)
        self._thread.start()
        return self

    def close(self) -> None:
        if not self._set_state(LoadState.CLOSED):
            return
        self._stopped.set()
        self.events.put(("stop",))
        try:
            self.client.remove_listener(self._on_connection)
        except Exception:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def loaded(self) -> bool:
        return self._state is LoadState.LIVE

    # ------------------------------------------------------------ what readers see (any thread)

    def groups(self) -> Dict[str, GroupView]:
        with self._lock:
            return dict(self._groups)

    def group(self, name: str) -> Optional[GroupView]:
        with self._lock:
            return self._groups.get(name)

    def topics(self) -> Tuple[Dict[str, Optional[int]], Dict[str, str]]:
        """({topic: partitions, None if unreadable}, {topic: why unreadable})."""
        with self._lock:
            return dict(self._topics), dict(self._topic_errors)

    def share_groups(self) -> Dict[str, Optional[ShareGroupView]]:
        """{share group: its view, None while it is listed but not read yet}."""
        with self._lock:
            return dict(self.shares.views)

    def share_group(self, name: str) -> Optional[ShareGroupView]:
        with self._lock:
            return self.shares.views.get(name)

    def coordinator(self):
        """(leader, contenders, {node id: report}, shard count, {shard: assignment})."""
        with self._lock:
            return self._leader, list(self._contenders), dict(self._nodes), self._shard_count, dict(self._assignments)

    def shard_leaders(self) -> Dict[int, Tuple[str, int, bool]]:
        """As :func:`coordinator.read.shard_leaders` answers, from memory."""
        _, _, nodes, count, assignments = self.coordinator()
        return shard_leaders_of(count, assignments, nodes) if count else {}

    # ------------------------------------------------------------ kazoo's thread: record only

    def _on_connection(self, state) -> None:
        self.connection = str(state)
        if state == KazooState.CONNECTED:
            self.events.put(("resync",))

    def _watch(self, *key) -> _Watcher:
        watcher = self._watchers.get(key)
        if watcher is None:
            watcher = self._watchers[key] = _Watcher(self.events, key)
        return watcher

    # ------------------------------------------------------------ the snapshot's thread

    def _run(self) -> None:
        self._set_state(LoadState.LOADING, expect={LoadState.STARTING})
        next_resync = 0.0
        while not self._stopped.is_set():
            try:
                if time.monotonic() >= next_resync:
                    self._resync()
                    next_resync = time.monotonic() + self.resync_interval_s
                    if self._state is LoadState.LOADING:
                        self.loaded_at = time.time()
                        self._set_state(LoadState.LIVE, expect={LoadState.LOADING})
                        log.info("console: snapshot loaded (%d groups)", len(self._groups))
                keys = self._drain(timeout=self.shares.wait_s())
                if ("stop",) in keys:
                    return
                if ("resync",) in keys:
                    next_resync = 0.0
                    continue
                keys += self.shares.due_keys()
                if keys:
                    self._handle(keys)
            except KazooException as e:
                if self._stopped.is_set():
                    return
                log.warning("console: reading ZooKeeper failed (%s); reading everything again", type(e).__name__)
                next_resync = time.monotonic() + 1.0
                self._stopped.wait(1.0)
            except Exception:
                log.exception("console: unexpected error keeping the snapshot; reading everything again")
                next_resync = time.monotonic() + 5.0
                self._stopped.wait(1.0)

    def _drain(self, timeout: float) -> List[tuple]:
        try:
            keys = [self.events.get(timeout=timeout)]
        except queue.Empty:
            return []
        while len(keys) < BATCH:
            try:
                keys.append(self.events.get_nowait())
            except queue.Empty:
                break
        return list(dict.fromkeys(keys))

    def _resync(self) -> None:
        """Read everything (and arm every watch)."""
        read = set(self._handle([("coordinator",), ("topics",), ("groups",)]))
        with self._lock:
            names = [g for g in self._groups if g not in read]
        for i in range(0, len(names), BATCH):
            self._handle([(kind, g) for g in names[i:i + BATCH] for kind in ("state", "ids", "timeline")])
        self.shares.read_all()
        self._watch_missing()

    def _handle(self, keys: List[tuple]) -> List[str]:
        """Read what each key names (pipelined, one round trip for all of a kind) and apply it;
        returns the groups that were new (read in full)."""
        by_kind: Dict[str, list] = {}
        for key in keys:
            by_kind.setdefault(key[0], []).append(key[1] if len(key) > 1 else None)
        if "coordinator" in by_kind or "leader" in by_kind or "election" in by_kind:
            self._read_coordinator()
        if "nodes" in by_kind:
            self._read_nodes()
        if "node" in by_kind:
            self._read_node_reports(by_kind["node"])
        if "shards" in by_kind:
            self._read_shard_count()
        if "shard" in by_kind:
            self._read_assignments(by_kind["shard"])
        if "topics" in by_kind:
            self._read_topics()
        if "topic" in by_kind:
            self._read_topic_counts(by_kind["topic"])
        if "share-groups" in by_kind:
            self.shares.read_names()
        if "share" in by_kind:
            self.shares.read_when_due([g for g in by_kind["share"] if g is not None])
        new_groups: List[str] = []
        if "groups" in by_kind:
            new_groups = self._read_group_names()
        for i in range(0, max(len(new_groups), 1), BATCH):
            for kind in ("state", "ids", "timeline"):
                names = [g for g in by_kind.get(kind, []) if g is not None] if i == 0 else []
                names += new_groups[i:i + BATCH]
                if names:
                    getattr(self, f"_read_{kind}")(list(dict.fromkeys(names)))
        self._watch_missing()
        return new_groups

    # ---- helpers: a read that arms a watch, or an exists watch where the znode is missing

    def _watched_reads(self, kind: str, keys, path_of, children: bool = False):
        """One pipelined round trip: ``path_of(key)`` read (its children with ``children``) for
        each key, each with the watch of ``(kind, key)``; [(key, watcher, answer)], all answered."""
        read = self.client.get_children_async if children else self.client.get_async
        pending = [(k, self._watch(kind, k)) for k in keys if k is not None]
        pending = [(k, w, read(path_of(k), watch=w)) for k, w in pending]
        wait_in_order([a for *_, a in pending])
        return pending

    def _answer(self, pending, path: str, watcher) -> Optional[Tuple[bytes, object]]:
        """The data of a read, or None where the znode is missing (then an exists watch is set
        on it by :meth:`_watch_missing`, so its creation is seen)."""
        try:
            return pending.get()
        except NoNodeError:
            self._missing.append((path, watcher))
            return None

    def _children(self, pending, path: str, watcher) -> Optional[List[str]]:
        try:
            return sorted(pending.get())
        except NoNodeError:
            self._missing.append((path, watcher))
            return None

    def _watch_missing(self) -> None:
        """Exists watches on the znodes found missing (pipelined); one made meanwhile is read again."""
        missing, self._missing = self._missing, []
        checks = [(watcher, self.client.exists_async(path, watch=watcher)) for path, watcher in missing]
        wait_in_order([a for _, a in checks])
        for watcher, a in checks:
            if a.get() is not None:
                self.events.put(watcher.key)

    def _changed(self) -> None:
        with self._lock:
            self.version += 1

    # ---- the coordinator

    def _read_coordinator(self) -> None:
        client = self.client
        leader_w, election_w = self._watch("leader"), self._watch("election")
        leader_a = client.get_async(protocol.LEADER, watch=leader_w)
        election_a = client.get_children_async(protocol.ELECTION, watch=election_w)
        wait_in_order([leader_a, election_a])
        got = self._answer(leader_a, protocol.LEADER, leader_w)
        try:
            leader = LeaderInfo.decode(got[0]) if got else None
        except CorruptZnode as e:
            log.warning("console: %s", e)
            leader = None
        children = contender_order(self._children(election_a, protocol.ELECTION, election_w) or [])
        datas = [client.get_async(f"{protocol.ELECTION}/{c}") for c in children]
        contenders = []
        for a in wait_in_order(datas):
            try:
                data, _ = a.get()
                if data is not None:
                    contenders.append(data.decode("utf-8", errors="replace"))
            except NoNodeError:
                continue
        with self._lock:
            self._leader, self._contenders = leader, contenders
        self._read_nodes()
        self._read_shard_count()
        self._changed()

    def _read_nodes(self) -> None:
        watcher = self._watch("nodes")
        names = self._children(self.client.get_children_async(protocol.NODES, watch=watcher), protocol.NODES,
                               watcher) or []
        with self._lock:
            for gone in set(self._nodes) - set(names):
                del self._nodes[gone]
        self._read_node_reports(names)

    def _read_node_reports(self, names) -> None:
        for name, _watcher, a in self._watched_reads("node", names, protocol.node_path):
            try:
                raw, _ = a.get()
                report = NodeInfo.decode(raw, protocol.node_path(name))
            except (NoNodeError, CorruptZnode):
                report = None
            with self._lock:
                if report is None:
                    self._nodes.pop(name, None)
                else:
                    self._nodes[name] = report
        self._changed()

    def _read_shard_count(self) -> None:
        watcher = self._watch("shards")
        got = self._answer(self.client.get_async(protocol.SHARDS, watch=watcher), protocol.SHARDS, watcher)
        try:
            count = protocol.ShardsInfo.decode(got[0]).count if got and got[0] else None
        except CorruptZnode:
            count = None
        with self._lock:
            self._shard_count = count
        if count:
            self._read_assignments(range(count))

    def _read_assignments(self, shards) -> None:
        for shard, watcher, a in self._watched_reads("shard", shards, protocol.shard_path):
            got = self._answer(a, protocol.shard_path(shard), watcher)
            try:
                assignment = ShardAssignment.decode(got[0] if got else b"", protocol.shard_path(shard))
            except CorruptZnode:
                assignment = ShardAssignment("", 0)
            with self._lock:
                self._assignments[shard] = assignment
        self._changed()

    # ---- topics

    def _read_topics(self) -> None:
        watcher = self._watch("topics")
        names = self._children(self.client.get_children_async(protocol.BROKER_TOPICS, watch=watcher),
                               protocol.BROKER_TOPICS, watcher) or []
        with self._lock:
            for gone in set(self._topics) - set(names):
                self._topics.pop(gone, None)
                self._topic_errors.pop(gone, None)
        self._read_topic_counts(names)

    def _read_topic_counts(self, names) -> None:
        for topic, _watcher, a in self._watched_reads("topic", names, protocol.topic_path):
            try:
                raw, _ = a.get()
            except NoNodeError:
                with self._lock:
                    self._topics.pop(topic, None)
                    self._topic_errors.pop(topic, None)
                continue
            try:
                count, error = protocol.decode_topic(raw, protocol.topic_path(topic)), None
            except CorruptZnode as e:
                count, error = None, e.problem
            with self._lock:
                self._topics[topic] = count
                if error:
                    self._topic_errors[topic] = error
                else:
                    self._topic_errors.pop(topic, None)
        self._changed()

    # ---- groups

    def _read_group_names(self) -> List[str]:
        """The groups' names (re-arming the watch); returns the new ones, dropping the deleted."""
        watcher = self._watch("groups")
        names = self._children(self.client.get_children_async(protocol.GROUPS, watch=watcher), protocol.GROUPS,
                               watcher) or []
        with self._lock:
            known = set(self._groups)
            for gone in known - set(names):
                del self._groups[gone]
            new = [g for g in names if g not in known]
            for g in new:
                self._groups[g] = GroupView(g)
        if new or known - set(names):
            self._changed()
        return new

    def _replace(self, name: str, **changes) -> None:
        with self._lock:
            view = self._groups.get(name)
            if view is not None:
                self._groups[name] = _with(view, **changes)

    def _read_state(self, names: List[str]) -> None:
        for group, watcher, a in self._watched_reads("state", names, protocol.state_path):
            path = protocol.state_path(group)
            got = self._answer(a, path, watcher)
            try:
                state, error = GroupState.decode(got[0] if got else b"", path), None
            except CorruptZnode as e:
                state, error = None, e.problem
            self._replace(group, state=state, state_error=error)
        self._changed()

    def _read_timeline(self, names: List[str]) -> None:
        for group, watcher, a in self._watched_reads("timeline", names, protocol.timeline_path):
            path = protocol.timeline_path(group)
            got = self._answer(a, path, watcher)
            try:
                entries, error = tuple(protocol.decode_timeline(got[0] if got else b"", path)), None
            except CorruptZnode as e:
                entries, error = (), e.problem
            self._replace(group, timeline=entries, timeline_error=error)
        self._changed()

    def _read_ids(self, names: List[str]) -> None:
        reads = []
        for group, watcher, a in self._watched_reads("ids", names, protocol.ids_path, children=True):
            ids = self._children(a, protocol.ids_path(group), watcher) or []
            view = self.group(group)
            if view is None:
                continue
            known = {**view.members, **{c: None for c in view.unreadable}}
            new = [c for c in ids if c not in known]
            reads.append((group, ids, [(c, self.client.get_async(protocol.ids_path(group, c))) for c in new]))
        wait_in_order([a for *_, gets in reads for _, a in gets])
        for group, ids, gets in reads:
            view = self.group(group)
            if view is None:
                continue
            members = {c: r for c, r in view.members.items() if c in ids}
            unreadable = {c: p for c, p in view.unreadable.items() if c in ids}
            gone = set()
            for cid, a in gets:
                path = protocol.ids_path(group, cid)
                try:
                    members[cid] = Registration.decode(a.get()[0], path)
                except NoNodeError:
                    gone.add(cid)  # left while we read
                except CorruptZnode as e:
                    unreadable[cid] = e.problem
            self._replace(group, ids=tuple(c for c in ids if c not in gone), members=members, unreadable=unreadable)
        self._changed()


def _with(view: GroupView, **changes) -> GroupView:
    values = {name: getattr(view, name) for name in GroupView.__dataclass_fields__}
    values.update(changes)
    return GroupView(**values)
