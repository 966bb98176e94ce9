"""A consumer group on Spark (consumer.spark, drain mode) against Spark reading the log directly.

Both read the same records from the same shared-disk log in one Spark session:

* direct (baseline): an RDD with one task per partition, each calling ``Log.fetch`` until
  the end of its partition and counting records. No group, no ZooKeeper, no commits.
* group: ``GroupJob`` in drain mode with ``--workers`` tasks, each a member of a fresh
  consumer group, the user function counting records, offsets committed after each batch.
* pipeline: what ``bin/pipeline`` runs (:func:`consumer.spark.sink.run_pipeline`): the
  group job writing exactly-once Parquet files (Arrow tables, fsync as ``bin/pipeline``
  does), then the per-key counts job. Timed without and with the counts.

Reported: records/s of each (wall time of the Spark job, seen from the driver), their ratio
to the direct read (target for the pipeline >= 0.5), and the fixed overhead: time from submitting the job to the first record
processed (the group's includes joining the group and the coordinator's rebalance). The two
alternate for ``--rounds`` rounds; the best of each is reported. A warm-up job runs first so
neither pays for starting Python workers. Then the ``zkgroups`` data source on the same log in
the same session (:mod:`tests.benchmarks.bench_spark_source`: a batch read and an availableNow
stream into the ``noop`` sink against the direct read, Spark alone reading ready Arrow batches,
and the fixed cost of a query against Spark's own); ``--source-only`` skips the group job and
the pipeline (at 20,000,000 records they take most of the run).

    bin/bench spark [--records N] [--partitions P] [--workers W] [--master M] [--rounds R] [--source-only]
"""
from __future__ import annotations

import logging
import os
import sys
import time

from consumer.log import Log
from consumer.spark import GroupJob, local_session, run_pipeline
from consumer.spark.sink import DEFAULT_BATCH_SIZE
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.topics import TopicRegistry
from tests.benchmarks.common import Row, Timer, print_table, scratch_dir, zk_client, workload_parser, zookeeper

TOPIC = "bench-spark"
TARGET_RATIO = 0.5
APPEND_CHUNK = 10_000


def write_log(zk, data_dir: str, records: int, partitions: int, size: int) -> float:
    TopicRegistry(zk).create(TOPIC, partitions)
    per = [records // partitions + (1 if p < records % partitions else 0) for p in range(partitions)]
    with Log(data_dir, fsync="never") as lg, Timer() as t:
        for p, n in enumerate(per):
            for base in range(0, n, APPEND_CHUNK):
                count = min(APPEND_CHUNK, n - base)
                lg.append(TOPIC, p, [(None, (b"%020d" % (base + i)).ljust(size, b"x"), 0, ()) for i in range(count)])
    return t.rate(records)


def _read_partition(data_dir: str):
    def run(partitions):
        first = None
        count = 0
        with Log(data_dir) as lg:
            for p in partitions:
                offset = lg.earliest_offset(TOPIC, p)
                while True:
                    batch = lg.fetch(TOPIC, p, offset, max_records=10_000, max_bytes=64 << 20)
                    if not batch:
                        break
                    if first is None:
                        first = time.time()
                    count += len(batch)
                    offset = batch[-1].offset + 1
        yield count, first
    return run


def direct(spark, data_dir: str, partitions: int):
    sc = spark.sparkContext
    started = time.time()
    with Timer() as t:
        rows = sc.parallelize(range(partitions), partitions).mapPartitions(_read_partition(data_dir)).collect()
    count = sum(c for c, _ in rows)
    firsts = [f for _, f in rows if f is not None]
    return count, t.seconds, (min(firsts) - started) if firsts else float("nan")


class CountRecords:
    """The user function: count (per task)."""

    def __init__(self):
        self.count = 0

    def __call__(self, batch):
        self.count += len(batch)


def group(spark, zk_connect: str, data_dir: str, workers: int, name: str):
    job = GroupJob(spark, name, [TOPIC], CountRecords(), zk=zk_connect, data_dir=data_dir, workers=workers,
                   mode="drain")
    with Timer() as t:
        summary = job.run()
    if not summary.complete:
        sys.exit(f"bench_spark: group {name} did not drain: {summary.committed}")
    return summary.records, t.seconds, summary.time_to_first_record_s, summary


def pipeline(spark, zk_connect: str, data_dir: str, workers: int, name: str, out: str, batch_size: int):
    """bin/pipeline's work: (records written, seconds of the group job writing them,
    seconds including the per-key counts job)."""
    with Timer() as t:
        result = run_pipeline(spark, zk=zk_connect, data_dir=data_dir, group=name, topic=TOPIC, out=out,
                              workers=workers, mode="drain", batch_size=batch_size)
    if result.output.overlaps or not result.summary.complete:
        sys.exit(f"bench_spark: pipeline {name} did not drain exactly once: {result.output.__dict__}")
    return result.output.counted, result.summary.duration_s, t.seconds


def main(argv=None) -> None:
    ap = workload_parser("spark", __doc__, rounds=3)
    ap.add_argument("--workers", type=int, default=2, help="group members (Spark tasks)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="the pipeline's records per file")
    ap.add_argument("--source-only", action="store_true", help="only the zkgroups data source against the direct read")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)

    with zookeeper() as connect, scratch_dir(keep=args.data_dir) as data_dir, zk_client(connect) as zk:
        coordinator = Coordinator(connect, "bench", CoordinatorConfig()).start()
        try:
            print(f"writing {args.records:,} records of {args.size} bytes on {args.partitions} partitions ...",
                  flush=True)
            write_rate = write_log(zk, data_dir, args.records, args.partitions, args.size)
            with Timer() as boot:
                spark = local_session(args.master, "zkgroups-bench-spark", log_level="ERROR")
            try:
                sc = spark.sparkContext
                if args.source_only:
                    from tests.benchmarks.bench_spark_source import measure  # it imports this module
                    print_table(measure(spark, connect, data_dir, args.records, args.partitions, args.rounds),
                                title=f"bench spark: the zkgroups data source (consumer.spark.source), "
                                      f"{args.records:,} x {args.size} B, {args.partitions} partitions, {sc.master}, "
                                      f"{os.cpu_count()} CPUs")
                    return
                direct(spark, data_dir, args.partitions)  # warm-up: Python workers, imports, page cache
                best_direct, best_group, best_pipeline, summaries = None, None, None, []
                for r in range(args.rounds):
                    n, secs, first = direct(spark, data_dir, args.partitions)
                    if n != args.records:
                        sys.exit(f"bench_spark: direct read {n:,} records, expected {args.records:,}")
                    if best_direct is None or secs < best_direct[0]:
                        best_direct = (secs, first)
                    n, secs, first, summary = group(spark, connect, data_dir, args.workers, f"bench-{r}")
                    if n < args.records:
                        sys.exit(f"bench_spark: the group processed {n:,} records, expected {args.records:,}")
                    summaries.append(summary)
                    if best_group is None or secs < best_group[0]:
                        best_group = (secs, first)
                    n, secs, with_counts = pipeline(spark, connect, data_dir, args.workers, f"bench-p{r}",
                                                    os.path.join(data_dir, f"_pipeline-{r}"), args.batch_size)
                    if n != args.records:
                        sys.exit(f"bench_spark: the pipeline wrote {n:,} records, expected {args.records:,}")
                    if best_pipeline is None or secs < best_pipeline[0]:
                        best_pipeline = (secs, with_counts)
                print(summaries[-1].table())
                print()
                direct_rate = args.records / best_direct[0]
                group_rate = args.records / best_group[0]
                ratio = group_rate / direct_rate
                pipeline_rate = args.records / best_pipeline[0]
                pipeline_ratio = pipeline_rate / direct_rate
                print_table([
                    Row("direct: Spark tasks calling Log.fetch", direct_rate, "records/s", 1.0,
                        f"{args.partitions} tasks, best of {args.rounds}"),
                    Row("group: GroupJob drain, counting", group_rate, "records/s", ratio,
                        f"{args.workers} workers"),
                    Row("pipeline: bin/pipeline's job, Parquet", pipeline_rate, "records/s", pipeline_ratio,
                        f"{args.workers} workers, files of {args.batch_size:,}; target >= {TARGET_RATIO} "
                        + ("(met)" if pipeline_ratio >= TARGET_RATIO else "(NOT met)")),
                    Row("pipeline: with the per-key counts job", args.records / best_pipeline[1], "records/s",
                        args.records / best_pipeline[1] / direct_rate),
                    Row("direct: job start to first record", best_direct[1], "s"),
                    Row("group: job start to first record", best_group[1], "s", best_group[1] / best_direct[1]
                        if best_direct[1] > 0 else None, "join + rebalance + first fetch"),
                    Row("direct: job time", best_direct[0], "s"),
                    Row("group: job time", best_group[0], "s", best_group[0] / best_direct[0]),
                    Row("log write (setup, Log.append)", write_rate, "records/s"),
                    Row("Spark session start (setup)", boot.seconds, "s"),
                ], title=f"bench spark: {args.records:,} x {args.size} B, {args.partitions} partitions, "
                         f"{sc.master}, {os.cpu_count()} CPUs")
                print()
                from tests.benchmarks.bench_spark_source import measure  # it imports this module
                print_table(measure(spark, connect, data_dir, args.records, args.partitions, args.rounds),
                            title="bench spark: the zkgroups data source (consumer.spark.source), same log, same session")
            finally:
                spark.stop()
        finally:
            coordinator.close()


if __name__ == "__main__":
    main()
