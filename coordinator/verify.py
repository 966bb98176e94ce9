"""Verification: proving a group's ownership is still what was verified, without reading it all.

Verification is what a rebalance run does when nothing needs commands: it proves that the
owner nodes are as the state says. A verified group's state records the zxids it saw
(:class:`~coordinator.protocol.GroupState` ``verified``, built by :func:`verified_record`),
and the node keeps a :class:`Fingerprint`: while they are unchanged the group is not read
again (the periodic check compares zxids only), and a node taking the group over trusts the
record instead of reading every owner node (:func:`still_as_recorded`, all the groups of a
shard at once). Every change to members, channels, owner nodes, the state or the topics'
partition counts changes a zxid or a count; an owner node rewritten in place (which no member
does) is caught by the periodic full check.

The reads here are one or two pipelined round trips each: :func:`still_as_verified` (a run's
shortcut), :func:`owners_as_assigned` (after every member acked), :func:`still_as_recorded`
(a shard taken over). :func:`recorded_plan` is pure: the plan a verified state holds, while
none of its inputs changed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from kazoo.exceptions import NoNodeError

from coordinator import protocol
from coordinator.errors import CorruptZnode
from coordinator.plan import Plan, Snapshot
from coordinator.protocol import GroupState, Ownership
from coordinator.zkclient import children_and_pzxid, wait_in_order


@dataclass(frozen=True)
class Fingerprint:
    """What a verified group looked like, in zxids: while none of them changed (and neither did
    the partition counts of its topics), neither did its members, their channels, its state or
    its owner nodes, so its ownership is still what was verified. pzxid (the zxid of a znode's
    last child change) and mzxid are unique in the whole ensemble, so a znode deleted and made
    again never matches. An owner node rewritten in place (set_data, which no member does)
    changes no pzxid: the periodic full check still reads every owner node now and then."""
    state_mzxid: Optional[int]
    ids_pzxid: int
    channel_pzxid: int
    owners: Tuple[Tuple[str, int], ...]     # (topic, pzxid of owners/<topic>) for the assigned topics
    topics: Tuple[Tuple[str, int], ...]     # (topic, partition count) of the topics the members use

    def paths(self, group: str) -> List[str]:
        """The znodes whose stats this fingerprint records, in :meth:`matches` order."""
        return ([protocol.state_path(group), protocol.ids_path(group), protocol.channel_path(group)]
                + [protocol.owners_path(group, t) for t, _ in self.owners])

    def matches(self, stats, topics: Dict[str, int]) -> bool:
        """Whether the stats of :meth:`paths` (None where missing) and the partition counts are unchanged."""
        if any(stat is None for stat in stats[1:]):
            return False
        state, ids, channels, owners = stats[0], stats[1], stats[2], stats[3:]
        return ((state.mzxid if state else None) == self.state_mzxid and ids.pzxid == self.ids_pzxid
                and channels.pzxid == self.channel_pzxid
                and tuple(o.pzxid for o in owners) == tuple(z for _, z in self.owners)
                and all(topics.get(t) == n for t, n in self.topics))


def fingerprint(snapshot: Snapshot, plan: Plan, owner_pzxids: Dict[str, int]) -> Fingerprint:
    used = sorted({t for subs in plan.members.values() for t in subs})
    return Fingerprint(snapshot.state_mzxid, snapshot.ids_pzxid, snapshot.channel_pzxid,
                       tuple(sorted(owner_pzxids.items())), tuple((t, snapshot.topics.get(t, 0)) for t in used))


def verified_record(snapshot: Snapshot, plan: Plan, owner_pzxids: Dict[str, int]) -> Dict:
    """What the state records of a verification (:attr:`GroupState.verified`): the pzxids seen
    and the partition counts of the topics the plan used."""
    return {"ids": snapshot.ids_pzxid, "channel": snapshot.channel_pzxid, "owners": dict(owner_pzxids),
            "topics": used_partitions(plan.members, snapshot.topics)}


def used_partitions(members: Dict[str, Dict[str, int]], topics: Dict[str, int]) -> Dict[str, int]:
    """The partition counts of the topics some member resolved to (those a verification records)."""
    subscribed = {t for subs in members.values() for t in subs}
    return {t: n for t, n in topics.items() if t in subscribed}


def recorded_plan(snapshot: Snapshot) -> Optional[Plan]:
    """The plan the state holds, when none of its inputs changed since it was verified: the same
    members (ids/ and channel/ unchanged since, every member in the state, none rejected) and
    the same partition counts of the topics they resolve to now. The assignors are pure, so
    computing it again would give the state's assignment; None when that cannot be known."""
    record, state = snapshot.state.verified, snapshot.state
    if (not record or "topics" not in record or record["ids"] != snapshot.ids_pzxid
            or record["channel"] != snapshot.channel_pzxid or snapshot.rejected
            or sorted(snapshot.members) != sorted(state.members)):
        return None
    members = {cid: reg.topics(snapshot.topics) for cid, reg in snapshot.members.items()}
    if used_partitions(members, snapshot.topics) != record["topics"]:
        return None
    return Plan(members, state.strategy, state.assignment)


def owners_as_assigned(client, group: str, assignment: Ownership) -> Optional[Dict[str, int]]:
    """After every member acked a generation: the pzxid of each owners/<topic> if exactly the
    assigned partitions have owner nodes (one pipelined round trip), else None. Who holds them
    needs no read: a member acks only once it created the owner nodes of all it was given,
    with its stream in them, and owner nodes are never rewritten; a member gone since then
    changed ids/ too, which the record shows."""
    listings = {t: client.get_children_async(protocol.owners_path(group, t), include_data=True) for t in assignment}
    wait_in_order(list(listings.values()))
    pzxids = {}
    for topic, pending in listings.items():
        children, pzxid = children_and_pzxid(pending)
        if set(children) != {str(p) for p in assignment[topic]}:
            return None
        pzxids[topic] = pzxid
    return pzxids


def still_as_verified(client, snapshot: Snapshot, plan: Plan) -> Optional[Dict[str, int]]:
    """The owners' pzxids if the state records a verification that still holds: members and
    channels unchanged since (the snapshot shows the same pzxids), the plan's topics those it
    verified, and their owner nodes unchanged (one pipelined round trip). None otherwise."""
    record = snapshot.state.verified
    if (not record or record["ids"] != snapshot.ids_pzxid or record["channel"] != snapshot.channel_pzxid
            or set(record["owners"]) != set(plan.assignment)):
        return None
    stats = [(t, client.exists_async(protocol.owners_path(snapshot.group, t))) for t in record["owners"]]
    wait_in_order([a for _, a in stats])
    now = _pzxids(stats)
    return now if now == record["owners"] else None


def _pzxids(stats) -> Dict[str, int]:
    """{topic: pzxid} from (topic, async exists of owners/<topic>) pairs (-1 where missing)."""
    return {t: (a.get().pzxid if a.get() is not None else -1) for t, a in stats}


def still_as_recorded(client, groups) -> Dict[str, Fingerprint]:
    """The groups among ``groups`` whose state records a verification that still holds, with
    their fingerprints: what a node taking a shard over needs to know before it may report the
    shard verified. Two pipelined round trips for all the groups (the states and the stats of
    ids/ and channel/; then each assigned owners/<topic> and the recorded topics' znodes),
    four requests a group and one a topic, no registration read.

    A group qualifies when its state is Stable or Empty with a ``verified`` record, has no
    static members, the pzxids of ids/, channel/ and every assigned owners/<topic> are the
    recorded ones, and its topics still have the recorded partition counts: then no member
    came or went, no owner node was made or deleted, and no partition was added since the
    owner nodes were found as the state assigns them. The others need a full run.

    The partition counts are read here, not taken from the caller's view of the topics: that
    view follows watch events, which may still be on their way when a shard changes hands, and
    a topic that grew just before the handover would be trusted unchanged. Read here, after
    the caller set its topic watches, a growth is either in this read or fires a watch."""
    first = [(g, client.get_async(protocol.state_path(g)), client.exists_async(protocol.ids_path(g)),
              client.exists_async(protocol.channel_path(g))) for g in groups]
    wait_in_order([a for *_, a in first])
    candidates = []
    for group, state_async, ids_async, channels_async in first:
        try:
            raw, stat = state_async.get()
            state = GroupState.decode(raw, protocol.state_path(group))
        except (NoNodeError, CorruptZnode):
            continue
        ids, channels, record = ids_async.get(), channels_async.get(), state.verified
        if (ids is None or channels is None or not record or "topics" not in record or state.static
                or state.state not in (protocol.STABLE, protocol.EMPTY)
                or record["ids"] != ids.pzxid or record["channel"] != channels.pzxid
                or set(record["owners"]) != set(state.assignment)):
            continue
        owners = [(t, client.exists_async(protocol.owners_path(group, t))) for t in record["owners"]]
        candidates.append((group, stat.mzxid, record, owners))
    topic_reads = {t: client.get_async(protocol.topic_path(t)) for *_, record, _ in candidates for t in record["topics"]}
    wait_in_order([a for *_, owners in candidates for _, a in owners] + list(topic_reads.values()))
    topics = _partition_counts(topic_reads)
    out = {}
    for group, mzxid, record, owners in candidates:
        now = _pzxids(owners)
        if now == record["owners"] and all(topics.get(t) == n for t, n in record["topics"].items()):
            out[group] = Fingerprint(mzxid, record["ids"], record["channel"], tuple(sorted(now.items())),
                                     tuple(sorted(record["topics"].items())))
    return out


def _partition_counts(reads) -> Dict[str, int]:
    """{topic: partition count} from (topic: async get of its znode); missing or unreadable ones left out."""
    out = {}
    for topic, a in reads.items():
        try:
            raw, _ = a.get()
            out[topic] = protocol.decode_topic(raw, protocol.topic_path(topic))
        except (NoNodeError, CorruptZnode):
            continue
    return out
