"""What the member thread and the fetcher leave for a consumer's poll thread.

A :class:`Consumer <consumer.consumer.Consumer>` runs the user's rebalance listener, commits
and errors on the thread that calls ``poll()``; the group member's thread (revocations,
assignments, lost partitions) and the fetcher's ``on_error`` only leave work for it here, in a
:class:`Handoff`, which the poll thread takes all at once. A :class:`Revocation` is how the
member thread waits for the poll thread to finish revoking.

Threads: every method of :class:`Handoff` may be called from any thread (one lock each call).
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional, Set

from consumer.records import TopicPartition


class Revocation:
    """Partitions the member thread revokes; it waits on ``done`` until the poll thread has run
    the revocation (the listener, the commit)."""

    def __init__(self, partitions: Set[TopicPartition]):
        self.partitions = partitions
        self.done = threading.Event()


class Handoff:
    """What the member thread and the fetcher leave for the poll thread, under one lock:
    revocations to finish, partitions assigned (with their committed offsets) or lost, and
    errors to raise. :meth:`take` hands the poll thread everything at once, one error at a time:
    a partition's error only once no record of that partition waits to be handed out before it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._revocations: List[Revocation] = []
        self._assigned: Dict[TopicPartition, Optional[int]] = {}
        self._lost: Set[TopicPartition] = set()
        self._errors: List[BaseException] = []

    def revoke(self, partitions: Set[TopicPartition]) -> Revocation:
        r = Revocation(set(partitions))
        with self._lock:
            self._revocations.append(r)
        return r

    def withdraw(self, r: Revocation) -> None:
        """The member gave up waiting for ``r`` (eviction): the poll thread must not run it."""
        with self._lock:
            if r in self._revocations:
                self._revocations.remove(r)

    def assigned(self, committed: Dict[TopicPartition, Optional[int]]) -> None:
        with self._lock:
            self._assigned.update(committed)

    def lost(self, partitions: Set[TopicPartition]) -> None:
        with self._lock:
            self._lost |= partitions
            for tp in partitions:
                self._assigned.pop(tp, None)

    def error(self, exc: BaseException) -> None:
        with self._lock:
            self._errors.append(exc)

    def pending_assigned(self) -> Set[TopicPartition]:
        with self._lock:
            return set(self._assigned)

    def take(self, buffered: Callable[[], Set[TopicPartition]]):
        """(lost, revocations, assigned {tp: committed}, error or None), each handed over once.
        ``buffered()``: the partitions with records still to hand out; an error of one of them
        waits (the fetcher reports an error after the records before it, but records given back
        after a lapsed lease are in front of it again)."""
        with self._lock:
            error = None
            if self._errors:
                waiting = buffered()
                error = next((e for e in self._errors if partition_of(e) not in waiting), None)
                if error is not None:
                    self._errors.remove(error)
            out = (self._lost, self._revocations, self._assigned, error)
            self._lost, self._revocations, self._assigned = set(), [], {}
        return out


def partition_of(exc: BaseException) -> Optional[TopicPartition]:
    """The partition an error is about (LogCorrupted, FetchFailed, OffsetOutOfRange), or None."""
    topic, partition = getattr(exc, "topic", None), getattr(exc, "partition", None)
    return TopicPartition(topic, partition) if topic is not None and partition is not None else None
