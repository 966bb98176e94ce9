"""A fetcher's partitions under one lock: where each stands, what it buffers, and the fair
round-robin that takes records out of the buffers (:class:`FetchBuffers`, the base of
:class:`consumer.fetcher.Fetcher`).

It keeps one :class:`~consumer.partition_buffer.PartitionBuffer` per assigned partition, in
assignment order, and two rotations over that order: where the next hand-out starts
(``_drain``) and where the next read looks (the fetcher's ``_pick``). Whatever repositions a
partition (``assign``, ``seek``, ``revoke``, a switch between records and Columns) bumps
``generation``; whatever may give a waiter something to do wakes it: the read-ahead thread
waits on ``_fetch_cv``, a ``poll()`` on ``_data_cv``. The buffers hold one form at a time, the
records or the log's Columns (``_switch_form``). What a read brings is kept (``_keep``) or
parks its partition (``_park``); a read whose partition changed meanwhile is not
``_current``.

Threads: every public method takes ``_lock``; the private ones whose docstring says "under the
lock" expect it held. No thread, no I/O and no lifecycle of its own: reading the log, waiting
for records and starting and closing are the fetcher's (:mod:`consumer.fetcher`, whose
docstring says what the fetcher guarantees).
"""
from __future__ import annotations

import threading
from typing import Dict, Iterable, List, Optional, Set

from consumer.log.batch import Columns
from consumer.partition_buffer import PartitionBuffer, rest_of
from consumer.records import TopicPartition
from coordinator.errors import IllegalStateError, OffsetOutOfRange


class FetchBuffers:
    """The assigned partitions of a fetcher, their positions, pauses and buffered records, and
    the rotations over them, guarded by ``_lock`` (see the module docstring)."""

    #: The per-partition state (a data plane's fetcher may buffer its own form of records).
    _partition_type = PartitionBuffer

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fetch_cv = threading.Condition(self._lock)  # the prefetch thread waits here
        self._data_cv = threading.Condition(self._lock)   # poll() waits here
        self._parts: Dict[TopicPartition, PartitionBuffer] = {}
        self._order: List[TopicPartition] = []  # assignment order, for both rotations
        self._poll_next = 0                     # index in _order where the next poll starts
        self._fetch_next = 0                    # index in _order where the next fetch looks
        #: Changes whenever a partition is assigned, revoked or repositioned (the partitions'
        #: epochs come from it; the consumer's iterator reads it without the lock: an int).
        self.generation = 0
        self._columns = False                   # buffers hold Columns (poll_columns), not records
        # False only once a drain found nothing buffered for unpaused partitions; set again
        # whenever records arrive or partitions resume. While it is False, poll() and the
        # prefetch thread know without a walk of the assignment that nothing is buffered.
        self._drainable = False

    # ------------------------------------------------------------------ assignment

    def assign(self, positions: Dict[TopicPartition, int], paused: bool = False) -> None:
        """Add partitions with their fetch positions. An already assigned partition is
        re-positioned as by ``seek`` (its pause state is kept). With ``paused=True`` new
        partitions start paused, atomically (no poll() can return their records in between,
        as it could between ``assign`` and a separate ``pause``)."""
        with self._lock:
            self._check_open()
            for tp, offset in positions.items():
                tp = TopicPartition(*tp)
                self.generation += 1
                st = self._parts.get(tp)
                if st is None:
                    st = self._parts[tp] = self._partition_type(tp, int(offset), self.generation)
                    st.paused = paused
                    self._order.append(tp)
                else:
                    st.reset(int(offset), self.generation)
            self._fetch_cv.notify_all()

    def revoke(self, tps: Iterable[TopicPartition]) -> None:
        """Stop fetching ``tps`` and drop their buffers. Unknown partitions are ignored."""
        with self._lock:
            for tp in map(TopicPartition._make, tps):
                if self._parts.pop(tp, None) is not None:
                    self.generation += 1
                    i = self._order.index(tp)
                    del self._order[i]
                    if i < self._poll_next:
                        self._poll_next -= 1
                    if i < self._fetch_next:
                        self._fetch_next -= 1
            n = len(self._order)
            if self._poll_next >= n:
                self._poll_next = 0
            if self._fetch_next >= n:
                self._fetch_next = 0
            self._fetch_cv.notify_all()  # buffer space may have been freed

    def assigned(self) -> Set[TopicPartition]:
        with self._lock:
            return set(self._parts)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Drop ``tp``'s buffer and fetch from ``offset`` next; clears a reported error."""
        with self._lock:
            st = self._assigned_partition(tp)
            self.generation += 1
            st.reset(int(offset), self.generation)
            self._fetch_cv.notify_all()

    def position(self, tp: TopicPartition) -> int:
        """Offset of the next record ``poll()`` would return for ``tp``."""
        with self._lock:
            return self._assigned_partition(tp).position

    def highwater(self, tp: TopicPartition) -> Optional[int]:
        """The partition's latest offset (next to be written) as last seen, without I/O: exact
        after a read that reached the end, otherwise at least the offset after the last record
        read. None before the first read. ``end_offsets`` asks the log."""
        with self._lock:
            return self._assigned_partition(tp).highwater

    def buffered(self, tp: Optional[TopicPartition] = None) -> int:
        """Records retained (fetched, not yet returned): for ``tp``, or for all partitions."""
        with self._lock:
            if tp is not None:
                st = self._parts.get(TopicPartition(*tp))
                return st.count if st is not None else 0
            return sum(st.count for st in self._parts.values())

    def holding(self) -> Set[TopicPartition]:
        """The partitions with records retained (fetched, not yet returned)."""
        with self._lock:
            return {tp for tp, st in self._parts.items() if st.count}

    # ------------------------------------------------------------------ pause / resume

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """Neither fetch nor return ``tps``; their buffers are kept. Partitions that are not
        assigned are ignored (a revoke may race with the caller; the consumer API checks its
        own assignment). Pause state ends with ``revoke``."""
        with self._lock:
            for st in filter(None, map(self._parts.get, map(TopicPartition._make, tps))):
                st.paused = True
            self._fetch_cv.notify_all()  # paused buffers stop counting towards the bound

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        """Fetch and return ``tps`` again, starting with their kept buffers. Partitions that
        are not assigned are ignored."""
        with self._lock:
            for tp in tps:
                st = self._parts.get(TopicPartition(*tp))
                if st is not None:
                    st.paused = False
            self._drainable = True
            self._fetch_cv.notify_all()
            self._data_cv.notify_all()

    def paused(self) -> Set[TopicPartition]:
        with self._lock:
            return {tp for tp, st in self._parts.items() if st.paused}

    # ------------------------------------------------------------------ the hand-out (under the lock)

    def give_back(self, taken: Dict[TopicPartition, list]) -> None:
        """Undo a ``poll()`` or ``poll_columns()`` whose records the caller could not hand out:
        put them back in front of their partitions' buffers and move the positions back.
        Partitions revoked, seeked or polled again since are left alone (their records are
        dropped)."""
        with self._lock:
            for tp, items in taken.items():
                st = self._parts.get(tp)
                if st is None or not items:
                    continue
                if self.SWITCH_REFETCHES and isinstance(items[0], Columns) != self._columns:
                    continue  # the buffers changed form since: these were read again
                first, end, chunks = st.given_back(items)
                if st.position != end:
                    continue
                if st.idx:  # the head chunk was partly taken: keep only its untaken part
                    st.chunks[0] = rest_of(st.chunks[0], st.idx)
                    st.idx = 0
                st.chunks.extendleft(reversed(chunks))
                st.count += end - first
                st.position = first
                self._drainable = True
            self._data_cv.notify_all()

    #: Whether the buffers' form follows the last poll (records or Columns: a switch reads them
    #: again); False where one form serves both (Kafka's buffers hold librdkafka's messages).
    SWITCH_REFETCHES = True

    def _switch_form(self, columns: bool) -> None:
        """Under the lock: buffer Columns (or records) from now on. What is buffered in the
        other form is dropped and read again from the positions (as a ``seek`` to each
        position; a read in flight is discarded)."""
        self._columns = columns
        if not self.SWITCH_REFETCHES:
            return
        for st in self._parts.values():
            self.generation += 1
            st.refetch(self.generation)
        self._fetch_cv.notify_all()

    def _rotation(self, start: int):
        """(index, state) of every assigned partition, from ``start`` round to ``start - 1``."""
        order, parts = self._order, self._parts
        size = len(order)
        for k in range(size):
            i = start + k
            if i >= size:
                i -= size
            yield i, parts[order[i]]

    def _drain(self, n: int, columns: bool, drained: List[tuple]) -> dict:
        """Greedy round-robin (under the lock): start at the rotating partition, take as much
        as possible from each until ``n`` are taken; the next poll starts after the partition
        where this one stopped. A parked partition whose last buffered record is taken goes
        to ``drained``: its error is reported now (:mod:`consumer.fetcher`, Errors)."""
        size = len(self._order)
        result = {}
        if not size or not self._drainable:
            return result
        start = i = self._poll_next
        for i, st in self._rotation(start):
            if st.count and not st.paused:
                before = st.count
                result[st.tp] = st.take_columns(n) if columns else st.take(n)
                n -= before - st.count
                if not st.count and st.unreported is not None:
                    drained.append((st.tp, st.unreported, st.error))
                    st.unreported = None
                if not n:
                    break
        else:
            i = start  # went all the way round (all drained): rotate the start by one
            self._drainable = False
        if result:
            self._poll_next = i + 1 if i + 1 < size else 0
        return result

    # ------------------------------------------------------------------ what a read brings (under the lock)

    def _current(self, st: PartitionBuffer, epoch: int) -> bool:
        """Under the lock: whether a read of ``st`` begun at ``epoch`` still counts (``st`` not
        revoked, re-assigned or seeked since)."""
        return self._parts.get(st.tp) is st and st.epoch == epoch

    def _keep(self, st: PartitionBuffer, chunks: list, count: int) -> None:
        """Under the lock: buffer the ``count`` records a read of ``st`` brought (in ``chunks``)."""
        st.chunks.extend(chunks)
        st.count += count
        self._drainable = True

    def _park(self, st: PartitionBuffer, offset: int, exc: BaseException) -> bool:
        """Under the lock: a fetch of ``st`` at ``offset`` failed. It is not fetched again until
        seek/assign; True if the error is to be reported now, False if records read before it
        are still buffered (the poll() that hands out the last of them reports it)."""
        st.error = exc
        if isinstance(exc, OffsetOutOfRange):
            st.highwater = exc.latest
        if st.count:
            st.unreported = offset
            return False
        return True

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        """Under the lock, before partitions are added: raise IllegalStateError if none may be
        (the fetcher does once closed); the buffers alone are never closed."""

    def _assigned_partition(self, tp: TopicPartition) -> PartitionBuffer:
        st = self._parts.get(TopicPartition(*tp))
        if st is None:
            raise IllegalStateError(f"partition {TopicPartition(*tp)} is not assigned")
        return st
