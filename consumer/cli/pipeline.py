"""``pipeline``: an example Spark pipeline on a zkgroups consumer group, with exactly-once output.

Reads a topic through consumer group ``--group`` on Spark workers (consumer.spark) and writes

    <out>/records/<topic>-<partition>/<start:020d>-<end:020d>.parquet   every record, once
    <out>/counts/                                                     per-key counts (Parquet)

then prints the summary.

Why the output is exactly once although consumption is at-least-once: batch boundaries do
not depend on timing. A worker cuts a partition's records at offsets that are multiples of
``--batch-size`` (or at the drain snapshot), and before cutting a batch that starts at
offset S it looks for a file that already starts at S and, if there is one, cuts where that
file ends. Each batch is written to a hidden temporary file and renamed into place
(``os.replace``), and its offsets are committed only after that. A batch redone after a
worker died (between the rename and the commit, or earlier) therefore rewrites the same
file with the same records. Per-key counts are computed afterwards by a Spark job over the
Parquet files, so they are exact too.

The same holds across runs (drain, then stream, then drain...) of one group into one
``--out``. Not covered: other consumers committing different offsets in the same group, or
a worker cut off from ZooKeeper that keeps writing after its partitions moved (a zombie).
"""
from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
import re
import signal
import sys
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import click

from coordinator import protocol
from coordinator.cli.common import (DEFAULT_ZK_TIMEOUT, MAX_MS, ZK_CONNECT, CliCommand, CliError, CliUsageError,
                                    Limited, Seconds)
from coordinator.config import DEFAULT_CONNECT, DEFAULT_DATA_DIR, DEFAULT_SESSION_TIMEOUT_MS, ENV_DATA_DIR, ENV_ZK_CONNECT
from coordinator.errors import ZkGroupsError

log = logging.getLogger("zkgroups.pipeline")

RECORDS_DIR = "records"
COUNTS_DIR = "counts"
_FILE = re.compile(r"^(\d{20})-(\d{20})\.parquet$")


# ---------------------------------------------------------------- the sink (runs on the executors)

def _schema():
    import pyarrow as pa

    return pa.schema([
        ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.int64()),
        ("key", pa.binary()), ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ])


class ParquetBatchWriter:
    """``process`` for consumer.spark: one Parquet file per partition and offset range.

    Picklable (plain attributes). ``after_write(batch)`` runs after the batch's files are in
    place and before its offsets are committed (tests use it to fail at the worst moment).
    """

    def __init__(self, records_dir: str, after_write: Optional[Callable] = None, fsync: bool = True):
        self.records_dir = os.path.abspath(records_dir)
        self.after_write = after_write
        self.fsync = fsync

    def partition_dir(self, tp) -> str:
        return os.path.join(self.records_dir, f"{tp.topic}-{tp.partition}")

    def path(self, tp, start: int, end: int) -> str:
        return os.path.join(self.partition_dir(tp), f"{start:020d}-{end:020d}.parquet")

    def existing_end(self, tp, start: int) -> Optional[int]:
        """End offset of a file already written for the batch starting at ``start`` (batch_end hook)."""
        ends = sorted(int(m.group(2)) for m in map(_FILE.match, _names(self.partition_dir(tp)))
                      if m and int(m.group(1)) == start)
        if len(ends) > 1:
            log.warning("%s: several files start at offset %d: %s", self.partition_dir(tp), start, ends)
        return ends[0] if ends else None

    def __call__(self, batch) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = _schema()
        for tp, recs in batch.records.items():
            start, end = recs[0].offset, recs[-1].offset + 1
            d = self.partition_dir(tp)
            os.makedirs(d, exist_ok=True)
            n = len(recs)
            table = pa.Table.from_arrays([
                pa.array([tp.topic] * n, pa.string()),
                pa.array([tp.partition] * n, pa.int32()),
                pa.array([r.offset for r in recs], pa.int64()),
                pa.array([r.timestamp for r in recs], pa.int64()),
                pa.array([r.key for r in recs], pa.binary()),
                pa.array([r.value for r in recs], pa.binary()),
                pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in recs], schema.field("headers").type),
            ], schema=schema)
            final = self.path(tp, start, end)
            tmp = os.path.join(d, f".{os.path.basename(final)}.{uuid.uuid4().hex[:8]}.tmp")
            try:
                pq.write_table(table, tmp)
                if self.fsync:
                    _fsync_file(tmp)
                os.replace(tmp, final)  # a redone batch replaces the same name with the same records
            except BaseException:
                _remove_quietly(tmp)
                raise
            if self.fsync:
                _fsync_file(d)
        if self.after_write is not None:
            self.after_write(batch)


def _names(d: str) -> List[str]:
    try:
        return os.listdir(d)
    except FileNotFoundError:
        return []


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# ---------------------------------------------------------------- output checks and counts (driver)

@dataclass
class OutputReport:
    files: int = 0
    records: int = 0                      # by file ranges
    overlaps: int = 0                     # offsets covered by more than one file (should be 0)
    ranges: Dict[str, List[Tuple[int, int]]] = field(default_factory=dict)  # merged, per partition
    distinct_keys: int = 0
    counted: int = 0                      # records counted by the Spark job
    counts_dir: str = ""


def scan_output(records_dir: str) -> OutputReport:
    """Files and offset ranges by name; removes leftover temporary files of dead workers."""
    report = OutputReport()
    for d in sorted(glob.glob(os.path.join(records_dir, "*"))):
        spans = []
        for name in _names(d):
            if name.startswith(".") and name.endswith(".tmp"):
                _remove_quietly(os.path.join(d, name))
                continue
            m = _FILE.match(name)
            if m:
                spans.append((int(m.group(1)), int(m.group(2))))
        spans.sort()
        merged: List[Tuple[int, int]] = []
        for a, b in spans:
            report.files += 1
            report.records += b - a
            if merged and a < merged[-1][1]:
                report.overlaps += min(b, merged[-1][1]) - a
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
            elif merged and a == merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        if merged:
            report.ranges[os.path.basename(d)] = merged
    return report


def count_keys(spark, records_dir: str, counts_dir: str) -> Tuple[int, int]:
    """Per-key counts of every record in ``records_dir`` -> Parquet at ``counts_dir``
    (columns key: binary, key_text: string, count: long). Returns (distinct keys, records)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType, BinaryType, StringType

    dirs = sorted(d for d in glob.glob(os.path.join(records_dir, "*"))
                  if any(_FILE.match(n) for n in _names(d)))
    if dirs:
        df = spark.read.parquet(*dirs)  # one directory per partition (hidden .tmp files are skipped)
        counts = df.groupBy("key").count().withColumn("key_text", F.col("key").cast("string")) \
            .select("key", "key_text", "count")
    else:
        schema = StructType([StructField("key", BinaryType()), StructField("key_text", StringType()),
                             StructField("count", LongType())])
        counts = spark.createDataFrame([], schema)
    counts.coalesce(1).write.mode("overwrite").parquet(counts_dir)
    row = spark.read.parquet(counts_dir).agg(F.count("*").alias("keys"), F.sum("count").alias("records")).first()
    return int(row["keys"] or 0), int(row["records"] or 0)


# ---------------------------------------------------------------- the pipeline

@dataclass
class PipelineResult:
    summary: object        # consumer.spark.JobSummary
    output: OutputReport

    def as_dict(self) -> dict:
        return {"summary": self.summary.as_dict(), "output": self.output.__dict__}


def run_pipeline(spark, *, zk: str, data_dir: str, group: str, topic: str, out: str, workers: int = 2,
                 mode: str = "drain", duration_s: Optional[float] = None, batch_size: int = 10000,
                 stop_file: Optional[str] = None, consumer_config: Optional[dict] = None,
                 after_write: Optional[Callable] = None, job_ready: Optional[Callable] = None,
                 fsync: bool = True) -> PipelineResult:
    """Consume ``topic`` through ``group`` on Spark into ``out`` (see the module docstring).
    ``job_ready(job)`` is called with the GroupJob before it runs (e.g. to wire a stop signal)."""
    from consumer.spark import GroupJob

    records_dir = os.path.join(os.path.abspath(out), RECORDS_DIR)
    os.makedirs(records_dir, exist_ok=True)
    writer = ParquetBatchWriter(records_dir, after_write, fsync)
    job = GroupJob(spark, group, [topic], writer, zk=zk, data_dir=data_dir, workers=workers, mode=mode,
                   duration_s=duration_s, stop_file=stop_file, align=batch_size, batch_end=writer.existing_end,
                   flush_partial=True, consumer_config=consumer_config)
    if job_ready is not None:
        job_ready(job)
    summary = job.run()
    report = scan_output(records_dir)
    report.counts_dir = os.path.join(os.path.abspath(out), COUNTS_DIR)
    report.distinct_keys, report.counted = count_keys(spark, records_dir, report.counts_dir)
    return PipelineResult(summary, report)


# ---------------------------------------------------------------- CLI

def _parse_conf(values) -> Dict[str, str]:
    conf = {}
    for item in values:
        if "=" not in item:
            raise CliUsageError(f"--conf {item!r} is not KEY=VALUE")
        k, v = item.split("=", 1)
        conf[k.strip()] = v.strip()
    return conf


@contextmanager
def _jvm_stderr_to(path: Optional[str]):
    """Start the JVM (and its Python workers) with stderr going to ``path`` (None: unchanged)."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def _fail(message: str, code: int = 1):
    error = CliError(message)
    error.exit_code = code
    raise error


@click.command(cls=CliCommand)
@click.option("--zk", envvar=ENV_ZK_CONNECT, default=DEFAULT_CONNECT, show_default=True, type=ZK_CONNECT,
              help="ZooKeeper connect string, optionally with a chroot (host:port/app).")
@click.option("--zk-timeout", envvar="ZKGROUPS_ZK_TIMEOUT", default=DEFAULT_ZK_TIMEOUT, show_default=True,
              type=Seconds(), metavar="SECONDS", help="How long to wait for ZooKeeper to answer.")
@click.option("--data-dir", envvar=ENV_DATA_DIR, default=DEFAULT_DATA_DIR, show_default=True, show_envvar=True, type=click.Path(file_okay=False),
              help="The log's directory (shared disk: the same files for the driver and every executor).")
@click.option("--group", default="pipeline", show_default=True, help="Consumer group id.")
@click.option("--topic", required=True, help="Topic to read.")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="Output directory: records/ and counts/ (Parquet).")
@click.option("--workers", default=2, show_default=True,
              type=Limited(1, protocol.MAX_PARTITIONS, "the most partitions a topic may have"),
              help="Worker tasks (group members; more than the topic's partitions would idle).")
@click.option("--mode", default="drain", show_default=True, type=click.Choice(["drain", "stream"]),
              help="drain: what is in the topic now, then exit; stream: until --duration, --stop-file or Ctrl-C.")
@click.option("--duration", type=Seconds(max=None),
              help="Seconds: stream for this long; in drain mode, give up after this long (exit 2).")
@click.option("--batch-size", default=10000, show_default=True, type=click.IntRange(1),
              help="Records per output file: partitions are cut at offsets that are multiples of this.")
@click.option("--master", default=None,
              help="Spark master [local[WORKERS,4]: WORKERS threads, a failed task is retried up to 3 times].")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Spark configuration (repeatable).")
@click.option("--stop-file", type=click.Path(dir_okay=False), help="Stop (after the current batch) when this file appears.")
@click.option("--session-timeout-ms", type=Limited(1, MAX_MS, "ZooKeeper's largest session timeout"),
              help=f"Workers' ZooKeeper session timeout [{DEFAULT_SESSION_TIMEOUT_MS}].")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--verbose", is_flag=True, help="Show Spark's own log on stderr (default: <out>/_spark.log).")
def main(zk, zk_timeout, data_dir, group, topic, out, workers, mode, duration, batch_size, master, confs, stop_file,
         session_timeout_ms, as_json, verbose):
    """Read TOPIC through a consumer group on Spark; write the records and per-key counts as Parquet."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.ERROR)
    protocol.validate_name(group, "group")
    protocol.validate_name(topic)
    conf = _parse_conf(confs)
    from consumer.spark import check_spark_conf

    check_spark_conf(conf)  # before paying for a JVM
    _preflight(zk, zk_timeout, data_dir, topic)
    if importlib.util.find_spec("pyspark") is None:
        _fail("pyspark is not installed (pip install 'zkgroups[spark]')")
    os.makedirs(out, exist_ok=True)
    conf.setdefault("spark.task.maxFailures", "4")
    conf.setdefault("spark.sql.shuffle.partitions", str(max(2, workers)))
    spark = _start_spark(master or f"local[{workers},4]", conf, None if verbose else os.path.join(out, "_spark.log"))
    consumer_config = {"session_timeout_ms": session_timeout_ms} if session_timeout_ms else None
    stop = threading.Event()

    def wire(job):
        def on_signal(*_):
            if stop.is_set():  # second Ctrl-C: give up at once
                os._exit(130)
            stop.set()
            threading.Thread(target=job.request_stop, daemon=True).start()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)

    try:
        result = run_pipeline(spark, zk=zk, data_dir=data_dir, group=group, topic=topic, out=out, workers=workers,
                              mode=mode, duration_s=duration, batch_size=batch_size, stop_file=stop_file,
                              consumer_config=consumer_config, job_ready=wire)
    except (ZkGroupsError, OSError) as e:
        log_hint = "" if verbose else f" (Spark's log: {os.path.join(out, '_spark.log')})"
        _fail(f"{e}{log_hint}")
    except Exception as e:  # Spark/Py4J trouble outside the group job: still one line
        _fail(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        try:
            spark.stop()
        except Exception:
            pass
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2, default=str))
    else:
        click.echo(result.summary.table())
        o = result.output
        click.echo(f"records: {o.counted:,} in {o.files} files under {os.path.join(out, RECORDS_DIR)}"
                   f" (overlapping offsets: {o.overlaps})")
        click.echo(f"per-key counts: {o.distinct_keys:,} keys in {o.counts_dir}")
    if mode == "drain" and not result.summary.complete:
        why = f"within --duration {duration:g}s" if duration and not stop.is_set() else "(stopped)"
        _fail(f"the drain did not finish {why}; records up to the committed offsets are written, "
              "run again to continue", code=2)


def _preflight(zk: str, zk_timeout: float, data_dir: str, topic: str) -> None:
    """Fail fast, before Spark starts: ZooKeeper reachable, a coordinator running, the topic known."""
    from coordinator import protocol
    from coordinator.topics import TopicRegistry
    from coordinator.zkclient import close_client, start_client

    if not os.path.isdir(data_dir):
        raise ZkGroupsError(f"data directory {data_dir} does not exist")
    client = start_client(zk, connect_timeout=zk_timeout)
    try:
        TopicRegistry(client).partitions(topic)
        if client.exists(protocol.LEADER) is None:
            raise ZkGroupsError(f"no zkgroups coordinator is running against {zk} (start bin/coordinatord)")
    finally:
        close_client(client)


def _start_spark(master: str, conf: Dict[str, str], jvm_log: Optional[str]):
    from consumer.spark import local_session

    with _jvm_stderr_to(jvm_log):
        return local_session(master, "zkgroups-pipeline", conf, log_level="WARN")


if __name__ == "__main__":
    main(prog_name="pipeline")
