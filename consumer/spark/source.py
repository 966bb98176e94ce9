"""The Spark data source ``zkgroups`` (pyspark's Python Data Source API): topics' records as a
DataFrame, batch or streaming, in the shape of Spark's Kafka source::

    from consumer.spark.source import register
    register(spark)
    df = (spark.read.format("zkgroups").option("zk", "127.0.0.1:2181")
          .option("topics", "orders,refunds")     # or .option("pattern", "orders-.*")
          .option("dataDir", "./data")            # or .option("bootstrapServers", "b1:9092")
          .option("group", "etl")                 # optional: start where the group is, commit to it
          .load())
    stream = spark.readStream.format("zkgroups")...option("maxRecordsPerTrigger", 100000).load()

Options (names are case-insensitive, as all Spark options; anything else is refused)
------------------------------------------------------------------------------------
``zk``
    ZooKeeper's connect string (required). ``zkAuth``: ``@/path/to/file`` holding
    ``user:password`` (only a file, so no secret is in the query plan), read on the driver.
    TLS to ZooKeeper: ``zkTlsCa``, ``zkTlsCert``, ``zkTlsKey`` and ``zkTlsKeyPasswordFile``
    (file names only, as ``zk_tls``; the host name checked unless ``zkTlsVerifyHostname`` is
    ``false``), checked when the DataFrame is defined.
``topics`` | ``pattern``
    A comma-separated list (``topic`` is an alias), or a regex matched against the whole
    name of every topic of the data plane (RE2, as group subscriptions), looked up again at
    every trigger: topics and partitions that appear later are read from their earliest
    offset.
``dataDir`` | ``bootstrapServers``
    The embedded log (a directory the driver and every executor see) or Kafka's brokers.
``group``
    A consumer group: where ``startingOffsets=group`` starts, and where a stream commits.
``startingOffsets``
    ``earliest``, ``latest``, ``group`` (the group's committed offsets, earliest where none;
    the default with a ``group``, else ``earliest``), or JSON like Spark's Kafka source,
    ``{"orders": {"0": 23, "1": -2}}`` (-2: earliest, -1: latest; partitions not named start
    at the earliest). Offsets outside a partition's [earliest, latest] are clamped (logged).
    Only where a query starts: a restarted query continues from its checkpoint.
``maxRecordsPerTrigger`` (or Spark's Kafka name ``maxOffsetsPerTrigger``)
    At most this many records per micro-batch, spread over the partitions in proportion to
    their backlog (largest remainder: the shares add up to exactly the limit).
``includeHeaders``
    ``true``: the ``headers`` column holds each record's headers; otherwise (the default, as
    Spark's Kafka source) they are not read and the column is null.

Columns (:data:`SCHEMA`, Spark's Kafka source): ``key`` binary, ``value`` binary, ``topic``
string, ``partition`` int, ``offset`` long, ``timestamp`` timestamp, ``timestampType`` int,
``headers`` array<struct<key string, value binary>> (null without ``includeHeaders``; Spark's
Kafka source leaves the column out then, this one keeps one schema). One Spark partition per
topic partition and batch; ``read()`` yields Arrow record batches built column by column.

What a query costs besides its records
--------------------------------------
Spark plans a Python data source in Python processes of its own (a streaming query keeps one
for the query's life): importing this module there loads only what the source needs (the
package ``consumer.spark`` imports its group-job modules on first use). A stream's trigger
asks for the latest offsets twice (``latestOffset``, then ``reportLatestOffset`` for its
progress report): one look at ZooKeeper and the data plane serves both, and the first trigger
reuses the look ``initialOffset`` (and ``prepareForTriggerAvailableNow``) took.

Guaranteed
----------
* A batch read holds, for each partition, the records from its starting offset up to the log
  end when the read was planned. A stream's micro-batch ``[start, end)`` is fixed when Spark
  plans it and reads the same records whenever it is run again (a retried task, a restarted
  query), so with Spark's checkpoint and an idempotent sink (the file sink, ``foreachBatch``
  keyed by batch id) every record is in the output exactly once.
* With ``group``, a stream commits its progress to the group (``groupctl groups describe``
  shows its lag): the end of each completed micro-batch, from ``commit()`` and, since Spark
  calls that only when it plans the next batch, also when the source is next asked for new
  data. A commit is the one an outsider may make (:func:`consumer.offsets.commit_unowned`):
  compare-and-set on the offsets znode, never backwards, and refused for a partition a live
  member owns (logged once per partition while that lasts; the query goes on). A batch read
  never commits.

Not provided
------------
* The group's offsets are not the query's progress: Spark's checkpoint is. A query restarted
  without its checkpoint starts at ``startingOffsets`` again (``group`` then gives where its
  last commit left the group).
* ``timestampType`` is always 0 (CreateTime): the data planes' records do not carry the type
  (a Kafka topic with LogAppendTime has the broker's time in ``timestamp``).
* Offsets must be contiguous (as for group jobs): no transactional or compacted Kafka topics.
  librdkafka properties other than the brokers cannot be given (they would be in the plan).
* Records removed by retention before a micro-batch read them fail that batch.
"""
from __future__ import annotations

import difflib
import json
import logging
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

from consumer.records import TopicPartition

log = logging.getLogger("zkgroups.spark.source")

#: The DataFrame's columns: Spark's Kafka source's.
SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                 StructField("value", BinaryType())]))),
])
#: Records per data-plane fetch, and so per Arrow record batch.
FETCH_RECORDS = 10_000
FETCH_BYTES = 64 << 20
#: JSON ``startingOffsets`` values, as in Spark's Kafka source.
EARLIEST, LATEST = -2, -1
STARTING = ("earliest", "latest", "group")

#: Every option, by the lower-case name Spark hands over, with its documented spelling.
OPTIONS = {name.lower(): name for name in (
    "zk", "zkAuth", "topics", "topic", "pattern", "group", "dataDir", "bootstrapServers", "startingOffsets",
    "maxRecordsPerTrigger", "maxOffsetsPerTrigger", "includeHeaders", "zkTlsCa", "zkTlsCert", "zkTlsKey",
    "zkTlsKeyPasswordFile", "zkTlsVerifyHostname")}

#: Offsets as Spark keeps them: {topic: {"partition": offset}}.
Offsets = Dict[str, Dict[str, int]]


def register(spark) -> None:
    """Make ``spark.read.format("zkgroups")`` (and ``readStream``) available in ``spark``."""
    spark.dataSource.register(ZkGroupsDataSource)


# ---------------------------------------------------------------- options (driver)

class SourceOptions:
    """The options, checked when the DataFrame is defined: ValueError naming the option."""

    def __init__(self, options: Mapping[str, str]):
        given = {k.lower(): v for k, v in options.items()}
        for name in given:
            if name not in OPTIONS:
                close = difflib.get_close_matches(name, OPTIONS, n=1)
                hint = f" (did you mean {OPTIONS[close[0]]}?)" if close else \
                    f" (options: {', '.join(sorted(set(OPTIONS.values()), key=str.lower))})"
                raise ValueError(f"the zkgroups source has no option {name!r}{hint}")
        self.zk = given.get("zk", "").strip()
        if not self.zk:
            raise ValueError("the zkgroups source needs the option zk (ZooKeeper's connect string)")
        self.zk_auth = _zk_auth(given.get("zkauth"))
        self.zk_tls = _zk_tls(given)
        self.topics, self.pattern = _subscription(given)
        self.group = given.get("group") or None
        if self.group is not None:
            _check_name(self.group, "group", "group")
        self.data_dir = given.get("datadir") or None
        self.bootstrap = (given.get("bootstrapservers") or "").strip()
        if self.data_dir and self.bootstrap:
            raise ValueError("options dataDir and bootstrapServers: give one (the embedded log or Kafka)")
        self.starting = _starting(given.get("startingoffsets"), self.group)
        self.max_records = _max_records(given)
        self.include_headers = _boolean(given, "includeHeaders")

    def plane(self, client=None):
        from consumer.dataplane import open_data_plane
        return open_data_plane(data_dir=self.data_dir, bootstrap_servers=self.bootstrap, zk=client)


def _zk_auth(value: Optional[str]):
    if value is None:
        return None
    if not value.startswith("@") or len(value) < 2:
        raise ValueError("option zkAuth takes only @/path/to/file (a file holding user:password), "
                         "so that no secret is in the query plan")
    from coordinator.acl import parse_auth
    from coordinator.errors import InvalidConfig
    try:
        return parse_auth(value, "option zkAuth")
    except InvalidConfig as e:
        raise ValueError(str(e)) from None


def _zk_tls(given: Mapping[str, str]) -> Optional[dict]:
    """The zkTls* options as ``zk_tls`` (file names only: no key or password in the query plan)."""
    files = {"ca": given.get("zktlsca"), "cert": given.get("zktlscert"), "key": given.get("zktlskey")}
    password_file = given.get("zktlskeypasswordfile")
    if not any(files.values()):
        if password_file or "zktlsverifyhostname" in given:
            raise ValueError("the zkTls* options need zkTlsCa, or zkTlsCert and zkTlsKey")
        return None
    from coordinator.errors import InvalidConfig
    from coordinator.zktls import parse_tls
    setting = {**{k: v for k, v in files.items() if v}, "verify_hostname": _boolean(given, "zkTlsVerifyHostname", True)}
    if password_file:
        setting["key_password"] = "@" + password_file
    try:
        return parse_tls(setting, "options zkTls*").carried("options zkTls*")
    except InvalidConfig as e:
        raise ValueError(str(e)) from None


def _check_name(name: str, option: str, kind: str) -> None:
    from coordinator.errors import ZkGroupsError
    from coordinator.protocol import validate_name
    try:
        validate_name(name, kind)
    except ZkGroupsError as e:
        raise ValueError(f"option {option}: {e}") from None


def _subscription(given: Dict[str, str]) -> Tuple[List[str], Optional[str]]:
    named = [o for o in ("topics", "topic", "pattern") if given.get(o)]
    if len(named) != 1:
        raise ValueError("the zkgroups source needs exactly one of the options topics (topic) and pattern"
                         + (f", not {' and '.join(named)}" if named else ""))
    if named[0] == "pattern":
        from coordinator.protocol import topic_matcher
        try:
            topic_matcher(given["pattern"])
        except ValueError as e:
            raise ValueError(f"option pattern: {e}") from None
        return [], given["pattern"]
    topics = [t.strip() for t in given[named[0]].split(",")]
    for t in topics:
        _check_name(t, named[0], "topic")
    return sorted(set(topics)), None


def _starting(value: Optional[str], group: Optional[str]):
    """"earliest" | "latest" | "group" | {topic: {partition: offset}}."""
    if value is None or not value.strip():
        return "group" if group else "earliest"
    value = value.strip()
    if value.lower() in STARTING:
        if value.lower() == "group" and not group:
            raise ValueError("option startingOffsets=group needs the option group")
        return value.lower()
    problem = ("option startingOffsets must be earliest, latest, group or JSON like "
               '{"topic": {"0": 23, "1": -2}} (-2: earliest, -1: latest)')
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ValueError(f"{problem}, not {value[:80]!r}") from None
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise ValueError(problem)
    out: Offsets = {}
    for topic, partitions in parsed.items():
        _check_name(topic, "startingOffsets", "topic")
        for p, o in partitions.items():
            if not str(p).isdigit() or isinstance(o, bool) or not isinstance(o, int) or o < EARLIEST:
                raise ValueError(f"{problem}: {topic} {p!r}: {o!r} is not a partition and an offset")
        out[topic] = {str(int(p)): o for p, o in partitions.items()}
    return out


def _boolean(given: Mapping[str, str], option: str, default: bool = False) -> bool:
    raw = str(given.get(option.lower(), str(default))).strip().lower()
    if raw not in ("true", "false"):
        raise ValueError(f"option {option} must be true or false, not {given[option.lower()]!r}")
    return raw == "true"


def _max_records(given: Dict[str, str]) -> Optional[int]:
    values = {}
    for option in ("maxRecordsPerTrigger", "maxOffsetsPerTrigger"):
        raw = given.get(option.lower())
        if raw is None:
            continue
        try:
            values[option] = int(str(raw).strip())
        except ValueError:
            values[option] = 0
        if values[option] <= 0:
            raise ValueError(f"option {option} must be a positive whole number, not {raw!r}")
    if len(set(values.values())) > 1:
        raise ValueError("options maxRecordsPerTrigger and maxOffsetsPerTrigger differ: give one")
    return next(iter(values.values()), None)


# ---------------------------------------------------------------- offsets (pure)

def spread(limit: int, backlog: Mapping[TopicPartition, int]) -> Dict[TopicPartition, int]:
    """``limit`` records shared among partitions in proportion to their backlog (largest
    remainder): each share is at most its backlog and they add up to ``min(limit, total)``."""
    total = sum(backlog.values())
    if total <= limit:
        return dict(backlog)
    shares = {tp: limit * n // total for tp, n in backlog.items()}
    left = limit - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda tp: (-(limit * backlog[tp] % total), tp))
    for tp in by_remainder[:left]:
        shares[tp] += 1
    return shares


def nested(offsets: Mapping[TopicPartition, int]) -> Offsets:
    """{tp: offset} as Spark keeps it, in a fixed order (Spark compares offsets as JSON text)."""
    out: Offsets = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def flat(offsets: Offsets) -> Dict[TopicPartition, int]:
    return {TopicPartition(t, int(p)): o for t, ps in offsets.items() for p, o in ps.items()}


class Snapshot:
    """Where every partition of the subscription begins and ends now (and, with a group, what
    it committed). Opens and closes its own ZooKeeper client and data plane unless given."""

    def __init__(self, options: SourceOptions, client=None, plane=None, committed: bool = False):
        from coordinator.zkclient import close_client, start_client
        from consumer.dataplane import topic_partitions
        from consumer.spark.executor import read_committed

        own_client = client is None
        client = client or start_client(options.zk, auth=options.zk_auth, tls=options.zk_tls)
        try:
            own_plane = plane is None
            plane = plane or options.plane(client)
            try:
                if options.pattern is not None:
                    from coordinator.protocol import topic_matcher
                    matcher = topic_matcher(options.pattern)
                    counts = {t: n for t, n in plane.partition_counts().items() if matcher.fullmatch(t)}
                else:
                    counts = topic_partitions(plane, client, options.topics)
                self.partitions = [TopicPartition(t, p) for t in sorted(counts) for p in range(counts[t])]
                self.earliest = plane.earliest_offsets(self.partitions)
                self.latest = plane.latest_offsets(self.partitions)
            finally:
                if own_plane:
                    plane.close()
            self.committed = read_committed(client, options.group, self.partitions) \
                if committed and options.group else {}
        finally:
            if own_client:
                close_client(client)

    def clamp(self, tp: TopicPartition, offset: int) -> int:
        return max(self.earliest[tp], min(offset, self.latest[tp]))

    def starting(self, starting) -> Dict[TopicPartition, int]:
        """Each partition's first offset for ``startingOffsets``."""
        out = {}
        for tp in self.partitions:
            if starting == "latest":
                out[tp] = self.latest[tp]
            elif starting == "group" and self.committed.get(tp) is not None:
                out[tp] = self.clamp(tp, self.committed[tp])
            elif isinstance(starting, dict) and str(tp.partition) in starting.get(tp.topic, {}):
                wanted = starting[tp.topic][str(tp.partition)]
                out[tp] = self.latest[tp] if wanted == LATEST else self.earliest[tp] if wanted == EARLIEST \
                    else self.clamp(tp, wanted)
                if wanted >= 0 and out[tp] != wanted:
                    log.warning("startingOffsets: %s has offsets [%d, %d]; starting at %d instead of %d", tp,
                                self.earliest[tp], self.latest[tp], out[tp], wanted)
            else:
                out[tp] = self.earliest[tp]
        if isinstance(starting, dict):
            unknown = sorted(set(starting) - {tp.topic for tp in self.partitions})
            if unknown:
                raise ValueError(f"option startingOffsets names topics the source does not read: {', '.join(unknown)}")
        return out


# ---------------------------------------------------------------- reading (executors)

class Range(InputPartition):
    """Records ``[start, end)`` of one partition (start None: the partition's earliest offset)."""

    def __init__(self, topic: str, partition: int, start: Optional[int], end: int):
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    def __repr__(self) -> str:
        return f"Range({self.topic}-{self.partition} [{self.start}, {self.end}))"


def ranges(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]) -> List[Range]:
    return [Range(tp.topic, tp.partition, start.get(tp), e) for tp, e in sorted(end.items())
            if tp not in start or e > start[tp]]


def read_range(options: SourceOptions, r: Range) -> Iterator:
    """The records of ``r`` as Arrow record batches of :data:`SCHEMA`. From the embedded
    log's columns, a batch per stored batch built in the schema's own types, its values over
    the stored bytes (:class:`~consumer.spark.sink.ColumnBatches`: no cast, no copy, no object
    per record); from records (Kafka), a table per fetch cast to the schema."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from consumer.spark.sink import ColumnBatches, records_table

    schema = to_arrow_schema(SCHEMA, timezone="UTC")
    tp = TopicPartition(r.topic, r.partition)
    batches = ColumnBatches(tp, schema, options.include_headers, FETCH_RECORDS)
    with options.plane() as plane:
        offset = plane.earliest_offsets([tp])[tp] if r.start is None else r.start
        while offset < r.end:
            want = min(FETCH_RECORDS, r.end - offset)
            parts = plane.fetch_columns(tp, offset, max_records=want, max_bytes=FETCH_BYTES)
            if parts is None:
                recs = plane.fetch(tp, offset, max_records=want, max_bytes=FETCH_BYTES)
                if recs and recs[-1].offset >= r.end:
                    recs = [rec for rec in recs if rec.offset < r.end]
                next_offset = recs[-1].offset + 1 if recs else offset
            else:
                next_offset = parts[-1].base + parts[-1].count if parts else offset
            if next_offset <= offset:
                raise RuntimeError(f"{tp}: no records at offset {offset} (below {r.end})")
            if parts is None:  # the pipeline's columns, Spark's timestamp unit
                yield from records_table(tp, recs, options.include_headers).cast(schema).to_batches()
            else:
                yield from batches(parts)
            offset = next_offset


# ---------------------------------------------------------------- Spark's interfaces

class BatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions):
        self.options = options

    def partitions(self):
        snap = Snapshot(self.options, committed=True)
        return ranges(snap.starting(self.options.starting), snap.latest)

    def read(self, partition):
        if isinstance(partition, Range):  # else Spark's stand-in for "no partitions"
            yield from read_range(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's driver-side calls (one Python process per query, one call at a time) and the
    executors' ``read``. Holds a ZooKeeper client and the data plane from the first call to
    ``stop()``; an instance shipped to executors carries neither."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self._client = None
        self._plane = None
        self._initial: Optional[Offsets] = None
        self._target: Optional[Dict[TopicPartition, int]] = None   # Trigger.AvailableNow's end
        self._committed: Optional[Offsets] = None                    # what this query last committed
        self._refused: Dict[TopicPartition, str] = {}
        # Looks taken by one call for the next (see the module docstring): initialOffset's or
        # prepareForTriggerAvailableNow's for the first latestOffset, latestOffset's for the
        # reportLatestOffset of its trigger. Each is used once; a trigger always looks afresh.
        self._for_latest: Optional[Snapshot] = None
        self._for_report: Optional[Snapshot] = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_client=None, _plane=None, _for_latest=None, _for_report=None)
        return state

    def _zk(self):
        from coordinator.zkclient import start_client
        if self._client is None:
            self._client = start_client(self.options.zk, auth=self.options.zk_auth, tls=self.options.zk_tls)
        return self._client

    def _snapshot(self, committed: bool = False) -> Snapshot:
        if self._plane is None:
            self._plane = self.options.plane(self._zk())
        return Snapshot(self.options, self._client, self._plane, committed)

    def initialOffset(self):
        snap = self._for_latest = self._snapshot(committed=True)
        self._initial = nested(snap.starting(self.options.starting))
        return self._initial

    def getDefaultReadLimit(self):
        return ReadAllAvailable() if self.options.max_records is None else ReadMaxRows(self.options.max_records)

    def prepareForTriggerAvailableNow(self):
        snap = self._for_latest = self._for_latest or self._snapshot()
        self._target = snap.latest

    def latestOffset(self, start, limit):
        if start != self._initial:
            self._commit(start)  # completed: Spark asks for more only once the batch before is done
        snap, self._for_latest = self._for_latest or self._snapshot(), None
        self._for_report, started = snap, flat(start)
        begin = {tp: started.get(tp, snap.earliest[tp]) for tp in snap.partitions}
        available = {tp: max(begin[tp], snap.latest[tp] if self._target is None else
                             min(snap.latest[tp], self._target.get(tp, begin[tp]))) for tp in snap.partitions}
        if isinstance(limit, ReadMaxRows):
            take = spread(limit.max_rows, {tp: available[tp] - begin[tp] for tp in begin})
            available = {tp: begin[tp] + take[tp] for tp in begin}
        return nested({**started, **available})

    def reportLatestOffset(self):
        snap, self._for_report = self._for_report or self._snapshot(), None
        return nested(snap.latest)

    def partitions(self, start, end):
        return ranges(flat(start), flat(end))

    def read(self, partition):
        return read_range(self.options, partition)

    def commit(self, end):
        self._commit(end)

    def stop(self):
        from coordinator.zkclient import close_client
        if self._plane is not None:
            self._plane.close()
            self._plane = None
        if self._client is not None:
            close_client(self._client)
            self._client = None

    def _commit(self, end: Offsets) -> None:
        """The group's offsets follow the query's completed batches (never fatal to the query)."""
        if not self.options.group or end == self._committed:
            return
        from kazoo.exceptions import KazooException
        from coordinator.errors import ZkGroupsError
        from consumer.offsets import commit_unowned

        try:
            refused = commit_unowned(self._zk(), self.options.group, flat(end))
        except (ZkGroupsError, KazooException) as e:
            log.warning("could not commit to group %s: %s", self.options.group, e)
            return
        for tp, why in sorted(refused.items()):
            if tp not in self._refused:
                log.warning("not committing %s to group %s: %s", tp, self.options.group, why)
        self._refused = refused
        self._committed = end


class ZkGroupsDataSource(DataSource):
    def __init__(self, options):
        super().__init__(options)
        self.checked = SourceOptions(options)

    @classmethod
    def name(cls):
        return "zkgroups"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return BatchReader(self.checked)

    def streamReader(self, schema):
        return StreamReader(self.checked)
