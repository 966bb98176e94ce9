"""One group's rebalance as a pipeline: read → compute → diff → write → wait.

``read_snapshot``, ``read_owners`` and ``find_squatters`` are the reads of a run, each one or
two pipelined round trips (the verification shortcuts are :mod:`coordinator.verify`'s);
``compute_plan`` and ``reasons_to_rebalance`` are pure functions of what was read
(:mod:`coordinator.plan`); ``write_commands`` is one ZooKeeper transaction fenced by the
group's shard epoch (several, each fenced, when a generation is larger than one request);
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

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, NamedTuple, NoReturn, Optional, Protocol, Set, Tuple

from kazoo.exceptions import NoNodeError

from coordinator import protocol, read, static
from coordinator.errors import ConsumerRebalanceFailedException, CorruptZnode
from coordinator.fencing import Fence, fenced, fenced_commit
from coordinator.plan import (Plan, Snapshot, acked_state, compute_plan, failed_state, late_partitions, moved,
                              reasons_to_rebalance, rebalancing_state, restorable, settled_state, static_hold)
from coordinator.protocol import GroupState, Ownership, Registration
from coordinator.verify import (Fingerprint, fingerprint, owners_as_assigned, recorded_plan, still_as_verified,
                                verified_record)
from coordinator.zkclient import (MAX_REQUEST_BYTES, TransactionFailed, children_and_pzxid, transaction_bytes,
                                  wait_in_order)

log = logging.getLogger("zkgroups.rebalance")

#: While waiting for acks: how often every pending command is looked at again (watches do the
#: work; this only covers a watch lost to a reconnect).
ACK_RECHECK_S = 2.0
#: How often, while waiting for acks, leadership and changes of the group are looked at.
ACK_POLL_S = 0.25
#: A create's serialized size beyond its path and data (header, ACL, flags), with room to spare.
COMMAND_OVERHEAD = 64


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

#: Registrations decoded before, by their bytes: a member's registration is read at every run
#: of its group, and decoding it was 8 % of a node's CPU in a cold start of 1,000 groups.
_REGISTRATIONS: Dict[bytes, Registration] = {}
REGISTRATIONS_KEPT = 65536


def decode_registration(raw: bytes, path: str) -> Registration:
    """``Registration.decode``, once per distinct registration (the result is shared: read-only)."""
    registration = _REGISTRATIONS.get(raw)
    if registration is None:
        registration = Registration.decode(raw, path)  # CorruptZnode is not kept: said again next time
        if len(_REGISTRATIONS) >= REGISTRATIONS_KEPT:
            _REGISTRATIONS.clear()
        _REGISTRATIONS[raw] = registration
    return registration


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
    ids, ids_pzxid = children_and_pzxid(ids_async)
    if ids_pzxid == -1 and members_watch is not None and client.exists(path, watch=members_watch) is not None:
        ids, ids_pzxid = children_and_pzxid(client.get_children_async(path, watch=members_watch,
                                                                       include_data=True))  # made meanwhile
    channels, channel_pzxid = children_and_pzxid(channels_async)
    channels = set(channels)
    members, rejected = {}, {}
    pending = [(cid, client.get_async(protocol.ids_path(group, cid))) for cid in ids]
    wait_in_order([a for _, a in pending])
    for cid, a in pending:
        path = protocol.ids_path(group, cid)
        try:
            raw, _ = a.get()
            members[cid] = decode_registration(raw, path)
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


def read_owners(client, group: str, topics, pzxids: Optional[Dict[str, int]] = None) -> Ownership:
    """Who holds each partition now: topic -> partition -> stream id (ephemeral owner nodes).
    ``pzxids``, if given, receives each owners/<topic> znode's pzxid as listed (before the
    owner nodes were read: a change after the listing shows as a newer one)."""
    children = {t: client.get_children_async(protocol.owners_path(group, t), include_data=True) for t in topics}
    gets = []
    for topic, a in children.items():
        listed, pzxid = children_and_pzxid(a)
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


# ---------------------------------------------------------------- write

def _write_state(t, group: str, state: GroupState, version: Optional[int]) -> None:
    if version is None:
        t.create(protocol.state_path(group), state.encode())
    else:
        t.set_data(protocol.state_path(group), state.encode(), version=version)


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
    state = rebalancing_state(snapshot, plan, generation, epoch, squatted)
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
    """How a run that did not raise ended: ``changed`` says whether it rebalanced the group
    (wrote a generation's commands, or gave returning static members their share back, and
    every member acked) or found its ownership already right (nothing written but, when it
    changed, the state's record of it); ``state`` is the group's state after the run (Stable,
    or Empty without members). A run that fails raises instead."""
    group: str
    changed: bool
    state: str
    generation: int
    reasons: List[str] = field(default_factory=list)
    moved: int = 0
    duration_ms: float = 0.0
    excluded: List[str] = field(default_factory=list)
    members: int = 0
    unavailable: int = 0             # partitions left unassigned: held by squatters (check again later)
    recheck_ms: Optional[int] = None  # a static member is held away: look again when its grace ends
    final_state: Optional[GroupState] = None  # the state znode as the run left it (written or read)


class RebalanceSettings(Protocol):
    """What the rebalancer reads of its node's configuration
    (:class:`~coordinator.coordinator.CoordinatorConfig`)."""
    rebalance_timeout_ms: int
    max_rebalance_retries: int
    rebalance_backoff_ms: int


@dataclass
class _Run:
    """One run of one group: what the caller gave it, and what its attempts learnt."""
    group: str
    fence: Fence
    topics: Callable[[], Dict[str, int]]
    abort: Callable[[], bool]
    changed: Callable[[], bool]
    observe: Optional[Callable]
    members_watch: Optional[Callable]
    started: float
    squatted: Dict[Tuple[str, int], int]                 # partitions held by non-members: left unassigned
    excluded: Set[str] = field(default_factory=set)     # members that did not ack an attempt: left out
    recheck_ms: Optional[int] = None                    # when the next static member's hold ends


@dataclass
class _Diff:
    """What an attempt found: why the group needs commands (none: its ownership is right),
    whether its ownership can be verified (no squatter, no static member held away), the
    owners' pzxids it verified, and the returning static members that are all it needs."""
    reasons: List[str]
    verifiable: bool
    owner_pzxids: Optional[Dict[str, int]] = None
    restore: Set[str] = field(default_factory=set)


class _Generation(NamedTuple):
    """What an attempt writes: the generation, why, the stale commands to delete, and to whom
    (None: every member not held away)."""
    number: int
    reasons: List[str]
    stale: List[str]
    recipients: Optional[List[str]]


def choose_plan(snapshot: Snapshot, excluded, squatted, hold: static.Hold) -> Plan:
    """The plan of an attempt: the state's own while none of its inputs changed since it was
    verified (:func:`~coordinator.verify.recorded_plan`), trusted only when no member is left
    out for not acking, no partition is squatted and the group has no static members (their
    records and holds are computed each time); else computed afresh."""
    if not excluded and not squatted and not hold.static:
        recorded = recorded_plan(snapshot)
        if recorded is not None:
            return recorded
    return compute_plan(snapshot, excluded, set(squatted), hold)


def next_generation(recorded: int, last_written: int) -> int:
    """The generation after the state's (``recorded``) and this node's last (``last_written``):
    generations only grow, even if someone deleted or damaged the state znode."""
    return max(recorded, last_written) + 1


class GroupRebalancer:
    """Runs the pipeline for a group with bounded retries (one instance per node, shared by its
    handler threads; callers never run it for the same group twice at once).

    A run is a loop of attempts, each of named steps: ``_look`` (read the group),
    ``_plan`` (the target), ``_diff`` (does anything need commands? the verification
    shortcut), then either ``_verified_unchanged`` (ownership right: record it, done) or
    ``_attempt`` (write a generation, or give returning static members their share back
    with ``_restore_static``; wait for the acks; ``_acked`` records Stable).

    A failed attempt (members did not ack in time) is retried after a backoff with the
    non-acking members left out (``_blame``); after ``max_rebalance_retries`` the group is
    ``Failed`` and :class:`ConsumerRebalanceFailedException` is raised (``_give_up``); the
    caller schedules a later retry. Members that did not ack because a squatter holds a
    partition they were given are not blamed: the squatter is named and the partition left
    unassigned in the next attempt.
    """

    def __init__(self, client, settings: RebalanceSettings):
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
            return self._run(_Run(group, fence, topics, abort, changed, observe, members_watch,
                                  started=time.monotonic(), squatted={}))
        except TransactionFailed as e:
            # A znode written under is gone, and so is ids/, where members register from the
            # group's start to its deletion: the group was deleted.
            if not isinstance(e.error, NoNodeError) or self.client.exists(protocol.ids_path(group)) is not None:
                raise
        self.forget(group)
        first = group not in self.deleted
        self.deleted.add(group)
        raise GroupDeleted(f"group {group} was deleted during its rebalance", first) from None

    def _run(self, run: _Run) -> Outcome:
        self.verified.pop(run.group, None)  # recorded again only by a run that verifies it
        run.squatted = self._still_squatted(run.group)
        attempts = self.settings.max_rebalance_retries + 1
        for attempt in range(attempts):
            snapshot = self._look(run)
            if snapshot is not None:
                plan = self._plan(run, snapshot)
                diff = self._diff(run, snapshot, plan)
                if not diff.reasons:
                    return self._verified_unchanged(run, snapshot, plan, diff)
                outcome = self._attempt(run, snapshot, plan, diff, attempt, attempts)
                if outcome is not None:
                    return outcome
            if attempt + 1 < attempts:
                _sleep(self.settings.rebalance_backoff_ms * (2 ** attempt) / 1000.0, run.abort)
        self._give_up(run, attempts)

    # ---- the steps

    def _look(self, run: _Run) -> Optional[Snapshot]:
        """Read the group (re-arming the caller's members watch), show its members to
        ``observe``, then take the caller's view of the topics (after observe: see
        :meth:`run`). None when every member left to assign to failed to ack: nothing can
        succeed until they do."""
        snapshot = read_snapshot(self.client, run.group, {}, run.members_watch)
        if snapshot.ids_pzxid != -1:
            self.deleted.discard(run.group)  # (made again since)
        if run.observe:
            run.observe(run.group, snapshot.members.values())
        snapshot = dataclasses.replace(snapshot, topics=run.topics())
        run.excluded &= set(snapshot.members)
        if run.excluded and run.excluded == set(snapshot.members):
            return None
        return snapshot

    def _plan(self, run: _Run, snapshot: Snapshot) -> Plan:
        """The attempt's plan (:func:`choose_plan`); static members away and still held are
        counted, and the run looks again when the first hold ends. Problems are logged once."""
        now = protocol.now_ms()
        hold = static_hold(snapshot, now)
        run.recheck_ms = None if hold.next_deadline_ms is None else max(0, hold.next_deadline_ms - now)
        plan = choose_plan(snapshot, run.excluded, run.squatted, hold)
        self._report(snapshot, plan, run.squatted)
        return plan

    def _diff(self, run: _Run, snapshot: Snapshot, plan: Plan) -> _Diff:
        """Why the group needs commands: first from the snapshot alone; if it shows none, from
        the owner nodes, unless the state's verification still holds (one round trip instead
        of reading them all; not on a full check)."""
        diff = _Diff(reasons_to_rebalance(snapshot, plan, None), verifiable=not run.squatted and not plan.held)
        if diff.reasons:
            return diff
        if diff.verifiable and run.group not in self.must_read:
            diff.owner_pzxids = still_as_verified(self.client, snapshot, plan)  # verified before, unchanged since
        if diff.owner_pzxids is None:
            diff.owner_pzxids = {}
            owners = read_owners(self.client, run.group, plan.assignment, diff.owner_pzxids)
            diff.reasons = reasons_to_rebalance(snapshot, plan, owners)
            diff.restore = restorable(snapshot, plan, owners) if diff.reasons else set()
            self.must_read.discard(run.group)
        return diff

    def _verified_unchanged(self, run: _Run, snapshot: Snapshot, plan: Plan, diff: _Diff) -> Outcome:
        """Ownership is already right: record it (no commands) with what was verified, if the
        state says otherwise, and keep the group's fingerprint."""
        record = verified_record(snapshot, plan, diff.owner_pzxids) if diff.verifiable else {}
        settled = settled_state(snapshot, plan, run.fence.epoch, run.squatted, record)
        if settled is not None:  # snapshot.state_mzxid follows the write: it is fingerprinted
            snapshot.state_mzxid = write_state(self.client, run.fence, run.group, settled, snapshot.state_version)
        if diff.verifiable:
            self.verified[run.group] = fingerprint(snapshot, plan, diff.owner_pzxids)
        return Outcome(run.group, False, protocol.STABLE if plan.members else protocol.EMPTY,
                       snapshot.state.generation, duration_ms=_ms(run.started), members=len(plan.members),
                       unavailable=len(run.squatted), recheck_ms=run.recheck_ms,
                       final_state=snapshot.state if settled is None else settled)

    def _attempt(self, run: _Run, snapshot: Snapshot, plan: Plan, diff: _Diff, attempt: int,
                 attempts: int) -> Optional[Outcome]:
        """Write the commands (a new generation, or the returning static members' share back)
        and wait for the acks: the outcome once every member acked, None if some did not."""
        if run.abort():
            raise Abandoned("leadership is ending")
        generation = self._restore_static(run, snapshot, diff) if diff.restore else self._next(run, snapshot, diff)
        commands = write_commands(self.client, run.fence, snapshot, plan, generation.number, generation.stale,
                                  run.squatted, generation.recipients)
        late = wait_for_acks(self.client, commands, self.settings.rebalance_timeout_ms / 1000.0, run.abort,
                             run.changed)
        if not late:
            return self._acked(run, snapshot, plan, diff, generation)
        self._blame(run, plan, late, generation.number, attempt, attempts)
        return None

    def _restore_static(self, run: _Run, snapshot: Snapshot, diff: _Diff) -> _Generation:
        """Returning static members are all the group needs: they get their share again at the
        current generation; the others keep theirs and get no command."""
        return _Generation(snapshot.state.generation, [f"static members {sorted(diff.restore)} returned"],
                           stale_commands(self.client, run.group, diff.restore), sorted(diff.restore))

    def _next(self, run: _Run, snapshot: Snapshot, diff: _Diff) -> _Generation:
        """A new generation for every member not held away (the commands still waiting for
        members left out are deleted)."""
        number = self.generations[run.group] = next_generation(snapshot.state.generation,
                                                                self.generations.get(run.group, 0))
        stale = stale_commands(self.client, run.group, run.excluded) if run.excluded else []
        return _Generation(number, diff.reasons, stale, None)

    def _acked(self, run: _Run, snapshot: Snapshot, plan: Plan, diff: _Diff, generation: _Generation) -> Outcome:
        """Every member acked: record the state (Stable or Empty) with the owner nodes verified
        as assigned when they can be."""
        owner_pzxids = owners_as_assigned(self.client, run.group, plan.assignment) if diff.verifiable else None
        record = verified_record(snapshot, plan, owner_pzxids) if owner_pzxids is not None else {}
        state = acked_state(snapshot, plan, generation.number, run.fence.epoch, run.squatted, record)
        snapshot.state_mzxid = write_state(self.client, run.fence, run.group, state,
                                           0 if snapshot.state_version is None else snapshot.state_version + 1)
        if record and snapshot.state_mzxid is not None:
            self.verified[run.group] = fingerprint(snapshot, plan, owner_pzxids)
        return Outcome(run.group, True, state.state, generation.number, generation.reasons,
                       moved(snapshot.state.assignment, plan.assignment), _ms(run.started), sorted(run.excluded),
                       members=len(plan.members), unavailable=len(run.squatted), recheck_ms=run.recheck_ms,
                       final_state=state)

    def _blame(self, run: _Run, plan: Plan, late: Set[str], generation: int, attempt: int, attempts: int) -> None:
        """Some members did not ack: if squatters hold partitions they were given, the next
        attempt leaves those partitions unassigned; otherwise it leaves those members out."""
        blocked = find_squatters(self.client, run.group, late_partitions(plan, late))
        if blocked:
            run.squatted.update(blocked)
            self.squatted[run.group] = run.squatted
        else:
            run.excluded |= late
            log.warning("group %s generation %d: no ack from %s within %d ms (attempt %d of %d)", run.group,
                        generation, sorted(late), self.settings.rebalance_timeout_ms, attempt + 1, attempts)

    def _give_up(self, run: _Run, attempts: int) -> NoReturn:
        """Out of attempts: the group is Failed (tried again later by the caller)."""
        error = f"can't rebalance after {attempts} attempts: members {sorted(run.excluded)} did not ack"
        snapshot = read_snapshot(self.client, run.group, run.topics())
        plan = compute_plan(snapshot, hold=static_hold(snapshot, protocol.now_ms()))
        write_state(self.client, run.fence, run.group, failed_state(snapshot, plan, error, run.fence.epoch),
                    snapshot.state_version)
        raise ConsumerRebalanceFailedException(f"group {run.group}: {error}")

    # ---- what a run remembers between runs

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


def _sleep(seconds: float, abort: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if abort():
            raise Abandoned("leadership is ending")
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def _ms(started: float) -> float:
    return (time.monotonic() - started) * 1000.0
