"""A Spark data source ``zkgroups`` (pyspark's Python Data Source API): a topic's records as a
DataFrame, from where a consumer group stands.

    from consumer.spark.source import register
    register(spark)
    df = (spark.read.format("zkgroups").option("zk", "127.0.0.1:2181").option("topic", "orders")
          .option("dataDir", "./data")            # or .option("bootstrapServers", "b1:9092")
          .option("group", "etl")                 # optional: start at the group's committed offsets
          .load())
    stream = spark.readStream.format("zkgroups")...load()   # the same options

Columns (Kafka's source, without headers): ``key`` binary, ``value`` binary, ``topic``
string, ``partition`` int, ``offset`` long, ``timestamp`` long. One Spark partition per topic
partition.

What a batch read holds: for each partition, the records from the group's committed offset
(``group`` given and something committed; else the partition's earliest offset) up to the
log end when the read was planned. A stream starts there too and then reads whatever
arrives; its progress is Spark's checkpoint, as for Spark's Kafka source.

Not done, by design: the source never joins the group and never commits to it (the group's
offsets stay its members' business; a group's committed offsets are only a starting point),
and it has no admission control (``maxOffsetsPerTrigger``): each micro-batch reads up to the
log end. Kafka librdkafka properties other than the brokers cannot be given (they would be
visible in the plan). Offsets must be contiguous (as for group jobs).
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp long"
FETCH_RECORDS = 10000


def register(spark) -> None:
    """Make ``spark.read.format("zkgroups")`` (and ``readStream``) available in ``spark``."""
    spark.dataSource.register(ZkGroupsDataSource)


class Range(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int):
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

class SourceOptions:
    """The source's options (checked on the driver) and what they give: offsets, ranges, records."""

    def __init__(self, options: Dict[str, str]):
        self.zk = options.get("zk")
        self.topic = options.get("topic")
        if not self.zk or not self.topic:
            raise ValueError("the zkgroups source needs the options zk and topic")
        self.group = options.get("group")
        self.data_dir = options.get("dataDir") or options.get("datadir")
        self.bootstrap = options.get("bootstrapServers") or options.get("bootstrapservers") or ""

    def plane(self, client=None):
        from consumer.dataplane import open_data_plane
        return open_data_plane(data_dir=self.data_dir, bootstrap_servers=self.bootstrap, zk=client)

    def offsets(self) -> Tuple[Dict[str, int], Dict[str, int]]:
        """({"p": start}, {"p": log end}) of every partition of the topic."""
        from coordinator.zkclient import close_client, start_client
        from consumer.records import TopicPartition
        from consumer.spark.driver import topic_partitions
        from consumer.spark.executor import read_committed

        client = start_client(self.zk)
        try:
            with self.plane(client) as plane:
                count = topic_partitions(plane, client, [self.topic])[self.topic]
                tps = [TopicPartition(self.topic, p) for p in range(count)]
                earliest, latest = plane.earliest_offsets(tps), plane.latest_offsets(tps)
            committed = read_committed(client, self.group, tps) if self.group else {}
        finally:
            close_client(client)
        start = {str(tp.partition): max(earliest[tp], committed.get(tp) or 0) for tp in tps}
        return start, {str(tp.partition): latest[tp] for tp in tps}

    def ranges(self, start: Dict[str, int], end: Dict[str, int]) -> List[Range]:
        return [Range(self.topic, int(p), start.get(p, 0), e)
                for p, e in sorted(end.items(), key=lambda item: int(item[0])) if e > start.get(p, 0)]

    def read(self, r: Range) -> Iterator:
        """The records of ``r`` as Arrow record batches."""
        from consumer.records import TopicPartition
        from consumer.spark.sink import records_table

        tp = TopicPartition(r.topic, r.partition)
        with self.plane() as plane:
            offset = r.start
            while offset < r.end:
                recs = plane.fetch(tp, offset, max_records=min(FETCH_RECORDS, r.end - offset), max_bytes=64 << 20)
                recs = [rec for rec in recs if rec.offset < r.end]
                if not recs:
                    raise RuntimeError(f"{tp}: no records at offset {offset} (below {r.end})")
                table = records_table(tp, recs).select(["key", "value", "topic", "partition", "offset", "timestamp"])
                yield from table.to_batches()
                offset = recs[-1].offset + 1

class BatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions):
        self.options = options
        self.start, self.end = options.offsets()

    def partitions(self):
        return self.options.ranges(self.start, self.end)

    def read(self, partition):
        return self.options.read(partition)

class StreamReader(DataSourceStreamReader):
    def __init__(self, options: SourceOptions):
        self.options = options
        self.first: Optional[Dict[str, int]] = None

    def initialOffset(self):
        if self.first is None:
            self.first, _ = self.options.offsets()
        return dict(self.first)

    def latestOffset(self):
        return self.options.offsets()[1]

    def partitions(self, start, end):
        return self.options.ranges(start, end)

    def read(self, partition):
        return self.options.read(partition)

    def commit(self, end):
        pass  # progress is Spark's checkpoint: nothing is committed to the group

class ZkGroupsDataSource(DataSource):
    @classmethod
    def name(cls):
        return "zkgroups"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return BatchReader(SourceOptions(self.options))

    def streamReader(self, schema):
        return StreamReader(SourceOptions(self.options))

