"""What ``for record in consumer`` holds between records: those a ``poll()`` fetched for the
iterator that it has not yielded yet.

``poll()`` moves each partition's position past the whole batch it returns; kafka-python's
iterator moves it one record at a time, as it hands records out. So the consumer's iterator
keeps the rest of a batch here, and the consumer reports a partition's position as the offset of
its first record not yielded.

Guarantees: a record counts as consumed once it was yielded. ``position()`` and every commit
(``commit()``, auto-commit, the commit before a revocation, ``close()``'s) stop at the first
record not yielded. Records not yielded are given back to the fetcher before anything else
polls, seeks, pauses or closes, so they are handed out again, never skipped. Records of a
partition that was revoked or repositioned since they were fetched are dropped, not yielded (the
fetcher's ``generation`` tells when to look).

Thread rule: the application's thread (the consumer's iterator, ``poll``, ``seek``, ``pause``,
``close``). :meth:`Unyielded.first_offset` may also be called from a metrics scrape: it reads a
snapshot (one record off at worst).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, Deque, Dict, Iterable, List, Mapping, Optional

from consumer.records import ConsumerRecord, TopicPartition
from coordinator.errors import ZkGroupsError

#: How long one wait of the iterator's for records lasts (it waits again until its timeout).
POLL_MS = 500


class Unyielded:
    """Records fetched for iteration and not yielded yet, in the order ``poll()`` returned them,
    over ``fetcher`` (its ``generation``, ``position(tp)`` and ``give_back``)."""

    __slots__ = ("_entries", "_generation", "_fetcher")

    def __init__(self, fetcher) -> None:
        self._entries: Deque[list] = deque()  # [tp, records, index of the next to yield]
        self._generation = -1
        self._fetcher = fetcher

    def __bool__(self) -> bool:
        return bool(self._entries)

    def next(self, poll: Callable[[float, Optional[int]], Mapping[TopicPartition, List[ConsumerRecord]]],
             convert: Optional[Callable[[ConsumerRecord], ConsumerRecord]], timeout_ms: Optional[float],
             is_open: Callable[[], bool]) -> ConsumerRecord:
        """The iterator's next record: one held here, else one of a new ``poll(timeout_ms,
        None)``, waiting up to ``timeout_ms`` (None: for as long as ``is_open()``). StopIteration
        then."""
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000.0
        while is_open():
            record = self.pop(convert)
            if record is not None:
                return record
            wait_ms = POLL_MS if deadline is None else (deadline - time.monotonic()) * 1000.0
            if wait_ms <= 0:
                break
            generation = self._fetcher.generation  # before the poll: a change during it is seen
            self.fill(poll(min(wait_ms, POLL_MS), None), generation)
        raise StopIteration

    def fill(self, batch: Mapping[TopicPartition, List[ConsumerRecord]], generation: int) -> None:
        """Keep ``batch`` (a ``poll()``'s), fetched when the fetcher's generation was ``generation``."""
        self._entries.extend([tp, records, 0] for tp, records in batch.items() if records)
        self._generation = generation

    def pop(self, convert: Optional[Callable[[ConsumerRecord], ConsumerRecord]] = None) -> Optional[ConsumerRecord]:
        """The next record (through ``convert``, which may raise: the record then stays next),
        or None when none is left."""
        generation = self._fetcher.generation
        if generation != self._generation:
            self._drop_stale(generation)
        entries = self._entries
        if not entries:
            return None
        entry = entries[0]
        records, i = entry[1], entry[2]
        record = records[i] if convert is None else convert(records[i])
        if i + 1 < len(records):
            entry[2] = i + 1
        else:
            entries.popleft()
        return record

    def first_offset(self, tp: TopicPartition, end: int) -> Optional[int]:
        """The offset of ``tp``'s first record not yielded, if its records here end at ``end``
        (the fetcher's position now); None otherwise."""
        for entry_tp, records, i in tuple(self._entries):  # a snapshot: a scrape may read it
            if entry_tp == tp:
                return records[i].offset if records[-1].offset + 1 == end else None
        return None

    def give_back(self, partitions: Optional[Iterable[TopicPartition]] = None) -> None:
        """Hand the records not yielded (of ``partitions``, default all) back to the fetcher:
        the next poll or iteration returns them again."""
        if self._entries:
            self._fetcher.give_back(self.take(partitions))

    def take(self, partitions: Optional[Iterable[TopicPartition]] = None) -> Dict[TopicPartition, list]:
        """Remove and return {partition: its records not yielded} (of ``partitions``, default all)."""
        wanted = None if partitions is None else set(partitions)
        taken, kept = {}, deque()
        for entry in self._entries:
            if wanted is None or entry[0] in wanted:
                taken[entry[0]] = entry[1][entry[2]:]
            else:
                kept.append(entry)
        self._entries = kept
        return taken

    def _drop_stale(self, generation: int) -> None:
        """Drop the records of partitions revoked or repositioned since they were fetched."""
        self._generation = generation
        self._entries = deque(e for e in self._entries if self._still_at(e[0], e[1][-1].offset + 1))

    def _still_at(self, tp: TopicPartition, end: int) -> bool:
        try:
            return self._fetcher.position(tp) == end
        except ZkGroupsError:
            return False  # revoked
