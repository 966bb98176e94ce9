"""Who may write: epochs, fences and terms of leadership.

Two kinds of leader write to ZooKeeper, and each writes only while it holds an epoch:

* **The controller** (one node, elected) holds the *controller epoch*: the version of
  ``/consumers/coordinator/epoch``, bumped by a compare-and-set when a node is elected. It
  fences the leader znode, the shard placements and the topic mirror's writes.
* **A shard's leader** (the node the controller placed the shard on) holds the *shard epoch*:
  the version of ``/consumers/coordinator/shards/<shard>/epoch``, bumped by the controller in
  the very transaction that hands the shard to a node. It fences every write of the shard's
  groups: their state, commands, timeline.

A :class:`Fence` is (epoch znode, epoch). Every fenced write is one transaction whose first
operation checks the fence (:func:`fenced`), committed by :func:`fenced_commit`, which turns a
failed check into :class:`Deposed`: the epoch moved on, someone else leads now, stop writing at
once. So a leader that paused, was cut off or simply lost its shard can never write again,
whatever it believes (the failure of KAFKA-6082, a deposed controller that kept writing).

A :class:`Term` is one holder's view of its lead, with the fence of its epoch:
:class:`Leadership` (the controller's term) and :class:`ShardTerm` (one shard at one epoch).
A term ends once, from any thread, with a reason; it is *active* while not ended and while the
node's connection is not suspended (a suspended node may already have lost its session: it
writes nothing until it is back).

Epochs never go back. A missing epoch znode (deleted by someone) is restored above the highest
epoch recorded anywhere (:func:`restore_epoch`; the controller epoch from the leader znode, a
shard's from its assignment, its groups' states and the nodes' reports): members ignore
commands of epochs below the one they applied, so an epoch that went back would leave groups
unserved.

Members fence their own writes differently: an offset commit is a compare-and-set on the
version of the partition's offsets znode, which every claim rewrites (the fencing token of
:mod:`consumer.member`).
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Callable, Dict

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from coordinator import protocol, read
from coordinator.errors import CorruptZnode
from coordinator.lifecycle import Lifecycle
from coordinator.zkclient import TransactionFailed, commit

log = logging.getLogger("zkgroups.controller")  # restoring epochs is the controller's work: its lines stay its own

#: Version bumps per transaction when a deleted epoch znode is restored.
EPOCH_RESTORE_BATCH = 1000


class Deposed(Exception):
    """The fence failed: another node leads the shard now (or the controller moved on). Stop
    writing at once."""


# ---------------------------------------------------------------- fences

@dataclass(frozen=True)
class Fence:
    """A write is allowed only while the znode at ``path`` has version ``epoch`` (checked as the
    first operation of the write's transaction)."""
    path: str
    epoch: int


def controller_fence(epoch: int) -> Fence:
    """The fence of the controller at ``epoch`` (the controller epoch znode's version)."""
    return Fence(protocol.EPOCH, epoch)


def shard_fence(shard: int, epoch: int) -> Fence:
    """The fence of ``shard``'s leader at ``epoch`` (the shard's epoch znode's version)."""
    return Fence(protocol.shard_epoch_path(shard), epoch)


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


# ---------------------------------------------------------------- terms

class TermState(enum.Enum):
    ACTIVE = "active"
    ENDED = "ended"


class Term(Lifecycle[TermState]):
    """A term of leadership at one epoch (``fence``).

    States: ACTIVE --end(reason)--> ENDED, once, from any thread (a later ``end()`` keeps the
    first reason). A term may write while :attr:`active`: not ended, and its node's connection
    not suspended (``suspended()``, the node's own answer, read on every check: a suspended
    node may already have lost its session)."""

    TRANSITIONS = {TermState.ACTIVE: {TermState.ENDED}, TermState.ENDED: set()}

    def __init__(self, fence: Fence, suspended: Callable[[], bool] = lambda: False):
        super().__init__(TermState.ACTIVE)
        self.fence, self.epoch = fence, fence.epoch
        self.reason = ""
        self._suspended = suspended

    def end(self, reason: str) -> None:
        with self._state_lock:
            if self.state is TermState.ACTIVE:
                self.reason = reason
                self._set_state(TermState.ENDED)

    @property
    def ended(self) -> bool:
        return self.state is TermState.ENDED

    @property
    def active(self) -> bool:
        return not self.ended and not self._suspended()


class ShardTerm(Term):
    """One node's lead of one shard at one epoch (fenced by the shard's epoch znode)."""

    def __init__(self, shard: int, epoch: int, suspended: Callable[[], bool] = lambda: False):
        super().__init__(shard_fence(shard, epoch), suspended)
        self.shard = shard

    def _lifecycle_name(self) -> str:
        return f"shard {self.shard} term (epoch {self.epoch})"

    def __repr__(self) -> str:
        return f"ShardTerm(shard={self.shard}, epoch={self.epoch}, ended={self.ended})"


class Leadership(Term):
    """One term as controller (fenced by the controller epoch znode)."""

    def __init__(self, epoch: int, suspended: Callable[[], bool] = lambda: False):
        super().__init__(controller_fence(epoch), suspended)

    def _lifecycle_name(self) -> str:
        return f"controller term (epoch {self.epoch})"


# ---------------------------------------------------------------- epochs

def bump_epoch(client, path: str, recorded: Callable[[], int], what: str) -> int:
    """The next epoch of the epoch znode ``path``: a compare-and-set of its version (one try;
    BadVersionError or NodeExistsError when someone else wrote it meanwhile). A missing epoch
    znode is restored above ``recorded()`` first (``what`` names it in that line)."""
    stat = client.exists(path)
    if stat is None:
        restore_epoch(client, path, recorded(), what)
        stat = client.exists(path)
    new = client.set(path, str(stat.version + 1).encode(), version=stat.version)
    return new.version


def highest_recorded_epoch(client) -> int:
    """The highest controller epoch recorded (the leader znode's; 0 if none)."""
    try:
        info = read.leader(client)
    except CorruptZnode:
        return 0
    return info.epoch if info else 0


def restore_epoch(client, path: str, floor: int, what: str) -> None:
    """Create the missing epoch znode ``path`` with a version of at least ``floor`` (each
    ``set_data`` bumps it; one transaction carries many), saying so if ``floor`` is above 0."""
    client.ensure_path(path.rsplit("/", 1)[0])
    try:
        client.create(path, b"0")
    except NodeExistsError:
        pass  # restored by someone else meanwhile
    if floor:
        log.error("the epoch znode %s (%s) was missing although epoch %d was recorded; restoring it above that",
                  path, what, floor)
    while True:
        stat = client.exists(path)
        if stat is None or stat.version >= floor:
            return
        t = client.transaction()
        for _ in range(min(EPOCH_RESTORE_BATCH, floor - stat.version)):
            t.set_data(path, b"restored")
        commit(t)


def recorded_shard_epochs(client, count: int) -> Dict[int, int]:
    """The highest epoch recorded per shard: in its assignment, its groups' states and the
    nodes' reports (0 where nothing is recorded). Reads pipelined."""
    highest = {s: 0 for s in range(count)}
    assignments = [(s, client.get_async(protocol.shard_path(s))) for s in range(count)]
    groups = read.groups(client)
    states = [(g, client.get_async(protocol.state_path(g))) for g in groups]
    nodes = [(n, client.get_async(protocol.node_path(n))) for n in read.children(client, protocol.NODES)]
    for s, a in assignments:
        try:
            highest[s] = max(highest[s], protocol.ShardAssignment.decode(a.get()[0], protocol.shard_path(s)).epoch)
        except (NoNodeError, CorruptZnode):
            pass
    for g, a in states:
        try:
            s = protocol.shard_of(g, count)
            highest[s] = max(highest[s], protocol.GroupState.decode(a.get()[0], protocol.state_path(g)).epoch)
        except (NoNodeError, CorruptZnode):
            pass
    for n, a in nodes:
        try:
            for s, report in protocol.NodeInfo.decode(a.get()[0], protocol.node_path(n)).shards.items():
                if s in highest:
                    highest[s] = max(highest[s], int(report["epoch"]))
        except (NoNodeError, CorruptZnode):
            pass
    return highest
