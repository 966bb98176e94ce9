"""The console's share groups: every share group (``/consumers/share-groups`` children) and,
of each, its settings, its members and every share-partition's state, read whole (a
:class:`coordinator.read.ShareGroupView`) when any of them changes, at most once per
``interval_s`` a group — a share-partition's state changes at every poll and acknowledgement, so
the console follows a busy group a second behind at most.

Cost: three watches per share group plus one per topic and share-partition, and a re-read of
all of those (pipelined, three round trips) at most once per ``interval_s`` while it is busy.
Names from ZooKeeper are joined into paths as they are (they are znode names): the console must
show a group or member no tool would accept, not fail on it.

Threads: the snapshot's own thread does everything; ``views`` is replaced entry by entry under
the snapshot's lock (readers copy it under that lock).
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional

from kazoo.exceptions import NoNodeError

from coordinator.protocol.share import SHARE_GROUPS, ShareGroupConfig, ShareMember, SharePartitionState
from coordinator.read import ShareGroupView, decoded
from coordinator.zkclient import wait_in_order

#: Reads sent at once before waiting for their answers (as the snapshot's).
BATCH = 2000
#: A busy share group is read again at most this often (its watches fire at every poll).
DEFAULT_SHARE_INTERVAL_S = 1.0


class ShareGroupsReader:
    """The share groups of a :class:`~coordinator.console.snapshot.ClusterSnapshot` (its watches,
    lock and thread)."""

    def __init__(self, snapshot, interval_s: float = DEFAULT_SHARE_INTERVAL_S):
        self.snapshot, self.interval_s = snapshot, interval_s
        self.views: Dict[str, Optional[ShareGroupView]] = {}   # None: listed, not read yet
        self._read_at: Dict[str, float] = {}   # group -> when it was last read (monotonic)
        self._due: Dict[str, float] = {}       # group -> when its deferred re-read is due

    def wait_s(self) -> float:
        """How long the snapshot may wait for events: a second, or until the next deferred group is due."""
        if not self._due:
            return 1.0
        return min(1.0, max(0.01, min(self._due.values()) - time.monotonic()))

    def due_keys(self) -> List[tuple]:
        """The events of the deferred groups now due."""
        now = time.monotonic()
        due = [g for g, at in self._due.items() if at <= now]
        for g in due:
            del self._due[g]
        return [("share", g) for g in due]

    def read_all(self) -> None:
        """Read every share group (the snapshot's resync), however recently it was."""
        self._read_at.clear()
        self._due.clear()
        read = set(self.read_names())
        with self.snapshot._lock:
            names = [g for g in self.views if g not in read]
        for i in range(0, len(names), BATCH):
            self._read(names[i:i + BATCH])

    def read_names(self) -> List[str]:
        """The share groups' names (re-arming the watch): the new ones read at once, the deleted
        dropped; returns the new ones."""
        watcher = self.snapshot._watch("share-groups")
        names = self.snapshot._children(self.snapshot.client.get_children_async(SHARE_GROUPS, watch=watcher), SHARE_GROUPS,
                               watcher) or []
        with self.snapshot._lock:
            known = set(self.views)
            gone = known - set(names)
            for g in gone:
                del self.views[g]
            new = [g for g in names if g not in known]
            for g in new:
                self.views[g] = None
        for g in gone:
            self._read_at.pop(g, None)
            self._due.pop(g, None)
        for i in range(0, len(new), BATCH):
            self._read(new[i:i + BATCH])
        if gone:
            self.snapshot._changed()
        return new

    def read_when_due(self, names: List[str]) -> None:
        """Read the share groups whose watches fired; one read less than ``share_interval_s``
        ago is deferred until then (its watches have fired: nothing is missed meanwhile)."""
        now = time.monotonic()
        ready = []
        for g in dict.fromkeys(names):
            last = self._read_at.get(g)
            if last is not None and now - last < self.interval_s:
                self._due.setdefault(g, last + self.interval_s)
            else:
                ready.append(g)
        for i in range(0, len(ready), BATCH):
            self._read(ready[i:i + BATCH])

    def _read(self, names: List[str]) -> None:
        """Read each share group whole, every read arming the group's one watcher: its znode and
        listings, then its members and topics, then its share-partitions' states (three round
        trips for all of ``names``). A znode that does not decode is in the view's ``problems``."""
        with self.snapshot._lock:
            names = [g for g in names if g in self.views]
        read = self._members_and_states(self._listings(names))
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
            with self.snapshot._lock:
                if g in self.views:
                    self.views[g] = view
        if names:
            self.snapshot._changed()

    def _listings(self, names: List[str]) -> list:
        """Round trip 1 and 2: each group's settings and listings, then its members' znodes and
        its topics' listings asked; [(group, config, problems, member reads, topic reads)]."""
        client = self.snapshot.client
        firsts = []
        for g in names:
            w, base = self.snapshot._watch("share", g), f"{SHARE_GROUPS}/{g}"
            self._read_at[g] = time.monotonic()
            self._due.pop(g, None)
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
                with self.snapshot._lock:   # deleted: the names' watch says so too
                    self.views.pop(g, None)
                continue
            config = decoded(ShareGroupConfig.decode, raw, base, problems) or ShareGroupConfig()
            ids = self.snapshot._children(members_a, base + "/members", w) or []
            topics = self.snapshot._children(topics_a, base + "/partitions", w) or []
            member_reads = [(m, f"{base}/members/{m}", client.get_async(f"{base}/members/{m}")) for m in ids]
            topic_paths = [(t, f"{base}/partitions/{t}") for t in topics]
            topic_reads = [(t, path, client.get_children_async(path, watch=w)) for t, path in topic_paths]
            seconds.append((g, w, config, problems, member_reads, topic_reads))
        wait_in_order([a for *_, ms, ts in seconds for *_, a in ms + ts])
        return seconds

    def _members_and_states(self, listed: list) -> list:
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
                state_reads += [((t, p), f"{path}/{p}", self.snapshot.client.get_async(f"{path}/{p}", watch=w))
                                for p in parts]
            thirds.append((g, config, problems, members, state_reads))
        wait_in_order([a for *_, states in thirds for *_, a in states])
        return thirds
