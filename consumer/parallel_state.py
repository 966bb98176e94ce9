"""What a :class:`~consumer.parallel.ParallelConsumer` knows between its records: each
partition's progress (what was taken, what finished, the committed point) and the lanes that
keep records of one key (or partition) in order.

Guarantees
----------
* **The committed point never passes an unfinished record.** :meth:`Progress.committable`
  is the lowest offset taken and not finished (or, with none, the offset after the last one
  taken), with the offsets finished above it; a restart from there redoes only what was in
  flight.
* **Bounded.** Offsets finished above the point are kept only up to
  :data:`~coordinator.protocol.groups.MAX_COMPLETED_SPAN` past it (:meth:`Progress.room` says when
  to stop taking more), so they always fit the completed znode.
* **Per-lane order.** :class:`Lanes` hands out the records of one lane one at a time, in the
  order they were added; a record being retried keeps its lane busy, so order holds through
  retries. A lane is ``(partition, epoch, key)`` (``ordering="key"``), ``(partition,
  epoch)`` (``"partition"``) or one per record (``"unordered"``); the epoch is the
  partition's ownership, so records of an ownership given up never hold back the next one's.

Not provided: threads. Both classes belong to the parallel consumer's poller thread (its one
thread rule), which is the only one that touches them.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Set, Tuple

from coordinator.protocol import MAX_COMPLETED_SPAN
from consumer.records import ConsumerRecord, TopicPartition

ORDERINGS = ("key", "partition", "unordered")


class Progress:
    """One partition's records since its committed offset ``base`` in one ownership (its
    ``epoch``); ``skip``: offsets a previous owner finished above ``base`` (read back from
    the completed znode), which are not processed again."""

    __slots__ = ("epoch", "end", "_unfinished", "_heap", "_done", "_last", "_floor")

    def __init__(self, epoch: int, base: int, skip: Iterable[int] = ()):
        self.epoch = epoch
        self.end = base                 # the offset after the last record taken
        self._unfinished: Set[int] = set()
        self._heap: List[int] = []      # the unfinished offsets' minimum, lazily
        self._done: Set[int] = {o for o in skip if base < o <= base + MAX_COMPLETED_SPAN}
        self._last: Optional[Tuple[int, frozenset]] = (base, frozenset(self._done))
        self._floor = base              # everything below it finished (what was pruned)

    def take(self, offset: int) -> bool:
        """Record ``offset`` as handed to this consumer; False if it was finished before (skip it)."""
        self.end = max(self.end, offset + 1)
        if offset < self._floor or offset in self._done:
            return False
        self._unfinished.add(offset)
        heapq.heappush(self._heap, offset)
        return True

    def finish(self, offset: int) -> None:
        if offset in self._unfinished:
            self._unfinished.discard(offset)
            self._done.add(offset)

    @property
    def pending(self) -> int:
        """Records taken and not finished (queued, in flight or waiting for a retry)."""
        return len(self._unfinished)

    def point(self) -> int:
        """The committed point: no record below it is unfinished."""
        heap = self._heap
        while heap and heap[0] not in self._unfinished:
            heapq.heappop(heap)
        point = heap[0] if heap else self.end
        while point in self._done and not heap:  # finished by a previous owner, past what was taken
            point += 1
        return point

    def room(self) -> bool:
        """Whether records may be taken further: the span above the point stays encodable."""
        return self.end < self.point() + MAX_COMPLETED_SPAN

    def committable(self) -> Optional[Tuple[int, frozenset]]:
        """(point, offsets finished above it) if they changed since :meth:`committed`, else None."""
        point = self.point()
        self._done = {o for o in self._done if o > point}
        self._floor = max(self._floor, point)
        now = (point, frozenset(self._done))
        return None if now == self._last else now

    def committed(self, what: Tuple[int, frozenset]) -> None:
        self._last = what


class Work:
    """One record on its way through the consumer: its lane, its tries, when it was queued."""

    __slots__ = ("record", "tp", "epoch", "lane", "attempts", "queued_at")

    def __init__(self, record: ConsumerRecord, tp: TopicPartition, epoch: int, lane, queued_at: float):
        self.record, self.tp, self.epoch, self.lane = record, tp, epoch, lane
        self.attempts = 0
        self.queued_at = queued_at


class Lanes:
    """Records waiting to run, by lane, and the retries waiting for their backoff."""

    def __init__(self, ordering: str):
        if ordering not in ORDERINGS:
            raise ValueError(f"ordering must be one of {', '.join(ORDERINGS)}, not {ordering!r}")
        self.ordering = ordering
        self._queues: Dict[object, Deque[Work]] = {}
        self._busy: Set[object] = set()
        self._ready: Deque[object] = deque()
        self._by_tp: Dict[TopicPartition, Set[object]] = {}
        self._retries: List[tuple] = []   # (due, seq, work)
        self._seq = itertools.count()
        self.queued = 0

    def lane_of(self, record: ConsumerRecord, tp: TopicPartition, epoch: int):
        if self.ordering == "key":
            return (tp, epoch, record.key)
        if self.ordering == "partition":
            return (tp, epoch)
        return (tp, epoch, "offset", record.offset)

    def add(self, work: Work) -> None:
        q = self._queues.get(work.lane)
        if q is None:
            q = self._queues[work.lane] = deque()
            self._by_tp.setdefault(work.tp, set()).add(work.lane)
        q.append(work)
        self.queued += 1
        if len(q) == 1 and work.lane not in self._busy:
            self._ready.append(work.lane)

    def take(self) -> Optional[Work]:
        """The next record whose lane is free (its lane is busy until :meth:`finish`)."""
        while self._ready:
            lane = self._ready.popleft()
            q = self._queues.get(lane)
            if q and lane not in self._busy:
                self._busy.add(lane)
                self.queued -= 1
                return q.popleft()
        return None

    def finish(self, work: Work) -> None:
        """``work`` is done (or dead-lettered): its lane's next record may run."""
        lane = work.lane
        self._busy.discard(lane)
        q = self._queues.get(lane)
        if q:
            self._ready.append(lane)
        elif q is not None:
            del self._queues[lane]
            lanes = self._by_tp.get(work.tp)
            if lanes is not None:
                lanes.discard(lane)

    def retry_at(self, due: float, work: Work) -> None:
        """Run ``work`` again at ``due`` (its lane stays busy meanwhile)."""
        heapq.heappush(self._retries, (due, next(self._seq), work))

    def due(self, now: float) -> List[Work]:
        out = []
        while self._retries and self._retries[0][0] <= now:
            out.append(heapq.heappop(self._retries)[2])
        return out

    def next_due(self) -> Optional[float]:
        return self._retries[0][0] if self._retries else None

    def drop(self, tp: TopicPartition) -> int:
        """Forget every queued record and retry of ``tp`` (revoked or lost); how many were queued."""
        dropped = 0
        for lane in self._by_tp.pop(tp, set()):
            dropped += len(self._queues.pop(lane, ()))
            self._busy.discard(lane)
        self.queued -= dropped
        self._retries = [r for r in self._retries if r[2].tp != tp]
        heapq.heapify(self._retries)
        return dropped
