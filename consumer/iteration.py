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

from collections import deque
from typing import Callable, Deque, Dict, Iterable, List, Mapping, Optional

from consumer.records import ConsumerRecord, TopicPartition


class Unyielded:
    """Records fetched for iteration and not yielded yet, in the order ``poll()`` returned them.

    ``still_fetched(tp, end)`` answers whether the fetcher still has ``tp`` at position ``end``
    (the offset after its last record here): otherwise its records here are stale."""

    __slots__ = ("_entries", "_generation", "_still_fetched")

    def __init__(self, still_fetched: Callable[[TopicPartition, int], bool]) -> None:
        self._entries: Deque[list] = deque()  # [tp, records, index of the next to yield]
        self._generation = -1
        self._still_fetched = still_fetched

    def __bool__(self) -> bool:
        return bool(self._entries)

    def fill(self, batch: Mapping[TopicPartition, List[ConsumerRecord]], generation: int) -> None:
        """Keep ``batch`` (a ``poll()``'s), fetched when the fetcher's generation was ``generation``."""
        self._entries.extend([tp, records, 0] for tp, records in batch.items() if records)
        self._generation = generation

    def pop(self, generation: int, convert: Optional[Callable[[ConsumerRecord], ConsumerRecord]] = None
            ) -> Optional[ConsumerRecord]:
        """The next record (through ``convert``, which may raise: the record then stays next),
        or None when none is left. ``generation`` is the fetcher's now."""
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

    def take(self, partitions: Optional[Iterable[TopicPartition]] = None) -> Dict[TopicPartition, list]:
        """Remove and return {partition: its records not yielded} (of ``partitions``, default
        all), for the fetcher's ``give_back``."""
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
        self._generation = generation
        self._entries = deque(e for e in self._entries if self._still_fetched(e[0], e[1][-1].offset + 1))
