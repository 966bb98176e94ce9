"""What the console shows, kept in memory and current by ZooKeeper watches.

:class:`ClusterSnapshot` follows, with one-shot watches re-armed by every read:

* every group (``/consumers/groups`` children) and, of each, its ``state`` (data), its members
  (``ids`` children, each registration read once when it appears) and its ``timeline``;
* the controller (``leader``), the election's contenders, the live nodes and their reports,
  the shard count and every shard's placement;
* every topic and its partition count;
* every share group (``/consumers/share-groups`` children) and, of each, its settings, its
  members and every share-partition's state, read whole (a :class:`coordinator.read.ShareGroupView`)
  when any of them changes, at most once per ``share_interval_s`` a group (a share-partition's
  state changes at every poll and acknowledgement: the console follows, a second behind at most).

A page or an API call reads this memory, never ZooKeeper. Every change costs one read of what
changed (pipelined with the others waiting); after a reconnect, and every
``resync_interval_s`` as a safety net, everything is read again (watches are hints).

ZooKeeper cost per node: three watches per group (state, ids, timeline) plus one per live
node, shard and topic; loading 10,000 groups is about 30,000 pipelined reads at start. A share
group costs three watches plus one per topic and share-partition, and a re-read of all
of those (pipelined, three round trips) at most once per ``share_interval_s`` while it is busy.

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
from coordinator.protocol.share import SHARE_GROUPS, ShareGroupConfig, ShareMember, SharePartitionState
from coordinator.read import ShareGroupView, decoded, shard_leaders_of
from coordinator.zkclient import wait_in_order

log = logging.getLogger("zkgroups.console")

#: Reads sent at once before waiting for their answers (bounds one step's memory and latency).
BATCH = 2000
DEFAULT_RESYNC_INTERVAL_S = 300.0
#: A busy share group is read again at most this often (its watches fire at every poll).
DEFAULT_SHARE_INTERVAL_S = 1.0
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
        self._share_groups: Dict[str, Optional[ShareGroupView]] = {}   # None: listed, not read yet
        self._share_read_at: Dict[str, float] = {}   # group -> when it was last read (monotonic; own thread)
        self._share_due: Dict[str, float] = {}       # group -> when its deferred re-read is due
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
            return dict(self._share_groups)

    def share_group(self, name: str) -> Optional[ShareGroupView]:
        with self._lock:
            return self._share_groups.get(name)

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
                keys = self._drain(timeout=self._wait_s())
                if ("stop",) in keys:
                    return
                if ("resync",) in keys:
                    next_resync = 0.0
                    continue
                keys += self._due_share_keys()
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

    def _wait_s(self) -> float:
        """How long to wait for events: a second, or until the next deferred share group is due."""
        if not self._share_due:
            return 1.0
        return min(1.0, max(0.01, min(self._share_due.values()) - time.monotonic()))

    def _due_share_keys(self) -> List[tuple]:
        now = time.monotonic()
        due = [g for g, at in self._share_due.items() if at <= now]
        for g in due:
            del self._share_due[g]
        return [("share", g) for g in due]

    def _resync(self) -> None:
        """Read everything (and arm every watch)."""
        read = set(self._handle([("coordinator",), ("topics",), ("groups",)]))
        with self._lock:
            names = [g for g in self._groups if g not in read]
        for i in range(0, len(names), BATCH):
            self._handle([(kind, g) for g in names[i:i + BATCH] for kind in ("state", "ids", "timeline")])
        self._share_read_at.clear()   # everything is read now, however recently it was
        self._share_due.clear()
        read = set(self._read_share_group_names())
        with self._lock:
            names = [g for g in self._share_groups if g not in read]
        for i in range(0, len(names), BATCH):
            self._read_share_groups(names[i:i + BATCH])
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
            self._read_share_group_names()
        if "share" in by_kind:
            self._read_share_groups_when_due([g for g in by_kind["share"] if g is not None])
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


    # ---- share groups (names from ZooKeeper are joined into paths as they are: they are znode
    # names, and the console must show a group or member no tool would accept, not fail on it)

    def _read_share_group_names(self) -> List[str]:
        """The share groups' names (re-arming the watch): the new ones read at once, the deleted
        dropped; returns the new ones."""
        watcher = self._watch("share-groups")
        names = self._children(self.client.get_children_async(SHARE_GROUPS, watch=watcher), SHARE_GROUPS,
                               watcher) or []
        with self._lock:
            known = set(self._share_groups)
            gone = known - set(names)
            for g in gone:
                del self._share_groups[g]
            new = [g for g in names if g not in known]
            for g in new:
                self._share_groups[g] = None
        for g in gone:
            self._share_read_at.pop(g, None)
            self._share_due.pop(g, None)
        for i in range(0, len(new), BATCH):
            self._read_share_groups(new[i:i + BATCH])
        if gone:
            self._changed()
        return new

    def _read_share_groups_when_due(self, names: List[str]) -> None:
        """Read the share groups whose watches fired; one read less than ``share_interval_s``
        ago is deferred until then (its watches have fired: nothing is missed meanwhile)."""
        now = time.monotonic()
        ready = []
        for g in dict.fromkeys(names):
            last = self._share_read_at.get(g)
            if last is not None and now - last < self.share_interval_s:
                self._share_due.setdefault(g, last + self.share_interval_s)
            else:
                ready.append(g)
        for i in range(0, len(ready), BATCH):
            self._read_share_groups(ready[i:i + BATCH])

    def _read_share_groups(self, names: List[str]) -> None:
        """Read each share group whole, every read arming the group's one watcher: its znode and
        listings, then its members and topics, then its share-partitions' states (three round
        trips for all of ``names``). A znode that does not decode is in the view's ``problems``."""
        with self._lock:
            names = [g for g in names if g in self._share_groups]
        read = self._share_members_and_states(self._share_listings(names))
        for g, config, problems, members, state_reads in read:
            states = {}
            for tp, path, a in state_reads:
                try:
                    state = decoded(SharePartitionState.decode, a.get()[0], path, problems)
                except NoNodeError:
                    continue
                if state is not None:
                    states[tp] = state
            view = ShareGroupView(g, config, members, states, problems)
            with self._lock:
                if g in self._share_groups:
                    self._share_groups[g] = view
        if names:
            self._changed()

    def _share_listings(self, names: List[str]) -> list:
        """Round trip 1 and 2: each group's settings and listings, then its members' znodes and
        its topics' listings asked; [(group, config, problems, member reads, topic reads)]."""
        client = self.client
        firsts = []
        for g in names:
            w, base = self._watch("share", g), f"{SHARE_GROUPS}/{g}"
            self._share_read_at[g] = time.monotonic()
            self._share_due.pop(g, None)
            firsts.append((g, w, base, client.get_async(base, watch=w),
                           client.get_children_async(base + "/members", watch=w),
                           client.get_children_async(base + "/partitions", watch=w)))
        wait_in_order([a for *_, c, m, p in firsts for a in (c, m, p)])
        seconds = []
        for g, w, base, config_a, members_a, topics_a in firsts:
            problems: Dict[str, str] = {}
            try:
                raw, _ = config_a.get()
            except NoNodeError:
                with self._lock:   # deleted: the names' watch says so too
                    self._share_groups.pop(g, None)
                continue
            config = decoded(ShareGroupConfig.decode, raw, base, problems) or ShareGroupConfig()
            ids = self._children(members_a, base + "/members", w) or []
            topics = self._children(topics_a, base + "/partitions", w) or []
            member_reads = [(m, f"{base}/members/{m}", client.get_async(f"{base}/members/{m}")) for m in ids]
            topic_paths = [(t, f"{base}/partitions/{t}") for t in topics]
            topic_reads = [(t, path, client.get_children_async(path, watch=w)) for t, path in topic_paths]
            seconds.append((g, w, config, problems, member_reads, topic_reads))
        wait_in_order([a for *_, ms, ts in seconds for *_, a in ms + ts])
        return seconds

    def _share_members_and_states(self, listed: list) -> list:
        """The members decoded and round trip 3 asked (the states, watched);
        [(group, config, problems, members, state reads)]."""
        thirds = []
        for g, w, config, problems, member_reads, topic_reads in listed:
            members = {}
            for m, path, a in member_reads:
                try:
                    member = decoded(ShareMember.decode, a.get()[0], path, problems)
                except NoNodeError:
                    continue   # left while we read
                if member is not None:
                    members[m] = member
            state_reads = []
            for t, path, a in topic_reads:
                try:
                    parts = sorted(int(p) for p in a.get() if p.isdigit())
                except NoNodeError:
                    continue
                state_reads += [((t, p), f"{path}/{p}", self.client.get_async(f"{path}/{p}", watch=w))
                                for p in parts]
            thirds.append((g, config, problems, members, state_reads))
        wait_in_order([a for *_, states in thirds for *_, a in states])
        return thirds


def _with(view: GroupView, **changes) -> GroupView:
    values = {name: getattr(view, name) for name in GroupView.__dataclass_fields__}
    values.update(changes)
    return GroupView(**values)
