"""An explicit-state model of the rebalance and fencing protocol, zombies included.

Each action below is one atomic step of a process against ZooKeeper (one request or one
transaction); the checker (:mod:`tests.model.check`) explores every interleaving of them
breadth-first, so a violation comes with a shortest trace.

Modelled (and where it lives in the code):

* ZooKeeper: sessions (a member's client reconnects with a new session after an expiry,
  while the member still holds what it held: the zombie), the ephemeral ``ids/`` and
  ``owners/`` nodes of a session (gone with it), the offsets znode with its version, the
  shard epoch znode, the group state's generation, the command channels.
* Coordinators (``coordinator/rebalance.py``, ``coordinator/fencing.py``): two nodes, one
  leading the shard at a time; a failover bumps the shard epoch; the deposed node keeps
  running on its old epoch until it notices. A rebalance reads the registrations, then writes
  the state and the commands in one transaction that checks the shard epoch.
* Members (``consumer/commands.py``, ``consumer/claims.py``, ``consumer/offsets.py``,
  ``consumer/lease.py``): apply commands newer than the last applied; revoke (final commit at
  the token + owner delete, one transaction); claim (owner create + offsets compare-and-set,
  one transaction); fetch into a buffer; hand records out under the lease; commit at the
  token; a commit whose answer was lost and its recovery (offsets + owner node read); the
  lease renewed by a round trip; noticing the lost session and registering again.
* Time, abstractly: a session expires only when its member's lease has lapsed (the lease is
  half the session timeout, counted from a round trip the server answered: the server cannot
  expire the session sooner), and a lease may lapse at any step.

Not modelled: acks and the ``Stable`` write (not needed for safety), several groups and shards,
ACLs, the Kafka data plane, share groups, the multi-transaction split of large claims.

Invariants (:func:`violations`): **exclusive** — no partition may be handed out by two members
at once (a zombie included); **fenced** — a commit lands only from the member whose claim is the
partition's latest; **no skip** — every offset below the committed one was handed out;
**deposed** — no write of a coordinator on an old epoch lands.

:data:`MUTATIONS` re-introduce known bugs, each of which the checker must catch.
"""
from __future__ import annotations

from typing import Iterator, NamedTuple, Optional, Tuple

#: Deliberately broken variants of the protocol; the checker must find a violation in each.
MUTATIONS = {
    "version0-fence": "a commit checks that an owner node exists (at version 0) instead of its token "
                      "(ENGINEERING.md §7: the next owner's node is at version 0 too)",
    "claim-without-owner-check": "a claim rewrites the offsets znode without creating the owner node "
                                 "in the same transaction (it trusts an earlier read that none existed)",
    "lease-without-round-trip": "the lease is renewed from the member's own timer, not by a round trip "
                                "that found its session alive",
    "lease-outlives-session": "the lease is as long as the session timeout (the server may expire "
                              "the session while the lease still holds)",
    "commit-fetched-position": "a commit writes the position fetched, not the one handed to the application",
    "lost-answer-without-owner-check": "after a commit whose answer was lost, the version read is adopted as "
                                       "the token without checking the owner node is still this session's",
    "unfenced-coordinator": "the coordinator writes commands without checking the shard epoch",
    "claim-keeps-version": "a claim creates the owner node but leaves the offsets znode as it was, taking the "
                           "version read as its token (a new holder that does not change the fence)",
}


class Scope(NamedTuple):
    members: int = 2
    partitions: int = 1
    records: int = 2          # offsets 0..records-1 per partition
    expiries: int = 1         # member session expiries
    failovers: int = 1        # coordinator failovers
    lost_answers: int = 1     # commits whose answer was lost


class Held(NamedTuple):
    """A partition a member holds (as the member believes)."""
    token: int                # the offsets znode version its last write left
    claim: int                # ghost: which claim of the partition this is
    fetched: int              # next offset to fetch
    handed: int               # next offset to hand out (the position)
    committed: int            # last offset it committed (or found at its claim)
    unknown: bool = False     # a commit's answer was lost


class Member(NamedTuple):
    session: int = 1          # the client's session (a new one once it reconnects after an expiry)
    holds_session: int = 0    # the session its holdings and registration belong to (0: not registered)
    applied: int = 0          # generation of the last command applied
    target: int = 0           # bitmask of the partitions its last command gives it
    held: Tuple[Optional[Held], ...] = ()
    lease: bool = False


class Coord(NamedTuple):
    epoch: int = 0            # the shard epoch it believes it leads at (0: not leading)


class State(NamedTuple):
    members: Tuple[Member, ...]
    coords: Tuple[Coord, ...]
    leader: int               # which coordinator ZooKeeper's election has
    epoch: int                # the shard epoch znode's version
    generation: int           # the group state's generation
    assigned: int             # the members the group state was computed for (bitmask)
    ids: Tuple[int, ...]      # per member: the session owning its ids/ node (0: none)
    alive: Tuple[int, ...]    # per member: its session the server keeps (0: expired, the client not back yet)
    channels: Tuple[Tuple[Tuple[int, int, int], ...], ...]  # per member: (epoch, generation, partitions)
    owners: Tuple[Optional[Tuple[int, int]], ...]           # per partition: (member, session) or None
    offsets: Tuple[Optional[Tuple[int, int]], ...]          # per partition: (offset, version) or None
    claims: Tuple[int, ...]   # ghost: claims of each partition so far
    handed_out: Tuple[int, ...]  # ghost: bitmask of offsets ever handed out, per partition
    budget: Tuple[int, int, int]  # faults left: expiries, failovers, lost answers
    bad: Optional[str] = None  # a violation seen on the step into this state


def initial(scope: Scope) -> State:
    n, p = scope.members, scope.partitions
    # Every member registered on its first session; no rebalance written yet.
    return State(members=tuple(Member(holds_session=1, held=(None,) * p, lease=True) for _ in range(n)),
                 coords=(Coord(epoch=1), Coord()), leader=0, epoch=1, generation=0, assigned=0,
                 ids=(1,) * n, alive=(1,) * n, channels=((),) * n, owners=(None,) * p, offsets=(None,) * p,
                 claims=(0,) * p, handed_out=(0,) * p,
                 budget=(scope.expiries, scope.failovers, scope.lost_answers))


def assignment(members: int, partitions: int) -> dict:
    """Round-robin of the partitions over the members of the bitmask (the coordinator's plan)."""
    live = [m for m in range(members.bit_length()) if members >> m & 1]
    out = {m: 0 for m in live}
    for p in range(partitions):
        if live:
            out[live[p % len(live)]] |= 1 << p
    return out


def _set(t: tuple, i: int, v) -> tuple:
    return t[:i] + (v,) + t[i + 1:]


def can_hand(m: Member, p: int) -> bool:
    """Whether member ``m`` may hand out records of partition ``p`` now (``Lease.holds``)."""
    return m.held[p] is not None and m.lease and m.holds_session == m.session


def violations(s: State) -> Optional[str]:
    """The first invariant ``s`` breaks, in words, or None."""
    if s.bad:
        return s.bad
    for p in range(len(s.owners)):
        handing = [i for i, m in enumerate(s.members) if can_hand(m, p)]
        if len(handing) > 1:
            return f"exclusive: members {handing} may both hand out partition {p}"
        if s.offsets[p] is not None:
            value = s.offsets[p][0]
            if s.handed_out[p] & ((1 << value) - 1) != (1 << value) - 1:
                return f"no skip: partition {p} committed at {value}, but not every offset below was handed out"
    return None


def successors(s: State, scope: Scope, mutation: Optional[str] = None) -> Iterator[Tuple[str, State]]:
    """Every (label, next state) one atomic step can reach from ``s``."""
    mu = mutation
    expiries, failovers, lost = s.budget
    # ---- coordinators
    registered = sum(1 << m for m, sess in enumerate(s.ids) if sess)
    for c, co in enumerate(s.coords):
        # A rebalance: read the registrations and the state, write the commands (one transaction).
        # The read and the write are one step: what fences the write is the epoch, not the read.
        if co.epoch and registered != s.assigned:
            if co.epoch != s.epoch and mu != "unfenced-coordinator":
                pass  # its transaction's epoch check fails: nothing changes (it notices below)
            else:
                gen = s.generation + 1
                channels = s.channels
                for m, parts in assignment(registered, scope.partitions).items():
                    channels = _set(channels, m, channels[m] + ((co.epoch, gen, parts),))
                bad = f"deposed: C{c} wrote generation {gen} on epoch {co.epoch} (shard epoch {s.epoch})" \
                    if co.epoch != s.epoch else None
                yield (f"C{c} writes generation {gen} for members {registered:b} (epoch {co.epoch})",
                       s._replace(generation=gen, assigned=registered, channels=channels, bad=bad))
        if co.epoch and s.leader != c:
            yield f"C{c} notices it was deposed", s._replace(coords=_set(s.coords, c, Coord()))
    if failovers:
        other = 1 - s.leader
        coords = _set(s.coords, other, Coord(epoch=s.epoch + 1))
        yield (f"C{s.leader}'s session expires: C{other} leads at epoch {s.epoch + 1}",
               s._replace(coords=coords, leader=other, epoch=s.epoch + 1, budget=(expiries, failovers - 1, lost)))
    # ---- members
    for i, m in enumerate(s.members):
        yield from _member_steps(s, scope, i, m, mu)


def _member_steps(s: State, scope: Scope, i: int, m: Member, mu) -> Iterator[Tuple[str, State]]:
    expiries, failovers, lost = s.budget
    current = m.holds_session == m.session
    # ZooKeeper requests need the client's session alive on the server; until the client
    # reconnects after an expiry they fail, while the process runs on (fetching, handing out).
    online = s.alive[i] == m.session

    def put(state: State, **changes) -> State:
        return state._replace(members=_set(state.members, i, m._replace(**changes)))

    if not online:
        yield (f"M{i}'s client reconnects: session {m.session + 1}",
               put(s, session=m.session + 1)._replace(alive=_set(s.alive, i, m.session + 1)))
        online = False  # its steps below are of the old session: local ones only
    elif m.holds_session == 0:
        yield (f"M{i} registers (session {m.session})",
               put(s, holds_session=m.session, lease=True)._replace(ids=_set(s.ids, i, m.session)))
    elif not current:
        yield f"M{i} notices session {m.holds_session} is lost", \
            put(s, holds_session=0, held=(None,) * scope.partitions, lease=False, target=0)
    if expiries and online and (not m.lease or mu == "lease-outlives-session"):
        old = m.session
        owners = tuple(None if o == (i, old) else o for o in s.owners)
        ids = _set(s.ids, i, 0) if s.ids[i] == old else s.ids
        yield (f"M{i}'s session {old} expires",
               s._replace(owners=owners, ids=ids, alive=_set(s.alive, i, 0), budget=(expiries - 1, failovers, lost)))
    if m.lease:
        yield f"M{i}'s lease lapses", put(s, lease=False)
    if online and current and s.ids[i] == m.session or mu == "lease-without-round-trip" and m.holds_session:
        if not m.lease:
            yield f"M{i} renews its lease", put(s, lease=True)
    # Commands: the next in the channel, applied if newer than the last applied.
    # Commands are read with the client's session, so a member that has not noticed its old
    # session's loss yet may still apply those left in its channel (it revokes, never claims).
    if online and s.channels[i]:
        epoch, gen, parts = s.channels[i][0]
        rest = s.channels[i][1:]
        if gen <= m.applied:
            yield f"M{i} ignores stale command (generation {gen})", s._replace(channels=_set(s.channels, i, rest))
        else:
            state = s._replace(channels=_set(s.channels, i, rest))
            held = list(m.held)
            for p in range(scope.partitions):
                h = held[p]
                if h is not None and not parts >> p & 1:
                    held[p] = None  # stop before the release: nothing more is handed out
                    if h.unknown:
                        continue  # not written again before its outcome is known (the owner node stays)
                    off = state.offsets[p]
                    if off is not None and off[1] == h.token:  # commit at the token + owner delete
                        state = state._replace(offsets=_set(state.offsets, p, (h.handed, off[1] + 1)),
                                               owners=_set(state.owners, p, None))
            yield (f"M{i} applies generation {gen}: partitions {parts:b}",
                   put(state, applied=gen, target=parts, held=tuple(held)))
    for p in range(scope.partitions):
        h = m.held[p]
        if h is None:
            if online and current and m.target >> p & 1 and (s.owners[p] is None or mu == "claim-without-owner-check"):
                off = s.offsets[p]
                value, version = (0, 0) if off is None else (off[0], off[1] + (mu != "claim-keeps-version"))
                n = s.claims[p] + 1
                owners = s.owners if s.owners[p] is not None else _set(s.owners, p, (i, m.session))
                yield (f"M{i} claims p{p} at offset {value} (token {version})",
                       put(s, held=_set(m.held, p, Held(version, n, value, value, value)), lease=True)._replace(
                           owners=owners, offsets=_set(s.offsets, p, (value, version)),
                           claims=_set(s.claims, p, n)))
            continue
        if h.fetched < scope.records and h.fetched == h.handed:  # a buffer of one record
            yield f"M{i} fetches p{p}@{h.fetched}", put(s, held=_set(m.held, p, h._replace(fetched=h.fetched + 1)))
        if h.fetched > h.handed and can_hand(m, p):
            yield (f"M{i} hands out p{p}@{h.handed}",
                   put(s, held=_set(m.held, p, h._replace(handed=h.handed + 1)))._replace(
                       handed_out=_set(s.handed_out, p, s.handed_out[p] | 1 << h.handed)))
        position = h.fetched if mu == "commit-fetched-position" else h.handed
        off = s.offsets[p]
        if not online:
            continue  # its commits fail (session expired) and change nothing
        if h.unknown:
            # The recovery: sync, read the offsets znode, then the owner node.
            ours = s.owners[p] == (i, m.holds_session) and current
            if ours or mu == "lost-answer-without-owner-check":
                yield (f"M{i} finds its lost commit of p{p}: token {off[1]}",
                       put(s, held=_set(m.held, p, h._replace(token=off[1], unknown=False))))
            else:
                yield f"M{i} finds p{p} lost (owner node gone)", put(s, held=_set(m.held, p, None))
            continue
        if position > h.committed:
            fenced = off is not None and (off[1] == h.token if mu != "version0-fence" else s.owners[p] is not None)
            if fenced:
                bad = None if h.claim == s.claims[p] else \
                    f"fenced: M{i}'s commit of p{p} landed after claim {s.claims[p]} (its claim: {h.claim})"
                landed = s._replace(offsets=_set(s.offsets, p, (position, off[1] + 1)), bad=bad)
                yield (f"M{i} commits p{p} at {position} (version {off[1]} -> {off[1] + 1})",
                       put(landed, held=_set(m.held, p, h._replace(token=off[1] + 1, committed=position))))
                if lost:
                    yield (f"M{i} commits p{p} at {position}: applied, answer lost",
                           put(landed, held=_set(m.held, p, h._replace(committed=position, unknown=True)))
                           ._replace(budget=(expiries, failovers, lost - 1)))
            else:
                yield (f"M{i}'s commit of p{p} at {position} refused (token {h.token})",
                       put(s, held=_set(m.held, p, None)))
            if lost:
                yield (f"M{i} commits p{p} at {position}: not applied, answer lost",
                       put(s, held=_set(m.held, p, h._replace(committed=position, unknown=True)))
                       ._replace(budget=(expiries, failovers, lost - 1)))
