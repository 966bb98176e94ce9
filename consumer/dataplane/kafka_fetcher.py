"""The fetcher over a librdkafka consumer (:class:`KafkaFetcher`): the embedded log's fetcher's
buffers and fair hand-out (:mod:`consumer.fetcher`) on top of what librdkafka prefetches, for a
client that only ever calls ``assign()`` (:mod:`consumer.dataplane.kafka` says why)."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional

from consumer.dataplane.kafka_messages import PARKING, runs as kafka_runs
from consumer.fetcher import Fetcher, FetcherState
from consumer.partition_buffer import PartitionBuffer
from consumer.records import ConsumerRecord, TopicPartition, kafka_messages, kafka_records
from coordinator.errors import FetchFailed, OffsetOutOfRange
from coordinator.kafka import log_client_error

if TYPE_CHECKING:
    from consumer.dataplane.kafka import KafkaDataPlane

log = logging.getLogger("zkgroups.kafka")

#: The longest a read waits for a first message: control calls (assign, seek, ...) wait for a
#: read in flight, so this bounds what a rebalance or a seek waits for librdkafka.
READ_WAIT_S = 0.02
#: The most one read takes out of librdkafka's queue (or ``max_poll_records``, if larger).
#: librdkafka hands messages out of one queue in arrival order, so one partition's backlog can
#: stand in front of the others' records: the fair round-robin over the per-partition buffers
#: serves every partition (seed 004), not the queue's order. Not much more: every buffered
#: message is an object the cyclic GC goes over (reads of 20,000 made poll() a fifth slower).
READ_RECORDS = 2_000


class _KafkaPartition(PartitionBuffer):
    """A partition's state in the KafkaFetcher: its chunks are runs of librdkafka's Messages,
    made into KafkaRecords as they are handed out (records live from ``poll()`` on, not while
    buffered: fewer objects for the cyclic GC to go over)."""

    __slots__ = ()

    def take(self, n: int) -> list:
        messages = self._take_items(n)
        self.position = messages[-1].offset() + 1
        return kafka_records(messages)

    def chunk_of(self, records: list) -> list:
        return kafka_messages(records)

    def take_columns(self, n: int) -> list:
        """The batch path: up to ``n`` buffered messages as librdkafka made them (no record object)."""
        messages = self._take_items(n)
        self.position = messages[-1].offset() + 1
        return messages

    def given_back(self, items: list):
        if isinstance(items[0], ConsumerRecord):
            return items[0].offset, items[-1].offset + 1, [kafka_messages(items)]
        return items[0].offset(), items[-1].offset() + 1, [list(items)]


class KafkaFetcher(Fetcher):
    """The fetcher's buffers and fair hand-out over a librdkafka consumer that only calls ``assign()``.

    Reading: one read at a time (the read slot, as for the log) takes what librdkafka has
    prefetched for any assigned partition (what is queued, up to ``READ_RECORDS`` or
    ``max_poll_records``); each partition's run joins that partition's buffer if it continues
    it (its first offset is the next one expected — a run from before a seek or a
    re-assignment never does; librdkafka also drops what it fetched before a seek).
    No prefetch thread: librdkafka prefetches into its queue in threads of its own, and
    ``poll()`` reads that queue when nothing is buffered (a thread of ours would only move
    messages between queues, taking the GIL from ``poll()``: without one ``poll()`` reads at
    0.76-0.90 of a bare reader's records per CPU second, against 0.58-0.62 with one).

    Control: ``assign``/``revoke``/``seek``/``pause``/``resume`` change the buffers (under the
    fetcher's lock) and then librdkafka's assignment, so librdkafka fetches only what is assigned
    and not paused.

    One call at a time: every call on a confluent-kafka consumer waits while another thread is
    inside its ``consume()``, so control calls take the read slot too (``_exclusive()``), and a
    read never blocks long: it waits for the first message only up to ``READ_WAIT_S`` (or less),
    then takes what else is already queued without waiting.
    """

    _partition_type = _KafkaPartition
    _reads_ahead = False
    SWITCH_REFETCHES = False   # the buffers hold messages whichever poll asks: records or the batch path

    def __init__(self, consumer, plane: "KafkaDataPlane", max_poll_records: int = 500,
                 max_partition_fetch_bytes: int = 1 << 20, fetch_max_bytes: int = 50 << 20,
                 fetch_max_wait_ms: int = 100, on_error=None):
        super().__init__(None, max_poll_records, max_partition_fetch_bytes, fetch_max_bytes, fetch_max_wait_ms,
                         on_error=on_error)
        self._kc = consumer
        self._plane = plane
        self._ktp = plane._ck.TopicPartition
        self._slot_waiters = 0
        self._read_size = max(max_poll_records, READ_RECORDS)
        self._topics: set = set()  # topics assigned (member thread writes, the reader reads a snapshot)

    # ---- control, mirrored to librdkafka

    def assign(self, positions, paused: bool = False) -> None:
        positions = {TopicPartition(*tp): int(offset) for tp, offset in positions.items()}
        known = self.assigned() & set(positions)
        super().assign(positions, paused)
        self._topics = {tp.topic for tp in self.assigned()}
        new = [self._ktp(tp.topic, tp.partition, positions[tp]) for tp in positions if tp not in known]

        def mirror():
            if new:
                self._kc.incremental_assign(new)
                if paused:
                    self._kc.pause(new)
            for tp in known:
                self._seek_kafka(tp, positions[tp])
        self._exclusive(mirror)

    def revoke(self, tps) -> None:
        tps = [TopicPartition(*tp) for tp in tps]
        gone = self.assigned() & set(tps)
        super().revoke(tps)
        self._topics = {tp.topic for tp in self.assigned()}
        if gone:
            self._exclusive(lambda: self._kc.incremental_unassign([self._ktp(tp.topic, tp.partition) for tp in gone]))

    def seek(self, tp, offset: int) -> None:
        tp = TopicPartition(*tp)
        super().seek(tp, offset)  # also clears a parked partition's error
        resume = tp not in self.paused()  # it was paused in librdkafka if it had been parked

        def mirror():
            self._seek_kafka(tp, int(offset))
            if resume:
                self._kc.resume([self._ktp(tp.topic, tp.partition)])
        self._exclusive(mirror)

    def _seek_kafka(self, tp: TopicPartition, offset: int) -> None:
        try:
            self._kc.seek(self._ktp(tp.topic, tp.partition, offset))
        except self._plane._ck.KafkaException:
            # Not fetching yet (librdkafka seeks only partitions it consumes): assign it anew there.
            self._kc.incremental_unassign([self._ktp(tp.topic, tp.partition)])
            self._kc.incremental_assign([self._ktp(tp.topic, tp.partition, offset)])

    def pause(self, tps) -> None:
        tps = [TopicPartition(*tp) for tp in tps]
        super().pause(tps)
        self._mirror(self._kc.pause, tps)

    def resume(self, tps) -> None:
        tps = [TopicPartition(*tp) for tp in tps]
        super().resume(tps)
        self._mirror(self._kc.resume, tps)

    def _mirror(self, call, tps) -> None:
        """Apply a librdkafka pause or resume to those of ``tps`` that are assigned."""
        mine = self.assigned() & set(tps)
        if mine:
            self._exclusive(lambda: call([self._ktp(tp.topic, tp.partition) for tp in mine]))

    def end_offsets(self, tps):
        latest = self._plane.latest_offsets(TopicPartition(*tp) for tp in tps)
        with self._lock:
            for tp, offset in latest.items():
                st = self._parts.get(tp)
                if st is not None and (st.highwater is None or offset > st.highwater):
                    st.highwater = offset
        return latest

    def close(self, timeout: float = 5.0) -> None:
        super().close(timeout)
        deadline = time.monotonic() + timeout  # for a poll() in another thread to leave its read
        with self._lock:
            while self._busy and time.monotonic() < deadline:
                self._data_cv.wait(READ_WAIT_S)
        self._kc.close()

    def _exclusive(self, call) -> None:
        """Run a call on the librdkafka consumer holding the read slot (see the class docstring);
        it waits for a read in flight, which ends within ``READ_WAIT_S``."""
        with self._lock:
            if self.state is FetcherState.CLOSED:
                return  # librdkafka's consumer is closed with the fetcher: nothing to mirror
            self._slot_waiters += 1
            try:
                while self._busy:
                    self._data_cv.wait()
                self._busy = True
            finally:
                self._slot_waiters -= 1
        try:
            call()
        finally:
            with self._lock:
                self._release_slot()

    def _release_slot(self) -> None:
        super()._release_slot()
        if self._slot_waiters:
            self._data_cv.notify_all()

    # ---- reading

    def _pick(self, now: float):
        """Under the lock, with the read slot free: a read of every partition (librdkafka
        decides which have data) if any is fetchable; the job is the read's start epoch."""
        if self._slot_waiters:
            return None, None  # a control call waits for the slot: it goes first, or it would starve
        if any(not st.paused and st.error is None for st in self._parts.values()):
            self._busy = True
            return self.generation, None
        return None, None

    def _fetch(self, job, wait: Optional[float] = None) -> None:
        started_epoch = job
        timeout = READ_WAIT_S if wait is None else max(0.0, min(wait, READ_WAIT_S))
        try:
            # librdkafka's consume() waits for a full batch or the timeout: wait for the first
            # message only, then take what is already queued.
            first = self._kc.poll(timeout)
            messages = [first] if first is not None else []
            if messages:
                messages += self._kc.consume(num_messages=self._read_size - 1, timeout=0)
            topics = self._topics
            runs = list(kafka_runs(messages, next(iter(topics)) if len(topics) == 1 else None))
        except Exception as e:
            with self._lock:
                self._release_slot()
            log.warning("Kafka consumer: %s", e)
            return
        failures = []
        with self._lock:
            self._release_slot()
            for run, message in runs:
                if message is not None:
                    failures.append(message)
                    continue
                head = run[0]
                st = self._parts.get(TopicPartition(head.topic(), head.partition()))
                if st is None or st.error is not None:
                    continue  # revoked (or parked) since: librdkafka's late delivery
                first = head.offset()
                if first < st.fetch_offset:
                    run = [m for m in run if m.offset() >= st.fetch_offset]
                    if not run:
                        continue
                    first = run[0].offset()
                if first != st.fetch_offset and st.epoch > started_epoch:
                    continue  # re-positioned during this read: only a run that continues it counts
                self._keep(st, [run], len(run))
                st.fetch_offset = last = run[-1].offset() + 1
                if st.highwater is None or last > st.highwater:
                    st.highwater = last
        for message in failures:
            self._partition_failed(message)

    def _partition_failed(self, message) -> None:
        err = message.error()
        topic, partition = message.topic(), message.partition()
        if not topic or partition is None or partition < 0:
            log_client_error(err)  # not about one partition: librdkafka retries it
            return
        tp = TopicPartition(topic, partition)
        name = err.name()
        if name == "_AUTO_OFFSET_RESET":
            low, high = self._plane._watermarks(tp)
            exc: BaseException = OffsetOutOfRange(topic, partition, message.offset(), low, high)
        elif name in PARKING or err.fatal() or not err.retriable():
            exc = FetchFailed(topic, partition, RuntimeError(f"{name}: {err.str()}"))
        else:
            log.info("Kafka: %s of %s (retried inside librdkafka)", err.str(), tp)
            return
        with self._lock:
            st = self._parts.get(tp)
            if st is None or st.error is not None:
                return
            offset = st.fetch_offset
            report_now = self._park(st, offset, exc)  # else after the records before it are handed out
        self._mirror(self._kc.pause, [tp])
        if report_now:
            self._report(tp, offset, exc)
