"""The JSON documents of zkgroups' read views: one schema for ``groupctl ... --output json``,
the console's ``/api/v1`` and its pages (field names in docs/reference/output.md).

Every function here is pure: it shapes what was read (by ``groupctl`` from ZooKeeper and the
data plane at once, by the console from its watched snapshot and its lag sampler) into rows,
dicts with the field names of the documents. Missing values are None.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from coordinator import protocol
from coordinator.protocol import GroupState, LeaderInfo, Registration
from coordinator.protocol.share import ACQUIRED
from coordinator.share_partition import counts as share_counts


@dataclass
class GroupSnapshot:
    """One group as read from ZooKeeper: its state, live members' registrations and the ids
    of members whose registration is unreadable (id -> the problem)."""
    group: str
    state: GroupState
    members: Dict[str, Registration]
    unreadable: Dict[str, str] = field(default_factory=dict)

    def owners(self) -> Dict[Tuple[str, int], str]:
        """{(topic, partition): consumer id} of the group state's assignment."""
        return {(topic, p): protocol.consumer_of_stream(stream)
                for topic, parts in self.state.assignment.items() for p, stream in parts.items()}

    def member_ids(self) -> List[str]:
        return sorted({*self.members, *self.unreadable})


# ---------------------------------------------------------------- groups list

def list_row(group: str, state: Optional[GroupState], members: Optional[int], error: Optional[str] = None) -> dict:
    """A row of ``groups list``: a group whose state is unreadable has ``error`` and None elsewhere."""
    if state is None:
        return {"group": group, "state": None, "generation": None, "members": None, "error": error}
    return {"group": group, "state": state.state, "generation": state.generation, "members": members, "error": None}


# ---------------------------------------------------------------- offsets view

def group_partitions(snapshot: GroupSnapshot, offset_topics: Mapping[str, Set[int]],
                     counts: Mapping[str, int]) -> Dict[str, Set[int]]:
    """{topic: partitions} of the group's topics: those it is assigned, has committed offsets
    for (``offset_topics``: its offsets znodes), or its live members subscribe to; every
    partition of each (``counts``: the data plane's partition counts), and any partition the
    assignment or an offsets znode names."""
    found: Dict[str, Set[int]] = {t: set(parts) for t, parts in snapshot.state.assignment.items()}
    for topic, parts in offset_topics.items():
        found.setdefault(topic, set()).update(parts)
    for registration in snapshot.members.values():
        for topic in registration.topics(counts):
            found.setdefault(topic, set())
    for topic, parts in found.items():
        parts.update(range(counts.get(topic, 0)))
    return found


def partitions_to_read(partitions: Mapping[str, Set[int]], counts: Mapping[str, int]) -> Dict[str, List[int]]:
    """The partitions whose log end to ask the data plane for: all of each topic's but those
    beyond the data plane's partition count (a topic it does not know: all)."""
    return {t: [p for p in sorted(parts) if counts.get(t) is None or p < counts[t]]
            for t, parts in sorted(partitions.items())}


def partition_pairs(partitions: Mapping[str, Set[int]]) -> List[Tuple[str, int]]:
    return [(topic, p) for topic in sorted(partitions) for p in sorted(partitions[topic])]


def offsets_rows(snapshot: GroupSnapshot, pairs: Sequence[Tuple[str, int]], committed: Mapping,
                 problems: Mapping, ends: Mapping[Tuple[str, int], int]) -> List[dict]:
    """The offsets view of one group: a row per (topic, partition) of ``pairs`` with its
    committed offset, log end, lag and owner (``problems``: why a committed offset is unreadable);
    its lag in seconds is None until :func:`coordinator.lagtime.fill` sets it."""
    owners = snapshot.owners()
    rows = []
    for pair in pairs:
        topic, p = pair
        current, end = committed.get(pair), ends.get(pair)
        owner = owners.get(pair)
        registration = snapshot.members.get(owner) if owner else None
        rows.append({"group": snapshot.group, "topic": topic, "partition": p, "current_offset": current,
                     "log_end_offset": end, "lag": None if current is None or end is None else end - current,
                     "consumer_id": owner, "host": registration.host if registration else None,
                     "client_id": registration.client_id if registration else None,
                     "error": problems.get(pair),
                     # set by coordinator.lagtime.fill where the records' timestamps are read
                     "lag_seconds": None, "estimated_lag_seconds": None})
    return rows


# ---------------------------------------------------------------- members view

def members_rows(snapshot: GroupSnapshot) -> List[dict]:
    """The members view of one group: a row per live member with what it is assigned."""
    assigned: Dict[str, Dict[str, List[int]]] = {}
    for (topic, p), owner in sorted(snapshot.owners().items()):
        assigned.setdefault(owner, {}).setdefault(topic, []).append(p)
    rows = []
    for cid in snapshot.member_ids():
        reg = snapshot.members.get(cid)
        assignment = assigned.get(cid, {})
        rows.append({"group": snapshot.group, "consumer_id": cid, "host": reg.host if reg else None,
                     "client_id": reg.client_id if reg else None,
                     "partitions": sum(len(parts) for parts in assignment.values()), "assignment": assignment,
                     "strategies": list(reg.strategies) if reg else None, "pattern": reg.pattern if reg else None,
                     "subscription": dict(reg.subscription) if reg else None,
                     "error": snapshot.unreadable.get(cid)})
    return rows


# ---------------------------------------------------------------- state view

def state_row(snapshot: GroupSnapshot, coordinator: Optional[str]) -> dict:
    """The state view of one group; ``coordinator``: the node leading the group's shard."""
    s = snapshot.state
    return {"group": snapshot.group, "coordinator": coordinator,
            "assignment_strategy": s.strategy or None, "state": s.state,
            "members": len(snapshot.member_ids()), "generation": s.generation, "error": s.error or None}


# ---------------------------------------------------------------- the coordinator

def leader_fields(info: Optional[LeaderInfo], verified: bool) -> Optional[dict]:
    """The controller as ``groupctl coordinator --output json`` shows it."""
    if info is None:
        return None
    since = dt.datetime.fromtimestamp(info.since / 1000).astimezone()
    return {"node_id": info.node_id, "host": info.host, "pid": info.pid, "epoch": info.epoch,
            "since": since.isoformat(timespec="seconds"), "since_ms": info.since, "verified_all_groups": verified}


def shard_rows(count: Optional[int], leaders: Mapping[int, Tuple[str, int, bool]], groups: Iterable[str]) -> List[dict]:
    """One row per shard: the node leading it, its epoch, whether that node verified all its
    groups, and the groups in it (``leaders``: :func:`coordinator.read.shard_leaders`'s answer)."""
    if not count:  # no controller has run yet
        return []
    members: Dict[int, List[str]] = {s: [] for s in range(count)}
    for g in groups:
        members[protocol.shard_of(g, count)].append(g)
    return [{"shard": s, "node": node or None, "epoch": epoch, "verified": verified, "groups": sorted(members[s])}
            for s, (node, epoch, verified) in sorted(leaders.items())]


def coordinator_document(info: Optional[LeaderInfo], verified: bool, contenders: Sequence[str], nodes: Iterable[str],
                         shards: List[dict]) -> dict:
    return {"leader": leader_fields(info, verified), "contenders": list(contenders), "nodes": sorted(nodes),
            "shards": shards}


# ---------------------------------------------------------------- topics

def topic_row(topic: str, partitions: Optional[int], error: Optional[str] = None) -> dict:
    return {"topic": topic, "partitions": partitions, "error": error}


def topic_partition_row(partition: int, earliest: int, latest: int, size: Optional[int], leader: Optional[int]) -> dict:
    """A row of ``topics describe``: ``bytes`` on the embedded log, ``leader`` on Kafka (else None)."""
    return {"partition": partition, "earliest": earliest, "latest": latest, "records": latest - earliest,
            "bytes": size, "leader": leader}


# ---------------------------------------------------------------- share groups

#: The columns of a share group's partitions (those of Kafka's ``kafka-share-groups.sh --describe``, and ours).
SHARE_PARTITION_COLUMNS = ("topic", "partition", "start_offset", "end_offset", "log_end_offset", "lag",
                           "in_flight", "acquired", "available", "delayed", "archived_pending", "holders",
                           "max_deliveries")


def share_partition_rows(view, log_ends: Mapping[Tuple[str, int], int]) -> List[dict]:
    """One row per share-partition of ``view`` (a :class:`coordinator.read.ShareGroupView`):
    its start (everything below is done), the window's end, the log end and the lag (records not
    done yet: from the start to the log end, less those done inside the window), what is in flight."""
    rows = []
    for (topic, partition), state in sorted(view.partitions.items()):
        c = share_counts(state)
        done = c.get("ok", 0) + c.get("ar", 0)
        end = log_ends.get((topic, partition))
        holders = sorted({holder for holder, _ in state.held.values()})
        rows.append({"topic": topic, "partition": partition, "start_offset": state.start,
                     "end_offset": state.end, "log_end_offset": end,
                     "lag": None if end is None else max(0, end - state.start - done),
                     "in_flight": state.end - state.start - done, "acquired": c.get("aq", 0),
                     "available": c.get("av", 0), "delayed": c.get("dl", 0),
                     "archived_pending": c.get("dq", 0) + c.get("dw", 0), "holders": holders,
                     "max_deliveries": max((r[3] for r in state.ranges), default=0)})
    return rows


def share_member_rows(view) -> List[dict]:
    """One row per member of ``view``: its id, host, client id, topics or pattern, records held."""
    held: Dict[str, int] = {}
    for state in view.partitions.values():
        for first, last, s, _, token, _ in state.ranges:
            if s == ACQUIRED:
                holder = state.held[token][0]
                held[holder] = held.get(holder, 0) + last - first + 1
    return [{"member_id": m, "host": info.host, "client_id": info.client_id,
             "subscription": info.pattern or ",".join(info.topics), "records_held": held.get(m, 0)}
            for m, info in sorted(view.members.items())]


def share_group_document(view, log_ends: Mapping[Tuple[str, int], int]) -> dict:
    """A share group as ``groupctl share-groups describe --output json`` and the console's API give it."""
    return {"group": view.name, "type": "share", "settings": view.config.settings(),
            "members": share_member_rows(view), "partitions": share_partition_rows(view, log_ends),
            "problems": dict(sorted(view.problems.items()))}


def share_group_row(view) -> dict:
    """A share group in one row, as ``groupctl share-groups list --output json`` and
    ``/api/v1/share-groups`` list it: its members, share-partitions, records in flight, and the
    first znode that could not be read (``"path: problem"``, None when all could)."""
    rows = share_partition_rows(view, {})
    problem = next(iter(sorted(view.problems.items())), None)
    return {"group": view.name, "members": len(view.members), "partitions": len(rows),
            "in_flight": sum(r["in_flight"] for r in rows),
            "error": None if problem is None else f"{problem[0]}: {problem[1]}"}
