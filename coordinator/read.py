"""Reading zkgroups' state from ZooKeeper: the one read API of the tools, Spark, the demo,
tests and benchmarks (and of the coordinator where it only reads).

Missing znodes read as nothing: ``[]`` for children, ``None`` for the leader and offsets, an
empty :class:`GroupState` for a group's state. Znodes that are not what zkgroups writes raise
:class:`CorruptZnode` naming them; :func:`committed_offsets` and :func:`members` can report
those per item instead, so one bad znode does not hide the rest. Reads of many znodes are
pipelined (async gets: one round trip, not one per znode).
"""
from __future__ import annotations

from typing import Dict, Hashable, Iterable, List, Optional, Tuple

from kazoo.exceptions import NoNodeError

from coordinator import protocol
from coordinator.errors import CorruptZnode
from coordinator.protocol import GroupState, LeaderInfo, NodeInfo, Registration, ShardAssignment, ShardsInfo


def children(zk, path: str, watch=None) -> List[str]:
    """The children of ``path``, sorted; [] when it does not exist."""
    try:
        return sorted(zk.get_children(path, watch=watch))
    except NoNodeError:
        return []


def subtree(zk, path: str) -> List[str]:
    """``path`` and everything under it, each node after its children (the order of a delete)."""
    out = []
    for child in children(zk, path):
        out.extend(subtree(zk, f"{path}/{child}"))
    out.append(path)
    return out


def groups(zk) -> List[str]:
    return children(zk, protocol.GROUPS)


def group_state(zk, group: str) -> GroupState:
    """The leader's last decision for ``group`` (``GroupState()`` before the first)."""
    path = protocol.state_path(group)
    try:
        return GroupState.decode(zk.get(path)[0], path)
    except NoNodeError:
        return GroupState()


def leader(zk) -> Optional[LeaderInfo]:
    """The current leader's znode, or None while no coordinator leads."""
    try:
        return LeaderInfo.decode(zk.get(protocol.LEADER)[0])
    except NoNodeError:
        return None


def members(zk, group: str, problems: Optional[Dict[str, str]] = None) -> Dict[str, Registration]:
    """{consumer id: registration} of the live members. An unreadable registration raises, or
    with ``problems`` given is left out and recorded there (consumer id -> the problem)."""
    ids = children(zk, protocol.ids_path(group))
    gets = [(cid, zk.get_async(protocol.ids_path(group, cid))) for cid in ids]
    out = {}
    for cid, a in gets:
        try:
            out[cid] = Registration.decode(a.get()[0], protocol.ids_path(group, cid))
        except NoNodeError:
            continue  # left while we read
        except CorruptZnode as e:
            if problems is None:
                raise
            problems[cid] = e.problem
    return out


def committed_offsets(zk, group: str, partitions: Iterable[Tuple[str, int]],
                      problems: Optional[Dict[Hashable, str]] = None) -> Dict[Hashable, Optional[int]]:
    """The group's committed offset (next to consume; None: nothing committed) of each
    ``(topic, partition)`` pair, keyed by the pairs as given (``TopicPartition`` works). A
    corrupt offsets znode raises, or with ``problems`` given reads as None and is recorded
    there (pair -> the problem)."""
    gets = [(tp, protocol.offsets_path(group, tp[0], tp[1])) for tp in partitions]
    pending = [(tp, path, zk.get_async(path)) for tp, path in gets]
    out: Dict[Hashable, Optional[int]] = {}
    for tp, path, a in pending:
        try:
            out[tp] = protocol.decode_offset(a.get()[0], path)
        except NoNodeError:
            out[tp] = None
        except CorruptZnode as e:
            if problems is None:
                raise
            problems[tp] = e.problem
            out[tp] = None
    return out


def shard_count(zk) -> Optional[int]:
    """How many shards groups are spread over (None before the first controller ran)."""
    try:
        return ShardsInfo.decode(zk.get(protocol.SHARDS)[0]).count
    except NoNodeError:
        return None


def nodes(zk) -> Dict[str, NodeInfo]:
    """{node id: its report} of the live coordinator nodes (unreadable reports left out)."""
    ids = children(zk, protocol.NODES)
    gets = [(n, zk.get_async(protocol.node_path(n))) for n in ids]
    out = {}
    for n, a in gets:
        try:
            out[n] = NodeInfo.decode(a.get()[0], protocol.node_path(n))
        except (NoNodeError, CorruptZnode):
            continue
    return out


def shard_leaders(zk, count: Optional[int] = None) -> Dict[int, Tuple[str, int, bool]]:
    """{shard: (node id, epoch, verified)} — who leads each shard now ("" when nobody does), at
    which epoch, and whether that node reports every group of it verified at that epoch
    (``count``: the shard count, when the caller has read it)."""
    count = shard_count(zk) if count is None else count
    if count is None:
        return {}
    gets = [(s, zk.get_async(protocol.shard_path(s))) for s in range(count)]
    live = nodes(zk)
    assignments = {}
    for s, a in gets:
        try:
            assignments[s] = ShardAssignment.decode(a.get()[0], protocol.shard_path(s))
        except (NoNodeError, CorruptZnode):
            assignments[s] = ShardAssignment("", 0)
    return shard_leaders_of(count, assignments, live)


def shard_leaders_of(count: int, assignments: Dict[int, ShardAssignment],
                     live: Dict[str, NodeInfo]) -> Dict[int, Tuple[str, int, bool]]:
    """:func:`shard_leaders` from what was read: each shard's placement and the live nodes'
    reports (pure; a shard placed on a node that does not report it at that epoch has no leader)."""
    out = {}
    for s in range(count):
        assignment = assignments.get(s) or ShardAssignment("", 0)
        report = live.get(assignment.node_id)
        held = report.shards.get(s) if report else None
        led = held is not None and held["epoch"] == assignment.epoch
        out[s] = (assignment.node_id if led else "", assignment.epoch, bool(led and held["verified"]))
    return out


def group_coordinators(zk, groups: Iterable[str]) -> Dict[str, Optional[str]]:
    """{group: the node leading its shard now} (None where nobody does, or before the shards
    exist); the shard leaders are read once for all of them."""
    count = shard_count(zk)
    leaders = shard_leaders(zk, count) if count else {}
    return {g: leaders.get(protocol.shard_of(g, count), ("",))[0] or None if count else None for g in groups}


def group_coordinator(zk, group: str) -> Optional[str]:
    """The node leading ``group``'s shard now (None if nobody does, or before the shards exist)."""
    return group_coordinators(zk, [group])[group]


def all_verified(zk) -> bool:
    """Whether every shard is led by a live node that has verified all its groups (after a
    start or a failover: the coordinators have caught up)."""
    leaders = shard_leaders(zk)
    return bool(leaders) and all(node and verified for node, _, verified in leaders.values())


# ---------------------------------------------------------------- share groups

def share_groups(zk) -> List[str]:
    return children(zk, protocol.SHARE_GROUPS)


class ShareGroupView:
    """What is in ZooKeeper of one share group: its settings, its members, each share-partition's
    state (``problems``: {path: what is wrong} of the znodes that could not be read)."""

    def __init__(self, name: str, config, members: Dict[str, "protocol.ShareMember"],
                 partitions: Dict[Tuple[str, int], "protocol.SharePartitionState"], problems: Dict[str, str]):
        self.name, self.config, self.members, self.partitions, self.problems = \
            name, config, members, partitions, problems


def share_group(zk, group: str) -> Optional[ShareGroupView]:
    """The share group ``group`` (None if it does not exist). Reads pipelined; a corrupt
    znode is reported in ``problems`` and leaves the rest readable."""
    path = protocol.share_group_path(group)
    try:
        raw = zk.get(path)[0]
    except NoNodeError:
        return None
    problems: Dict[str, str] = {}
    config = decoded(protocol.ShareGroupConfig.decode, raw, path, problems) or protocol.ShareGroupConfig()
    ids = children(zk, protocol.share_members_path(group))
    member_reads = [(m, zk.get_async(protocol.share_members_path(group, m))) for m in ids]
    base = protocol.share_partitions_path(group)
    topic_reads = [(t, zk.get_children_async(f"{base}/{t}")) for t in children(zk, base)]
    state_reads = []
    for topic, answer in topic_reads:
        try:
            parts = sorted(int(p) for p in answer.get() if p.isdigit())
        except NoNodeError:
            continue
        state_reads += [((topic, p), zk.get_async(protocol.share_partitions_path(group, topic, p))) for p in parts]
    members = _gathered(member_reads, lambda m: protocol.share_members_path(group, m),
                        protocol.ShareMember.decode, problems)
    states = _gathered(state_reads, lambda tp: protocol.share_partitions_path(group, *tp),
                       protocol.SharePartitionState.decode, problems)
    return ShareGroupView(group, config, members, states, problems)


def decoded(decode, raw: bytes, path: str, problems: Dict[str, str]):
    """``decode(raw, path)``, or None with the problem recorded in ``problems`` under ``path``."""
    try:
        return decode(raw, path)
    except CorruptZnode as e:
        problems[path] = e.problem
        return None


def _gathered(reads, path_of, decode, problems: Dict[str, str]) -> dict:
    out = {}
    for key, answer in reads:
        try:
            raw = answer.get()[0]
        except NoNodeError:
            continue
        value = decoded(decode, raw, path_of(key), problems)
        if value is not None:
            out[key] = value
    return out
