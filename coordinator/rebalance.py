"""One group's rebalance as a pipeline: read → compute → diff → write → wait.

``read_snapshot`` and ``read_owners`` are the only reads; ``compute_plan`` and
``reasons_to_rebalance`` are pure functions of what was read; ``write_commands`` is one
ZooKeeper transaction fenced by the leader's epoch; ``wait_for_acks`` watches the commands
disappear. :class:`GroupRebalancer` strings them together with bounded retries.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set

from kazoo.exceptions import BadVersionError, NoNodeError

from coordinator import assignors, protocol
from coordinator.errors import ConsumerRebalanceFailedException, CorruptZnode, ZkGroupsError
from coordinator.protocol import GroupState, Ownership, Registration
from coordinator.zkclient import TransactionFailed, commit

log = logging.getLogger(__name__)


class Deposed(Exception):
    """The epoch check failed: another coordinator leads now. Stop writing at once."""


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
    rejected: Dict[str, str]           # consumer id -> why its registration was rejected
    topics: Dict[str, int]             # every readable topic -> partition count
    state: GroupState
    state_version: Optional[int]       # None: no state znode yet


def read_snapshot(client, group: str, topics: Dict[str, int]) -> Snapshot:
    """Members (registrations decoded, bad ones rejected) and the group's last state."""
    state_async = client.get_async(protocol.state_path(group))
    try:
        ids = client.get_children(protocol.ids_path(group))
    except NoNodeError:
        ids = []
    members, rejected = {}, {}
    pending = [(cid, client.get_async(protocol.ids_path(group, cid))) for cid in ids]
    for cid, a in pending:
        path = protocol.ids_path(group, cid)
        try:
            raw, _ = a.get()
            members[cid] = Registration.decode(raw, path)
        except NoNodeError:
            continue  # left while we read
        except CorruptZnode as e:
            rejected[cid] = e.problem
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

@dataclass
class Plan:
    members: Dict[str, Dict[str, int]]     # consumer id -> {topic: streams}, resolved
    strategy: str
    assignment: Ownership
    error: str = ""

    def shares(self) -> Dict[str, Ownership]:
        """Each member's part of the assignment (one pass over it)."""
        out: Dict[str, Ownership] = {cid: {} for cid in self.members}
        for topic, parts in self.assignment.items():
            for p, stream in parts.items():
                out.setdefault(protocol.consumer_of_stream(stream), {}).setdefault(topic, {})[p] = stream
        return out


def compute_plan(snapshot: Snapshot, excluded=()) -> Plan:
    """The target assignment for the members not excluded (pure)."""
    regs = {cid: r for cid, r in snapshot.members.items() if cid not in excluded}
    members = {cid: r.topics(snapshot.topics) for cid, r in regs.items()}
    if not regs:
        return Plan({}, "", {})
    try:
        strategy = assignors.choose_strategy({cid: r.strategies for cid, r in regs.items()})
    except ZkGroupsError as e:
        return Plan(members, "", {}, error=str(e))
    subscribed = {t for subs in members.values() for t in subs}
    partitions = {t: n for t, n in snapshot.topics.items() if t in subscribed}
    # The last assignment lets the sticky strategy keep partitions where they are.
    return Plan(members, strategy, assignors.assign(strategy, members, partitions, snapshot.state.assignment))


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
    wanted = {(t, p): s for t, parts in plan.assignment.items() for p, s in parts.items()}
    held = {(t, p): s for t, parts in owners.items() for p, s in parts.items()}
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


def fenced_commit(t, epoch: int) -> list:
    """Commit a transaction whose first operation is the epoch check; Deposed if it failed."""
    try:
        return commit(t)
    except TransactionFailed as e:
        if e.index == 0 and isinstance(e.error, BadVersionError):
            raise Deposed(f"epoch {epoch} is no longer current") from None
        raise


def write_state(client, epoch: int, group: str, state: GroupState, version: Optional[int]) -> int:
    """Write the group state, fenced; return the state znode's new version."""
    t = client.transaction()
    t.check(protocol.EPOCH, epoch)
    _write_state(t, group, state, version)
    fenced_commit(t, epoch)
    return 0 if version is None else version + 1


def write_commands(client, epoch: int, snapshot: Snapshot, plan: Plan, generation: int,
                   stale: List[str]) -> Dict[str, List[str]]:
    """One fenced transaction: state Rebalancing, then stop-fetcher and start-fetcher for
    every member (in that order, so each channel holds stop before start), and the removal
    of ``stale`` command paths. Returns consumer id -> [stop path, start path]."""
    group = snapshot.group
    t = client.transaction()
    t.check(protocol.EPOCH, epoch)
    state = GroupState(generation, protocol.REBALANCING, list(plan.members), plan.assignment,
                       plan.strategy, _rejected_error(snapshot), epoch)
    _write_state(t, group, state, snapshot.state_version)
    for path in stale:
        t.delete(path)
    order = sorted(plan.members)
    shares = plan.shares()
    for cid in order:
        prefix = protocol.command_prefix(group, cid)
        t.create(prefix, protocol.Command(protocol.STOP_FETCHER, generation, epoch, consumer_id=cid).encode(),
                 sequence=True)
        t.create(prefix, protocol.Command(protocol.START_FETCHER, generation, epoch, shares[cid],
                                          consumer_id=cid).encode(), sequence=True)
    results = fenced_commit(t, epoch)
    first = 2 + len(stale)
    return {cid: results[first + 2 * i:first + 2 * i + 2] for i, cid in enumerate(order)}


def _rejected_error(snapshot: Snapshot) -> str:
    return "; ".join(f"member {cid} rejected: {why}" for cid, why in sorted(snapshot.rejected.items()))


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
    paths = []
    for cid in members:
        try:
            paths += [f"{protocol.channel_path(group, cid)}/{c}"
                      for c in client.get_children(protocol.channel_path(group, cid))]
        except NoNodeError:
            continue
    return paths


# ---------------------------------------------------------------- the whole thing

@dataclass
class RebalanceSettings:
    rebalance_timeout_ms: int = 30000
    max_rebalance_retries: int = 4
    rebalance_backoff_ms: int = 200


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


class GroupRebalancer:
    """Runs the pipeline for a group with bounded retries (one instance per leader term;
    callers never run it for the same group twice at once).

    A failed attempt (members did not ack in time) is retried after a backoff with the
    non-acking members left out; after ``max_rebalance_retries`` the group is ``Failed`` and
    :class:`ConsumerRebalanceFailedException` is raised; the caller schedules a later retry.
    """

    def __init__(self, client, epoch: int, settings: RebalanceSettings, abort: Callable[[], bool]):
        self.client, self.epoch, self.settings, self.abort = client, epoch, settings, abort
        # The last generation this leader wrote per group: generations only grow, even if
        # someone deletes or damages the state znode (members ignore older generations).
        self.generations: Dict[str, int] = {}

    def run(self, group: str, topics: Dict[str, int], observe=None,
            changed: Callable[[], bool] = lambda: False) -> Outcome:
        """Rebalance ``group`` if needed. ``observe(group, registrations)`` sees every snapshot;
        ``changed()`` says the group changed since this run began (raises :class:`Superseded`
        while waiting for acks, rather than waiting out members that may be gone)."""
        started = time.monotonic()
        excluded: Set[str] = set()
        attempts = self.settings.max_rebalance_retries + 1
        for attempt in range(attempts):
            snapshot = read_snapshot(self.client, group, topics)
            if observe:
                observe(group, snapshot.members.values())
            for cid, why in snapshot.rejected.items():
                log.error("group %s: registration of %s rejected: %s", group, cid, why)
            excluded &= set(snapshot.members)
            if excluded and excluded == set(snapshot.members):
                # Everyone left to assign to failed to ack: nothing can succeed until they do.
                if attempt + 1 < attempts:
                    self._sleep(self.settings.rebalance_backoff_ms * (2 ** attempt) / 1000.0)
                continue
            plan = compute_plan(snapshot, excluded)
            if plan.error:
                self._fail(snapshot, plan, plan.error)
                return Outcome(group, protocol.FAILED, snapshot.state.generation, error=plan.error,
                               duration_ms=_ms(started))
            reasons = reasons_to_rebalance(snapshot, plan, None)
            if not reasons:
                reasons = reasons_to_rebalance(snapshot, plan, read_owners(self.client, group, plan.assignment))
            if not reasons:
                self._settle(snapshot, plan)
                return Outcome(group, "unchanged", snapshot.state.generation, duration_ms=_ms(started))
            if self.abort():
                raise Abandoned("leadership is ending")
            generation = max(snapshot.state.generation, self.generations.get(group, 0)) + 1
            self.generations[group] = generation
            stale = stale_commands(self.client, group, excluded) if excluded else []
            commands = write_commands(self.client, self.epoch, snapshot, plan, generation, stale)
            late = wait_for_acks(self.client, commands, self.settings.rebalance_timeout_ms / 1000.0, self.abort,
                                 changed)
            if not late:
                state = protocol.STABLE if plan.members else protocol.EMPTY
                write_state(self.client, self.epoch, group,
                            GroupState(generation, state, list(plan.members), plan.assignment, plan.strategy,
                                       _rejected_error(snapshot), self.epoch),
                            0 if snapshot.state_version is None else snapshot.state_version + 1)
                return Outcome(group, state, generation, reasons, _moved(snapshot.state.assignment, plan.assignment),
                               _ms(started), sorted(excluded), members=len(plan.members))
            excluded |= late
            log.warning("group %s generation %d: no ack from %s within %d ms (attempt %d of %d)", group,
                        generation, sorted(late), self.settings.rebalance_timeout_ms, attempt + 1, attempts)
            if attempt + 1 < attempts:
                self._sleep(self.settings.rebalance_backoff_ms * (2 ** attempt) / 1000.0)
        error = f"can't rebalance after {attempts} attempts: members {sorted(excluded)} did not ack"
        snapshot = read_snapshot(self.client, group, topics)
        self._fail(snapshot, compute_plan(snapshot), error)
        raise ConsumerRebalanceFailedException(f"group {group}: {error}")

    def _settle(self, snapshot: Snapshot, plan: Plan) -> None:
        """Ownership is already right: record it as Stable (no commands) if the state says otherwise."""
        want = protocol.STABLE if plan.members else protocol.EMPTY
        error = _rejected_error(snapshot)
        if snapshot.state.state != want or snapshot.state.error != error:
            s = snapshot.state
            write_state(self.client, self.epoch, snapshot.group,
                        GroupState(s.generation, want, s.members, s.assignment, s.strategy, error, self.epoch),
                        snapshot.state_version)

    def _fail(self, snapshot: Snapshot, plan: Plan, error: str) -> None:
        s = snapshot.state
        write_state(self.client, self.epoch, snapshot.group,
                    GroupState(s.generation, protocol.FAILED, list(plan.members), s.assignment, plan.strategy,
                               error, self.epoch), snapshot.state_version)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.abort():
                raise Abandoned("leadership is ending")
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def _moved(before: Ownership, after: Ownership) -> int:
    old = {(t, p): s for t, parts in before.items() for p, s in parts.items()}
    return sum(1 for t, parts in after.items() for p, s in parts.items() if old.get((t, p)) != s)


def _ms(started: float) -> float:
    return (time.monotonic() - started) * 1000.0
