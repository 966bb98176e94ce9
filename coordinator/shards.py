"""Shards: how groups are spread over coordinator nodes.

Groups map to a fixed number of shards by a stable hash of their name
(:func:`coordinator.protocol.shard_of`). The elected controller places every shard on a live
node (:func:`place_shards`: balanced, and sticky so that only the shards of a node that died or
that must make room for a new one move). Each shard has an epoch — the version of its
``shards/<shard>/epoch`` znode — which the controller bumps in the same transaction as it hands
the shard to a node; every write a node makes for the shard's groups checks it (a
:class:`Fence`). So a group has at most one coordinator able to write at a time: a node that
lost a shard (died, paused, cut off, or simply moved off it) can no longer write anything of it.

Why one controller placing shards, rather than a separate election per shard: placement is
one pure function of (live nodes, current placement), computed in one place, balanced by
construction and minimal in moves; a per-shard election spreads shards by who queued first
and needs every node to keep adjusting its own share. The controller's failover changes
nothing for shard owners (placements live in ZooKeeper, epochs unchanged).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Sequence

from coordinator import protocol


@dataclass(frozen=True)
class Fence:
    """A write is allowed only while the znode at ``path`` has version ``epoch`` (checked as the
    first operation of the write's transaction)."""
    path: str
    epoch: int


def place_shards(count: int, nodes: Sequence[str], current: Mapping[int, str]) -> Dict[int, str]:
    """{shard: node} for shards 0..count-1 over ``nodes``.

    Balanced: each node leads ``count // n`` or ``count // n + 1`` shards. Sticky: a shard stays
    with its current node unless that node is gone or leads more than its share (the nodes that
    lead most keep the extra ones), so a node joining takes only what it must, and a node leaving
    gives away only its own. Deterministic: same input, same output. No nodes: {}.
    """
    nodes = sorted(set(nodes))
    if not nodes:
        return {}
    base, extra = divmod(count, len(nodes))
    held = {node: sorted(s for s, owner in current.items() if owner == node and 0 <= s < count) for node in nodes}
    by_load = sorted(nodes, key=lambda node: (-len(held[node]), node))
    quota = {node: base + (1 if i < extra else 0) for i, node in enumerate(by_load)}
    placed: Dict[int, str] = {}
    for node in nodes:
        for shard in held[node][:quota[node]]:
            placed[shard] = node
    free = iter(s for s in range(count) if s not in placed)
    for node in nodes:
        for _ in range(quota[node] - sum(1 for owner in placed.values() if owner == node)):
            placed[next(free)] = node
    return dict(sorted(placed.items()))


class Term:
    """A term of leadership, ended once (from any thread, with a reason); active while not
    ended and not suspended (``_suspended()``, read on every check)."""

    def __init__(self):
        self.ended = threading.Event()
        self.reason = ""

    def end(self, reason: str) -> None:
        if not self.ended.is_set():
            self.reason = reason
            self.ended.set()

    def _suspended(self) -> bool:
        return False

    @property
    def active(self) -> bool:
        return not self.ended.is_set() and not self._suspended()


class ShardTerm(Term):
    """One node's lead of one shard at one epoch; suspended while the node's connection is
    (``suspended``: a callable the node provides)."""

    def __init__(self, shard: int, epoch: int, suspended: Callable[[], bool] = lambda: False):
        super().__init__()
        self.shard, self.epoch = shard, epoch
        self.fence = Fence(protocol.shard_epoch_path(shard), epoch)
        self._suspended = suspended

    def __repr__(self) -> str:
        return f"ShardTerm(shard={self.shard}, epoch={self.epoch}, ended={self.ended.is_set()})"
