"""What a share member acquired but has not handed to the application yet.

A member acquires more than one ``poll()`` returns when it can use it within its locks: one
write then serves several polls. How much (:meth:`Prefetched.acquisition_size`) adapts: a
buffer emptied within a tenth of the lock duration doubles the next acquisition (up to
:data:`MAX_DEPTH` polls' worth, and never past the member's fair share of the group's locks); one
that took over a quarter halves it. Records that waited half a lock duration are given back
uncounted (:meth:`drop_stale`), so a record is never handed out so late that its lock may
already have ended on the coordinator's clock (which starts after this member's).

Threads: the consumer's application thread only.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Deque, Dict, List, Tuple

from consumer.records import ShareRecord, TopicPartition

#: The most polls' worth one acquisition takes.
MAX_DEPTH = 8


class _Chunk:
    """The records of one acquisition (one token) not handed out yet."""
    __slots__ = ("tp", "token", "acquired", "records")

    def __init__(self, tp: TopicPartition, token: int, acquired: float, records: List[ShareRecord]):
        self.tp, self.token, self.acquired, self.records = tp, token, acquired, records


class Prefetched:
    """The buffer of acquired records, oldest first, and the ranges to give back."""

    def __init__(self) -> None:
        self._chunks: Deque[_Chunk] = deque()
        self.size = 0
        self.depth = 1
        #: {partition: [(token, first, last)]}: acquired, never handed out, to give back with the next write.
        self.undelivered: Dict[TopicPartition, List[Tuple[int, int, int]]] = {}

    def __bool__(self) -> bool:
        return self.size > 0

    def acquisition_size(self, max_poll_records: int, fair_share: int) -> int:
        """How many records the next acquisition takes."""
        return max(1, min(fair_share, max_poll_records * self.depth))

    def add(self, tp: TopicPartition, token: int, acquired: float, records: List[ShareRecord]) -> None:
        if records:
            self._chunks.append(_Chunk(tp, token, acquired, records))
            self.size += len(records)

    def take(self, n: int, handed: Dict[TopicPartition, Dict[int, int]], lock_ms: int) -> List[ShareRecord]:
        """Up to ``n`` records, oldest first, noted in ``handed`` ({partition: {offset: token}})."""
        out: List[ShareRecord] = []
        while self._chunks and len(out) < n:
            chunk = self._chunks[0]
            part = chunk.records[:n - len(out)]
            del chunk.records[:len(part)]
            handed.setdefault(chunk.tp, {}).update(dict.fromkeys([r.offset for r in part], chunk.token))
            out += part
            if not chunk.records:
                self._chunks.popleft()
                self._adapt(time.monotonic() - chunk.acquired, lock_ms / 1000)
        self.size -= len(out)
        return out

    def _adapt(self, took_s: float, lock_s: float) -> None:
        if took_s < lock_s / 10:
            self.depth = min(self.depth * 2, MAX_DEPTH)
        elif took_s > lock_s / 4:
            self.depth = max(1, self.depth // 2)

    def drop_stale(self, lock_ms: int) -> None:
        """Give back (uncounted) what waited half a lock duration."""
        now = time.monotonic()
        while self._chunks and now - self._chunks[0].acquired > lock_ms / 2000:
            self._give_back(self._chunks.popleft())
            self.depth = 1

    def forget(self) -> None:
        """Drop everything (the member's session ended: its coordinator released what it held,
        so none of it may be handed out, and there is nothing to give back)."""
        self._chunks.clear()
        self.undelivered.clear()
        self.size = 0

    def give_back_all(self) -> None:
        while self._chunks:
            self._give_back(self._chunks.popleft())

    def _give_back(self, chunk: _Chunk) -> None:
        self.size -= len(chunk.records)
        ranges = self.undelivered.setdefault(chunk.tp, [])
        for offset in (r.offset for r in chunk.records):
            if ranges and ranges[-1][0] == chunk.token and ranges[-1][2] + 1 == offset:
                ranges[-1] = (chunk.token, ranges[-1][1], offset)
            else:
                ranges.append((chunk.token, offset, offset))
