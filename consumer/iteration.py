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
from itertools import islice
from typing import Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional

from consumer.records import ConsumerRecord, TopicPartition
from coordinator.errors import ZkGroupsError

#: How long one wait of the iterator's for records lasts (it waits again until its timeout).
POLL_MS = 500


class Unyielded:
    """Records fetched for iteration and not yielded yet, in the order ``poll()`` returned them,
    over ``fetcher`` (its ``generation``, ``position(tp)`` and ``give_back``).

    The partition being yielded from is kept in slots of its own (``_tp``, ``_records``, ``_i``,
    ``_n``), the ones after it in ``_rest``: a record handed out costs a few attribute reads,
    no method call of the fetcher's."""

    __slots__ = ("_tp", "_records", "_i", "_n", "_rest", "_generation", "_fetcher")

    def __init__(self, fetcher) -> None:
        self._tp: Optional[TopicPartition] = None
        self._records: List[ConsumerRecord] = []
        self._i = self._n = 0
        self._rest: Deque[tuple] = deque()  # (tp, records) after the current one
        self._generation = -1
        self._fetcher = fetcher

    def __bool__(self) -> bool:
        return self._i < self._n or bool(self._rest)

    def next(self, poll: Callable[[float, Optional[int]], Mapping[TopicPartition, List[ConsumerRecord]]],
             convert: Optional[Callable[[ConsumerRecord], ConsumerRecord]], timeout_ms: Optional[float],
             is_open: Callable[[], bool]) -> ConsumerRecord:
        """The iterator's next record: one held here, else one of a new ``poll(timeout_ms,
        None)``, waiting up to ``timeout_ms`` (None: for as long as ``is_open()``). StopIteration
        then."""
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000.0
        polled = False
        while is_open():
            record = self.pop(convert)
            if record is not None:
                return record
            wait_ms = POLL_MS if deadline is None else (deadline - time.monotonic()) * 1000.0
            if wait_ms <= 0 and polled:  # at least one poll, even with a timeout of 0
                break
            generation = self._fetcher.generation  # before the poll: a change during it is seen
            self.fill(poll(max(0.0, min(wait_ms, POLL_MS)), None), generation)
            polled = True
        raise StopIteration

    def records(self, poll: Callable[[float, Optional[int]], Mapping[TopicPartition, List[ConsumerRecord]]],
                convert: Optional[Callable[[ConsumerRecord], ConsumerRecord]], timeout_ms: Optional[float],
                is_open: Callable[[], bool]) -> Iterator[ConsumerRecord]:
        """What :meth:`next` returns, as a generator (``for record in consumer``): the same
        records and positions, with the per-record steps inlined (no call per record but the
        generator's own resumption)."""
        fetcher = self._fetcher
        while True:
            if fetcher.generation != self._generation:
                self._drop_stale()
            if self._i < self._n:
                records, generation = self._records, self._generation
                for i, record in enumerate(islice(records, self._i, None), self._i + 1):
                    if convert is not None:
                        record = convert(record)  # may raise: the record stays next
                    self._i = i  # handed out: the position moves past it
                    yield record
                    # A seek, a pause or a poll replaces _records; a revocation moves the
                    # fetcher's generation: then look again before the next record.
                    if self._records is not records or fetcher.generation != generation:
                        break
                continue
            try:
                yield self.next(poll, convert, timeout_ms, is_open)
            except StopIteration:
                return

    def fill(self, batch: Mapping[TopicPartition, List[ConsumerRecord]], generation: int) -> None:
        """Keep ``batch`` (a ``poll()``'s), fetched when the fetcher's generation was ``generation``."""
        self._rest.extend((tp, records) for tp, records in batch.items() if records)
        self._generation = generation

    def pop(self, convert: Optional[Callable[[ConsumerRecord], ConsumerRecord]] = None) -> Optional[ConsumerRecord]:
        """The next record (through ``convert``, which may raise: the record then stays next),
        or None when none is left."""
        if self._fetcher.generation != self._generation:
            self._drop_stale()
        i = self._i
        if i >= self._n:
            if not self._rest:
                return None
            self._tp, self._records = self._rest.popleft()
            self._n, i = len(self._records), 0
        record = self._records[i]
        if convert is not None:
            record = convert(record)
        self._i = i + 1
        return record

    def first_offset(self, tp: TopicPartition, end: int) -> Optional[int]:
        """The offset of ``tp``'s first record not yielded, if its records here end at ``end``
        (the fetcher's position now); None otherwise."""
        for entry_tp, records, i in self._entries():
            if entry_tp == tp:
                return records[i].offset if records[-1].offset + 1 == end else None
        return None

    def give_back(self, partitions: Optional[Iterable[TopicPartition]] = None) -> None:
        """Hand the records not yielded (of ``partitions``, default all) back to the fetcher:
        the next poll or iteration returns them again."""
        if self:
            self._fetcher.give_back(self.take(partitions))

    def take(self, partitions: Optional[Iterable[TopicPartition]] = None) -> Dict[TopicPartition, list]:
        """Remove and return {partition: its records not yielded} (of ``partitions``, default all)."""
        wanted = None if partitions is None else set(partitions)
        taken, kept = {}, []
        for tp, records, i in self._entries():
            if wanted is None or tp in wanted:
                taken[tp] = records[i:]
            else:
                kept.append((tp, records[i:]))
        self._keep(kept)
        return taken

    def _entries(self) -> List[tuple]:
        """(tp, records, index of the next to yield) of every partition held, current first (a
        snapshot: a metrics scrape may read it while the application's thread moves on)."""
        head = [(self._tp, self._records, self._i)] if self._i < self._n else []
        return head + [(tp, records, 0) for tp, records in tuple(self._rest)]

    def _keep(self, entries: List[tuple]) -> None:
        self._tp, self._records, self._i, self._n = None, [], 0, 0
        self._rest = deque(entries)

    def _drop_stale(self) -> None:
        """Drop the records of partitions revoked or repositioned since they were fetched."""
        self._generation = self._fetcher.generation
        self._keep([(tp, records[i:]) for tp, records, i in self._entries()
                    if self._still_at(tp, records[-1].offset + 1)])

    def _still_at(self, tp: TopicPartition, end: int) -> bool:
        try:
            return self._fetcher.position(tp) == end
        except ZkGroupsError:
            return False  # revoked
