"""What a consumer may ask of its topics without being in the group: where partitions begin
and end, the offset for a time, the topics and their partitions (kafka-python's lookups), from
the data plane and ZooKeeper's topic registry. :class:`~consumer.consumer.Consumer` has these
(a base of its own: they need only ``_plane`` and ``_client``, never the group)."""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Set

from coordinator.errors import UnknownTopic
from coordinator.topics import TopicRegistry
from consumer.dataplane.record_times import RecordTimesReader
from consumer.records import OffsetAndTimestamp, TopicPartition


class Lookups:
    """Lookups over ``self._plane`` (a data plane) and ``self._client`` (a started ZooKeeper
    client); any thread."""

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        """Earliest retained offset of each partition (owned or not)."""
        return self._plane.earliest_offsets(partitions)

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        """Offset after the last record of each partition (owned or not)."""
        return self._plane.latest_offsets(partitions)

    def offsets_for_times(self, timestamps: Dict[TopicPartition, int]) -> Dict[TopicPartition, Optional[OffsetAndTimestamp]]:
        """For each partition (owned or not) the earliest offset whose timestamp is at least the
        given one (milliseconds) and that record's own timestamp, or None if there is none."""
        found = self._plane.offsets_for_times(timestamps)
        reader = RecordTimesReader(self._plane)
        try:
            times = reader([(tp.topic, tp.partition, o) for tp, o in found.items() if o is not None])
        finally:
            reader.close()
        return {tp: None if o is None else OffsetAndTimestamp(o, times.get((tp.topic, tp.partition, o), timestamps[tp]))
                for tp, o in found.items()}

    def topics(self) -> Set[str]:
        """Every topic registered in ZooKeeper (``/brokers/topics``: the topics the coordinator
        assigns, on either data plane); kafka-python's ``topics()``."""
        return set(TopicRegistry(self._client).all_partitions())

    def partitions_for_topic(self, topic: str) -> Set[int]:
        """The partition ids of ``topic`` as registered in ZooKeeper; empty if there is no such topic."""
        try:
            return set(range(TopicRegistry(self._client).partitions(topic)))
        except UnknownTopic:
            return set()
