"""The pure part of a rebalance: what a group looks like, what it should look like, and why
they differ.

A :class:`Snapshot` is what a run read of the group (members, the topics' partition counts,
the last state); :func:`compute_plan` turns it into a :class:`Plan` (the target assignment,
through the group's strategy: :mod:`coordinator.assignors`); :func:`reasons_to_rebalance`
says why the group needs commands, empty when its ownership is already right (seed 001,
D.3); :func:`problems` is what keeps it from being whole, for the state's ``error``.

The group state a run writes is built here too, one function per step that writes it, so
what each step may write is in one place: :func:`rebalancing_state` (commands written),
:func:`acked_state` (every member acked: Stable, or Empty without members),
:func:`settled_state` (ownership already right: Stable or Empty, generation and assignment
kept; also to record a verification or a new ``error``), :func:`failed_state` (out of
retries: Failed, tried again later). Any state may precede any of these: a node taking a
group over starts from whatever its predecessor left, a superseded generation leaves
Rebalancing behind, and a Failed group is tried again.

All are pure functions of what was read, tested from fixtures (``tests/unit/test_plan.py``,
``tests/unit/test_rebalance.py``); :mod:`coordinator.rebalance` does the reading and writing
around them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from coordinator import assignors, protocol, static
from coordinator.protocol import GroupState, Ownership, Registration, StaticMember


@dataclass
class Snapshot:
    """One read of a group: its members (readable registrations with a command channel), the
    members left out and why, the topics' partition counts, its last state, and the zxids
    verification compares (:mod:`coordinator.verify`)."""
    group: str
    members: Dict[str, Registration]
    rejected: Dict[str, str]           # consumer id -> why it cannot be a member (left out)
    topics: Dict[str, int]             # every readable topic -> partition count
    state: GroupState
    state_version: Optional[int]       # None: no state znode yet
    ids_pzxid: int = -1                # zxids of the last child change of ids/ and channel/ when read (-1: unknown)
    channel_pzxid: int = -1
    state_mzxid: Optional[int] = None  # zxid of the state znode's last write (None: no state znode)


@dataclass
class Plan:
    """What the group should look like: its members' resolved subscriptions, the strategy and
    the assignment computed with it, the members left out, and the static members held away."""
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


def problems(snapshot: Snapshot, plan: Plan, squatted: Optional[Dict[Tuple[str, int], int]] = None) -> str:
    """What keeps the group from being whole, for the state's ``error`` (empty if nothing)."""
    out = [f"member {cid} left out: {why}" for cid, why in sorted({**snapshot.rejected, **plan.left_out}.items())]
    out += [f"partition {t}-{p} held by session 0x{sid:x}, which is not a member"
            for (t, p), sid in sorted((squatted or {}).items())]
    return "; ".join(out)


def static_hold(snapshot: Snapshot, now_ms: int) -> static.Hold:
    """The static members of the snapshot's group that are away and still held."""
    return static.hold_departed(snapshot.state.static, snapshot.state.members, static.static_of(snapshot.members),
                                snapshot.members, now_ms)


def restorable(snapshot: Snapshot, plan: Plan, owners: Ownership) -> Set[str]:
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


def late_partitions(plan: Plan, late) -> List[Tuple[str, int]]:
    """The (topic, partition) pairs the plan gave to the members in ``late``."""
    shares = plan.shares()
    return [(t, p) for cid in late for t, parts in shares.get(cid, {}).items() for p in parts]


# ---------------------------------------------------------------- the states a run writes

def rebalancing_state(snapshot: Snapshot, plan: Plan, generation: int, epoch: int, squatted=None) -> GroupState:
    """The state written with a generation's commands: Rebalancing, with the plan."""
    return GroupState(generation, protocol.REBALANCING, list(plan.members), plan.assignment, plan.strategy,
                      problems(snapshot, plan, squatted), epoch, static=plan.static)


def acked_state(snapshot: Snapshot, plan: Plan, generation: int, epoch: int, squatted=None,
                verified: Optional[Dict] = None) -> GroupState:
    """The state written once every member acked ``generation``: Stable (Empty without
    members), with what was verified of the owner nodes (``verified``, may be empty)."""
    return GroupState(generation, protocol.STABLE if plan.members else protocol.EMPTY, list(plan.members),
                      plan.assignment, plan.strategy, problems(snapshot, plan, squatted), epoch,
                      verified=verified or {}, static=plan.static)


def settled_state(snapshot: Snapshot, plan: Plan, epoch: int, squatted=None,
                  verified: Optional[Dict] = None) -> Optional[GroupState]:
    """Ownership is already right: the state that records it as Stable (Empty without members),
    the generation, members and assignment kept, with what was verified; None if the state
    says all that already (a static member that went away or came back changes ``static``)."""
    want = protocol.STABLE if plan.members else protocol.EMPTY
    error, verified = problems(snapshot, plan, squatted), verified or {}
    s = snapshot.state
    if s.state == want and s.error == error and s.verified == verified and s.static == plan.static:
        return None
    return GroupState(s.generation, want, s.members, s.assignment, s.strategy, error, epoch,
                      verified=verified, static=plan.static)


def failed_state(snapshot: Snapshot, plan: Plan, error: str, epoch: int) -> GroupState:
    """The state written when the retries are exhausted: Failed with ``error``, the last
    generation and assignment kept, the members the group has now."""
    s = snapshot.state
    return GroupState(s.generation, protocol.FAILED, list(plan.members), s.assignment, plan.strategy, error, epoch,
                      static=plan.static)


def moved(before: Ownership, after: Ownership) -> int:
    """How many partitions ``after`` assigns to another stream than ``before`` did (or newly)."""
    old = {(t, p): s for t, parts in before.items() for p, s in parts.items()}
    return sum(1 for t, parts in after.items() for p, s in parts.items() if old.get((t, p)) != s)
