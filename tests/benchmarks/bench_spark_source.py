"""The ``zkgroups`` Spark data source (consumer.spark.source) against Spark reading the log directly.

All read the same records of the same shared-disk log in one Spark session:

* direct (baseline): :func:`tests.benchmarks.bench_spark.direct`, one task per partition
  calling ``Log.fetch`` to the end and counting.
* batch: ``spark.read.format("zkgroups")...load()`` written to the ``noop`` sink (every row
  reaches the JVM, nothing is kept).
* stream: ``spark.readStream.format("zkgroups")...load()`` with ``trigger(availableNow=True)``
  into the ``noop`` sink, a fresh checkpoint per round.

Reported: records/s of each (wall time seen from the driver) and the ratio of the source's to
the direct read's (target >= 0.7), best of ``rounds``; and, apart, the source's fixed cost per
query (the same read with ``startingOffsets=latest``: nothing to read, only Spark's planning
of a Python data source, its Python planner processes, the ZooKeeper and log look-ups, and for
the stream its checkpoint) and its rate past that cost. :func:`measure` takes a started
SparkSession and a filled log; run alone it fills one first:

    python -m tests.benchmarks.bench_spark_source [--records N] [--partitions P] [--master M] [--rounds R]
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
from typing import List

from consumer.spark import local_session
from consumer.spark.source import register
from tests.benchmarks.bench_spark import TOPIC, direct, write_log
from tests.benchmarks.common import Row, Timer, print_table, scratch_dir, workload_parser, zk_client, zookeeper

TARGET_RATIO = 0.7


def _source(spark, zk_connect: str, data_dir: str, stream: bool, starting: str = "earliest"):
    reader = spark.readStream if stream else spark.read
    return (reader.format("zkgroups").option("zk", zk_connect).option("dataDir", data_dir).option("topics", TOPIC)
            .option("startingOffsets", starting).load())


def batch_read(spark, zk_connect: str, data_dir: str, starting: str = "earliest") -> float:
    """Seconds of a batch read of the whole topic (``latest``: of nothing) into the noop sink."""
    with Timer() as t:
        _source(spark, zk_connect, data_dir, False, starting).write.format("noop").mode("overwrite").save()
    return t.seconds


def stream_read(spark, zk_connect: str, data_dir: str, starting: str = "earliest") -> float:
    """Seconds of an availableNow stream over the whole topic (``latest``: over nothing) into the noop sink."""
    with tempfile.TemporaryDirectory(prefix="zkgroups-bench-cp-") as checkpoint, Timer() as t:
        query = (_source(spark, zk_connect, data_dir, True, starting).writeStream.format("noop")
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination()
    if query.exception() is not None:
        sys.exit(f"bench_spark_source: the stream failed: {query.exception()}")
    return t.seconds


def measure(spark, zk_connect: str, data_dir: str, records: int, partitions: int, rounds: int = 3) -> List[Row]:
    """Rows for :func:`print_table`: the direct read, the source's batch read and its stream,
    best of ``rounds`` each, against ``records`` records of the log's topic ``TOPIC``."""
    register(spark)
    direct(spark, data_dir, partitions)  # warm-up: Python workers, imports, page cache
    batch_read(spark, zk_connect, data_dir)
    best = dict.fromkeys(["direct", "batch", "stream", "batch_fixed", "stream_fixed"], float("inf"))
    for _ in range(rounds):
        n, secs, _first = direct(spark, data_dir, partitions)
        if n != records:
            sys.exit(f"bench_spark_source: the direct read got {n:,} records, expected {records:,}")
        best["direct"] = min(best["direct"], secs)
        best["batch"] = min(best["batch"], batch_read(spark, zk_connect, data_dir))
        best["stream"] = min(best["stream"], stream_read(spark, zk_connect, data_dir))
        best["batch_fixed"] = min(best["batch_fixed"], batch_read(spark, zk_connect, data_dir, "latest"))
        best["stream_fixed"] = min(best["stream_fixed"], stream_read(spark, zk_connect, data_dir, "latest"))
    if _source(spark, zk_connect, data_dir, False).count() != records:
        sys.exit(f"bench_spark_source: the source does not read {records:,} records")
    rate = {k: records / best[k] for k in ("direct", "batch", "stream")}
    past = {k: records / max(best[k] - best[f"{k}_fixed"], 1e-9) for k in ("batch", "stream")}

    def ratio_note(r: float) -> str:
        return f"target >= {TARGET_RATIO} " + ("(met)" if r >= TARGET_RATIO else "(NOT met)")

    return [
        Row("direct: Spark tasks calling Log.fetch", rate["direct"], "records/s", 1.0,
            f"{partitions} tasks, best of {rounds}"),
        Row("source: spark.read.format('zkgroups') -> noop", rate["batch"], "records/s",
            rate["batch"] / rate["direct"], ratio_note(rate["batch"] / rate["direct"])),
        Row("source: readStream availableNow -> noop", rate["stream"], "records/s",
            rate["stream"] / rate["direct"], ratio_note(rate["stream"] / rate["direct"])),
        Row("source: batch, fixed cost per query", best["batch_fixed"], "s", None, "startingOffsets=latest"),
        Row("source: stream, fixed cost per query", best["stream_fixed"], "s", None, "startingOffsets=latest"),
        Row("source: batch, past the fixed cost", past["batch"], "records/s", past["batch"] / rate["direct"]),
        Row("source: stream, past the fixed cost", past["stream"], "records/s", past["stream"] / rate["direct"]),
    ]


def main(argv=None) -> None:
    ap = workload_parser("spark-source", __doc__, rounds=3)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    with zookeeper() as connect, scratch_dir(keep=args.data_dir) as data_dir, zk_client(connect) as zk:
        print(f"writing {args.records:,} records of {args.size} bytes on {args.partitions} partitions ...", flush=True)
        write_log(zk, data_dir, args.records, args.partitions, args.size)
        spark = local_session(args.master, "zkgroups-bench-spark-source", log_level="ERROR")
        try:
            rows = measure(spark, connect, data_dir, args.records, args.partitions, args.rounds)
            print_table(rows, title=f"bench spark source: {args.records:,} x {args.size} B, {args.partitions} "
                                    f"partitions, {spark.sparkContext.master}, {os.cpu_count()} CPUs")
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
