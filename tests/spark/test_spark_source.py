"""The ``zkgroups`` Spark data source (consumer.spark.source) as a Spark user expects it:
Kafka's columns, start positions, read limits, checkpoints that give exactly-once output
through restarts and killed Python workers, and the group's committed offsets following the
query (fenced against the group's live members).

One local[2,4] SparkSession for the module (a failed task is retried up to 3 times); a real
ZooKeeper; the embedded log written with ``Log.append``; one test on the mock Kafka cluster.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None:
    pytest.skip("pyspark needs a Java runtime", allow_module_level=True)

from consumer.log import Log  # noqa: E402
from consumer.offsets import commit_unowned  # noqa: E402
from consumer.records import TopicPartition  # noqa: E402
from consumer.spark import local_session  # noqa: E402
from consumer.spark.source import SourceOptions, StreamReader, ZkGroupsDataSource, register, spread  # noqa: E402
from coordinator import protocol  # noqa: E402
from tests.support import helpers  # noqa: E402
from tests.support.helpers import wait_for  # noqa: E402
from tests.spark.test_spark import WORKER_CONFIG, coordinator  # noqa: E402,F401  (the in-process coordinator fixture)
from tests.spark.test_spark_stream import Producer  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

KAFKA_SCHEMA = ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
                "timestampType:int,headers:array<struct<key:string,value:binary>>>")


@pytest.fixture(scope="module")
def spark():
    session = local_session("local[2,4]", "zkgroups-source-tests", {"spark.task.maxFailures": "4"},
                            log_level="ERROR")
    register(session)
    session.dataSource.register(DyingSource)
    yield session
    session.stop()


def source(spark, zk_connect, data_dir, stream=False, **options):
    reader = (spark.readStream if stream else spark.read).format(options.pop("format", "zkgroups"))
    reader = reader.option("zk", zk_connect).option("dataDir", data_dir)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def positions(rows):
    return sorted((r.topic, r.partition, r.offset) for r in rows)


def everything(**topics):
    """Every (topic, partition, offset) of topics filled with ``counts``."""
    return sorted((t, p, o) for t, counts in topics.items() for p, n in enumerate(counts) for o in range(n))


class BatchSizes:
    """foreachBatch: remembers each batch's (topic, partition, offset)s by batch id (a batch
    run again replaces its earlier run: what an idempotent sink does)."""

    def __init__(self):
        self.batches = {}
        self.lock = threading.Lock()

    def __call__(self, df, batch_id):
        rows = df.select("topic", "partition", "offset").collect()
        with self.lock:
            self.batches[batch_id] = positions(rows)

    def all(self):
        return sorted(x for rows in self.batches.values() for x in rows)


# ---------------------------------------------------------------- options and pure logic (no Spark job)

@pytest.mark.parametrize("options,message", [
    ({"topics": "t"}, "needs the option zk"),
    ({"zk": "h:2181"}, "exactly one of the options topics (topic) and pattern"),
    ({"zk": "h:2181", "topics": "t", "pattern": "t.*"}, "not topics and pattern"),
    ({"zk": "h:2181", "topics": "t", "startingOfsets": "earliest"}, "no option 'startingofsets' (did you mean "
                                                                    "startingOffsets?)"),
    ({"zk": "h:2181", "topics": "t", "startingOffsets": "first"}, "option startingOffsets must be earliest"),
    ({"zk": "h:2181", "topics": "t", "startingOffsets": "group"}, "startingOffsets=group needs the option group"),
    ({"zk": "h:2181", "topics": "t", "startingOffsets": '{"t": {"x": 1}}'}, "is not a partition and an offset"),
    ({"zk": "h:2181", "topics": "t", "maxRecordsPerTrigger": "0"}, "option maxRecordsPerTrigger must be a positive"),
    ({"zk": "h:2181", "topics": "t", "maxOffsetsPerTrigger": "ten"}, "option maxOffsetsPerTrigger must be a positive"),
    ({"zk": "h:2181", "topics": "t", "maxRecordsPerTrigger": "5", "maxOffsetsPerTrigger": "6"}, "differ"),
    ({"zk": "h:2181", "topics": "t/x"}, "option topics: topic name 't/x' is illegal"),
    ({"zk": "h:2181", "pattern": "(a)\\1"}, "option pattern: regex"),
    ({"zk": "h:2181", "topics": "t", "group": "g g"}, "option group: group name"),
    ({"zk": "h:2181", "topics": "t", "zkAuth": "user:pw123"}, "zkAuth takes only @/path/to/file"),
    ({"zk": "h:2181", "topics": "t", "zkAuth": "@/nonexistent/file"}, "option zkAuth"),
    ({"zk": "h:2181", "topics": "t", "dataDir": "/d", "bootstrapServers": "b:9092"}, "give one"),
    ({"zk": "h:2181", "topics": "t", "includeHeaders": "yes"}, "option includeHeaders must be true or false"),
])
def test_bad_options_are_one_line_naming_the_option(options, message):
    with pytest.raises(ValueError) as e:
        SourceOptions(options)
    assert message in str(e.value)
    assert "\n" not in str(e.value) and "pw123" not in str(e.value)
    assert e.value.__cause__ is None and (e.value.__context__ is None or e.value.__suppress_context__)


def test_options_and_their_defaults():
    o = SourceOptions({"ZK": "h:2181", "topic": "b,a,b", "maxoffsetspertrigger": "10"})
    assert (o.topics, o.pattern, o.group, o.starting, o.max_records) == (["a", "b"], None, None, "earliest", 10)
    assert not o.include_headers and SourceOptions({"zk": "h", "topics": "a", "INCLUDEHEADERS": "True"}).include_headers
    o = SourceOptions({"zk": "h:2181", "pattern": "a.*", "group": "g"})
    assert (o.topics, o.pattern, o.starting, o.max_records) == ([], "a.*", "group", None)
    o = SourceOptions({"zk": "h:2181", "topics": "a", "startingOffsets": '{"a": {"0": 5, "1": -1}}'})
    assert o.starting == {"a": {"0": 5, "1": -1}}


def test_spread_is_proportional_to_backlog_and_adds_up_to_the_limit():
    a, b, c = (TopicPartition("t", p) for p in range(3))
    assert spread(70, {a: 100, b: 50, c: 10}) == {a: 44, b: 22, c: 4}
    assert spread(1000, {a: 100, b: 50, c: 0}) == {a: 100, b: 50, c: 0}
    assert spread(2, {a: 1, b: 1, c: 1}) == {a: 1, b: 1, c: 0}
    for limit in range(1, 40):
        shares = spread(limit, {a: 7, b: 13, c: 19})
        assert sum(shares.values()) == limit and shares[a] <= 7 and shares[b] <= 13


@pytest.mark.parametrize("include_headers", [False, True])
def test_batches_read_from_the_logs_columns_equal_the_records_cast_to_the_schema(tmp_path, monkeypatch,
                                                                                  include_headers):
    """read_range's batches, built from the log's columns in the schema's own types, equal
    the records' table cast to the schema: fixed and varying values, keys and none, headers
    (null unless asked for), fetches that cut stored batches, ranges that end inside one."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from consumer.spark.sink import ColumnBatches, records_table
    from consumer.spark.source import SCHEMA, Range, read_range
    import pyarrow as pa

    monkeypatch.setattr("consumer.spark.source.FETCH_RECORDS", 16)  # fetches that cut stored batches
    schema = to_arrow_schema(SCHEMA, timezone="UTC")
    tp = TopicPartition("t", 0)
    options = SourceOptions({"zk": "h:2181", "topics": "t", "dataDir": str(tmp_path),
                             "includeHeaders": str(include_headers).lower()})
    with Log(str(tmp_path), fsync="never") as lg:
        lg.append("t", 0, [(None, b"v%05d" % i, 1000, ()) for i in range(5)])
        lg.append("t", 0, [(None, b"w%07d" % i, 1500 + i, ()) for i in range(50)])
        lg.append("t", 0, [(b"k%d" % i if i % 3 else None, b"x" * i, 2000 + i // 10, ()) for i in range(40)])
        lg.append("t", 0, [(b"", b"", 3000 + i * 7, (("h", b"1"), ("n", None)) if i % 2 else ()) for i in range(30)])
        lg.append("t", 0, [(None, b"", 5, ())] * 3)
        for start, end in [(None, 128), (10, 60), (55, 95), (89, 128), (127, 128), (3, 4)]:
            batches = list(read_range(options, Range("t", 0, start, end)))
            assert batches and all(b.schema.equals(schema) for b in batches)
            records = lg.fetch("t", 0, start or 0, max_records=end - (start or 0), max_bytes=1 << 30)
            want = records_table(tp, records, include_headers).cast(schema)
            assert pa.Table.from_batches(batches, schema).to_pylist() == want.to_pylist(), (start, end)
        grown = ColumnBatches(tp, schema, include_headers, capacity=1)  # regrown for longer stored batches
        got = pa.Table.from_batches(grown(lg.fetch_columns("t", 0, 0, max_records=128, max_bytes=1 << 30)), schema)
        want = records_table(tp, lg.fetch("t", 0, 0, max_records=128, max_bytes=1 << 30), include_headers)
        assert got.to_pylist() == want.cast(schema).to_pylist()


def test_a_trigger_looks_at_zookeeper_and_the_data_plane_once():
    """latestOffset's look serves its trigger's reportLatestOffset; the first trigger reuses
    the look of initialOffset (and prepareForTriggerAvailableNow); every trigger looks afresh."""
    tp = TopicPartition("t", 0)
    looks = []

    class Look:
        partitions, committed = [tp], {}

        def __init__(self):
            looks.append(self)
            self.earliest, self.latest = {tp: 0}, {tp: 10 * len(looks)}

        def starting(self, starting):
            return {tp: 0}

    reader = StreamReader(SourceOptions({"zk": "h:2181", "topics": "t"}))
    reader._snapshot = lambda committed=False: Look()
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert len(looks) == 1 and end == reader.reportLatestOffset() == {"t": {"0": 10}}
    for trigger in (2, 3):
        assert reader.latestOffset(end, reader.getDefaultReadLimit()) == {"t": {"0": 10}}  # availableNow's end
        assert reader.reportLatestOffset() == {"t": {"0": 10 * trigger}} and len(looks) == trigger
    assert reader.reportLatestOffset() == {"t": {"0": 40}}  # not after a latestOffset: a look of its own


@pytest.mark.zk
def test_commit_unowned_is_fenced_forward_only_and_refused_under_a_live_owner(zk):
    t0, t1, t2 = (TopicPartition("t", p) for p in range(3))
    assert commit_unowned(zk, "g", {t0: 10, t1: 10}) == {}                  # created
    assert helpers.committed(zk, "g", "t", 2) == {0: 10, 1: 10}
    assert commit_unowned(zk, "g", {t0: 5, t1: 12}) == {}                   # t0 is never moved back
    assert helpers.committed(zk, "g", "t", 2) == {0: 10, 1: 12}
    zk.create(protocol.owners_path("g", "t", 1), b"member-1", ephemeral=True, makepath=True)
    zk.create(protocol.offsets_path("g", "t", 2), b"")                   # a claim's empty fencing token
    refused = commit_unowned(zk, "g", {t0: 20, t1: 20, t2: 20})
    assert list(refused) == [t1] and "live member" in refused[t1]
    assert helpers.committed(zk, "g", "t", 3) == {0: 20, 1: 12, 2: 20}


# ---------------------------------------------------------------- batch reads

def test_batch_read_of_several_topics_has_every_record_once_in_kafkas_schema(spark, zk, zk_connect, data_dir):
    helpers.fill(data_dir, "src-a", [120, 80, 0], zk=zk, key=lambda o: b"k%d" % o)
    helpers.fill(data_dir, "src-b", [50, 60], zk=zk)
    with Log(data_dir) as lg:  # a record with headers, Kafka style
        lg.append("src-b", 1, [(b"hk", b"src-b-1-60", 1_700_000_000_123, (("h1", b"v1"), ("h2", b"")))])
    df = source(spark, zk_connect, data_dir, topics="src-a,src-b", includeHeaders="true")
    assert df.schema.simpleString() == KAFKA_SCHEMA
    rows = df.collect()
    assert positions(rows) == everything(**{"src-a": [120, 80, 0], "src-b": [50, 61]})
    assert all(r.value == f"{r.topic}-{r.partition}-{r.offset}".encode() for r in rows)
    last = [r for r in rows if (r.topic, r.partition, r.offset) == ("src-b", 1, 60)][0]
    assert [(h.key, h.value) for h in last.headers] == [("h1", b"v1"), ("h2", b"")]
    assert last.key == b"hk" and last.timestampType == 0
    assert df.selectExpr("max(unix_millis(timestamp))").first()[0] == 1_700_000_000_123
    assert [r for r in rows if r.topic == "src-a" and r.offset == 7][0].key == b"k7"
    # a pattern over the registered topics reads the same; without includeHeaders the headers are null
    plain = source(spark, zk_connect, data_dir, pattern="src-[ab]")
    assert plain.schema.simpleString() == KAFKA_SCHEMA
    assert positions(plain.collect()) == positions(rows) and plain.where("headers is not null").count() == 0
    assert source(spark, zk_connect, data_dir, pattern="nothing.*").count() == 0


def test_starting_offsets(spark, zk, zk_connect, data_dir):
    helpers.fill(data_dir, "so", [100, 40], zk=zk)
    zk.create(protocol.offsets_path("gso", "so", 0), b"70", makepath=True)
    read = lambda **o: positions(source(spark, zk_connect, data_dir, topics="so", **o).collect())  # noqa: E731
    assert read() == everything(so=[100, 40])
    assert read(group="gso") == [("so", 0, o) for o in range(70, 100)] + [("so", 1, o) for o in range(40)]
    assert read(group="gso", startingOffsets="earliest") == everything(so=[100, 40])
    assert read(startingOffsets="latest") == []
    assert read(startingOffsets=json.dumps({"so": {"0": 95, "1": -1}})) == [("so", 0, o) for o in range(95, 100)]
    assert read(startingOffsets=json.dumps({"so": {"1": 1000}})) == [("so", 0, o) for o in range(100)]  # clamped
    with pytest.raises(Exception, match="names topics the source does not read: other"):
        read(startingOffsets=json.dumps({"other": {"0": 1}}))
    with pytest.raises(Exception, match="option startingOffsets must be earliest"):
        read(startingOffsets="newest")

    # a stream from latest gets only what arrives after it started
    sizes = BatchSizes()
    query = (source(spark, zk_connect, data_dir, stream=True, topics="so", startingOffsets="latest")
             .writeStream.foreachBatch(sizes).start())
    try:
        query.processAllAvailable()
        with Log(data_dir) as lg:
            lg.append("so", 1, [(None, b"new", 0, ())] * 3)
        query.processAllAvailable()
    finally:
        query.stop()
    assert sizes.all() == [("so", 1, o) for o in range(40, 43)]


# ---------------------------------------------------------------- streams

def test_max_records_per_trigger_bounds_every_micro_batch(spark, zk, zk_connect, data_dir, tmp_path):
    helpers.fill(data_dir, "lim", [100, 50, 10], zk=zk)
    sizes = BatchSizes()
    query = (source(spark, zk_connect, data_dir, stream=True, topics="lim", maxRecordsPerTrigger="70")
             .writeStream.foreachBatch(sizes).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(60)
    assert [len(sizes.batches[b]) for b in sorted(sizes.batches)] == [70, 70, 20]
    assert sizes.all() == everything(lim=[100, 50, 10])
    first = sizes.batches[min(sizes.batches)]
    assert [sum(1 for x in first if x[1] == p) for p in range(3)] == [44, 22, 4]  # shares of the backlog


def test_file_sink_restarted_from_its_checkpoint_while_records_arrive_has_every_record_once(
        spark, zk, zk_connect, data_dir, tmp_path):
    helpers.fill(data_dir, "fs", [200, 200], zk=zk)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")

    def start():
        return (source(spark, zk_connect, data_dir, stream=True, topics="fs", maxRecordsPerTrigger="1000")
                .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
                .trigger(processingTime="100 milliseconds").start())

    def written():
        try:
            return spark.read.parquet(out).count()
        except Exception:  # nothing committed yet
            return 0

    with Producer(data_dir, "fs", 2, per_round=2) as producer:
        query = start()
        wait_for(lambda: written() > 400, 60, message="the first run wrote records")
        query.stop()
        first_run = written()
        query = start()
        wait_for(lambda: written() > first_run, 60, message="the restarted run wrote records")
    producer.thread.join(10)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    with Log(data_dir) as lg:
        ends = [lg.latest_offset("fs", p) for p in range(2)]
    got = positions(spark.read.parquet(out).select("topic", "partition", "offset").collect())
    assert got == everything(fs=ends)


class DyingSource(ZkGroupsDataSource):
    """``zkgroups`` whose Python worker exits in the middle of reading partition 0 of the
    second micro-batch, the first time only (a marker file says it happened)."""

    @classmethod
    def name(cls):
        return "zkgroups_dying"

    def __init__(self, options):
        options = dict(options)
        self.marker = options.pop("diemarker")
        super().__init__(options)

    def streamReader(self, schema):
        return DyingReader(self.checked, self.marker)


class DyingReader(StreamReader):
    def __init__(self, options, marker):
        super().__init__(options)
        self.marker = marker

    def read(self, partition):
        records = super().read(partition)
        yield next(records)
        if partition.partition == 0 and partition.start and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        yield from records


def test_a_python_worker_killed_mid_batch_is_retried_and_every_record_is_output_once(
        spark, zk, zk_connect, data_dir, tmp_path):
    helpers.fill(data_dir, "die", [25_000, 300], zk=zk)
    marker = str(tmp_path / "died")
    sizes = BatchSizes()
    query = (source(spark, zk_connect, data_dir, stream=True, format="zkgroups_dying", topics="die",
                    maxRecordsPerTrigger="20000", dieMarker=marker)
             .writeStream.foreachBatch(sizes).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(60)
    assert query.exception() is None
    assert os.path.exists(marker)  # the worker did die
    assert sizes.all() == everything(die=[25_000, 300])


# ---------------------------------------------------------------- commits to the group

def groupctl_lags(zk_connect, data_dir, group, env):
    out = subprocess.run([sys.executable, "-m", "consumer.cli.groupctl", "--zk", zk_connect, "--data-dir", data_dir,
                          "groups", "describe", group, "--output", "json"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return {(r["topic"], r["partition"]): r["lag"] for r in json.loads(out.stdout)["offsets"]}


def test_the_groups_offsets_follow_the_query_and_groupctl_shows_lag_0(
        spark, zk, zk_connect, data_dir, tmp_path, subprocess_env):
    helpers.fill(data_dir, "cm", [300, 100, 0], zk=zk)
    zk.create(protocol.offsets_path("gcm", "cm", 0), b"100", makepath=True)
    sizes = BatchSizes()
    query = (source(spark, zk_connect, data_dir, stream=True, topics="cm", group="gcm", maxRecordsPerTrigger="150")
             .writeStream.foreachBatch(sizes).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(60)
    assert sizes.all() == [("cm", 0, o) for o in range(100, 300)] + [("cm", 1, o) for o in range(100)]
    assert helpers.committed(zk, "gcm", "cm", 3) == {0: 300, 1: 100, 2: 0}
    assert groupctl_lags(zk_connect, data_dir, "gcm", subprocess_env) == {("cm", 0): 0, ("cm", 1): 0, ("cm", 2): 0}


def test_a_partition_owned_by_a_live_member_is_not_committed(spark, zk, zk_connect, data_dir, tmp_path, coordinator):
    from consumer.consumer import Consumer

    helpers.fill(data_dir, "own", [50, 50], zk=zk)
    member = Consumer("gown", ["own"], zk=zk_connect, data_dir=data_dir, enable_auto_commit=False, **WORKER_CONFIG)
    try:
        wait_for(lambda: (member.poll(timeout_ms=100) or True) and len(member.assignment()) == 2, 30,
                 message="the member owns both partitions")
        member.commit({TopicPartition("own", 0): 10})
        sizes = BatchSizes()
        query = (source(spark, zk_connect, data_dir, stream=True, topics="own", group="gown",
                        startingOffsets="earliest")
                 .writeStream.foreachBatch(sizes).option("checkpointLocation", str(tmp_path / "cp"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(60)
        assert query.exception() is None and len(sizes.all()) == 100  # the query went on
        assert helpers.committed(zk, "gown", "own", 2) == {0: 10, 1: None}
    finally:
        member.close()
    # the member left: the next run of the query commits
    with Log(data_dir) as lg:
        lg.append("own", 1, [(None, b"x", 0, ())] * 5)
    query = (source(spark, zk_connect, data_dir, stream=True, topics="own", group="gown")
             .writeStream.foreachBatch(sizes).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(60)
    assert helpers.committed(zk, "gown", "own", 2) == {0: 50, 1: 55}


# ---------------------------------------------------------------- Kafka

@pytest.mark.kafka
def test_batch_read_on_kafka(spark, zk_connect, kafka_cluster, kafka_topic_name):
    ck = pytest.importorskip("confluent_kafka")
    kafka_cluster.create_topic(kafka_topic_name, 2)
    producer = ck.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    for p in range(2):
        for o in range(30):
            producer.produce(kafka_topic_name, f"v{p}-{o}".encode(), b"k", partition=p,
                             headers=[("h", b"x")] if o == 0 else None)
    assert producer.flush(20) == 0
    def df(**options):
        reader = (spark.read.format("zkgroups").option("zk", zk_connect).option("topics", kafka_topic_name)
                  .option("bootstrapServers", kafka_cluster.bootstrap_servers))
        return reader.options(**options).load()
    rows = df(includeHeaders="true").collect()
    assert positions(rows) == everything(**{kafka_topic_name: [30, 30]})
    assert all(r.value == f"v{r.partition}-{r.offset}".encode() for r in rows)
    assert {(r.partition, tuple((h.key, h.value) for h in r.headers)) for r in rows if r.offset == 0} == \
        {(0, (("h", b"x"),)), (1, (("h", b"x"),))}
    assert [r.headers for r in rows if r.offset == 1] == [[], []]
    assert {r.headers for r in df().collect()} == {None}  # without includeHeaders
