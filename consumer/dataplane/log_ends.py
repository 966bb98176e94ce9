"""The coordinator console's reader of the data plane: log ends, partitions' details and the
timestamps of the records at committed offsets (lag in seconds). ``coordinatord``
(:mod:`consumer.cli.coordinatord`) hands it to the node, which never imports the data plane."""
from __future__ import annotations

from coordinator import documents
from consumer.dataplane import open_data_plane
from consumer.dataplane.record_times import RecordTimesReader
from consumer.records import TopicPartition


class DataPlaneEnds:
    """The console's :class:`~coordinator.console.lag.LogEnds` over a :mod:`consumer.dataplane`
    (what ``groupctl groups describe`` and ``topics describe`` read)."""

    def __init__(self, plane):
        self.plane, self.name = plane, plane.name
        self.timestamps = RecordTimesReader(plane)  # lag in seconds: the records at committed offsets

    @classmethod
    def open(cls, bootstrap_servers: str, kafka: dict, data_dir: str) -> "DataPlaneEnds":
        return cls(open_data_plane(data_dir=data_dir, bootstrap_servers=bootstrap_servers, kafka=kafka))

    def describe(self) -> str:
        return self.plane.describe()

    def partition_counts(self):
        return self.plane.partition_counts()

    def latest(self, topic: str, partitions):
        if not self.plane.has_data(topic):  # no directory of it here (another --data-dir?): unknown, not 0
            return {}
        got = self.plane.latest_offsets([TopicPartition(topic, p) for p in partitions])
        return {tp.partition: offset for tp, offset in got.items()}

    def details(self, topic: str, partitions):
        tps = [TopicPartition(topic, p) for p in partitions]
        earliest, latest = self.plane.earliest_offsets(tps), self.plane.latest_offsets(tps)
        kafka = self.name == "kafka"
        leaders = self.plane.partition_leaders(topic) if kafka else {}
        return [documents.topic_partition_row(tp.partition, earliest[tp], latest[tp],
                                              None if kafka else self.plane.log.size_bytes(topic, tp.partition),
                                              leaders.get(tp.partition, -1) if kafka else None) for tp in tps]

    def close(self) -> None:
        self.timestamps.close()
        self.plane.close()
