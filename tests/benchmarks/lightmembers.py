"""Light group members for the scale benchmark: thousands of members per process, few threads.

A :class:`MemberPool` runs many members over a few shared kazoo clients. Every member does on
the wire what :class:`consumer.member.GroupMember` does for its group's coordinator:

* registers: its command channel ``channel/<consumer id>`` first, then its ephemeral
  ``ids/<consumer id>`` with a real :class:`~coordinator.protocol.Registration` (the group's
  directories are made once per process instead of being looked at by every member);
* watches its channel (a one-shot watch re-armed by every read) and, when it fires, reads
  every command, then its shard's epoch znode, then the group state (all in the listing's
  round trip when the channel was empty at its last listing: the next commands are numbered
  after the last one seen), and decides what applies with the member's own pure
  :func:`consumer.commands.decide`;
* releases what moves away (owner nodes deleted, each with its offsets token checked) and
  claims what is new (its owners and offsets directories listed and the offsets znodes its
  last listing showed read, in one round trip; those listed now but not read, in a second;
  then ephemeral owner nodes created and offsets znodes rewritten compare-and-set at the
  versions just read, or created where there were none), each in transactions of at most
  :data:`~consumer.member.CLAIM_PARTITIONS` partitions, one after the other, the applied
  commands deleted with the last (the ack), as the member does.

Members are handled in batches: one worker thread per client takes every member whose channel
fired and runs each step for the whole batch as pipelined asynchronous calls, so a batch costs
one round trip per step, not one per member. That is where it is lighter than real members
(a thread each, synchronous steps, a housekeeping wake-up every second).

Not done: fetching and committing records, the lease, re-registration after a lost session,
static membership, eviction; a claim refused because an owner node is still held (its
previous owner has not released it yet) is tried again after a short pause instead of
watching the owners directory.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from typing import Dict, List, Optional, Tuple

from kazoo.exceptions import NodeExistsError, NoNodeError

from consumer import commands as channel
from consumer.member import CLAIM_PARTITIONS, decode_commands, partition_numbers
from coordinator import protocol
from coordinator.errors import CorruptZnode
from coordinator.protocol import Registration
from coordinator.zkclient import wait_in_order

#: A member whose claim was refused looks at its channel again after this long.
RETRY_S = 0.1
#: At most this many members are handled in one batch (bounds one step's pipelined requests).
BATCH = 500


class LightMember:
    """One member's protocol state (touched only by its client's worker thread)."""

    __slots__ = ("group", "consumer_id", "client", "wake", "applied", "owned", "tokens", "rebalances", "left",
                 "last_command", "channel_empty", "offsets_listed")

    def __init__(self, group: str, consumer_id: str, client, wake):
        self.group, self.consumer_id, self.client = group, consumer_id, client
        self.wake = wake                       # its channel watch (kazoo thread: queue only)
        self.applied = channel.NOTHING_APPLIED
        self.owned: Dict[Tuple[str, int], str] = {}    # (topic, partition) -> stream
        self.tokens: Dict[Tuple[str, int], int] = {}   # offsets znode version after our claim
        self.rebalances = 0
        self.left = False
        self.last_command = -1        # the number of the last command seen (it made its channel: none yet)
        self.channel_empty = False    # whether its last listing found the channel empty
        self.offsets_listed: Dict[str, set] = {}   # topic -> partitions with offsets znodes, as last listed


class _Worker:
    """The members of one client and the thread that handles them."""

    def __init__(self, client, epoch_path):
        self.client = client
        self.epoch_path = epoch_path
        self.members: List[LightMember] = []
        self._pending: Dict[str, LightMember] = {}   # consumer id -> member whose channel fired
        self._retry: List[Tuple[float, LightMember]] = []
        self._leaving: List[Tuple[LightMember, threading.Event]] = []
        self._cv = threading.Condition()
        self._stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True, name="light-members")

    def wake(self, member: LightMember) -> None:
        with self._cv:
            self._pending[member.consumer_id] = member
            self._cv.notify()

    def leave(self, member: LightMember, timeout: float) -> bool:
        """Have the worker thread take ``member`` out of the group (between two batches)."""
        done = threading.Event()
        with self._cv:
            self._leaving.append((member, done))
            self._cv.notify()
        return done.wait(timeout)

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._stopped and not self._due() and not self._leaving:
                    self._cv.wait(RETRY_S)
                if self._stopped:
                    return
                leaving, self._leaving = self._leaving, []
            for member, done in leaving:
                _leave(self.client, member)
                done.set()
            with self._cv:
                now = time.monotonic()
                for at, member in self._retry:
                    if at <= now:
                        self._pending[member.consumer_id] = member
                self._retry = [(at, m) for at, m in self._retry if at > now]
                batch = list(self._pending.values())[:BATCH]
                for member in batch:
                    del self._pending[member.consumer_id]
                batch = [m for m in batch if not m.left]
            try:
                refused = handle_batch(self.client, batch, self.epoch_path)
            except Exception:  # a connection blip: look at the whole batch again
                refused = batch
            if refused:
                with self._cv:
                    self._retry += [(time.monotonic() + RETRY_S, m) for m in refused]

    def _due(self) -> List[LightMember]:
        now = time.monotonic()
        return [m for at, m in self._retry if at <= now]


def handle_batch(client, batch: List[LightMember], epoch_path) -> List[LightMember]:
    """Read the channels of ``batch`` and apply what applies (``epoch_path(group)``: its shard
    epoch znode, None while unknown); returns the members whose claim was refused."""
    listings, guessed, guessing = [], {}, set()
    for m in batch:
        listings.append((m, client.get_children_async(protocol.channel_path(m.group, m.consumer_id), watch=m.wake)))
        if m.channel_empty:
            guessing.add(m.group)
            for path in (protocol.command_path(m.group, m.consumer_id, m.last_command + i) for i in (1, 2)):
                guessed[path] = client.get_async(path)
    # After the commands: the epochs and the states (so both are at least as new as them).
    after = _EpochsAndStates(client, guessing, epoch_path)
    wait_in_order([a for _, a in listings] + list(guessed.values()) + after.sent)
    busy, missed = [], False
    for m, a in listings:
        try:
            names = sorted(a.get())
        except NoNodeError:
            names = []
        base = protocol.channel_path(m.group, m.consumer_id)
        paths = [f"{base}/{c}" for c in names]
        guessed_here, m.channel_empty = m.channel_empty, not paths
        if paths:
            m.last_command = protocol.command_sequence(paths[-1])
            for path in paths:
                if path not in guessed:
                    guessed[path] = client.get_async(path)
                    missed = True
            missed = missed or not guessed_here
            busy.append((m, [(path, guessed[path]) for path in paths]))
    if not busy:
        return []
    if missed:  # commands read in a second round trip: the epochs and states again after them
        after = _EpochsAndStates(client, {m.group for m, _ in busy}, epoch_path)
    epoch_of, generations = after.answers()
    plans, ignored = [], []
    for m, gets in busy:
        commands = decode_commands(gets)
        decision = channel.decide(commands, m.consumer_id, m.applied, epoch_of.get(epoch_path(m.group)),
                                  generations.get(m.group))
        if decision.target is None:
            ignored += decision.ignored_paths
        else:
            plans.append((m, decision))
    for a in [client.delete_async(p) for p in ignored]:
        _quietly(a)
    return _apply(client, plans)


class _EpochsAndStates:
    """The shard epochs and the states of some groups, asked for at once (pipelined)."""

    def __init__(self, client, groups, epoch_path):
        paths = {epoch_path(g) for g in groups} - {None}
        self.epochs = {p: client.exists_async(p) for p in paths}
        self.states = {g: client.get_async(protocol.state_path(g)) for g in groups}
        self.sent = list(self.epochs.values()) + list(self.states.values())

    def answers(self):
        """(epoch znode path -> version, group -> generation), waiting for them."""
        wait_in_order(self.sent)
        epoch_of = {p: (a.get().version if a.get() is not None else None) for p, a in self.epochs.items()}
        generations = {}
        for group, a in self.states.items():
            try:
                generations[group] = protocol.GroupState.decode(a.get()[0], protocol.state_path(group)).generation
            except (NoNodeError, CorruptZnode):
                generations[group] = None
        return epoch_of, generations


def _apply(client, plans) -> List[LightMember]:
    """Release, then claim, for every member with a decision (each step pipelined for all),
    acking in the last write as the member does."""
    moves = []
    for m, d in plans:
        target = {(t, int(p)): s for t, parts in d.target.items() for p, s in parts.items()}
        revoked = {tp for tp, s in m.owned.items() if target.get(tp) != s}
        added = {tp: s for tp, s in target.items() if tp not in m.owned or tp in revoked}
        acks = d.ignored_paths + d.acks
        start = [d.start_path] if d.start_path else []
        if revoked and added:      # release with the acks, claim with the start
            moves.append((m, d, revoked, acks, added, start))
        elif revoked:              # nothing to claim: the start is acked with the release
            moves.append((m, d, revoked, acks + start, {}, []))
        else:
            moves.append((m, d, set(), [], added, acks + start))
    releases = [(m, revoked, _release_parts(client, m, revoked, release_acks))
                for m, d, revoked, release_acks, _, _ in moves if revoked]
    for r in range(max((len(parts) for *_, parts in releases), default=0)):  # each member's parts in turn
        sent = [parts[r].commit_async() for *_, parts in releases if r < len(parts)]
        wait_in_order(sent)
        for a in sent:
            a.get()  # a refused release (a token taken over) leaves the node to its new owner
    for m, revoked, _ in releases:
        for tp in revoked:
            m.owned.pop(tp, None)
            m.tokens.pop(tp, None)
    # As the member: its owners and offsets directories listed and the offsets znodes it knows
    # of read, in one round trip; the ones listed now but not read, in a second.
    reads = []
    for m, d, _, _, added, claim_acks in moves:
        topics = sorted({t for t, _ in added})
        listings = [(t, client.get_children_async(protocol.owners_path(m.group, t)),
                     client.get_children_async(protocol.offsets_path(m.group, t))) for t in topics]
        gets = {tp: client.get_async(protocol.offsets_path(m.group, *tp))
                for tp in added if tp[1] in m.offsets_listed.get(tp[0], ())}
        reads.append((m, d, added, claim_acks, listings, gets))
    wait_in_order([a for *_, listings, gets in reads for a in [x for _, o, f in listings for x in (o, f)]
                   + list(gets.values())])
    looked = []
    for m, d, added, claim_acks, listings, gets in reads:
        held = {(t, p) for t, owners, _ in listings for p in partition_numbers(_children(owners))}
        for t, _, offsets in listings:
            m.offsets_listed[t] = partition_numbers(_children(offsets))
        for tp in added:
            if tp not in gets and tp[1] in m.offsets_listed[tp[0]]:
                gets[tp] = client.get_async(protocol.offsets_path(m.group, *tp))
        looked.append((m, d, added, claim_acks, held, gets))
    wait_in_order([a for *_, gets in looked for a in gets.values()])
    # As the member: CLAIM_PARTITIONS a transaction, each member's parts one after the other
    # (the members' parts of one round pipelined), the acks with the last part.
    claims, refused = [], []
    for m, d, added, claim_acks, held, gets in looked:
        if held & set(added):
            refused.append(m)  # its previous owner has not released it yet
            continue
        order = list(added)
        parts = [order[i:i + CLAIM_PARTITIONS] for i in range(0, len(order), CLAIM_PARTITIONS)] or [[]]
        claims.append((m, d, added, gets, claim_acks, parts))
    for r in range(max((len(parts) for *_, parts in claims), default=0)):
        sent = []
        for m, d, added, gets, claim_acks, parts in claims:
            if r >= len(parts) or m in refused:
                continue
            t, versions = client.transaction(), {}
            for tp in parts[r]:
                t.create(protocol.owners_path(m.group, *tp), added[tp].encode(), ephemeral=True)
            for tp in parts[r]:
                stored = _stored(gets.get(tp))
                if stored is None:
                    t.create(protocol.offsets_path(m.group, *tp), protocol.NO_OFFSET)
                    versions[tp] = 0
                else:
                    t.set_data(protocol.offsets_path(m.group, *tp), stored[0], version=stored[1].version)
                    versions[tp] = stored[1].version + 1
            final = r == len(parts) - 1
            for path in claim_acks if final else ():
                t.delete(path)
            sent.append((m, d, {tp: added[tp] for tp in parts[r]}, versions, final,
                         t.commit_async() if t.operations else None))
        wait_in_order([a for *_, a in sent if a is not None])
        for m, d, part, versions, final, a in sent:
            if a is not None and any(isinstance(x, Exception) for x in a.get()):
                refused.append(m)  # an owner node still held, or an offset written meanwhile
                continue
            m.owned.update(part)
            m.tokens.update(versions)
            for topic, p in part:
                m.offsets_listed.setdefault(topic, set()).add(p)
            if final:
                _applied(m, d)
    return refused


def _release_parts(client, m: LightMember, partitions, deletes: List[str]):
    """The transactions of a release, as a member writes them: its owner nodes deleted, each
    with a check of its token, CLAIM_PARTITIONS a transaction; ``deletes`` with the last."""
    order = list(partitions)
    chunks = [order[i:i + CLAIM_PARTITIONS] for i in range(0, len(order), CLAIM_PARTITIONS)] or [[]]
    parts = []
    for k, chunk in enumerate(chunks):
        t = client.transaction()
        for tp in chunk:
            if tp in m.tokens:
                t.check(protocol.offsets_path(m.group, *tp), m.tokens[tp])
            t.delete(protocol.owners_path(m.group, *tp))
        for path in deletes if k == len(chunks) - 1 else ():
            t.delete(path)
        parts.append(t)
    return parts


def _leave(client, m: LightMember) -> None:
    """Leave as a member does: its owner nodes released (each with its token checked), the
    commands left in its channel and its registration deleted with the last of those
    transactions; it handles nothing after that."""
    m.left = True
    base = protocol.channel_path(m.group, m.consumer_id)
    commands = [f"{base}/{c}" for c in sorted(client.get_children(base))]
    for t in _release_parts(client, m, m.owned, commands + [protocol.ids_path(m.group, m.consumer_id)]):
        t.commit_async().get()
    m.owned.clear()
    m.tokens.clear()


def _applied(m: LightMember, d) -> None:
    m.applied = d.applied
    m.rebalances += 1


def _children(pending) -> List[str]:
    try:
        return pending.get()
    except NoNodeError:
        return []


def _stored(pending):
    """(data, stat) of an offsets znode read, or None where it was not read (none was listed)
    or is gone."""
    if pending is None:
        return None
    try:
        return pending.get()
    except NoNodeError:
        return None


def _quietly(pending) -> None:
    try:
        pending.get()
    except NoNodeError:
        pass


class MemberPool:
    """Members of ``groups`` (``per_group`` each, subscribed to ``topic``) over ``clients``.

    ``start()`` makes the directories, registers every member (pipelined) and starts one
    worker thread per client; ``stop()`` stops the workers (the members' ephemeral nodes go
    with the clients' sessions)."""

    def __init__(self, clients, groups: List[str], per_group: int, topic: str):
        self.clients, self.groups, self.per_group, self.topic = clients, groups, per_group, topic
        self.workers = [_Worker(c, None) for c in clients]
        self.members: List[LightMember] = []

    def start(self) -> "MemberPool":
        first = self.clients[0]
        for group in self.groups:
            for path in (protocol.ids_path(group), protocol.owners_path(group, self.topic),
                         protocol.offsets_path(group, self.topic)):
                first.ensure_path_async(path)
            first.ensure_path(protocol.channel_path(group))
        host = socket.gethostname()
        registration = Registration({self.topic: 1}, protocol.PATTERN_STATIC, ["sticky", "range"], host)
        k = 0
        for group in self.groups:
            for _ in range(self.per_group):
                worker = self.workers[k % len(self.workers)]
                k += 1
                cid = f"{group}_{host}-{protocol.now_ms()}-{os.urandom(4).hex()}"
                member = LightMember(group, cid, worker.client, None)
                member.wake = _waker(worker, member)
                worker.members.append(member)
                self.members.append(member)
        for step in (self._create_channels, lambda m: m.client.create_async(
                protocol.ids_path(m.group, m.consumer_id), registration.encode(), ephemeral=True)):
            for i in range(0, len(self.members), BATCH):
                for a in [step(m) for m in self.members[i:i + BATCH]]:
                    try:
                        a.get()
                    except NodeExistsError:
                        pass
        for worker in self.workers:
            worker.epoch_path = self._epoch_path_for(worker)
            worker.thread.start()
            for member in worker.members:
                worker.wake(member)
        return self

    @staticmethod
    def _create_channels(m: LightMember):
        return m.client.create_async(protocol.channel_path(m.group, m.consumer_id))

    @staticmethod
    def _epoch_path_for(worker: _Worker):
        """``group -> its shard epoch path``, once a controller wrote the shard count (read
        once per worker; None until then)."""
        count: List[int] = []

        def epoch_path_of(group: str) -> Optional[str]:
            if not count:
                try:
                    count.append(protocol.ShardsInfo.decode(worker.client.get(protocol.SHARDS)[0]).count)
                except (NoNodeError, CorruptZnode):
                    return None
            return protocol.shard_epoch_path(protocol.shard_of(group, count[0]))
        return epoch_path_of

    def leave(self, member: LightMember, timeout: float = 10.0) -> bool:
        """Take ``member`` out of its group as a member leaves (see :func:`_leave`); True once done."""
        return next(w for w in self.workers if w.client is member.client).leave(member, timeout)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        for worker in self.workers:
            worker.thread.join(5)


def _waker(worker: _Worker, member: LightMember):
    def wake(_event=None):  # kazoo thread: queue only
        worker.wake(member)
    return wake
