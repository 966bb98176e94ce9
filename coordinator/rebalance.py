"""One group's rebalance as a pipeline: read → compute → diff → write → wait.

``read_snapshot``, ``read_owners`` and ``find_squatters`` are the only reads;
``compute_plan`` and ``reasons_to_rebalance`` are pure functions of what was read;
``write_commands`` is one ZooKeeper transaction fenced by the group's shard epoch;
``wait_for_acks`` watches the commands disappear. :class:`GroupRebalancer` strings them
together with bounded retries.

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
from coordinator.zkclient import TransactionFailed, commit

log = logging.getLogger(__name__)


class Deposed(Exception):
    """The fence failed: another node leads the shard now (or the controller moved on). Stop
    writing at once."""


class Abandoned(Exception):
    """The attempt was abandoned because leadership is ending (suspension, shutdown)."""


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


def read_snapshot(client, group: str, topics: Dict[str, int]) -> Snapshot:
    """Members (registrations decoded; unreadable ones and ones without a command channel
    rejected) and the group's last state."""
    state_async = client.get_async(protocol.state_path(group))
    ids = read.children(client, protocol.ids_path(group))
    members, rejected = {}, {}
    pending = [(cid, client.get_async(protocol.ids_path(group, cid)),
                client.exists_async(protocol.channel_path(group, cid))) for cid in ids]
    for cid, a, channel in pending:
        path = protocol.ids_path(group, cid)
        try:
            raw, _ = a.get()
            members[cid] = Registration.decode(raw, path)
        except NoNodeError:
            continue  # left while we read
        except CorruptZnode as e:
            rejected[cid] = e.problem
            continue
        if channel.get() is None:
            del members[cid]
            rejected[cid] = f"has no command channel ({protocol.channel_path(group, cid)} is missing)"
    try:
        raw, stat = state_async.get()
        state, version = GroupState.decode(raw, protocol.state_path(group)), stat.version
    except NoNodeError:
        state, version = GroupState(), None
    except CorruptZnode as e:
        # Our own znode, damaged by someone: overwrite it with a fresh decision. Every
        # generation was written at least once, so the znode version bounds the last one.
        log.error("group %s: %s; it will be rewritten", group, e)
        _, stat = client.get(protocol.state_path(group))
        state, version = GroupState(generation=stat.version), stat.version
    return Snapshot(group, members, rejected, topics, state, version)


def read_owners(client, group: str, topics) -> Ownership:
    """Who holds each partition now: topic -> partition -> stream id (ephemeral owner nodes)."""
    children = {t: client.get_children_async(protocol.owners_path(group, t)) for t in topics}
    gets = []
    for topic, a in children.items():
        try:
            for p in a.get():
                gets.append((topic, p, client.get_async(protocol.owners_path(group, topic, p))))
        except NoNodeError:
            continue
    owners: Ownership = {}
    for topic, p, a in gets:
        try:
            raw, _ = a.get()
            owners.setdefault(topic, {})[int(p)] = raw.decode(errors="replace")
        except (NoNodeError, ValueError):
            continue
    return owners


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


def write_state(client, fence: Fence, group: str, state: GroupState, version: Optional[int]) -> int:
    """Write the group state, fenced; return the state znode's new version."""
    t = fenced(client, fence)
    _write_state(t, group, state, version)
    fenced_commit(t, fence)
    return 0 if version is None else version + 1


def write_commands(client, fence: Fence, snapshot: Snapshot, plan: Plan, generation: int,
                   stale: List[str], squatted=None, recipients: Optional[List[str]] = None) -> Dict[str, List[str]]:
    """One fenced transaction: state Rebalancing, then stop-fetcher and start-fetcher for
    every recipient (default: every member not held away; in that order, so each channel holds
    stop before start), and the removal of ``stale`` command paths. Returns consumer id ->
    [stop path, start path]."""
    group = snapshot.group
    epoch = fence.epoch
    t = fenced(client, fence)
    state = GroupState(generation, protocol.REBALANCING, list(plan.members), plan.assignment,
                       plan.strategy, problems(snapshot, plan, squatted), epoch, static=plan.static)
    _write_state(t, group, state, snapshot.state_version)
    for path in stale:
        t.delete(path)
    order = sorted(plan.recipients() if recipients is None else recipients)
    shares = plan.shares()
    for cid in order:
        prefix = protocol.command_prefix(group, cid)
        t.create(prefix, protocol.Command(protocol.STOP_FETCHER, generation, epoch, consumer_id=cid).encode(),
                 sequence=True)
        t.create(prefix, protocol.Command(protocol.START_FETCHER, generation, epoch, shares[cid],
                                          consumer_id=cid).encode(), sequence=True)
    results = fenced_commit(t, fence)
    first = 2 + len(stale)
    return {cid: results[first + 2 * i:first + 2 * i + 2] for i, cid in enumerate(order)}


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
    to leave out of the next attempt. A watch per command reports its deletion; every 250 ms
    all pending commands are checked again, in case a watch was lost to a reconnect.

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
            recheck = now + 0.25
            checks = [(path, client.exists_async(path, watch=watch)) for path in pending]
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
            woken.wait(min(remaining, max(0.0, recheck - time.monotonic())))
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

    def run(self, group: str, topics: Dict[str, int], fence: Fence, abort: Callable[[], bool], observe=None,
            changed: Callable[[], bool] = lambda: False) -> Outcome:
        """Rebalance ``group`` if needed, every write checking ``fence`` (the group's shard
        epoch); ``abort()`` says leadership of the shard is ending (raises :class:`Abandoned`).
        ``observe(group, registrations)`` sees every snapshot; ``changed()`` says the group
        changed since this run began (raises :class:`Superseded` while waiting for acks, rather
        than waiting out members that may be gone)."""
        started = time.monotonic()
        excluded: Set[str] = set()
        squatted = self._still_squatted(group)
        attempts = self.settings.max_rebalance_retries + 1
        for attempt in range(attempts):
            snapshot = read_snapshot(self.client, group, topics)
            if observe:
                observe(group, snapshot.members.values())
            excluded &= set(snapshot.members)
            if excluded and excluded == set(snapshot.members):
                # Everyone left to assign to failed to ack: nothing can succeed until they do.
                if attempt + 1 < attempts:
                    _sleep(self.settings.rebalance_backoff_ms * (2 ** attempt) / 1000.0, abort)
                continue
            now = protocol.now_ms()
            hold = _hold(snapshot, now)
            recheck = None if hold.next_deadline_ms is None else max(0, hold.next_deadline_ms - now)
            plan = compute_plan(snapshot, excluded, set(squatted), hold)
            self._report(snapshot, plan, squatted)
            reasons = reasons_to_rebalance(snapshot, plan, None)
            restore: Set[str] = set()
            if not reasons:
                owners = read_owners(self.client, group, plan.assignment)
                reasons = reasons_to_rebalance(snapshot, plan, owners)
                restore = self._restorable(snapshot, plan, owners) if reasons else set()
            if not reasons:
                self._settle(snapshot, plan, squatted, fence)
                return Outcome(group, "unchanged", snapshot.state.generation, duration_ms=_ms(started),
                               unavailable=len(squatted), recheck_ms=recheck)
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
                write_state(self.client, fence, group,
                            GroupState(generation, state, list(plan.members), plan.assignment, plan.strategy,
                                       problems(snapshot, plan, squatted), fence.epoch, static=plan.static),
                            0 if snapshot.state_version is None else snapshot.state_version + 1)
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
        snapshot = read_snapshot(self.client, group, topics)
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

    def _settle(self, snapshot: Snapshot, plan: Plan, squatted, fence: Fence) -> None:
        """Ownership is already right: record it as Stable (no commands) if the state says otherwise."""
        want = protocol.STABLE if plan.members else protocol.EMPTY
        error = problems(snapshot, plan, squatted)
        s = snapshot.state
        if s.state != want or s.error != error or s.static != plan.static:  # static: a member went away or came back
            write_state(self.client, fence, snapshot.group,
                        GroupState(s.generation, want, s.members, s.assignment, s.strategy, error, fence.epoch,
                                   static=plan.static),
                        snapshot.state_version)

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
