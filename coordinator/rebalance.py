"""One group's rebalance as a pipeline: read → compute → diff → write → wait.

``read_snapshot``, ``read_owners``, ``find_squatters``, ``still_as_verified``,
``still_as_recorded`` (a shard taken over, all its groups at once) and ``owners_as_assigned``
are the only reads, each one or two pipelined round trips;
``compute_plan`` and ``reasons_to_rebalance`` are pure functions of what was read;
``write_commands`` is one ZooKeeper transaction fenced by the group's shard epoch (several,
each fenced, when a generation is larger than one request); ``wait_for_acks`` watches the
commands disappear. :class:`GroupRebalancer` strings them together with bounded retries.

Verification is what a run does when nothing needs commands: it proves that the owner nodes
are as the state says. A verified group's state records the zxids it saw
(:class:`~coordinator.protocol.GroupState` ``verified``), and the node keeps a
:class:`Fingerprint`: while they are unchanged the group is not read again (the periodic
check compares zxids only), and a node taking the group over trusts the record instead of
reading every owner node. Every change to members, channels, owner nodes, the state or the
topics' partition counts changes a zxid or a count; an owner node rewritten in place (which
no member does) is caught by the periodic full check.

Static members (:mod:`coordinator.static`): a static member whose registration is gone is held
for its grace (counted in the assignment, sent no command; its departure writes only the
state's ``away_since``); a returning one whose partitions are the only ones not owned gets
stop-fetcher and start-fetcher alone, at the current generation; the others get nothing.

One bad member never stops its group: a member whose registration is unreadable, that has no
command channel, or that supports no strategy the group can use is left out of the
assignment, named in one log line and in the group state's ``error``; the others are
rebalanced. A partition whose owner node is held by a session that is no member's (a
squatter: written by someone else, or left by a bug) is named the same way and left
unassigned until that node goes, instead of the members waiting for it being blamed.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple

from kazoo.exceptions import BadVersionError, NoNodeError

from coordinator import assignors, protocol, read, static
from coordinator.config import CoordinatorConfig
from coordinator.shards import Fence
from coordinator.errors import ConsumerRebalanceFailedException, CorruptZnode
from coordinator.protocol import GroupState, Ownership, Registration, StaticMember
from coordinator.zkclient import MAX_REQUEST_BYTES, TransactionFailed, commit, transaction_bytes, wait_in_order

log = logging.getLogger(__name__)

#: While waiting for acks: how often every pending command is looked at again (watches do the
#: work; this only covers a watch lost to a reconnect).
ACK_RECHECK_S = 2.0
#: How often, while waiting for acks, leadership and changes of the group are looked at.
ACK_POLL_S = 0.25
#: A create's serialized size beyond its path and data (header, ACL, flags), with room to spare.
COMMAND_OVERHEAD = 64


class Deposed(Exception):
    """The fence failed: another node leads the shard now (or the controller moved on). Stop
    writing at once."""


class Abandoned(Exception):
    """The attempt was abandoned because leadership is ending (suspension, shutdown)."""


class GroupDeleted(Exception):
    """The group's znodes were deleted while it was being rebalanced (an administrator deleted
    the group): there is nothing left to rebalance. ``first``: not said before for this
    deletion (a run queued meanwhile finds the group gone again)."""

    def __init__(self, message: str, first: bool = True):
        super().__init__(message)
        self.first = first


class Superseded(Exception):
    """The group changed while its members were applying a generation (a member joined or
    left, partitions were added): that generation is dropped for one computed afresh, as
    Kafka's coordinator goes back to PreparingRebalance when a member joins during a sync."""


# ---------------------------------------------------------------- read

@dataclass
class Snapshot:
    group: str
    members: Dict[str, Registration]
    rejected: Dict[str, str]           # consumer id -> why it cannot be a member (left out)
    topics: Dict[str, int]             # every readable topic -> partition count
    state: GroupState
    state_version: Optional[int]       # None: no state znode yet
    ids_pzxid: int = -1                # zxids of the last child change of ids/ and channel/ when read (-1: unknown)
    channel_pzxid: int = -1
    state_mzxid: Optional[int] = None  # zxid of the state znode's last write (None: no state znode)


def read_snapshot(client, group: str, topics: Dict[str, int], members_watch=None) -> Snapshot:
    """Members (registrations decoded; unreadable ones and ones without a command channel
    rejected) and the group's last state. Two pipelined round trips: the state, ids/ and
    channel/ (in that order: a member creates its channel before it registers, so every member
    listed has its channel listed), then the registrations. ``members_watch``, if given, is
    set on ids/ by the listing (or, if ids/ is missing, on its creation)."""
    path = protocol.ids_path(group)
    state_async = client.get_async(protocol.state_path(group))
    ids_async = client.get_children_async(path, watch=members_watch, include_data=True)
    channels_async = client.get_children_async(protocol.channel_path(group), include_data=True)
    ids, ids_pzxid = _children_and_pzxid(ids_async)
    if ids_pzxid == -1 and members_watch is not None and client.exists(path, watch=members_watch) is not None:
        ids, ids_pzxid = _children_and_pzxid(client.get_children_async(path, watch=members_watch,
                                                                       include_data=True))  # made meanwhile
    channels, channel_pzxid = _children_and_pzxid(channels_async)
    channels = set(channels)
    members, rejected = {}, {}
    pending = [(cid, client.get_async(protocol.ids_path(group, cid))) for cid in ids]
    wait_in_order([a for _, a in pending])
    for cid, a in pending:
        path = protocol.ids_path(group, cid)
        try:
            raw, _ = a.get()
            members[cid] = Registration.decode(raw, path)
        except NoNodeError:
            continue  # left while we read
        except CorruptZnode as e:
            rejected[cid] = e.problem
            continue
        if cid not in channels:
            del members[cid]
            rejected[cid] = f"has no command channel ({protocol.channel_path(group, cid)} is missing)"
    mzxid = None
    try:
        raw, stat = state_async.get()
        mzxid = stat.mzxid
        state, version = GroupState.decode(raw, protocol.state_path(group)), stat.version
    except NoNodeError:
        state, version = GroupState(), None
    except CorruptZnode as e:
        # Our own znode, damaged by someone: overwrite it with a fresh decision. Every
        # generation was written at least once, so the znode version bounds the last one.
        log.error("group %s: %s; it will be rewritten", group, e)
        _, stat = client.get(protocol.state_path(group))
        state, version = GroupState(generation=stat.version), stat.version
    return Snapshot(group, members, rejected, topics, state, version, ids_pzxid, channel_pzxid, mzxid)


def _children_and_pzxid(pending) -> Tuple[List[str], int]:
    """A get_children(include_data=True) answer: sorted children and the parent's pzxid ([] and -1 if missing)."""
    try:
        children, stat = pending.get()
    except NoNodeError:
        return [], -1
    return sorted(children), stat.pzxid


def read_owners(client, group: str, topics, pzxids: Optional[Dict[str, int]] = None) -> Ownership:
    """Who holds each partition now: topic -> partition -> stream id (ephemeral owner nodes).
    ``pzxids``, if given, receives each owners/<topic> znode's pzxid as listed (before the
    owner nodes were read: a change after the listing shows as a newer one)."""
    children = {t: client.get_children_async(protocol.owners_path(group, t), include_data=True) for t in topics}
    gets = []
    for topic, a in children.items():
        listed, pzxid = _children_and_pzxid(a)
        if pzxids is not None:
            pzxids[topic] = pzxid
        for p in listed:
            gets.append((topic, p, client.get_async(protocol.owners_path(group, topic, p))))
    wait_in_order([a for _, _, a in gets])
    owners: Ownership = {}
    for topic, p, a in gets:
        try:
            raw, _ = a.get()
            owners.setdefault(topic, {})[int(p)] = raw.decode(errors="replace")
        except (NoNodeError, ValueError):
            continue
    return owners


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


def fingerprint(snapshot: Snapshot, plan: "Plan", owner_pzxids: Dict[str, int]) -> Fingerprint:
    used = sorted({t for subs in plan.members.values() for t in subs})
    return Fingerprint(snapshot.state_mzxid, snapshot.ids_pzxid, snapshot.channel_pzxid,
                       tuple(sorted(owner_pzxids.items())), tuple((t, snapshot.topics.get(t, 0)) for t in used))


def verified_record(snapshot: Snapshot, plan: "Plan", owner_pzxids: Dict[str, int]) -> Dict:
    """What the state records of a verification (:attr:`GroupState.verified`): the pzxids seen
    and the partition counts of the topics the plan used."""
    return {"ids": snapshot.ids_pzxid, "channel": snapshot.channel_pzxid, "owners": dict(owner_pzxids),
            "topics": _used_partitions(plan.members, snapshot.topics)}


def _used_partitions(members: Dict[str, Dict[str, int]], topics: Dict[str, int]) -> Dict[str, int]:
    subscribed = {t for subs in members.values() for t in subs}
    return {t: n for t, n in topics.items() if t in subscribed}


def recorded_plan(snapshot: Snapshot) -> Optional["Plan"]:
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
    if _used_partitions(members, snapshot.topics) != record["topics"]:
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
        children, pzxid = _children_and_pzxid(pending)
        if set(children) != {str(p) for p in assignment[topic]}:
            return None
        pzxids[topic] = pzxid
    return pzxids


def still_as_verified(client, snapshot: Snapshot, plan: "Plan") -> Optional[Dict[str, int]]:
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


# ---------------------------------------------------------------- compute

def find_squatters(client, group: str, partitions) -> Dict[Tuple[str, int], int]:
    """Owner nodes among ``partitions`` ((topic, partition) pairs) held by a session that holds
    no registration in the group: {(topic, partition): that session}. Members register before
    they claim and release their owner nodes before (or with) their registration, so such a
    node is not a member's, and only its session ending or someone deleting it frees it."""
    partitions = list(partitions)
    if not partitions:
        return {}
    ids = read.children(client, protocol.ids_path(group))
    registrations = [client.exists_async(protocol.ids_path(group, cid)) for cid in ids]
    owners = [(tp, client.exists_async(protocol.owners_path(group, *tp))) for tp in partitions]
    wait_in_order([a for _, a in owners])
    sessions = {stat.ephemeralOwner for stat in (a.get() for a in registrations) if stat is not None}
    out = {}
    for tp, a in owners:
        stat = a.get()
        if stat is not None and stat.ephemeralOwner not in sessions:
            out[tp] = stat.ephemeralOwner
    return out


@dataclass
class Plan:
    members: Dict[str, Dict[str, int]]     # consumer id -> {topic: streams}, resolved (held ones included)
    strategy: str
    assignment: Ownership
    left_out: Dict[str, str] = field(default_factory=dict)   # consumer id -> why it cannot use the strategy
    held: Set[str] = field(default_factory=set)               # away static members: no command for them
    static: Dict[str, StaticMember] = field(default_factory=dict)   # the state's record of static members

    def recipients(self) -> List[str]:
        """The members commands go to (the held ones are away)."""
        return sorted(set(self.members) - self.held)

    def shares(self) -> Dict[str, Ownership]:
        """Each member's part of the assignment (one pass over it)."""
        out: Dict[str, Ownership] = {cid: {} for cid in self.members}
        for topic, parts in self.assignment.items():
            for p, stream in parts.items():
                out.setdefault(protocol.consumer_of_stream(stream), {}).setdefault(topic, {})[p] = stream
        return out


def compute_plan(snapshot: Snapshot, excluded=(), unavailable=frozenset(), hold: Optional[static.Hold] = None) -> Plan:
    """The target assignment for the members not excluded (pure). Members that cannot use the
    group's strategy are left out (``Plan.left_out``); ``unavailable`` (topic, partition)
    pairs (held by squatters) are left unassigned. Static members ``hold`` keeps while they
    are away count as members with the registration the state recorded for them."""
    hold = hold or static.Hold()
    regs = {cid: r for cid, r in snapshot.members.items() if cid not in excluded}
    regs.update({cid: hold.static[cid].registration() for cid in hold.held})
    if not regs:
        return Plan({}, "", {})
    strategy, left_out = assignors.settle_strategy({cid: r.strategies for cid, r in regs.items()},
                                                   snapshot.state.strategy)
    members = {cid: r.topics(snapshot.topics) for cid, r in regs.items() if cid not in left_out}
    records = {cid: m for cid, m in hold.static.items() if cid in members}
    if not members:
        return Plan({}, "", {}, left_out)
    subscribed = {t for subs in members.values() for t in subs}
    partitions = {t: n for t, n in snapshot.topics.items() if t in subscribed}
    # The last assignment lets the sticky strategy keep partitions where they are.
    assignment = assignors.assign(strategy, members, partitions, snapshot.state.assignment)
    if unavailable:
        assignment = {t: {p: s for p, s in parts.items() if (t, p) not in unavailable}
                      for t, parts in assignment.items()}
    return Plan(members, strategy, assignment, left_out, hold.held & set(members), records)


def reasons_to_rebalance(snapshot: Snapshot, plan: Plan, owners: Optional[Ownership]) -> List[str]:
    """Why the group needs new commands (seed 001, D.3); empty means ownership is correct.

    ``owners=None`` checks only what the snapshot shows; pass the owner nodes to verify them.
    """
    state = snapshot.state
    reasons = []
    if sorted(state.members) != sorted(plan.members):
        reasons.append("membership changed")
    if not state.assignment and plan.assignment:
        reasons.append("no ownership registered")
    elif state.assignment != plan.assignment:
        reasons.append("ownership differs from the computed assignment")
    if reasons or owners is None:
        return reasons
    away = plan.held  # nobody owns an away member's partitions, and nobody should
    wanted = {(t, p): s for t, parts in plan.assignment.items() for p, s in parts.items()
              if protocol.consumer_of_stream(s) not in away}
    held = {(t, p): s for t, parts in owners.items() for p, s in parts.items()
            if protocol.consumer_of_stream(s) not in away}
    if any(tp not in held for tp in wanted):
        reasons.append("partitions not owned")
    if any(tp not in wanted for tp in held):
        reasons.append("owned partitions no longer assigned")
    if any(held[tp] != s for tp, s in wanted.items() if tp in held):
        reasons.append("partitions owned by the wrong stream")
    return reasons


# ---------------------------------------------------------------- write

def _write_state(t, group: str, state: GroupState, version: Optional[int]) -> None:
    if version is None:
        t.create(protocol.state_path(group), state.encode())
    else:
        t.set_data(protocol.state_path(group), state.encode(), version=version)


def fenced(client, fence: Fence):
    """A transaction whose first operation checks ``fence`` (commit it with :func:`fenced_commit`)."""
    t = client.transaction()
    t.check(fence.path, fence.epoch)
    return t


def fenced_commit(t, fence: Fence) -> list:
    """Commit a transaction whose first operation is the fence's check; Deposed if it failed."""
    try:
        return commit(t)
    except TransactionFailed as e:
        if e.index == 0 and isinstance(e.error, (BadVersionError, NoNodeError)):  # bumped, or deleted
            raise Deposed(f"epoch {fence.epoch} of {fence.path} is no longer current") from None
        raise


def write_state(client, fence: Fence, group: str, state: GroupState, version: Optional[int]) -> Optional[int]:
    """Write the group state, fenced; return the zxid of the write (the state znode's mzxid
    now) when ZooKeeper says it (an update does; a creation does not: None)."""
    t = fenced(client, fence)
    _write_state(t, group, state, version)
    written = fenced_commit(t, fence)[1]
    return getattr(written, "mzxid", None)


def write_commands(client, fence: Fence, snapshot: Snapshot, plan: Plan, generation: int,
                   stale: List[str], squatted=None, recipients: Optional[List[str]] = None) -> Dict[str, List[str]]:
    """Fenced transactions: state Rebalancing, then stop-fetcher and start-fetcher for every
    recipient (default: every member not held away; in that order, so each channel holds stop
    before start), and the removal of ``stale`` command paths. Returns consumer id -> [stop
    path, start path].

    Normally one transaction. One larger than ZooKeeper takes (:data:`MAX_REQUEST_BYTES`: a
    group of hundreds of members on thousands of partitions) is split: the state and the stale
    removals first, then the members' command pairs, as many per transaction as fit. Every
    part checks the fence as its first operation, so a deposed node's part fails whole, and a
    member's pair is never split. Parts written before a failure are harmless: the state
    already names this generation, a later attempt writes a newer one, members apply only the
    newest commands, and no partition can have two owners (owner nodes are exclusive)."""
    group = snapshot.group
    epoch = fence.epoch
    state = GroupState(generation, protocol.REBALANCING, list(plan.members), plan.assignment,
                       plan.strategy, problems(snapshot, plan, squatted), epoch, static=plan.static)
    order = sorted(plan.recipients() if recipients is None else recipients)
    shares = plan.shares()
    pairs = []
    for cid in order:
        prefix = protocol.command_prefix(group, cid)
        pairs.append((prefix, protocol.Command(protocol.STOP_FETCHER, generation, epoch, consumer_id=cid).encode(),
                      protocol.Command(protocol.START_FETCHER, generation, epoch, shares[cid],
                                       consumer_id=cid).encode()))
    t = fenced(client, fence)
    _write_state(t, group, state, snapshot.state_version)
    for path in stale:
        t.delete(path)
    parts, size = [t], transaction_bytes(t)
    path_bytes = len(client.chroot or "") + COMMAND_OVERHEAD  # kazoo sends paths with the chroot in front
    for prefix, stop, start in pairs:
        pair_bytes = 2 * (len(prefix) + path_bytes) + len(stop) + len(start)
        if size + pair_bytes > MAX_REQUEST_BYTES:
            t = fenced(client, fence)
            parts.append(t)
            size = transaction_bytes(t)
        t.create(prefix, stop, sequence=True)
        t.create(prefix, start, sequence=True)
        size += pair_bytes
    created: List[str] = []
    for i, part in enumerate(parts):
        results = fenced_commit(part, fence)
        created += results[1 + (1 + len(stale) if i == 0 else 0):]
    return {cid: created[2 * i:2 * i + 2] for i, cid in enumerate(order)}


def problems(snapshot: Snapshot, plan: Plan, squatted: Optional[Dict[Tuple[str, int], int]] = None) -> str:
    """What keeps the group from being whole, for the state's ``error`` (empty if nothing)."""
    out = [f"member {cid} left out: {why}" for cid, why in sorted({**snapshot.rejected, **plan.left_out}.items())]
    out += [f"partition {t}-{p} held by session 0x{sid:x}, which is not a member"
            for (t, p), sid in sorted((squatted or {}).items())]
    return "; ".join(out)


# ---------------------------------------------------------------- wait

def wait_for_acks(client, commands: Dict[str, List[str]], timeout: float,
                  abort: Callable[[], bool], changed: Callable[[], bool] = lambda: False) -> Set[str]:
    """Wait until every member deleted its start-fetcher command (its ack); return the members
    to leave out of the next attempt. A watch per command reports its deletion; every
    :data:`ACK_RECHECK_S` all pending commands are checked again, in case a watch was lost
    to a reconnect; ``abort`` and ``changed`` are looked at every :data:`ACK_POLL_S`.

    A member that did not even ack its stop-fetcher is the one holding the group up; members
    that acked stop but not start are usually waiting for its owner nodes, so they are only
    blamed when nobody is stuck at stop."""
    pending = {paths[-1]: cid for cid, paths in commands.items()}
    deleted: Set[str] = set()
    woken = threading.Condition()

    def watch(event):  # kazoo's thread: record only
        with woken:
            deleted.add(event.path)
            woken.notify()

    deadline = time.monotonic() + timeout
    recheck = 0.0
    while pending:
        if abort():
            raise Abandoned("leadership is ending")
        if changed():
            raise Superseded("the group changed")
        now = time.monotonic()
        if now >= recheck:
            recheck = now + ACK_RECHECK_S
            checks = [(path, client.exists_async(path, watch=watch)) for path in pending]
            wait_in_order([a for _, a in checks])
            for path, a in checks:
                if a.get() is None:
                    del pending[path]
        with woken:
            for path in deleted & set(pending):
                del pending[path]
            deleted.clear()
            remaining = deadline - time.monotonic()
            if not pending or remaining <= 0:
                break
            woken.wait(min(remaining, ACK_POLL_S, max(0.0, recheck - time.monotonic())))
    if not pending:
        return set()
    late = set(pending.values())
    stuck = {cid for cid, a in [(cid, client.exists_async(commands[cid][0])) for cid in late] if a.get() is not None}
    return stuck or late


def stale_commands(client, group: str, members) -> List[str]:
    """Command paths still waiting in the channels of ``members``."""
    return [f"{protocol.channel_path(group, cid)}/{c}" for cid in members
            for c in read.children(client, protocol.channel_path(group, cid))]


# ---------------------------------------------------------------- the whole thing

@dataclass
class Outcome:
    group: str
    state: str                       # Stable, Failed, Empty, or "unchanged"
    generation: int
    reasons: List[str] = field(default_factory=list)
    moved: int = 0
    duration_ms: float = 0.0
    excluded: List[str] = field(default_factory=list)
    error: str = ""
    members: int = 0
    unavailable: int = 0             # partitions left unassigned: held by squatters (check again later)
    recheck_ms: Optional[int] = None  # a static member is held away: look again when its grace ends


class GroupRebalancer:
    """Runs the pipeline for a group with bounded retries (one instance per node, shared by its
    handler threads; callers never run it for the same group twice at once).

    A failed attempt (members did not ack in time) is retried after a backoff with the
    non-acking members left out; after ``max_rebalance_retries`` the group is ``Failed`` and
    :class:`ConsumerRebalanceFailedException` is raised; the caller schedules a later retry.
    Members that did not ack because a squatter holds a partition they were given are not
    blamed: the squatter is named and the partition left unassigned in the next attempt.
    """

    def __init__(self, client, settings: CoordinatorConfig):
        self.client, self.settings = client, settings
        # The last generation this node wrote per group: generations only grow, even if
        # someone deletes or damages the state znode (members ignore older generations).
        self.generations: Dict[str, int] = {}
        # Partitions found held by squatters, per group: checked again at each run.
        self.squatted: Dict[str, Dict[Tuple[str, int], int]] = {}
        # Problems already logged, per group: each is logged once while it lasts.
        self._reported: Dict[str, Set[str]] = {}
        # The last verified look of each group whose ownership was found right (see Fingerprint):
        # a periodic check needs to run a group again only when it no longer matches.
        self.verified: Dict[str, Fingerprint] = {}
        # Groups whose next run reads their owner nodes whatever their state records (a full check).
        self.must_read: Set[str] = set()
        # Groups found deleted (and not seen again since): their deletion is reported once.
        self.deleted: Set[str] = set()

    def forget(self, group: str) -> None:
        """The group is gone: drop what is known of it."""
        self.verified.pop(group, None)
        self.must_read.discard(group)

    def read_in_full(self, groups) -> None:
        """The next run of each of ``groups`` reads every znode of it, owner nodes included."""
        for group in groups:
            self.verified.pop(group, None)
            self.must_read.add(group)

    def run(self, group: str, topics: Callable[[], Dict[str, int]], fence: Fence, abort: Callable[[], bool],
            observe=None, changed: Callable[[], bool] = lambda: False, members_watch=None) -> Outcome:
        """Rebalance ``group`` if needed, every write checking ``fence`` (the group's shard
        epoch); ``abort()`` says leadership of the shard is ending (raises :class:`Abandoned`).
        ``topics()`` is the caller's current view of the topics' partition counts.
        ``observe(group, registrations)`` sees every snapshot; ``changed()`` says the group
        changed since this run began (raises :class:`Superseded` while waiting for acks, rather
        than waiting out members that may be gone). ``members_watch`` is set on the group's
        ids/ by every read of its members (the caller's one-shot watch, re-armed).

        ``topics()`` is called after ``observe``: a caller that learns of a topic's growth asks
        for a run of the groups it knows to use that topic, and a group is known to it from
        ``observe`` on. So a growth is either in the view this run takes or comes after the
        group was observed, and then the caller asks for another run; a view taken before
        ``observe`` could miss it both ways (a node taking a shard over knows none of its
        groups' subscriptions yet). Raises :class:`GroupDeleted` when the group's znodes are
        deleted under the run."""
        try:
            return self._run(group, topics, fence, abort, observe, changed, members_watch)
        except TransactionFailed as e:
            # A znode written under is gone, and so is ids/, where members register from the
            # group's start to its deletion: the group was deleted.
            if not isinstance(e.error, NoNodeError) or self.client.exists(protocol.ids_path(group)) is not None:
                raise
        self.forget(group)
        first = group not in self.deleted
        self.deleted.add(group)
        raise GroupDeleted(f"group {group} was deleted during its rebalance", first) from None

    def _run(self, group: str, topics: Callable[[], Dict[str, int]], fence: Fence, abort: Callable[[], bool],
             observe, changed: Callable[[], bool], members_watch) -> Outcome:
        started = time.monotonic()
        self.verified.pop(group, None)  # recorded again only by a run that verifies it
        excluded: Set[str] = set()
        squatted = self._still_squatted(group)
        attempts = self.settings.max_rebalance_retries + 1
        for attempt in range(attempts):
            snapshot = read_snapshot(self.client, group, {}, members_watch)
            if snapshot.ids_pzxid != -1:
                self.deleted.discard(group)  # (made again since)
            if observe:
                observe(group, snapshot.members.values())
            snapshot = dataclasses.replace(snapshot, topics=topics())  # after observe: see run()
            excluded &= set(snapshot.members)
            if excluded and excluded == set(snapshot.members):
                # Everyone left to assign to failed to ack: nothing can succeed until they do.
                if attempt + 1 < attempts:
                    _sleep(self.settings.rebalance_backoff_ms * (2 ** attempt) / 1000.0, abort)
                continue
            now = protocol.now_ms()
            hold = _hold(snapshot, now)
            recheck = None if hold.next_deadline_ms is None else max(0, hold.next_deadline_ms - now)
            # The state's plan is trusted only for groups without static members (their records
            # and holds are computed each time).
            plan = (not excluded and not squatted and not hold.static and recorded_plan(snapshot)) or \
                compute_plan(snapshot, excluded, set(squatted), hold)
            verifiable = not squatted and not plan.held  # every assigned partition should be owned
            self._report(snapshot, plan, squatted)
            reasons = reasons_to_rebalance(snapshot, plan, None)
            restore: Set[str] = set()
            owner_pzxids: Optional[Dict[str, int]] = None
            if not reasons and verifiable and group not in self.must_read:
                owner_pzxids = still_as_verified(self.client, snapshot, plan)  # verified before, unchanged since
            if not reasons and owner_pzxids is None:
                owner_pzxids = {}
                owners = read_owners(self.client, group, plan.assignment, owner_pzxids)
                reasons = reasons_to_rebalance(snapshot, plan, owners)
                restore = self._restorable(snapshot, plan, owners) if reasons else set()
                self.must_read.discard(group)
            if not reasons:
                record = verified_record(snapshot, plan, owner_pzxids) if verifiable else {}
                self._settle(snapshot, plan, squatted, fence, record)
                if verifiable:
                    self.verified[group] = fingerprint(snapshot, plan, owner_pzxids)
                return Outcome(group, "unchanged", snapshot.state.generation, duration_ms=_ms(started),
                               members=len(plan.members), unavailable=len(squatted), recheck_ms=recheck)
            if abort():
                raise Abandoned("leadership is ending")
            if restore:  # returning static members only: the others keep their generation, no command
                generation, reasons = snapshot.state.generation, [f"static members {sorted(restore)} returned"]
                stale = stale_commands(self.client, group, restore)
            else:
                generation = max(snapshot.state.generation, self.generations.get(group, 0)) + 1
                self.generations[group] = generation
                stale = stale_commands(self.client, group, excluded) if excluded else []
            commands = write_commands(self.client, fence, snapshot, plan, generation, stale, squatted,
                                      sorted(restore) if restore else None)
            late = wait_for_acks(self.client, commands, self.settings.rebalance_timeout_ms / 1000.0, abort,
                                 changed)
            if not late:
                state = protocol.STABLE if plan.members else protocol.EMPTY
                owner_pzxids = owners_as_assigned(self.client, group, plan.assignment) if verifiable else None
                record = verified_record(snapshot, plan, owner_pzxids) if owner_pzxids is not None else {}
                snapshot.state_mzxid = write_state(
                    self.client, fence, group,
                    GroupState(generation, state, list(plan.members), plan.assignment, plan.strategy,
                               problems(snapshot, plan, squatted), fence.epoch, verified=record, static=plan.static),
                    0 if snapshot.state_version is None else snapshot.state_version + 1)
                if record and snapshot.state_mzxid is not None:
                    self.verified[group] = fingerprint(snapshot, plan, owner_pzxids)
                return Outcome(group, state, generation, reasons, _moved(snapshot.state.assignment, plan.assignment),
                               _ms(started), sorted(excluded), members=len(plan.members), unavailable=len(squatted),
                               recheck_ms=recheck)
            shares = plan.shares()
            blocked = find_squatters(self.client, group, [(t, p) for cid in late
                                                          for t, parts in shares.get(cid, {}).items() for p in parts])
            if blocked:
                squatted.update(blocked)
                self.squatted[group] = squatted
            else:
                excluded |= late
                log.warning("group %s generation %d: no ack from %s within %d ms (attempt %d of %d)", group,
                            generation, sorted(late), self.settings.rebalance_timeout_ms, attempt + 1, attempts)
            if attempt + 1 < attempts:
                _sleep(self.settings.rebalance_backoff_ms * (2 ** attempt) / 1000.0, abort)
        error = f"can't rebalance after {attempts} attempts: members {sorted(excluded)} did not ack"
        snapshot = read_snapshot(self.client, group, topics())
        self._fail(snapshot, compute_plan(snapshot, hold=_hold(snapshot, protocol.now_ms())), error, fence)
        raise ConsumerRebalanceFailedException(f"group {group}: {error}")

    @staticmethod
    def _restorable(snapshot: Snapshot, plan: Plan, owners: Ownership) -> Set[str]:
        """The returning static members to give their share back, if that is all the group
        needs: the membership and the assignment are the state's, and every other partition is
        owned as assigned (so whatever the state's generation asked of the others is done, even
        if a superseded attempt left the state Rebalancing)."""
        if plan.members.keys() != set(snapshot.state.members) or plan.assignment != snapshot.state.assignment:
            return set()
        shares = {cid: share for cid, share in plan.shares().items() if cid not in plan.held}
        present = set(plan.static) - plan.held
        restore = static.members_to_restore(shares, owners, present)
        return restore if static.only_restores(shares, owners, restore) else set()

    def _still_squatted(self, group: str) -> Dict[Tuple[str, int], int]:
        """The squatters found before that still hold their partitions (the others are forgotten)."""
        known = self.squatted.pop(group, {})
        now = find_squatters(self.client, group, known)
        still = {tp: sid for tp, sid in now.items() if known.get(tp) == sid}
        if still:
            self.squatted[group] = still
        return dict(still)

    def _report(self, snapshot: Snapshot, plan: Plan, squatted: Dict[Tuple[str, int], int]) -> None:
        """One error line per problem, when it first appears (not at every check)."""
        current = set()
        for cid, why in sorted({**snapshot.rejected, **plan.left_out}.items()):
            current.add(f"member {cid} is left out of group {snapshot.group}: {why}")
        for (t, p), sid in sorted(squatted.items()):
            current.add(f"group {snapshot.group}: partition {t}-{p} is held by ZooKeeper session 0x{sid:x}, which "
                        f"is not a member; it stays unassigned until that owner node goes "
                        f"({protocol.owners_path(snapshot.group, t, p)})")
        for line in sorted(current - self._reported.get(snapshot.group, set())):
            log.error("%s", line)
        self._reported[snapshot.group] = current

    def _settle(self, snapshot: Snapshot, plan: Plan, squatted, fence: Fence, record: Dict) -> None:
        """Ownership is already right: record it as Stable (no commands), with what was verified,
        if the state says otherwise. ``snapshot.state_mzxid`` follows a write (it is fingerprinted)."""
        want = protocol.STABLE if plan.members else protocol.EMPTY
        error = problems(snapshot, plan, squatted)
        s = snapshot.state
        # static: a member went away or came back
        if s.state != want or s.error != error or s.verified != record or s.static != plan.static:
            snapshot.state_mzxid = write_state(
                self.client, fence, snapshot.group,
                GroupState(s.generation, want, s.members, s.assignment, s.strategy, error, fence.epoch,
                           verified=record, static=plan.static), snapshot.state_version)

    def _fail(self, snapshot: Snapshot, plan: Plan, error: str, fence: Fence) -> None:
        s = snapshot.state
        write_state(self.client, fence, snapshot.group,
                    GroupState(s.generation, protocol.FAILED, list(plan.members), s.assignment, plan.strategy,
                               error, fence.epoch, static=plan.static), snapshot.state_version)


def _hold(snapshot: Snapshot, now_ms: int) -> static.Hold:
    """The static members of the snapshot's group that are away and still held."""
    return static.hold_departed(snapshot.state.static, snapshot.state.members, static.static_of(snapshot.members),
                                snapshot.members, now_ms)


def _sleep(seconds: float, abort: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if abort():
            raise Abandoned("leadership is ending")
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def _moved(before: Ownership, after: Ownership) -> int:
    old = {(t, p): s for t, parts in before.items() for p, s in parts.items()}
    return sum(1 for t, parts in after.items() for p, s in parts.items() if old.get((t, p)) != s)


def _ms(started: float) -> float:
    return (time.monotonic() - started) * 1000.0
