"""The controller: the one elected coordinator node that places shards on live nodes.

Every node contends in kazoo's election under ``/consumers/coordinator/election``. The winner
bumps the controller epoch (the version of ``/consumers/coordinator/epoch``), publishes
``/consumers/coordinator/leader`` and, for its term (:class:`Controller`):

* makes sure the shards exist: ``/consumers/coordinator/shards`` (:class:`ShardsInfo`, the
  shard count, written once) and, per shard, its assignment znode and its epoch znode. A missing
  epoch znode is restored above every epoch recorded for the shard (its assignment, its groups'
  states, the nodes' reports): members ignore commands of epochs below the one they applied, so
  an epoch that went back would leave the shard's groups unserved.
* keeps every shard on one live node (:func:`coordinator.shards.place_shards` over the children
  of ``/consumers/coordinator/nodes``): each change is one transaction fenced by the controller
  epoch that bumps the moved shards' epochs and records their new owners. The old owner can no
  longer write anything of those groups from that moment (its writes check the old epoch).
* runs the topic mirror of a KRaft Kafka cluster when ``bootstrap_servers`` is configured
  (:mod:`coordinator.mirror`).

A controller failover moves nothing: placements and shard epochs live in ZooKeeper, and the new
controller changes only what the live nodes require.

Threads: the controller runs on its node's election thread; kazoo's watch callbacks and the
node's connection listener only put an :class:`Event` on ``events``. The mirror has a thread
of its own.
"""
from __future__ import annotations

import enum
import logging
import queue
import time
from typing import Dict, List, Optional

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from coordinator import protocol, read
from coordinator.errors import CorruptZnode
from coordinator.fencing import Deposed, fenced, fenced_commit, recorded_shard_epochs, restore_epoch
from coordinator.lifecycle import Lifecycle
from coordinator.mirror import TopicMirror
from coordinator.shards import place_shards
from coordinator.zkclient import TransactionFailed

log = logging.getLogger("zkgroups.controller")

#: The controller looks at the placement this often even when no watch fires (watches are hints).
RECONCILE_INTERVAL_S = 5.0


class Event(enum.Enum):
    """What the controller's thread is told (kazoo's threads and the node's connection listener
    only put these on its queue)."""
    NODES = "nodes"              # the live nodes changed
    EPOCH = "epoch"              # a shard's epoch znode was deleted or bumped by someone
    RECONNECTED = "reconnected"  # the connection is back after a suspension: look at everything again


class ControllerState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class Controller(Lifecycle[ControllerState]):
    """One term as controller (see the module docstring). ``term`` is the node's
    :class:`~coordinator.fencing.Leadership` for this election: its epoch fences every write.

    States (:class:`ControllerState`): NEW --run()--> RUNNING --stop()--> STOPPED, and NEW
    --stop()--> STOPPED. ``run()`` works until the term ends (or ``stop()``), once; ``stop()``
    stops the mirror, once."""

    TRANSITIONS = {ControllerState.NEW: {ControllerState.RUNNING, ControllerState.STOPPED},
                   ControllerState.RUNNING: {ControllerState.STOPPED}, ControllerState.STOPPED: set()}

    def __init__(self, client, config, node_id: str, term):
        super().__init__(ControllerState.NEW)
        self.client, self.config, self.node_id, self.term = client, config, node_id, term
        self.fence = term.fence
        self.events: "queue.Queue[Event]" = queue.Queue()
        self.count = 0
        self.mirror: Optional[TopicMirror] = None
        if config.bootstrap_servers:
            self.mirror = TopicMirror(client, self.fence, config.bootstrap_servers, config.kafka,
                                      config.mirror_interval_ms, active=lambda: self.term.active,
                                      on_deposed=lambda reason: self.term.end(f"deposed: {reason}"))

    def _lifecycle_name(self) -> str:
        return f"controller {self.node_id} (epoch {self.term.epoch})"

    def run(self) -> None:
        if not self._set_state(ControllerState.RUNNING, expect={ControllerState.NEW}):
            return
        self.count = self._ensure_shards()
        ChildrenWatch(self.client, protocol.NODES, self._watch_nodes)
        for s in range(self.count):
            DataWatch(self.client, protocol.shard_epoch_path(s), self._watch_epoch(s))
        if self.mirror:
            self.client.ensure_path(protocol.MIRROR_REFRESH)
            DataWatch(self.client, protocol.MIRROR_REFRESH, self._watch_refresh_requests)
            self.mirror.start()
        next_reconcile = 0.0
        while not self.term.ended and self.state is ControllerState.RUNNING:
            try:
                event = self.events.get(timeout=0.1)
                next_reconcile = 0.0  # something changed: look now
                if event is Event.RECONNECTED and self.mirror:
                    self.mirror.request_refresh()
            except queue.Empty:
                pass
            now = time.monotonic()
            if now >= next_reconcile and self.term.active:
                next_reconcile = now + RECONCILE_INTERVAL_S
                try:
                    self._reconcile()
                except Deposed as e:
                    self.term.end(f"deposed: {e}")
                except KazooException as e:
                    log.warning("controller: ZooKeeper error placing shards (%s); trying again", type(e).__name__)
                    next_reconcile = now + 0.2

    def stop(self) -> None:
        if self._set_state(ControllerState.STOPPED) and self.mirror:
            self.mirror.stop()

    def request_mirror_refresh(self) -> None:
        if self.mirror:
            self.mirror.request_refresh()

    def reconnected(self) -> None:
        """The node's connection is back after a suspension (kazoo's thread: record only)."""
        self.events.put(Event.RECONNECTED)

    # ------------------------------------------------------------ watches (kazoo thread: record only)

    def _watch_nodes(self, children):
        if self.term.ended:
            return False
        self.events.put(Event.NODES)

    def _watch_refresh_requests(self, data, stat):
        if self.term.ended:
            return False
        if self.mirror:
            self.mirror.request_refresh()  # only sets an event

    def _watch_epoch(self, shard: int):
        def callback(data, stat):
            if self.term.ended:
                return False
            self.events.put(Event.EPOCH)  # deleted, or bumped by someone: look at the placement
        return callback

    # ------------------------------------------------------------ the shards (controller thread)

    def _ensure_shards(self) -> int:
        """The shard count (creating the shards znode at first start) and every shard's
        assignment and epoch znodes (restoring missing epochs above what is recorded)."""
        client = self.client
        client.ensure_path(protocol.NODES)
        try:
            raw, _ = client.get(protocol.SHARDS)
            count = protocol.ShardsInfo.decode(raw).count
        except NoNodeError:
            count = self.config.shards
            t = fenced(client, self.fence)
            t.create(protocol.SHARDS, protocol.ShardsInfo(count).encode())
            try:
                fenced_commit(t, self.fence)
                log.info("controller: groups are spread over %d shards", count)
            except TransactionFailed:  # created meanwhile
                count = protocol.ShardsInfo.decode(client.get(protocol.SHARDS)[0]).count
        except CorruptZnode as e:
            existing = [int(c) for c in read.children(client, protocol.SHARDS) if c.isdigit()]
            count = max(existing) + 1 if existing else self.config.shards
            log.error("%s; rewriting it with %d shards (the shards that exist)", e, count)
            t = fenced(client, self.fence)
            t.set_data(protocol.SHARDS, protocol.ShardsInfo(count).encode())
            fenced_commit(t, self.fence)
        if count != self.config.shards:
            log.warning("controller: this installation has %d shards (set when it was created); the configured %d "
                        "is not used", count, self.config.shards)
        checks = [(s, client.exists_async(protocol.shard_path(s)), client.exists_async(protocol.shard_epoch_path(s)))
                  for s in range(count)]
        missing_epochs = []
        for s, shard, epoch in checks:
            if shard.get() is None:
                try:
                    client.create(protocol.shard_path(s), b"")
                except NodeExistsError:
                    pass
            if epoch.get() is None:
                missing_epochs.append(s)
        if missing_epochs:
            floors = recorded_shard_epochs(client, count)
            for s in missing_epochs:
                restore_epoch(client, protocol.shard_epoch_path(s), floors[s], f"shard {s}")
        return count

    def _reconcile(self, restored=frozenset()) -> None:
        """Keep every shard on a live node: one fenced transaction for all the changes.
        ``restored``: shards whose epoch znode was just restored, placed afresh whatever the
        assignment says (so they lead at an epoch above every one recorded)."""
        client = self.client
        live = read.children(client, protocol.NODES)
        reads = [(s, client.get_async(protocol.shard_path(s)), client.exists_async(protocol.shard_epoch_path(s)))
                 for s in range(self.count)]
        current: Dict[int, protocol.ShardAssignment] = {}
        versions: Dict[int, int] = {}
        gone: List[int] = []
        for s, assignment, epoch in reads:
            try:
                current[s] = protocol.ShardAssignment.decode(assignment.get()[0], protocol.shard_path(s))
            except NoNodeError:
                current[s] = protocol.ShardAssignment("", 0)
            except CorruptZnode as e:
                log.error("%s; the shard is placed afresh", e)
                current[s] = protocol.ShardAssignment("", 0)
            stat = epoch.get()
            if stat is None:
                gone.append(s)
            else:
                versions[s] = stat.version
        if gone:
            floors = recorded_shard_epochs(client, self.count)
            for s in gone:
                restore_epoch(client, protocol.shard_epoch_path(s), floors[s], f"shard {s}")
            return self._reconcile(frozenset(gone))
        target = place_shards(self.count, live, {s: a.node_id for s, a in current.items() if a.node_id in live})
        # A shard changes hands, or its recorded epoch is not its epoch znode's (restored, or
        # bumped by someone): write a fresh assignment at a fresh epoch.
        changes = {s: node for s, node in target.items()
                   if node != current[s].node_id or current[s].epoch != versions[s] or s in restored}
        if not changes:
            return
        t = fenced(client, self.fence)
        for s, node in sorted(changes.items()):
            t.set_data(protocol.shard_epoch_path(s), b"", version=versions[s])
            t.set_data(protocol.shard_path(s), protocol.ShardAssignment(node, versions[s] + 1).encode())
        try:
            fenced_commit(t, self.fence)
        except TransactionFailed as e:
            log.info("controller: a shard epoch changed while placing shards (%s); looking again", e)
            return
        moved = [f"{s}:{current[s].node_id or '-'}->{node}" for s, node in sorted(changes.items())]
        log.info("controller epoch %d placed %d shards over %d nodes: %s", self.term.epoch, len(changes), len(live),
                 " ".join(moved[:32]) + (" ..." if len(moved) > 32 else ""))
