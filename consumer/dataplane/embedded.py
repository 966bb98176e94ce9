"""The embedded data plane: the durable partitioned log on a disk every member sees
(:mod:`consumer.log`), with topics registered in ZooKeeper in Kafka's own format."""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from consumer.dataplane import DataPlane, Record
from consumer.fetcher import Fetcher
from consumer.log import Columns, Log
from consumer.records import ConsumerRecord, TopicPartition
from coordinator.errors import IllegalStateError
from coordinator.topics import TopicRegistry


class EmbeddedDataPlane(DataPlane):
    """The log under ``data_dir``; ``zk`` (a started client) is needed only for
    :meth:`partition_counts` (the topic registry)."""

    name = "embedded"

    def __init__(self, data_dir: str, zk=None, log: Optional[Log] = None, **log_options):
        self.log = log if log is not None else Log(data_dir, **log_options)
        self._owns_log = log is None
        self._zk = zk

    def describe(self) -> str:
        return f"the embedded log under {self.log.data_dir}"

    def partition_counts(self, topics: Optional[Iterable[str]] = None) -> Dict[str, int]:
        if self._zk is None:
            raise IllegalStateError("the embedded log's topics are registered in ZooKeeper: give a client")
        counts = TopicRegistry(self._zk).all_partitions()
        return counts if topics is None else {t: counts[t] for t in topics if t in counts}

    def earliest_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        return {tp: self.log.earliest_offset(tp.topic, tp.partition) for tp in partitions}

    def latest_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        return {tp: self.log.latest_offset(tp.topic, tp.partition) for tp in partitions}

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> Dict[TopicPartition, Optional[int]]:
        return {tp: self.log.offset_for_time(tp.topic, tp.partition, ts) for tp, ts in timestamps.items()}

    def fetch(self, tp: TopicPartition, offset: int, max_records: int = 500,
              max_bytes: int = 1 << 20) -> List[ConsumerRecord]:
        return self.log.fetch(tp.topic, tp.partition, offset, max_records=max_records, max_bytes=max_bytes)

    def fetch_columns(self, tp: TopicPartition, offset: int, max_records: int = 500,
                      max_bytes: int = 1 << 20) -> List[Columns]:
        return self.log.fetch_columns(tp.topic, tp.partition, offset, max_records=max_records, max_bytes=max_bytes)

    def open_fetcher(self, *, group_id: str, max_poll_records: int, max_partition_fetch_bytes: int,
                     fetch_max_bytes: int, fetch_max_wait_ms: int,
                     on_error: Callable[[TopicPartition, BaseException], None]) -> Fetcher:
        return Fetcher(self.log, max_poll_records, max_partition_fetch_bytes, fetch_max_bytes, fetch_max_wait_ms,
                       on_error=on_error)

    def append(self, tp: TopicPartition, records: Sequence[Record]) -> int:
        return self.log.append(tp.topic, tp.partition, records)

    def has_data(self, topic: str) -> bool:
        return self.log.has_data(topic)

    def close(self) -> None:
        if self._owns_log:
            self.log.close()
