"""The shards a node leads, as its event thread and its rebalance handlers both see them: a
:class:`~coordinator.fencing.ShardTerm` per shard placed on it, the groups of each not verified
yet, and when a group's rebalance is due to be tried again.

Thread rule: any thread. One lock guards the three maps and is never held around a ZooKeeper
call or a term's end. ``count`` (the shard count) is written once, by the event thread, before
any term begins; read without the lock.
"""
from __future__ import annotations

import threading
import time
from typing import Dict, Iterable, List, Optional, Set

from coordinator import protocol
from coordinator.fencing import ShardTerm


class ShardTerms:
    """Which shards a node leads, at which epoch, and what is left to do for their groups."""

    def __init__(self) -> None:
        self.count: Optional[int] = None
        self._lock = threading.Lock()
        self._terms: Dict[int, ShardTerm] = {}
        self._unverified: Dict[int, Set[str]] = {}
        self._retry_at: Dict[str, float] = {}

    # ---- terms

    def shard_of(self, group: str) -> Optional[int]:
        return None if self.count is None else protocol.shard_of(group, self.count)

    def get(self, shard: int) -> Optional[ShardTerm]:
        """The term of ``shard``, ended or not (None if it holds none)."""
        with self._lock:
            return self._terms.get(shard)

    def of(self, group: str) -> Optional[ShardTerm]:
        """The term ``group`` is led under now, if it has not ended."""
        shard = self.shard_of(group)
        with self._lock:
            term = self._terms.get(shard) if shard is not None else None
        return term if term is not None and not term.ended else None

    def begin(self, term: ShardTerm, groups: Iterable[str]) -> None:
        """Hold ``term``; ``groups`` of its shard wait to be verified."""
        with self._lock:
            self._terms[term.shard] = term
            self._unverified[term.shard] = set(groups)

    def drop(self, shard: int) -> None:
        """Forget ``shard``'s term (its caller ended it)."""
        with self._lock:
            self._terms.pop(shard, None)
            self._unverified.pop(shard, None)

    def end_all(self, reason: str) -> None:
        with self._lock:
            terms = list(self._terms.values())
        for term in terms:
            term.end(reason)

    def held(self) -> Dict[int, int]:
        """{shard: epoch} of the terms that have not ended."""
        with self._lock:
            return {s: t.epoch for s, t in self._terms.items() if not t.ended}

    # ---- verification

    def verified(self, group: str) -> Optional[ShardTerm]:
        """Record that ``group`` was verified; the term of its shard if that made every group
        of the shard verified (None otherwise, or if it was not waiting)."""
        shard = self.shard_of(group)
        with self._lock:
            waiting = self._unverified.get(shard)
            if not waiting or group not in waiting:
                return None
            waiting.discard(group)
            return self._terms.get(shard) if not waiting else None

    def all_verified(self) -> bool:
        with self._lock:
            return not any(self._unverified.values())

    def report(self) -> Dict[int, dict]:
        """{shard: {"epoch", "verified"}} of the terms that have not ended (the node znode's)."""
        with self._lock:
            return {s: {"epoch": t.epoch, "verified": not self._unverified.get(s)}
                    for s, t in self._terms.items() if not t.ended}

    # ---- retries

    def retry_later(self, group: str, delay_ms: int) -> None:
        with self._lock:
            self._retry_at[group] = time.monotonic() + delay_ms / 1000.0

    def due_retries(self, now: float) -> List[str]:
        """The groups whose retry is due (each returned once)."""
        with self._lock:
            due = [g for g, at in self._retry_at.items() if at <= now]
            for group in due:
                del self._retry_at[group]
        return due
