"""An exactly-once Parquet sink for group jobs, the check of its output, and per-key counts.

:func:`run_pipeline` reads a topic through a consumer group on Spark (:class:`GroupJob`)
and writes

    <out>/records/topic=<topic>/partition=<p>/<start:020d>-<end:020d>.parquet   every record, once
    <out>/records/_SUCCESS        JSON manifest, written when a run ended cleanly
    <out>/counts/                 per-key counts (Parquet)

What readers get: ``spark.read.parquet("<out>/records")`` returns every record once with
Spark's Kafka-source schema (:data:`KAFKA_SCHEMA_DDL`; ``topic`` and ``partition`` are in the
files and in the Hive-style directory names, whose discovered types agree unless a topic
name is a number: :func:`read_records` gives the schema explicitly). Files appear only by
rename from hidden names (``.…tmp``, which Spark skips), so a reader never sees a half-written
one, and every file in place is final. ``_SUCCESS`` is removed when a run starts and written
(atomically) when it returned cleanly; it names the run, the committed offsets and the
offset ranges in place. An output directory of an older layout is refused.

Why the output is exactly once although consumption is at-least-once: batch boundaries do
not depend on timing. A worker cuts a partition's records at offsets that are multiples of
``batch_size`` (or at the drain snapshot), and before cutting a batch that starts at
offset S it looks for a file that already starts at S and, if there is one, cuts where that
file ends (:meth:`ParquetBatchWriter.existing_end`, the job's ``batch_end``). Each batch is
written to a hidden temporary file and renamed into place (``os.replace``), and its offsets
are committed only after that. A batch redone after a worker died (between the rename and
the commit, or earlier) therefore rewrites the same file with the same records. Per-key
counts are computed afterwards by a Spark job over the Parquet files, so they are exact too.

The same holds across runs (drain, then stream, then drain...) of one group into one
``out``, and after the group's offsets were moved back (``groupctl groups reset-offsets``):
output is idempotent per (topic, partition, offset). A batch that starts inside a file
already written is cut where that file ends and not written again (its records are there);
a batch that would run into the next file is cut where that file starts. So no offset is
ever in two files; if a scan still finds one (files copied in by hand), ``bin/pipeline``
exits non-zero. Per-key counts count distinct (topic, partition, offset) records. This
relies on the log being immutable: the records at an offset are the ones written before.
On either data plane: on Kafka the workers read the brokers (no shared disk for the
records), and only ``out`` must be a directory every executor and the driver see. Not
covered: other consumers committing different offsets in the same group, a worker cut off
from ZooKeeper that keeps writing after its partitions moved (a zombie), and Kafka topics
whose offsets have gaps (transactional producers' commit markers, compaction): batches are
cut at offsets, and a drain ends when the records reach the snapshot.

Speed: on the embedded log the workers poll columns (``Consumer.poll_columns``): a batch
arrives as the log's :class:`~consumer.log.Columns` and its stored bytes and offsets become
Arrow buffers, so a record is read once and never becomes a Python object; on Kafka the
columns are taken from the records in C (:func:`consumer.records.column`: from librdkafka's
messages, no per-record Python code). Parquet's
dictionary encoding and statistics are kept to the columns where they pay. pyarrow and
pyspark are imported only when a batch is written or the keys are counted.
"""
from __future__ import annotations

import glob
import logging
import os
import re
import uuid
from array import array
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from coordinator.errors import ZkGroupsError
from consumer.records import column
from consumer.spark.driver import GroupJob, JobSummary

log = logging.getLogger("zkgroups.pipeline")

RECORDS_DIR = "records"
COUNTS_DIR = "counts"
#: Written into the records directory when a run ended cleanly: JSON (:func:`write_success`).
SUCCESS_FILE = "_SUCCESS"
#: Records per file unless told otherwise (``--batch-size``): at ~100-byte values about 10 MB
#: per file before compression, a worker holding at most this many records per partition.
DEFAULT_BATCH_SIZE = 100_000
_FILE = re.compile(r"^(\d{20})-(\d{20})\.parquet$")
_PARTITION_DIR = re.compile(r"^topic=([a-zA-Z0-9._-]+)/partition=(\d+)$")


def partition_dir(records_dir: str, topic: str, partition: int) -> str:
    """``<records>/topic=<topic>/partition=<partition>``: Hive-style, so Spark's partition
    discovery finds the two columns (topic names need no escaping: [a-zA-Z0-9._-])."""
    return os.path.join(records_dir, f"topic={topic}", f"partition={partition}")


def partition_dirs(records_dir: str) -> Dict[str, str]:
    """``{"topic-partition": directory}`` of every partition directory under ``records_dir``."""
    found = {}
    for d in glob.glob(os.path.join(glob.escape(records_dir), "topic=*", "partition=*")):
        m = _PARTITION_DIR.match(os.path.relpath(d, records_dir).replace(os.sep, "/"))
        if m and os.path.isdir(d):
            found[f"{m.group(1)}-{int(m.group(2))}"] = d
    return found


def foreign_entries(records_dir: str) -> List[str]:
    """Entries of ``records_dir`` that are not this layout (e.g. ``<topic>-<partition>/``
    directories of an older layout): their records would not be seen, so a run refuses."""
    return sorted(n for n in _names(records_dir)
                  if not n.startswith(("_", ".")) and not (n.startswith("topic=") and
                                                         os.path.isdir(os.path.join(records_dir, n))))


# ---------------------------------------------------------------- the sink (runs on the executors)

#: The columns of every record, as Spark's Kafka source has them (``spark.read.parquet`` of the
#: records directory gives exactly this schema; ``topic`` and ``partition`` are also the
#: Hive-style directories, whose discovered types match as long as a topic name is not a number).
KAFKA_SCHEMA_DDL = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
                    "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
#: Kafka's CreateTime: the producer's timestamp (the only kind the log keeps).
CREATE_TIME = 0


def _schema():
    import pyarrow as pa

    return pa.schema([
        ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
        ("offset", pa.int64()), ("timestamp", pa.timestamp("ms", tz="UTC")), ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ])


def records_table(tp, recs, headers: bool = True):
    """One partition's contiguous records as an Arrow table of ``_schema()`` (Spark's Kafka
    source columns). Each column is taken from the records in C (:func:`~consumer.records.column`,
    one ``pa.array`` call); the offsets of a contiguous run are a range, the constant columns
    are repeated scalars, and a batch without keys or headers gets those columns built at once.
    ``headers=False``: the headers column is null (not read)."""
    import pyarrow as pa

    n = len(recs)
    keys = column(recs, "key")
    found = column(recs, "headers") if headers else None
    return _table(tp, recs[0].offset, n,
                  pa.nulls(n, pa.binary()) if keys.count(None) == n else pa.array(keys, pa.binary()),
                  pa.array(column(recs, "value"), pa.binary()), column(recs, "timestamp"),
                  found if found and any(found) else None, headers)


def columns_table(tp, chunks, headers: bool = True):
    """The same table as :func:`records_table`, from the embedded log's :class:`Columns` of a
    contiguous run (``Log.fetch_columns``, ``Consumer.poll_columns``): keys and values made
    from the stored bytes by Arrow, a chunk per stored batch, the other columns once for the
    whole run; in C, with no Python object per record (headers aside; ``headers=False``: the
    headers column is null)."""
    import pyarrow as pa

    keys, values, timestamps = [], [], array("q")
    fixed_offsets: Dict[int, object] = {}  # value size -> offsets: most chunks share one
    for c in chunks:
        k, v = _binary_columns(c, fixed_offsets)
        keys.append(k)
        values.append(v)
        timestamps += c.timestamps
    found = None
    if headers and any(c.headers is not None and any(c.headers) for c in chunks):
        found = list(chain.from_iterable(repeat((), c.count) if c.headers is None else c.headers for c in chunks))
    return _table(tp, chunks[0].base if chunks else 0, len(timestamps), pa.chunked_array(keys, pa.binary()),
                  pa.chunked_array(values, pa.binary()), timestamps, found, headers)


class ColumnBatches:
    """Arrow record batches of ``schema`` (the sink's columns, timestamps in the schema's
    unit, e.g. the DataFrame source's) for records of ``tp``, one per :class:`Columns` chunk
    (a stored batch, or the part of one a fetch took): keys and values as
    :func:`columns_table` makes them, and the columns every batch has alike (topic,
    partition, timestampType, null or empty headers, the offsets' 0, 1, ...) made once and
    sliced, so a batch costs a few Arrow calls and no copy of its bytes. The schema's own
    types throughout: no cast of the batch afterwards. ``headers=False``: the headers column
    is null.

    No states: a cache of columns, grown when a chunk is longer than any before. One thread."""

    def __init__(self, tp, schema, headers: bool = True, capacity: int = 0):
        import pyarrow as pa

        self.tp, self.schema, self.headers = tp, schema, headers
        self._header_type = schema.field("headers").type
        self._time_type = schema.field("timestamp").type
        self._ms = pa.timestamp("ms", tz=self._time_type.tz)
        self._fixed_offsets: Dict[int, object] = {}
        self._capacity = 0
        self._grow(max(capacity, 1))

    def _grow(self, n: int) -> None:
        import pyarrow as pa

        self._capacity = n
        self._fixed_offsets.clear()  # sized for the old capacity
        self._steps = _arange(pa.int64(), 0, n)
        self._topic = pa.repeat(pa.scalar(self.tp.topic, pa.string()), n)
        self._partition = pa.repeat(pa.scalar(self.tp.partition, pa.int32()), n)
        self._time_type_column = pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n)
        self._no_headers = _header_column(n, None, self._header_type, self.headers)

    def __call__(self, chunks):
        """One record batch per chunk of ``chunks`` (``Log.fetch_columns``), in offset order."""
        import pyarrow as pa
        import pyarrow.compute as pc

        for c in chunks:
            n = c.count
            if n > self._capacity:
                self._grow(n)
            keys, values = _binary_columns(c, self._fixed_offsets, self._capacity)
            timestamps = _fixed_width(self._ms, "q", c.timestamps, n)
            if self._ms != self._time_type:
                timestamps = timestamps.cast(self._time_type)
            if self.headers and c.headers is not None and any(c.headers):
                header_col = _header_column(n, c.headers, self._header_type)
            else:
                header_col = self._no_headers.slice(0, n)
            yield pa.RecordBatch.from_arrays([
                keys, values, self._topic.slice(0, n), self._partition.slice(0, n),
                pc.call_function("add", [self._steps.slice(0, n), pa.scalar(c.base, pa.int64())]),
                timestamps, self._time_type_column.slice(0, n), header_col,
            ], schema=self.schema)


def _binary_columns(c, fixed_offsets: Dict[int, object], capacity: int = 0):
    """``(keys, values)`` of one :class:`Columns` chunk as Arrow binary arrays over its
    stored bytes (no copy). ``fixed_offsets``: {value size: offsets buffer} kept by the
    caller, for at least ``max(capacity, c.count)`` values, since most chunks share one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = c.count
    buf = memoryview(c.buf)
    if c.value_starts is None:
        offsets = fixed_offsets.get(c.value_size)
        if offsets is None or len(offsets) < 4 * (n + 1):
            offsets = fixed_offsets[c.value_size] = \
                _arange(pa.int32(), 0, max(capacity, n) + 1, c.value_size).buffers()[1]
        first, last = c.value_pos, c.value_pos + c.value_size * n
    else:
        offsets, first, last = _relative(c.value_starts, n)
    values = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(buf[first:last])])
    if c.key_starts is None:
        return pa.nulls(n, pa.binary()), values
    key_offsets, first, last = _relative(c.key_starts, n)
    present = pc.call_function("greater_equal", [_fixed_width(pa.int32(), "i", c.key_lengths, n),
                                                 pa.scalar(0, pa.int32())])
    validity = None if present.false_count == 0 else present.buffers()[1]
    return pa.Array.from_buffers(pa.binary(), n, [validity, key_offsets, pa.py_buffer(buf[first:last])]), values


def _header_column(n: int, headers, header_type, with_headers: bool = True):
    """The headers column of ``n`` records: null without ``with_headers``; else from
    ``headers`` (a sequence of (key, value) pairs per record, falsy for none), or empty
    lists when ``headers`` is None (no record has any)."""
    import pyarrow as pa

    if not with_headers:
        return pa.nulls(n, header_type)
    if headers is not None:
        return pa.array([[{"key": k, "value": v} for k, v in h or ()] for h in headers], header_type)
    return pa.ListArray.from_arrays(_fixed_width(pa.int32(), "i", bytes(4 * (n + 1)), n + 1),
                                    pa.array([], header_type.value_type))


def _table(tp, first: int, n: int, keys, values, timestamps, headers, with_headers: bool = True):
    """The table of ``_schema()`` of ``n`` records of ``tp`` from offset ``first``: ``keys``
    and ``values`` as Arrow arrays, ``timestamps`` (ms) as an array or an iterable, ``headers``
    a sequence of (key, value) pairs per record, falsy for none (None: no record has any);
    ``with_headers=False``: a null headers column."""
    import pyarrow as pa

    schema = _schema()
    return pa.Table.from_arrays([
        keys, values,
        pa.repeat(pa.scalar(tp.topic, pa.string()), n),
        pa.repeat(pa.scalar(tp.partition, pa.int32()), n),
        _arange(pa.int64(), first, n),
        _fixed_width(schema.field("timestamp").type, "q", timestamps, n),
        pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n),
        _header_column(n, headers, schema.field("headers").type, with_headers),
    ], schema=schema)


def _arange(arrow_type, start: int, n: int, step: int = 1):
    """``start, start + step, ...`` (``n`` values) as an Arrow array, computed in C."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.cumulative_sum(pa.repeat(pa.scalar(step, arrow_type), n), start=pa.scalar(start - step, arrow_type))


def _relative(starts, n: int):
    """``(int32 offsets buffer from 0, first byte, end byte)`` of ``n + 1`` absolute positions.
    (``pc.call_function`` with a typed scalar: ``pc.subtract`` with a Python int costs far more
    than the subtraction.)"""
    import pyarrow as pa
    import pyarrow.compute as pc

    absolute = _fixed_width(pa.int64(), "q", starts, n + 1)
    relative = pc.call_function("subtract", [absolute, pa.scalar(starts[0], pa.int64())])
    return relative.cast(pa.int32()).buffers()[1], starts[0], starts[n]


def _fixed_width(arrow_type, typecode: str, values, n: int):
    """An Arrow array of ``n`` fixed-width ``values`` without nulls, filled in C through the
    buffer of an ``array.array`` (``values`` may be bytes: taken as the buffer itself)."""
    import pyarrow as pa

    data = values if isinstance(values, (bytes, array)) else array(typecode, values)
    return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(data)])


def write_records(table, path: str) -> None:
    """Write ``table`` as Parquet: snappy; dictionary encoding and statistics only where
    they pay (the constant and ordered columns; not the keys and values, which cost most to
    encode and which no reader filters by min/max)."""
    import pyarrow.parquet as pq

    pq.write_table(table, path, compression="snappy", use_dictionary=["topic", "partition", "timestampType"],
                   write_statistics=["topic", "partition", "offset", "timestamp", "timestampType"])


class ParquetBatchWriter:
    """``process`` for a group job: one Parquet file per partition and offset range.

    Picklable (plain attributes). ``after_write(batch)`` runs after the batch's files are in
    place and before its offsets are committed (tests use it to fail at the worst moment).
    """

    def __init__(self, records_dir: str, after_write: Optional[Callable] = None, fsync: bool = True,
                 align: Optional[int] = None):
        self.records_dir = os.path.abspath(records_dir)
        self.after_write = after_write
        self.fsync = fsync
        self.align = align  # the job's batch size: where a batch is cut when no file says otherwise

    def partition_dir(self, tp) -> str:
        return partition_dir(self.records_dir, tp.topic, tp.partition)

    def path(self, tp, start: int, end: int) -> str:
        return os.path.join(self.partition_dir(tp), f"{start:020d}-{end:020d}.parquet")

    def spans(self, tp) -> List[Tuple[int, int]]:
        """The (start, end) offset ranges of ``tp``'s files, sorted."""
        return sorted((int(m.group(1)), int(m.group(2)))
                      for m in map(_FILE.match, _names(self.partition_dir(tp))) if m)

    def existing_end(self, tp, start: int) -> Optional[int]:
        """Where the batch starting at ``start`` must end so that no offset gets a second file
        (the job's ``batch_end`` hook): the end of a file starting at ``start`` (a redone batch,
        rewritten as it was), else of a file holding ``start`` (offsets moved back: those
        records are written already), else the start of the next file if it comes before the
        aligned cut. None: no file says (cut at the multiple of ``align``)."""
        spans = self.spans(tp)
        same = [b for a, b in spans if a == start]
        if len(same) > 1:
            log.warning("%s: several files start at offset %d: %s", self.partition_dir(tp), start, same)
        if same:
            return same[0]
        holding = [b for a, b in spans if a < start < b]
        if holding:
            return max(holding)
        following = [a for a, _ in spans if a > start]
        aligned = (start // self.align + 1) * self.align if self.align else None
        if following and (aligned is None or min(following) < aligned):
            return min(following)
        return None

    def already_written(self, tp, start: int, end: int) -> bool:
        """A file other than [start, end)'s own holds every offset of [start, end)."""
        return any(a <= start and end <= b and (a, b) != (start, end) for a, b in self.spans(tp))

    def __call__(self, batch) -> None:
        columns = batch.columns
        for tp, (start, end) in batch.ranges.items():
            if self.already_written(tp, start, end):
                continue  # offsets moved back: these records are in place already
            d = self.partition_dir(tp)
            os.makedirs(d, exist_ok=True)
            final = self.path(tp, start, end)
            # Hidden until renamed: readers (Spark skips names starting with "." or "_") never see it half-written.
            tmp = os.path.join(d, f".{os.path.basename(final)}.{uuid.uuid4().hex[:8]}.tmp")
            try:
                write_records(columns_table(tp, columns[tp]) if columns is not None
                              else records_table(tp, batch.records[tp]), tmp)
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
    written: int = 0                      # offsets whose file appeared during this run (any attempt's)
    distinct_keys: int = 0
    counted: int = 0                      # records counted by the Spark job
    counts_dir: str = ""
    success_file: str = ""                # the run's _SUCCESS manifest ("" when the run did not end cleanly)


def scan_output(records_dir: str) -> OutputReport:
    """Files and offset ranges by name; removes leftover temporary files of dead workers."""
    report = OutputReport()
    for name, d in sorted(partition_dirs(records_dir).items()):
        spans = []
        for entry in _names(d):
            if entry.startswith(".") and entry.endswith(".tmp"):
                _remove_quietly(os.path.join(d, entry))
                continue
            m = _FILE.match(entry)
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
            report.ranges[name] = merged
    return report


def write_success(records_dir: str, summary: JobSummary, report: OutputReport, topic: str) -> str:
    """Write ``<records>/_SUCCESS`` (atomically: hidden temporary file, then rename): JSON
    naming the run, the group's committed offsets and the offset ranges in place. Present
    only after a run that ended cleanly (removed when the next run starts); every file a
    reader sees is complete either way, since files appear only by rename."""
    import json
    import time

    path = os.path.join(records_dir, SUCCESS_FILE)
    manifest = {"group": summary.group_id, "topic": topic, "mode": summary.mode, "app_id": summary.app_id,
                "run_id": summary.run_id, "finished_at": time.time(), "complete": summary.complete,
                "committed": summary.committed, "files": report.files, "records": report.records,
                "ranges": report.ranges}
    tmp = os.path.join(records_dir, f".{SUCCESS_FILE}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise
    return path


def read_records(spark, records_dir: str):
    """The records under ``records_dir`` as a DataFrame of Spark's Kafka-source schema
    (:data:`KAFKA_SCHEMA_DDL`, given explicitly so the types never depend on discovery)."""
    return spark.read.schema(KAFKA_SCHEMA_DDL).parquet(records_dir)


def count_keys(spark, records_dir: str, counts_dir: str, deduplicate: bool = True) -> Tuple[int, int]:
    """Per-key counts of every distinct record (topic, partition, offset) in ``records_dir``
    -> Parquet at ``counts_dir`` (columns key: binary, key_text: string, count: long).
    Returns (distinct keys, records). ``deduplicate=False`` skips the shuffle that drops
    duplicates, for output whose file ranges were found not to overlap."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType, BinaryType, StringType

    if partition_dirs(records_dir):
        df = read_records(spark, records_dir)  # hidden temporary files and _SUCCESS are skipped
        if deduplicate:
            df = df.dropDuplicates(["topic", "partition", "offset"])  # distinct records, whatever the files
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
    summary: JobSummary
    output: OutputReport

    def as_dict(self) -> dict:
        return {"summary": self.summary.as_dict(), "output": self.output.__dict__}


def run_pipeline(spark, *, zk: str, group: str, topic: str, out: str, data_dir: Optional[str] = None,
                 bootstrap_servers: Optional[str] = None, kafka: Optional[Mapping[str, object]] = None,
                 workers: int = 2, mode: str = "drain", duration_s: Optional[float] = None,
                 batch_size: int = DEFAULT_BATCH_SIZE, stop_file: Optional[str] = None,
                 consumer_config: Optional[dict] = None, after_write: Optional[Callable] = None,
                 job_ready: Optional[Callable] = None, fsync: bool = True, **job_options) -> PipelineResult:
    """Consume ``topic`` through ``group`` on Spark into ``out`` (see the module docstring):
    from Kafka with ``bootstrap_servers`` and librdkafka properties ``kafka``, else from the
    embedded log under ``data_dir`` (:class:`GroupJob`'s rule). ``job_ready(job)`` is called
    with the GroupJob before it runs (e.g. to wire a stop signal); ``job_options`` go to
    :class:`GroupJob` (``trigger_interval_s``, ``max_worker_deaths``, ``death_window_s``, ...)."""
    records_dir = os.path.join(os.path.abspath(out), RECORDS_DIR)
    os.makedirs(records_dir, exist_ok=True)
    foreign = foreign_entries(records_dir)
    if foreign:
        raise ZkGroupsError(f"{records_dir} holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}, "
                            "which is not topic=<topic>/partition=<p>/ output: move it away (its records would "
                            "not be seen, and be written again)")
    _remove_quietly(os.path.join(records_dir, SUCCESS_FILE))  # present again only if this run ends cleanly
    before = scan_output(records_dir).records
    writer = ParquetBatchWriter(records_dir, after_write, fsync, align=batch_size)
    job = GroupJob(spark, group, [topic], writer, zk=zk, data_dir=data_dir, bootstrap_servers=bootstrap_servers,
                   kafka=kafka, workers=workers, mode=mode,
                   duration_s=duration_s, stop_file=stop_file, align=batch_size, batch_end=writer.existing_end,
                   flush_partial=True, consumer_config=consumer_config, **job_options)
    if job_ready is not None:
        job_ready(job)
    summary = job.run()
    report = scan_output(records_dir)
    report.written = max(0, report.records - before)
    report.counts_dir = os.path.join(os.path.abspath(out), COUNTS_DIR)
    report.distinct_keys, report.counted = count_keys(spark, records_dir, report.counts_dir,
                                                      deduplicate=report.overlaps > 0)
    if not report.overlaps:
        report.success_file = write_success(records_dir, summary, report, topic)
    return PipelineResult(summary, report)
