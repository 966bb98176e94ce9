"""The rebalance timeline: every rebalance of a group, kept in ZooKeeper where any node reads it.

After a rebalance that wrote a generation (or failed, or was superseded, or holds a static
member's partitions while it is away), the node leading the group appends one
:class:`~coordinator.protocol.RebalanceRecord` to ``/consumers/groups/<group>/timeline``: a
ring of the last :data:`~coordinator.protocol.groups.TIMELINE_ENTRIES`, so a node that takes the
shard over (and every node's console) shows the history its predecessor wrote.

What an entry says is computed (:func:`build_record`, pure) from the group state the node just
wrote and the ring's previous entry: who joined and who left (the members after the previous
entry against those after this one), whether a topic grew, static members away, back, or
gone past their grace, members left out for not acking, and the coordinator's own reasons.

Cost: per recorded rebalance, one write fenced by the shard epoch (and a pipelined read of
the state and the ring when the node does not know them), after the members acked (never on
their path); a group's ring is one znode of
about 10 KB (entries name at most :data:`~coordinator.protocol.groups.TIMELINE_IDS` consumer ids per
list, so even a group of thousands of members stays far below ZooKeeper's 1 MB).

Not provided: telling a member that left cleanly from one whose session expired (ZooKeeper
deletes the registration the same way in both cases: both are ``leave``); rebalances of a
node that died between the members' acks and its timeline write (the next one is recorded,
with the members before taken from the last entry there is).
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from coordinator import protocol
from coordinator.errors import CorruptZnode
from coordinator.protocol import GroupState, RebalanceRecord
from coordinator.fencing import Deposed, Fence, fenced, fenced_commit
from coordinator.rebalance import Outcome
from coordinator.zkclient import TransactionFailed, wait_in_order

log = logging.getLogger("zkgroups.timeline")

JOIN, LEAVE, TOPIC_GREW, TOPIC_ADDED = "join", "leave", "topic grew", "topic added"
STATIC_AWAY, STATIC_BACK, STATIC_EXPIRED = "static member away", "static member back", "static member's grace ended"
NOT_ACKED, REPAIRED, CHANGED = "members did not ack", "ownership repaired", "membership changed"
SUPERSEDED, HELD = "Superseded", "Held"

#: How many groups' rings a node remembers (each at most a ring of ~10 KB).
RINGS_KEPT = 4096


def topic_counts(state: GroupState) -> Dict[str, int]:
    """The partition count of each topic the state assigns (its highest partition + 1)."""
    return {t: max(parts) + 1 for t, parts in state.assignment.items() if parts}


def held_until(state: GroupState) -> Dict[str, int]:
    """Static members the state holds away: consumer id -> when their grace ends (ms)."""
    return {cid: m.away_since + m.grace_ms for cid, m in state.static.items() if m.away_since is not None}


def build_record(state: GroupState, previous: Optional[RebalanceRecord], outcome: str, at: int, node: str,
                 epoch: int, detail: Sequence[str] = (), moved: Optional[int] = None,
                 duration_ms: Optional[float] = None, excluded: Sequence[str] = ()) -> RebalanceRecord:
    """The entry for a rebalance that left ``state``, after ``previous`` (the ring's newest
    entry, None for a first one); pure. Who joined and who left is known when ``previous``
    kept its members (the newest entry does, up to :data:`~coordinator.protocol.groups.TIMELINE_MEMBERS`),
    and for a group's first generation (nobody was there before)."""
    after = set(state.members)
    if previous is None:  # a group's first rebalance starts from nobody; a later first entry does not know
        before: Optional[set] = set() if state.generation <= 1 else None
    else:
        before = None if previous.members is None else set(previous.members)
    joined = sorted(after - before) if before is not None else []
    gone = sorted(before - after) if before is not None else []
    was_held = set(previous.held) if previous else set()
    expired = [cid for cid in gone if cid in was_held]
    left = [cid for cid in gone if cid not in was_held]
    reasons: List[str] = []
    if joined:
        reasons.append(JOIN)
    if left:
        reasons.append(LEAVE)
    if expired:
        reasons.append(STATIC_EXPIRED)
    counts, earlier = topic_counts(state), (previous.topics if previous else {})
    if any(t in earlier and n > earlier[t] for t, n in counts.items()):
        reasons.append(TOPIC_GREW)
    if previous is not None and any(t not in earlier for t in counts):
        reasons.append(TOPIC_ADDED)
    held = held_until(state)
    if set(held) - was_held:
        reasons.append(STATIC_AWAY)
    if any("static members" in d and "returned" in d for d in detail):
        reasons.append(STATIC_BACK)
    if excluded:
        reasons.append(NOT_ACKED)
    if not reasons:
        reasons.append(CHANGED if before is None or any("membership" in d for d in detail) else REPAIRED)
    return RebalanceRecord(generation=state.generation, at=at, outcome=outcome, node=node, epoch=epoch,
                           reasons=reasons, detail=list(detail),
                           members_before=previous.members_after if previous is not None else
                           (0 if before is not None else None),
                           members_after=len(after), joined=joined, left=left + expired, topics=counts,
                           moved=moved, duration_ms=duration_ms, error=state.error, excluded=sorted(excluded),
                           held=held, members=sorted(after))


class TimelineRecorder:
    """Appends entries to the timelines of the groups a node leads. Its handler threads call
    :meth:`record`; a group is never handled by two threads of a node at once, and the shard
    fence keeps other nodes out, so two records of one group never race.

    It remembers the ring it last wrote of each group (at most :data:`RINGS_KEPT`) with its
    znode version, and the run hands it the state it left, so an entry costs one write and no
    read: a cold start of 1,000 groups read 2,000 znodes for nothing. The write is made at that
    version; if another node wrote the ring since (the shard moved away and back), it fails,
    and the entry is made again from the ring as read. Everything an entry needs is in
    ZooKeeper: a node taking a group over goes on from the entries its predecessor wrote.

    Nothing here raises into the rebalance: a failed write is one warning (the group was
    rebalanced; only its history misses a line)."""

    def __init__(self, client, node_id: str):
        self.client, self.node_id = client, node_id
        self._rings: Dict[str, Tuple[List[RebalanceRecord], int]] = {}  # group -> (ring, znode version)
        self._lock = threading.Lock()  # guards _rings' size, not a group's entry (one thread each)

    def record(self, group: str, fence: Fence, outcome: Optional[Outcome] = None, failed: bool = False,
               superseded: bool = False) -> None:
        """Record the rebalance of ``group`` that just ended: ``outcome`` (it wrote a
        generation; or, unchanged with a static member held away, a hold), ``failed``
        (retries exhausted) or ``superseded`` (the group changed while its members applied it)."""
        try:
            try:
                self._record(group, fence, outcome, failed, superseded, self._rings.pop(group, None))
            except TransactionFailed as e:
                if e.index != 1 or not isinstance(e.error, (BadVersionError, NodeExistsError, NoNodeError)):
                    raise
                self._record(group, fence, outcome, failed, superseded, None)  # written since: read it
        except Deposed:
            pass  # another node leads the group now: its history is that node's to write
        except (KazooException, TransactionFailed, CorruptZnode) as e:
            log.warning("group %s: its rebalance timeline was not updated (%s)", group, type(e).__name__,
                        extra={"group": group, "error": type(e).__name__})

    def _record(self, group: str, fence: Fence, outcome: Optional[Outcome], failed: bool, superseded: bool,
                known: Optional[Tuple[List[RebalanceRecord], int]]) -> None:
        path = protocol.timeline_path(group)
        state = outcome.final_state if outcome is not None else None
        ring, version = known if known is not None else ([], None)
        if state is None or known is None:
            state_async = None if state is not None else self.client.get_async(protocol.state_path(group))
            ring_async = None if known is not None else self.client.get_async(path)
            wait_in_order([a for a in (state_async, ring_async) if a is not None])
            if state_async is not None:
                state = GroupState.decode(state_async.get()[0], protocol.state_path(group))
            if ring_async is not None:
                ring, version = self._read_ring(group, ring_async)
        previous = ring[-1] if ring else None
        if outcome is not None and not outcome.changed:
            # A static member held away: recorded once per hold (every check until it ends finds the same).
            if previous is not None and previous.held == held_until(state):
                self._keep(group, ring, version)
                return
            kind = HELD
        else:
            kind = protocol.FAILED if failed else SUPERSEDED if superseded else state.state
        entry = build_record(state, previous, kind, protocol.now_ms(), self.node_id, fence.epoch,
                             detail=outcome.reasons if outcome else (),
                             moved=outcome.moved if outcome and kind != HELD else None,
                             duration_ms=outcome.duration_ms if outcome and kind != HELD else None,
                             excluded=outcome.excluded if outcome else ())
        t = fenced(self.client, fence)
        ring = (ring + [entry])[-protocol.TIMELINE_ENTRIES:]
        data = protocol.encode_timeline(ring)
        if version is None:
            t.create(path, data)
        else:
            t.set_data(path, data, version=version)
        written = fenced_commit(t, fence)[1]
        self._keep(group, ring, getattr(written, "version", 0))

    @staticmethod
    def _read_ring(group: str, ring_async) -> Tuple[List[RebalanceRecord], Optional[int]]:
        """The ring as read and its version (None: there is none yet); a damaged one starts again."""
        path = protocol.timeline_path(group)
        try:
            raw, stat = ring_async.get()
            version: Optional[int] = stat.version
        except NoNodeError:
            raw, version = b"", None
        try:
            return protocol.decode_timeline(raw, path), version
        except CorruptZnode as e:
            log.error("group %s: %s; its timeline starts again", group, e)
            return [], version

    def _keep(self, group: str, ring: List[RebalanceRecord], version: Optional[int]) -> None:
        if version is None:
            return
        with self._lock:
            if len(self._rings) >= RINGS_KEPT:
                self._rings.pop(next(iter(self._rings)))  # the longest kept
            self._rings[group] = (ring, version)
