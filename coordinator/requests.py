"""What a node's handler threads work on: the queue of groups to rebalance, and which groups
care about which topics.

:class:`RebalanceRequests` is the seed's rebalanceRequestQ and groupsBeingRebalanced in one: a
group is queued at most once however many changes arrive, is never handled by two threads at
once, and a change during its handling marks it dirty (handled again when done; a run waiting
for acks drops its generation for a fresh one). :class:`GroupIndex` is the seed's
consumerGroupsPerTopic and groupsWithWildcardTopics: which groups to rebalance when a topic
appears, grows or goes.
"""
from __future__ import annotations

import queue
import threading
from typing import Dict, Optional, Set

from coordinator import protocol


class RebalanceRequests:
    """The blocking queue of groups to rebalance (seed: rebalanceRequestQ + groupsBeingRebalanced).

    A group is queued at most once; a request for a group that is being handled marks it
    dirty: it is queued again when the handler is done, and a handler still waiting for the
    members' acks drops that generation at once (:class:`~coordinator.rebalance.Superseded`) instead of waiting for
    members that may have left.
    """

    def __init__(self):
        self._queue: "queue.Queue[Optional[str]]" = queue.Queue()
        self._lock = threading.Lock()
        self._queued: Set[str] = set()
        self._running: Set[str] = set()
        self._dirty: Set[str] = set()
        self._closed = False

    def queued(self) -> int:
        """How many groups wait for a handler thread."""
        with self._lock:
            return len(self._queued)

    def request(self, group: str, changed: bool = True) -> None:
        """Queue ``group``. ``changed=False`` is a routine check: a group being handled is
        being checked already, so it is not marked dirty (which would supersede its run)."""
        with self._lock:
            if self._closed or group in self._queued:
                return
            if group in self._running:
                if changed:
                    self._dirty.add(group)
                return
            self._queued.add(group)
        self._queue.put(group)

    def take(self, timeout: float) -> Optional[str]:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def begin(self, group: str) -> None:
        with self._lock:
            self._queued.discard(group)
            self._running.add(group)
            self._dirty.discard(group)

    def changed(self, group: str) -> bool:
        """Whether ``group`` was requested again since its handling began."""
        with self._lock:
            return group in self._dirty

    def done(self, group: str) -> None:
        with self._lock:
            self._running.discard(group)
            again = group in self._dirty and not self._closed
            self._dirty.discard(group)
        if again:
            self.request(group)

    def close(self, handlers: int) -> None:
        with self._lock:
            self._closed = True
        for _ in range(handlers):
            self._queue.put(None)


class GroupIndex:
    """Which groups care about which topics (seed: consumerGroupsPerTopic, groupsWithWildcardTopics)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._static: Dict[str, Set[str]] = {}         # group -> topics named explicitly
        self._wildcards: Dict[str, list] = {}          # group -> [(compiled regex, white?)]

    def update(self, group: str, registrations) -> None:
        static, wild = set(), []
        for reg in registrations:
            if reg.pattern == protocol.PATTERN_STATIC:
                static |= set(reg.subscription)
            else:  # linear-time matching: a registration can never stall the leader's thread
                wild.append((protocol.topic_matcher(next(iter(reg.subscription))),
                             reg.pattern == protocol.PATTERN_WHITE_LIST))
        with self._lock:
            self._static[group], self._wildcards[group] = static, wild

    def groups_for(self, topic: str) -> Set[str]:
        with self._lock:
            groups = {g for g, topics in self._static.items() if topic in topics}
            groups |= {g for g, pats in self._wildcards.items()
                       if any(bool(rx.fullmatch(topic)) == white for rx, white in pats)}
        return groups
