"""The data plane: where topics' records live, behind one interface.

zkgroups decides *who* owns a partition (ZooKeeper, the coordinator); the data plane is *where*
its records are read from and written to. Two implementations:

* :mod:`~consumer.dataplane.embedded` — the embedded log on a shared disk (:mod:`consumer.log`),
  topics registered in ZooKeeper (``/brokers/topics``). The default.
* :mod:`~consumer.dataplane.kafka` — Kafka brokers through librdkafka (confluent-kafka).
  Consumers only ``assign()`` the partitions the coordinator gave them, at positions zkgroups
  chose: Kafka's own group protocol is never used, so zkgroups stays the one decider. Its
  fetcher is :mod:`~consumer.dataplane.kafka_fetcher`; :mod:`~consumer.dataplane.kafka_messages`
  reads librdkafka's messages and errors for both.

What every data plane offers (:class:`DataPlane`): topics and their partition counts; the
earliest and latest offsets and the offset for a time; a bounded batch read of one partition
from an offset (tools, range reads); a *fetcher* — the streaming reader a ``Consumer`` polls,
with fair ``max_poll_records`` hand-out (:class:`consumer.fetcher.Fetcher`'s interface); appends;
and, for Kafka, a copy of a group's committed offsets where Kafka's own tools read them.

Beside them, :mod:`~consumer.dataplane.record_times` reads the timestamps of the records at
given offsets from either (lag in seconds: the age of a group's oldest unconsumed record), and
:mod:`~consumer.dataplane.log_ends` is the coordinator console's reader of log ends (handed to the
node by ``coordinatord``'s entry point).

Which one: :func:`open_data_plane` — Kafka when bootstrap servers are given (argument, config,
or ``KAFKA_BOOTSTRAP_SERVERS``), else the embedded log under ``data_dir``. A topic's partition
count: :func:`topic_partitions` (ZooKeeper's registry for the embedded log, Kafka's metadata).
"""
from __future__ import annotations

import abc
import os
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from consumer.records import ConsumerRecord, TopicPartition

ENV_BOOTSTRAP_SERVERS = "KAFKA_BOOTSTRAP_SERVERS"

#: (key, value, timestamp ms, headers) — what :meth:`DataPlane.append` takes.
Record = tuple


class DataPlane(abc.ABC):
    """Records of topics: read, written, and where a partition begins and ends."""

    #: "embedded" or "kafka"
    name: str = ""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the records are, for messages: ``the embedded log under ./data``, ``Kafka at h:9092``."""

    @abc.abstractmethod
    def partition_counts(self, topics: Optional[Iterable[str]] = None) -> Dict[str, int]:
        """{topic: partition count} of ``topics`` (every topic when None); unknown ones are left out."""

    @abc.abstractmethod
    def earliest_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        """The first offset still held of each partition."""

    @abc.abstractmethod
    def latest_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        """The offset the next record of each partition will get (the log end)."""

    @abc.abstractmethod
    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> Dict[TopicPartition, Optional[int]]:
        """The earliest offset whose timestamp is at least the given one (ms), or None."""

    @abc.abstractmethod
    def fetch(self, tp: TopicPartition, offset: int, max_records: int = 500,
              max_bytes: int = 1 << 20) -> List[ConsumerRecord]:
        """Up to ``max_records`` records of ``tp`` from ``offset`` (at least one if any, whatever
        ``max_bytes``); [] at the end. Raises OffsetOutOfRange below the earliest offset."""

    def fetch_columns(self, tp: TopicPartition, offset: int, max_records: int = 500,
                      max_bytes: int = 1 << 20) -> Optional[list]:
        """What :meth:`fetch` returns, column by column (the embedded log's
        :class:`~consumer.log.Columns`, one per stored batch), where the data plane keeps its
        records in columns; None where it does not (call :meth:`fetch`)."""
        return None

    @abc.abstractmethod
    def open_fetcher(self, *, group_id: str, max_poll_records: int, max_partition_fetch_bytes: int,
                     fetch_max_bytes: int, fetch_max_wait_ms: int,
                     on_error: Callable[[TopicPartition, BaseException], None]):
        """The streaming reader a Consumer polls (the interface of :class:`consumer.fetcher.Fetcher`)."""

    @abc.abstractmethod
    def append(self, tp: TopicPartition, records: Sequence[Record]) -> int:
        """Write ``records`` to ``tp`` now (tools and tests; producers batch). Returns the first offset."""

    def has_data(self, topic: str) -> bool:
        """Whether this data plane holds anything of ``topic`` (else the consumer says so once)."""
        return True

    def commit_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Record a copy of a group's committed offsets where the data plane's own tools read
        them (Kafka). ZooKeeper stays the source of truth; the embedded log has no such copy."""

    def close(self) -> None:
        """Release files, connections and threads (a closed data plane is not used again)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def bootstrap_servers_from(value: Optional[str] = None) -> str:
    """``value``, else ``$KAFKA_BOOTSTRAP_SERVERS``, else "" (the embedded log)."""
    return (value if value is not None else os.environ.get(ENV_BOOTSTRAP_SERVERS, "")).strip()


def open_data_plane(*, data_dir: Optional[str] = None, bootstrap_servers: Optional[str] = None,
                    kafka: Optional[Mapping[str, object]] = None, zk=None,
                    log_options: Optional[Mapping[str, object]] = None,
                    timeout_s: Optional[float] = None) -> DataPlane:
    """Kafka at ``bootstrap_servers`` (librdkafka properties in ``kafka``; ``timeout_s`` bounds
    each request, 10 s by default), or the embedded log under ``data_dir`` (its topics
    registered through the ZooKeeper client ``zk``)."""
    servers = bootstrap_servers_from(bootstrap_servers)
    if servers:
        from consumer.dataplane.kafka import KafkaDataPlane
        return KafkaDataPlane(servers, kafka) if timeout_s is None else KafkaDataPlane(servers, kafka, timeout_s)
    from consumer.dataplane.embedded import EmbeddedDataPlane
    from coordinator.config import default_data_dir
    return EmbeddedDataPlane(data_dir or default_data_dir(), zk=zk, **(log_options or {}))


def topic_partitions(plane: DataPlane, client, topics: Sequence[str]) -> Dict[str, int]:
    """{topic: partition count}: the topic registry in ZooKeeper (``client``) for the embedded
    log, Kafka's metadata on Kafka (whose topics the coordinator learns from a Kafka in
    ZooKeeper mode or its topic mirror). Raises UnknownTopic for a topic that is not there."""
    if plane.name != "kafka":
        return registered_partitions(client, topics)
    counts = plane.partition_counts(topics)
    for t in topics:
        if t not in counts:
            from coordinator.errors import UnknownTopic
            raise UnknownTopic(t)
    return counts


def registered_partitions(client, topics: Sequence[str]) -> Dict[str, int]:
    """{topic: partition count} from ZooKeeper's topic registry (UnknownTopic if one is not there)."""
    from coordinator.topics import TopicRegistry
    registry = TopicRegistry(client)
    return {t: registry.partitions(t) for t in topics}
