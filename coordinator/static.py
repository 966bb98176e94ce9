"""Static membership (as Kafka's KIP-345): which departed static members are still held, and
which returning ones only need their partitions back (pure functions of what was read).

A static member registers with a ``group_instance_id``; its consumer id is derived from it
(:func:`coordinator.protocol.static_consumer_id`), so a restarted process has the same
consumer id, streams and command channel as the one it replaces.

Guaranteed while a static member is away (its registration is gone, and it is within its
grace, ``static_grace_ms`` counted from when the leader first found the registration gone):

* it stays in the group state's ``members`` and the assignment is computed as if it were
  there, with the registration the state recorded for it: its share stays its own, none of its
  partitions is given to another member, and nobody consumes them (they are unconsumed for up
  to the grace: Kafka's trade-off too);
* its departure alone writes no command and leaves the generation unchanged (the state only
  records ``away_since``);
* a rebalance needed for another reason (a member joins or leaves, a topic grows) goes on with
  the away member counted in (it gets no command; its share, as the strategy decides, waits
  for its return or for the grace to run out).

When it returns (a process registers with the same instance id), and its partitions are the
only ones not owned, the leader writes stop-fetcher and start-fetcher to its channel only, at
the group's current generation: the others get no command and the generation is unchanged.

When its grace runs out it is dropped from the membership, which is an ordinary rebalance
(a new generation; its partitions go to the others). Not provided: a hold across a leader whose
clock is far off the previous leader's (``away_since`` is wall-clock time).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Iterable, Mapping, Optional, Set

from coordinator.protocol import Ownership, Registration, StaticMember


@dataclass
class Hold:
    """What :func:`hold_departed` decided."""
    static: Dict[str, StaticMember] = field(default_factory=dict)   # for the next group state
    held: Set[str] = field(default_factory=set)        # away, within their grace: keep their share
    expired: Set[str] = field(default_factory=set)     # away past their grace: drop them
    next_deadline_ms: Optional[int] = None             # when the first hold runs out


def static_of(registrations: Mapping[str, Registration]) -> Dict[str, StaticMember]:
    """The registered static members: consumer id -> StaticMember (present, so not away)."""
    return {cid: StaticMember.of(r) for cid, r in registrations.items() if r.group_instance_id}


def hold_departed(recorded: Mapping[str, StaticMember], last_members: Iterable[str],
                  present: Mapping[str, StaticMember], registered: Iterable[str], now_ms: int) -> Hold:
    """``recorded``: the group state's static members; ``last_members``: its members;
    ``present``: the static members registered now (:func:`static_of`); ``registered``: every
    registered consumer id. A recorded static member of the last decision that is not
    registered is held until ``away_since + grace_ms`` (``away_since`` is set to ``now_ms`` when
    it is first found away)."""
    out = Hold(static=dict(present))
    registered = set(registered)
    for cid in set(last_members) & set(recorded):
        if cid in registered:
            continue
        member = recorded[cid]
        away = member.away_since if member.away_since is not None else now_ms
        deadline = away + member.grace_ms
        if now_ms < deadline:
            out.held.add(cid)
            out.static[cid] = replace(member, away_since=away)
            out.next_deadline_ms = deadline if out.next_deadline_ms is None else min(out.next_deadline_ms, deadline)
        else:
            out.expired.add(cid)
    return out


def members_to_restore(shares: Mapping[str, Ownership], owners: Ownership, static_members: Iterable[str]) -> Set[str]:
    """Static members (registered now) that own none of their non-empty share: a restarted
    process. If every unowned partition of the assignment belongs to one of them, giving them
    their share is all the group needs."""
    held = {(t, p): s for t, parts in owners.items() for p, s in parts.items()}
    out = set()
    for cid in static_members:
        share = [(t, p, s) for t, parts in shares.get(cid, {}).items() for p, s in parts.items()]
        if share and not any(held.get((t, p)) == s for t, p, s in share):
            out.add(cid)
    return out


def only_restores(shares: Mapping[str, Ownership], owners: Ownership, restore: Set[str]) -> bool:
    """Whether every partition not owned by its stream belongs to a member in ``restore``, and
    every owner node is the assigned stream's (nothing else is wrong)."""
    held = {(t, p): s for t, parts in owners.items() for p, s in parts.items()}
    wanted = {(t, p): (cid, s) for cid, share in shares.items() for t, parts in share.items() for p, s in parts.items()}
    if any(tp not in wanted for tp in held):
        return False
    for tp, (cid, stream) in wanted.items():
        if held.get(tp) == stream:
            continue
        if cid not in restore or tp in held:
            return False
    return bool(restore)
