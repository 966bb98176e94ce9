"""The groups a coordinator node leads: those of every shard the controller placed on it.

:class:`GroupCoordinator` is the shard-leader half of a node (:mod:`coordinator.coordinator` is
the node; :mod:`coordinator.controller` the controller half). It only wires its three parts:

* :class:`~coordinator.shard_follower.ShardFollower` — the event thread: registers the node,
  follows the shards' placement, holds their terms, watches the topics and the members of the
  groups it leads, and queues a group once per change;
* :class:`~coordinator.rebalance_handlers.RebalanceHandlers` — the handler threads: take a
  queued group and rebalance it (read → compute → diff → write → wait, :mod:`coordinator.rebalance`);
* :class:`~coordinator.shard_terms.ShardTerms` — what both sides share, under one lock: the
  terms, the groups not verified yet, the retries due;
* :class:`~coordinator.share_decider.ShareDecider` — the clock of the share groups of the same
  shards: locks and delays that end, members that left (its own thread; it reads the terms).

The two sides meet only at the blocking :class:`~coordinator.requests.RebalanceRequests` (the
follower puts, the handlers take), the shared terms, and the follower's any-thread calls
(``request``, ``verified``, ``publish``), as Helix keeps its controller's event queue apart from
its stage pipeline.
"""
from __future__ import annotations

from typing import Dict

from coordinator.rebalance import GroupRebalancer
from coordinator.rebalance_handlers import RebalanceHandlers
from coordinator.requests import GroupIndex, RebalanceRequests
from coordinator.shard_follower import ShardFollower
from coordinator.share_decider import ShareDecider
from coordinator.shard_terms import ShardTerms
from coordinator.timeline import TimelineRecorder


class GroupCoordinator:
    """Leads the groups of the shards the controller placed on ``node`` (its
    :class:`~coordinator.coordinator.Coordinator`). Its state is its follower's
    (:class:`~coordinator.shard_follower.GroupsState`); ``start()`` and ``stop()`` as theirs (a
    second call does nothing). Every method may be called from any thread."""

    def __init__(self, node):
        self.node_id = node.node_id
        self.terms = ShardTerms()
        self.requests = RebalanceRequests()
        self.rebalancer = GroupRebalancer(node.client, node.config)
        self.index = GroupIndex()
        self.follower = ShardFollower(node, self.terms, self.requests, self.rebalancer, self.index)
        self.handlers = RebalanceHandlers(node, self.terms, self.follower, self.requests, self.rebalancer, self.index,
                                          TimelineRecorder(node.client, node.node_id))
        self.share = ShareDecider(node.client, self.terms, node.metrics)

    def start(self) -> "GroupCoordinator":
        self.handlers.start()
        self.follower.start()
        self.share.start()
        return self

    def stop(self) -> None:
        """End every term, stop both sides, and give the shards up now."""
        if not self.follower.stop():
            return
        self.share.stop()
        self.handlers.stop()
        self.follower.leave()

    @property
    def registered(self) -> bool:
        """Whether the node's znode is this session's (the controller may place shards on it)."""
        return self.follower.registered

    def loaded(self) -> bool:
        """Whether this node knows the shard count and has verified every group of every shard
        placed on it (a node leading nothing has nothing to load)."""
        return (self.registered and self.terms.count is not None and not self.follower.taking_over
                and self.terms.all_verified())

    def held(self) -> Dict[int, int]:
        """{shard: epoch} of the shards this node leads now."""
        return self.terms.held()

    def leads(self, group: str) -> bool:
        return self.follower.leads(group)

    def event_thread_alive(self) -> bool:
        """Whether the follower's event thread runs (``/healthz``)."""
        thread = self.follower.thread
        return thread is not None and thread.is_alive()

    def events_queued(self) -> int:
        """Events waiting for the event thread (a metric)."""
        return self.follower.events.qsize()

    @property
    def shard_count(self):
        """The shard count, once the event thread has read it (else None)."""
        return self.terms.count

    def end_all(self, reason: str) -> None:
        self.terms.end_all(reason)

    def session_lost(self) -> None:
        """kazoo's thread: the session expired; the node znode is gone with it."""
        self.follower.session_lost()

    def reconnected(self) -> None:
        """kazoo's thread: the connection is back; re-read what we depend on."""
        self.follower.reconnected()
