"""A Python data source with nothing in it, for measuring what Spark alone costs a query
(:mod:`tests.benchmarks.bench_spark_source`). Its own module, importing only pyspark: Spark's
Python planner and workers import it, and that import is part of what is measured."""
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

NAME = "zkgroups_bench_empty"
#: The zkgroups source's columns (consumer.spark.source.SCHEMA), written out.
SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
              "timestampType int, headers array<struct<key: string, value: binary>>")


class EmptySource(DataSource):
    """The zkgroups source's schema and nothing in it; its calls are answered at once, as the
    zkgroups source's are when there is nothing to read."""

    @classmethod
    def name(cls):
        return NAME

    def schema(self):
        return SCHEMA_DDL

    def reader(self, schema):
        return _EmptyReader()

    def streamReader(self, schema):
        return _EmptyStreamReader()


class _EmptyReader(DataSourceReader):
    def read(self, partition):
        return iter(())


class _EmptyStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def initialOffset(self):
        return {"offset": 0}

    def prepareForTriggerAvailableNow(self):
        pass

    def latestOffset(self, start, limit):
        return start

    def reportLatestOffset(self):
        return {"offset": 0}

    def partitions(self, start, end):
        return []

    def read(self, partition):
        return iter(())


READY = "zkgroups_bench_ready"


class ReadySource(DataSource):
    """The zkgroups source's schema and ``rows`` rows over ``partitions`` partitions, yielded
    as Arrow record batches made once (100-byte values, null keys and headers, as the
    benchmark's log): what Spark alone costs a record of a Python data source, with no reading
    behind it."""

    @classmethod
    def name(cls):
        return READY

    def schema(self):
        return SCHEMA_DDL

    def reader(self, schema):
        return _ReadyReader(int(self.options["rows"]), int(self.options["partitions"]),
                            int(self.options.get("batch", 10_000)))


class _ReadyReader(DataSourceReader):
    def __init__(self, rows: int, partitions: int, batch: int):
        self.rows, self.count, self.batch = rows, partitions, batch

    def partitions(self):
        from pyspark.sql.datasource import InputPartition
        return [InputPartition(p) for p in range(self.count)]

    def read(self, partition):
        import pyarrow as pa

        header = pa.struct([("key", pa.string()), ("value", pa.binary())])
        schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                            ("partition", pa.int32()), ("offset", pa.int64()),
                            ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
                            ("headers", pa.list_(header))])
        n = self.batch
        batch = pa.RecordBatch.from_arrays([
            pa.nulls(n, pa.binary()), pa.array([b"x" * 100] * n, pa.binary()), pa.array(["bench-spark"] * n),
            pa.array([partition.value] * n, pa.int32()), pa.array(range(n), pa.int64()),
            pa.array([0] * n, schema.field("timestamp").type), pa.array([0] * n, pa.int32()),
            pa.nulls(n, schema.field("headers").type)], schema=schema)
        left = self.rows // self.count + (1 if partition.value < self.rows % self.count else 0)
        while left > 0:
            yield batch if left >= n else batch.slice(0, left)
            left -= n
