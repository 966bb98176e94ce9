"""The Kafka data plane: topics on Kafka brokers, read and written through librdkafka
(confluent-kafka), while zkgroups stays the one decider of who owns which partition.

Guarantees
----------
* **zkgroups decides.** A consumer's librdkafka client only ``assign()``s the partitions the
  coordinator gave its member, at the positions zkgroups chose (the offset committed in
  ZooKeeper, or the start position); it never ``subscribe()``s, so Kafka's own group protocol
  (JoinGroup, SyncGroup, heartbeats) is never used and cannot move partitions behind our back.
  ``group.id`` is set to the zkgroups group only so offsets can be *copied* where Kafka's tools
  read them (:meth:`KafkaDataPlane.commit_offsets`; ZooKeeper stays the source of truth and
  carries the fence).
* **Positions are ours.** ``auto.offset.reset=error``: a position Kafka no longer holds is
  reported as :class:`OffsetOutOfRange` (with the partition's earliest and latest offsets), and
  the consumer's own ``auto_offset_reset`` decides, exactly as with the embedded log.
* **The fetcher's promises hold** (:class:`KafkaFetcher`): fair ``max_poll_records`` hand-out
  from per-partition buffers, pause/resume/seek, records of a revoked or re-positioned partition
  never handed out, one error report per parked partition, made only once the records
  buffered before the error are handed out. librdkafka prefetches; the buffers above it are
  bounded as for the embedded log.
* **Failures inside Kafka stay inside librdkafka**: a broker down, a leader moving, a request
  timing out are retried there and never reach ``poll()``; a partition whose topic disappears,
  or that the client may not read, is reported once and parked. One exception: a partition
  given to the member without a committed offset needs its start offset looked up; if no
  broker answers within the request timeout, ``poll()`` raises a retriable FetchFailed for it
  and the member releases it (the coordinator gives it out again at its next check).
* **Keys land where Java clients put them**: producers use ``partitioner=murmur2_random``.
* librdkafka's own log lines go to Python logging (``zkgroups.kafka``), never straight to stderr.
* The user's librdkafka properties may be secrets: a configuration librdkafka refuses is one
  :class:`InvalidConfig` line, and no error message shows their values.
* Administration for ``groupctl`` (:meth:`KafkaDataPlane.create_topic`, ``create_partitions``,
  ``partition_leaders``) ends within the request timeout: a cluster that does not carry a
  request out (librdkafka's mock has no controller) is :class:`KafkaUnavailable`.

Not provided: Kafka transactions (records of aborted transactions are skipped by librdkafka's
default ``isolation.level=read_committed``; offsets may then have gaps, which readers accept),
and ``offsets_for_times`` where the brokers do not support it (librdkafka's mock cluster
answers -1: no offset).
"""
from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from itertools import accumulate
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from consumer.dataplane import DataPlane, Record
from consumer.dataplane.kafka_fetcher import KafkaFetcher
from consumer.dataplane.kafka_messages import (PARKING, error_name, error_text, kafka_error, partition_error,
                                               record_sizes, runs)
from consumer.records import ConsumerRecord, TopicPartition, kafka_records
from coordinator.errors import InvalidConfig, OffsetOutOfRange, TopicExists, UnknownTopic, ZkGroupsError
from coordinator.kafka import (DEFAULT_TIMEOUT_S, KafkaUnavailable, check_bootstrap_servers, confluent_kafka,
                               librdkafka_config)

log = logging.getLogger("zkgroups.kafka")

#: librdkafka settings zkgroups needs and a user may not change (see the module docstring).
FORCED_CONSUMER_CONFIG = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "error",
    "enable.partition.eof": False,
}
#: Defaults a user may override in the ``[kafka]`` table.
DEFAULT_CONSUMER_CONFIG = {
    # librdkafka pauses fetching 1 s whenever its local queue is full by default; readers then
    # flap between ~185k and ~2M records/s. Its documentation advises ~10 ms when that shows.
    "fetch.queue.backoff.ms": 10,
}
DEFAULT_PRODUCER_CONFIG = {
    "partitioner": "murmur2_random",   # Java's placement of keys (librdkafka's default differs)
    "linger.ms": 5,
}


class KafkaDataPlane(DataPlane):
    """A Kafka cluster at ``bootstrap_servers``; ``config``: librdkafka properties (the
    ``[kafka]`` table: ``security.protocol``, ``sasl.*``, ``ssl.*``, tuning)."""

    name = "kafka"

    def __init__(self, bootstrap_servers: str, config: Optional[Mapping[str, object]] = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self._ck = confluent_kafka()
        self.servers = check_bootstrap_servers(bootstrap_servers)
        self._user_config = dict(config or {})
        librdkafka_config(self.servers, self._user_config, {})  # reject conflicts now
        self.timeout_s = timeout_s
        self._lock = threading.Lock()   # one client call at a time on the shared clients below
        self._reader = None             # metadata, watermarks, range reads (no group)
        self._admin = None
        self._producer = None
        self._committers: Dict[str, object] = {}
        self._closed = False

    def describe(self) -> str:
        return f"Kafka at {self.servers}"

    # ------------------------------------------------------------ clients

    def consumer_config(self, group_id: str = "") -> dict:
        config = librdkafka_config(self.servers, self._user_config, DEFAULT_CONSUMER_CONFIG, FORCED_CONSUMER_CONFIG)
        config["group.id"] = group_id or "zkgroups-tools"
        return config

    def producer_config(self, overrides: Optional[Mapping[str, object]] = None) -> dict:
        return {**librdkafka_config(self.servers, self._user_config, DEFAULT_PRODUCER_CONFIG), **(overrides or {})}

    def new_client(self, factory, config: Mapping[str, object]):
        """``factory(config)`` (a confluent-kafka client class); a configuration librdkafka
        refuses is one InvalidConfig line that never shows the user's values (they may be secrets)."""
        try:
            return factory(dict(config))
        except (self._ck.KafkaException, ValueError, TypeError) as e:
            reason = self._redacted(error_text(e))
            raise InvalidConfig(f"librdkafka refused the Kafka configuration: {reason}") from None

    def new_producer(self, overrides: Optional[Mapping[str, object]] = None):
        """A librdkafka producer configured by :meth:`producer_config`."""
        return self.new_client(self._ck.Producer, self.producer_config(overrides))

    def _redacted(self, text: str) -> str:
        for value in self._user_config.values():
            if isinstance(value, str) and len(value) >= 3:
                text = text.replace(value, "***")
        return text

    def _reader_client(self):
        if self._reader is None:
            self._reader = self.new_client(self._ck.Consumer, self.consumer_config())
        return self._reader

    def _admin_client(self):
        if self._admin is None:
            from confluent_kafka.admin import AdminClient
            self._admin = self.new_client(AdminClient, librdkafka_config(self.servers, self._user_config, {}))
        return self._admin

    def _unavailable(self, e: BaseException) -> KafkaUnavailable:
        return KafkaUnavailable(f"Kafka at {self.servers} did not answer within {self.timeout_s:g}s "
                                f"({self._redacted(error_text(e))})")

    # ------------------------------------------------------------ topics and offsets

    def partition_counts(self, topics: Optional[Iterable[str]] = None) -> Dict[str, int]:
        with self._lock:
            try:
                metadata = self._reader_client().list_topics(timeout=self.timeout_s)
            except self._ck.KafkaException as e:
                raise self._unavailable(e) from None
        counts = {name: len(t.partitions) for name, t in metadata.topics.items()
                  if t.error is None and not name.startswith("__")}
        return counts if topics is None else {t: counts[t] for t in topics if t in counts}

    def _list_offsets(self, spec_of: Mapping[TopicPartition, object]) -> Dict[TopicPartition, int]:
        if not spec_of:
            return {}
        ck = self._ck
        with self._lock:
            futures = self._admin_client().list_offsets(
                {ck.TopicPartition(tp.topic, tp.partition): spec for tp, spec in spec_of.items()},
                request_timeout=self.timeout_s)
        out = {}
        for ktp, future in futures.items():
            tp = TopicPartition(ktp.topic, ktp.partition)
            try:
                out[tp] = future.result().offset
            except ck.KafkaException as e:
                name = error_name(e)
                if name in PARKING or (name == "_NOENT" and tp.topic not in self.partition_counts([tp.topic])):
                    raise UnknownTopic(tp.topic) from None  # _NOENT: no leader found, as for a topic that is not there
                raise self._unavailable(e) from None
        return out

    def earliest_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        from confluent_kafka.admin import OffsetSpec
        return self._list_offsets({TopicPartition(*tp): OffsetSpec.earliest() for tp in partitions})

    def latest_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        from confluent_kafka.admin import OffsetSpec
        return self._list_offsets({TopicPartition(*tp): OffsetSpec.latest() for tp in partitions})

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> Dict[TopicPartition, Optional[int]]:
        from confluent_kafka.admin import OffsetSpec
        found = self._list_offsets({TopicPartition(*tp): OffsetSpec.for_timestamp(ts) for tp, ts in timestamps.items()})
        return {tp: (offset if offset >= 0 else None) for tp, offset in found.items()}

    # ------------------------------------------------------------ reading

    def fetch(self, tp: TopicPartition, offset: int, max_records: int = 500,
              max_bytes: int = 1 << 20) -> List[ConsumerRecord]:
        tp = TopicPartition(*tp)
        low, high = self._watermarks(tp)
        if offset < low or offset > high:
            raise OffsetOutOfRange(tp.topic, tp.partition, offset, low, high)
        if offset == high:
            return []
        ck = self._ck
        out: List[ConsumerRecord] = []
        size = 0
        deadline = time.monotonic() + self.timeout_s
        with self._lock:
            reader = self._reader_client()
            reader.assign([ck.TopicPartition(tp.topic, tp.partition, offset)])
            try:
                while len(out) < max_records and time.monotonic() < deadline:
                    messages = reader.consume(num_messages=min(max_records - len(out), 10_000), timeout=0.2)
                    for run, error in runs(messages, tp.topic):
                        if error is not None:
                            raise partition_error(tp, offset, error)
                        records = kafka_records(run)
                        if records[0].offset < offset:
                            records = [r for r in records if r.offset >= offset]
                        records = records[:max_records - len(out)]
                        # Up to and with the record that reaches max_bytes (at least one).
                        ends = list(accumulate(record_sizes(records), initial=size))
                        full = bisect_left(ends, max_bytes, 1)
                        out += records[:full]
                        size = ends[min(full, len(records))]
                        if len(out) >= max_records or full <= len(records):
                            return out
                    if out and out[-1].offset + 1 >= high:
                        return out
            finally:
                reader.unassign()
        if not out:
            raise self._unavailable(TimeoutError("no records arrived"))
        return out

    def _watermarks(self, tp: TopicPartition):
        with self._lock:
            try:
                return self._reader_client().get_watermark_offsets(
                    self._ck.TopicPartition(tp.topic, tp.partition), timeout=self.timeout_s, cached=False)
            except self._ck.KafkaException as e:
                raise self._unavailable(e) from None

    def open_fetcher(self, *, group_id: str, max_poll_records: int, max_partition_fetch_bytes: int,
                     fetch_max_bytes: int, fetch_max_wait_ms: int,
                     on_error: Callable[[TopicPartition, BaseException], None]) -> "KafkaFetcher":
        config = self.consumer_config(group_id)
        config.setdefault("fetch.max.bytes", fetch_max_bytes)
        config.setdefault("max.partition.fetch.bytes", max_partition_fetch_bytes)
        config.setdefault("fetch.wait.max.ms", fetch_max_wait_ms)
        return KafkaFetcher(self.new_client(self._ck.Consumer, config), self, max_poll_records,
                            max_partition_fetch_bytes, fetch_max_bytes, fetch_max_wait_ms, on_error=on_error)

    # ------------------------------------------------------------ writing

    def append(self, tp: TopicPartition, records: Sequence[Record]) -> int:
        tp = TopicPartition(*tp)
        with self._lock:
            if self._producer is None:
                self._producer = self.new_producer({"linger.ms": 0})
            offsets, errors = [], []

            def delivered(err, msg):
                (errors if err is not None else offsets).append(err if err is not None else msg.offset())
            for key, value, timestamp, headers in records:
                self._producer.produce(tp.topic, value, key, tp.partition, on_delivery=delivered,
                                       timestamp=timestamp or 0, headers=list(headers) or None)
            left = self._producer.flush(self.timeout_s)
        if errors or left:
            raise self._unavailable(errors[0] if errors else TimeoutError(f"{left} records not delivered"))
        return min(offsets)

    # ------------------------------------------------------------ the group's offsets, for Kafka's tools

    def commit_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Copy a group's committed offsets to Kafka (OffsetCommit for a group that never joins:
        Kafka accepts it unfenced, so ZooKeeper's fenced commit comes first, always)."""
        if not offsets:
            return
        ck = self._ck
        with self._lock:
            committer = self._committer(group_id)
            try:
                committer.commit(offsets=[ck.TopicPartition(tp.topic, tp.partition, o) for tp, o in offsets.items()],
                                 asynchronous=False)
            except ck.KafkaException as e:
                raise self._unavailable(e) from None

    def _committer(self, group_id: str):
        """The group's client for OffsetCommit/OffsetFetch (under ``_lock``)."""
        committer = self._committers.get(group_id)
        if committer is None:
            committer = self.new_client(self._ck.Consumer, self.consumer_config(group_id))
            self._committers[group_id] = committer
        return committer

    def committed_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, Optional[int]]:
        """What Kafka holds for the group (as its tools see it); None where nothing was committed."""
        ck = self._ck
        with self._lock:
            committer = self._committer(group_id)
            try:
                found = committer.committed([ck.TopicPartition(tp.topic, tp.partition) for tp in partitions],
                                            timeout=self.timeout_s)
            except ck.KafkaException as e:
                raise self._unavailable(e) from None
        return {TopicPartition(k.topic, k.partition): (k.offset if k.offset >= 0 else None) for k in found}

    # ------------------------------------------------------------ administration (groupctl topics)

    def partition_leaders(self, topic: str) -> Dict[int, int]:
        """{partition: id of its leader broker (-1: none now)} from Kafka's metadata."""
        with self._lock:
            try:
                metadata = self._reader_client().list_topics(timeout=self.timeout_s)
            except self._ck.KafkaException as e:
                raise self._unavailable(e) from None
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            raise UnknownTopic(topic)
        return {p.id: p.leader for p in found.partitions.values()}

    def create_topic(self, topic: str, partitions: int, replication_factor: int = -1) -> None:
        """CreateTopics (replication factor -1: the brokers' default). Raises TopicExists, or
        KafkaUnavailable when the cluster does not carry it out within the timeout."""
        from confluent_kafka.admin import NewTopic
        self._admin_call("create_topics", "create topic", topic,
                         [NewTopic(topic, partitions, replication_factor)])

    def create_partitions(self, topic: str, total: int) -> None:
        """CreatePartitions: grow ``topic`` to ``total`` partitions."""
        from confluent_kafka.admin import NewPartitions
        self._admin_call("create_partitions", "add partitions to topic", topic, [NewPartitions(topic, total)])

    def _admin_call(self, method: str, what: str, topic: str, requests: list) -> None:
        timeout = self.timeout_s
        with self._lock:
            futures = getattr(self._admin_client(), method)(requests, request_timeout=timeout,
                                                             operation_timeout=timeout)
        try:
            futures[topic].result(timeout=timeout + 1)
        except self._ck.KafkaException as e:
            name = error_name(e)
            if name == "TOPIC_ALREADY_EXISTS":
                raise TopicExists(topic) from None
            if name == "UNKNOWN_TOPIC_OR_PART":
                raise UnknownTopic(topic) from None
            error = kafka_error(e)
            if error is not None and not error.retriable() and name != "_TIMED_OUT":
                raise ZkGroupsError(f"Kafka at {self.servers} refused to {what} {topic}: "
                                    f"{self._redacted(error_text(e))}") from None
            raise KafkaUnavailable(f"Kafka at {self.servers} did not {what} {topic} within {timeout:g}s "
                                   f"({self._redacted(error_text(e))})") from None
        except TimeoutError:
            raise KafkaUnavailable(f"Kafka at {self.servers} did not {what} {topic} within {timeout:g}s") from None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            clients = [c for c in [self._reader, *self._committers.values()] if c is not None]
            self._reader, self._committers = None, {}
            producer, self._producer = self._producer, None
        for client in clients:
            client.close()
        if producer is not None:
            producer.flush(self.timeout_s)


__all__ = ["KafkaDataPlane", "KafkaFetcher", "kafka_error", "error_name", "error_text"]
