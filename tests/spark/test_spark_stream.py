"""Spark streams as a Spark user expects them: stops that lose nothing, processing-time
triggers, worker deaths spread over a long life, reruns after offsets were moved back, the
master spark-submit chose.

One local[3] SparkSession for the module: three task slots and no in-job task retry (a
failed worker task fails its worker's job at once, and the driver starts it again), so
every death reaches the driver's death budget. A coordinator runs in-process in every test.
"""
from __future__ import annotations

import glob
import os
import random
import threading
import time

import pytest

pytest.importorskip("pyspark")

from coordinator import protocol  # noqa: E402
from consumer.log import Log  # noqa: E402
from consumer.records import TopicPartition  # noqa: E402
from consumer.spark import GroupJob, ParquetBatchWriter, SparkJobError, local_session, run_pipeline  # noqa: E402
from consumer.spark.driver import spark_master  # noqa: E402
from tests.support import helpers  # noqa: E402
from tests.support.helpers import wait_for  # noqa: E402
from tests.spark.test_spark import (WORKER_CONFIG, KillWorker, Producer,  # noqa: E402
                               coordinator)  # noqa: E402,F401  (the in-process coordinator fixture)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]  # the first test also starts the Spark session


@pytest.fixture(scope="module")
def spark():
    session = local_session("local[3]", "zkgroups-stream-tests", log_level="ERROR")
    yield session
    session.stop()


def output_offsets(records_dir):
    """{(partition, offset): files holding it} from the Parquet files' names."""
    got = {}
    for path in glob.glob(os.path.join(str(records_dir), "topic=*", "partition=*", "*.parquet")):
        p = int(os.path.basename(os.path.dirname(path)).split("=", 1)[1])  # .../topic=<t>/partition=<p>/
        a, b = (int(x) for x in os.path.basename(path)[:-len(".parquet")].split("-"))
        for o in range(a, b):
            got[(p, o)] = got.get((p, o), 0) + 1
    return got


def assert_output_is_committed(records_dir, committed, partitions):
    """Every offset below each partition's committed offset in exactly one file, nothing past it."""
    got = output_offsets(records_dir)
    assert max(got.values(), default=1) == 1
    for p in range(partitions):
        assert {o for (q, o) in got if q == p} == set(range(committed.get(p) or 0)), p


# ---------------------------------------------------------------- the stop barrier

class StopAfter:
    """after_write hook: creates ``stop_file`` once the group is stable with ``workers``
    members, every one of them wrote a batch and ``n`` batches were written in the run (marker
    files): a stop in full flow, while the other workers hold fetched records."""

    def __init__(self, stop_file, marks, zk_connect, group, workers, n):
        self.stop_file, self.marks, self.n = str(stop_file), str(marks), n
        self.zk_connect, self.group, self.workers = zk_connect, group, workers

    def __call__(self, batch):
        os.makedirs(self.marks, exist_ok=True)
        open(os.path.join(self.marks, f"{batch.worker.index} {batch.worker.batches}"), "w").close()
        marks = os.listdir(self.marks)
        if len({m.split()[0] for m in marks}) >= self.workers and len(marks) >= self.n and self._stable():
            open(self.stop_file, "w").close()

    def _stable(self):
        state, _ = group_now(self.zk_connect, self.group)
        return state.state == protocol.STABLE and len(state.members) == self.workers


def group_now(zk_connect, group):
    """(the group's state, its registered member ids) now, read from an executor."""
    from coordinator.zkclient import close_client, start_client
    client = start_client(zk_connect)
    try:
        raw, _ = client.get(protocol.state_path(group))
        return protocol.GroupState.decode(raw, protocol.state_path(group)), client.get_children(protocol.ids_path(group))
    finally:
        close_client(client)


#: No worker dies in the stop test: sessions long enough that a busy machine expires none.
STOP_TEST_CONFIG = {**WORKER_CONFIG, "session_timeout_ms": 8000}


def test_stops_at_bad_moments_lose_no_fetched_record_and_cost_no_rebalance(spark, zk, zk_connect, coordinator,
                                                                            data_dir, tmp_path):
    helpers.fill(data_dir, "st", [2000] * 6, zk=zk)
    records_dir = tmp_path / "out" / "records"
    rng = random.Random(7)
    with Producer(data_dir, "st", 6, 20):
        for run in range(4):
            stop_file = tmp_path / f"STOP-{run}"
            writer = ParquetBatchWriter(str(records_dir), StopAfter(stop_file, tmp_path / f"marks-{run}", zk_connect,
                                                                    "gst", 3, rng.randint(3, 9)), fsync=False, align=700)
            summary = GroupJob(spark, "gst", ["st"], writer, zk=zk_connect, data_dir=data_dir, workers=3,
                               mode="stream", duration_s=60, stop_file=str(stop_file), align=700,
                               batch_end=writer.existing_end, consumer_config=STOP_TEST_CONFIG).run()
            assert {w.stop_reason for w in summary.workers} == {"stopped"}
            # No generation decided after a stop reached a member before everybody had flushed.
            assert [w.stop_rebalances for w in summary.workers] == [0] * len(summary.workers), run
            committed = {int(k.rsplit("-", 1)[1]): v for k, v in summary.committed.items()}
            assert_output_is_committed(records_dir, committed, 6)
    assert zk.get_children(protocol.SPARK_RUNS) == []  # each run's barrier znodes are gone


class StopInRebalance:
    """after_write hook: marks the run's first batch (``first_batch``), then creates
    ``stop_file`` at the first batch written while a rebalance is in flight, as ``when`` says:
    "joined" (more members registered than at this worker's first batch: a worker joined and
    the group has not settled it yet), "unstable" (the group's state is not Stable),
    "generation" (the group's generation moved since this worker's first batch). The stop
    file names what held."""

    def __init__(self, stop_file, first_batch, zk_connect, group, when):
        self.stop_file, self.first_batch = str(stop_file), str(first_batch)
        self.zk_connect, self.group, self.when = zk_connect, group, when
        self.first = None  # (generation, registered members) at this task's first batch

    def __call__(self, batch):
        open(self.first_batch, "a").close()
        if os.path.exists(self.stop_file):
            return
        state, ids = group_now(self.zk_connect, self.group)
        if self.first is None:
            self.first = (state.generation, len(ids))
        held = {"joined": len(ids) > self.first[1], "unstable": state.state != protocol.STABLE,
                "generation": state.generation != self.first[0]}
        # The chosen moment, else the first batch after a generation change (a rebalance may
        # settle between two batches): every run stops.
        when = self.when if held[self.when] else "generation" if held["generation"] else None
        if when:
            with open(self.stop_file, "w") as f:
                f.write(f"{when} {state.state} generation {state.generation} members {len(ids)}")


def hold_slot(held, release, timeout_s):
    """A Spark task that holds its slot until ``release`` exists (at most ``timeout_s``): the
    group job's worker waiting for that slot starts late."""
    def hold(_):
        open(held, "a").close()
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.02)
        return []
    return hold


def test_stops_with_a_rebalance_in_flight_lose_no_fetched_record(spark, zk, zk_connect, coordinator, data_dir,
                                                                 tmp_path):
    # Three workers on three task slots, one or two of which another job holds until the first
    # batch is written: the late workers join a group in full flow and the stop comes while
    # one of those rebalances is in flight (or before they start: then they must not join).
    helpers.fill(data_dir, "sr", [3000] * 6, zk=zk)
    records_dir = tmp_path / "out" / "records"
    rng = random.Random(11)
    stops = []
    with Producer(data_dir, "sr", 6, 5):
        for run in range(10):
            stop_file, first_batch = tmp_path / f"STOP-{run}", str(tmp_path / f"first-{run}")
            align, late = rng.choice([40, 80, 150]), rng.choice([1, 2])
            held = [str(tmp_path / f"held-{run}-{i}") for i in range(late)]
            holders = [threading.Thread(target=lambda h=h: spark.sparkContext.parallelize([0], 1).mapPartitions(
                hold_slot(h, first_batch, 30)).collect(), daemon=True) for h in held]
            for t in holders:
                t.start()
            wait_for(lambda: all(os.path.exists(h) for h in held), 30, message="the slots are held")
            writer = ParquetBatchWriter(str(records_dir), StopInRebalance(
                stop_file, first_batch, zk_connect, "gsr", rng.choice(["joined", "unstable", "generation"])),
                fsync=False, align=align)
            summary = GroupJob(spark, "gsr", ["sr"], writer, zk=zk_connect, data_dir=data_dir, workers=3,
                               mode="stream", duration_s=60, stop_file=str(stop_file), align=align,
                               batch_end=writer.existing_end, consumer_config=STOP_TEST_CONFIG,
                               progress_interval_s=None).run()
            for t in holders:
                t.join(30)
            assert {w.stop_reason for w in summary.workers} == {"stopped"}, run
            stops.append(stop_file.read_text())
            committed = {int(k.rsplit("-", 1)[1]): v for k, v in summary.committed.items()}
            assert_output_is_committed(records_dir, committed, 6)  # every fetched record processed, once
    assert len(stops) == 10
    assert zk.get_children(protocol.SPARK_RUNS) == []


# ---------------------------------------------------------------- processing-time trigger

def test_trigger_interval_cuts_batches_of_a_slow_stream(spark, zk, zk_connect, coordinator, data_dir, tmp_path):
    helpers.fill(data_dir, "tr", [10] * 3, zk=zk)
    records_dir = tmp_path / "out" / "records"
    writer = ParquetBatchWriter(str(records_dir), fsync=False, align=10000)
    with Producer(data_dir, "tr", 3, 2, pause_s=0.05):
        job = GroupJob(spark, "gtr", ["tr"], writer, zk=zk_connect, data_dir=data_dir, workers=2, mode="stream",
                       duration_s=60, align=10000, batch_end=writer.existing_end, trigger_interval_s=0.5,
                       consumer_config=WORKER_CONFIG)
        result = {}
        runner = threading.Thread(target=lambda: result.update(summary=job.run()), daemon=True)
        runner.start()
        # Far below the batch size, yet batches keep coming: several files per partition.
        wait_for(lambda: all(len(glob.glob(str(records_dir / "topic=tr" / f"partition={p}" / "*.parquet"))) >= 3
                             for p in range(3)),
                 60, message="three triggered batches of every partition")
        job.request_stop()
        runner.join(30)
    assert not runner.is_alive()
    committed = {int(k.rsplit("-", 1)[1]): v for k, v in result["summary"].committed.items()}
    assert_output_is_committed(records_dir, committed, 3)


# ---------------------------------------------------------------- metrics

def test_the_driver_serves_the_runs_progress_as_metrics(spark, zk, zk_connect, coordinator, data_dir, tmp_path):
    from tests.console.test_metrics import scrape, value

    helpers.fill(data_dir, "mt", [300] * 3, zk=zk)
    writer = ParquetBatchWriter(str(tmp_path / "out" / "records"), fsync=False, align=100)
    with Producer(data_dir, "mt", 3, 2, pause_s=0.05):
        job = GroupJob(spark, "gmt", ["mt"], writer, zk=zk_connect, data_dir=data_dir, workers=2, mode="stream",
                       duration_s=60, align=100, batch_end=writer.existing_end, metrics_port=0,
                       progress_interval_s=None, consumer_config=WORKER_CONFIG)
        result = {}
        runner = threading.Thread(target=lambda: result.update(summary=job.run()), daemon=True)
        runner.start()
        url = wait_for(lambda: job.metrics_server, 60, message="the metrics server").url

        def flowing(more_than=0.0):
            samples = scrape(url)
            return samples if (value(samples, "zkgroups_spark_records_processed_total") > more_than
                               and value(samples, "zkgroups_spark_workers_up") == 2
                               and ("zkgroups_spark_lag", ()) in samples) else None

        first = wait_for(flowing, 60, message="records processed by both workers, their lag known")
        assert value(first, "zkgroups_spark_info", group="gmt", run=job.run_id, mode="stream") == 1
        assert value(first, "zkgroups_spark_batches_total") > 0 and value(first, "zkgroups_spark_lag") >= 0
        assert ("zkgroups_spark_worker_restarts_total", ()) in first and ("zkgroups_spark_task_failures_total", ()) in first
        later = wait_for(lambda: flowing(value(first, "zkgroups_spark_records_processed_total")), 60,
                         message="the records counter moves")
        assert value(later, "zkgroups_spark_batches_total") > value(first, "zkgroups_spark_batches_total")
        job.request_stop()
        runner.join(30)
    assert not runner.is_alive()
    assert job.metrics_server is None  # served while the run runs
    assert result["summary"].records_all_attempts >= value(later, "zkgroups_spark_records_processed_total")


@pytest.mark.parametrize("port", [-1, 65536, "9090", True])
def test_a_bad_metrics_port_is_refused_before_the_job_starts(port):
    from coordinator.errors import InvalidConfig

    with pytest.raises(InvalidConfig, match="metrics_port must be a port number"):
        GroupJob(None, "g", ["t"], print, zk="127.0.0.1:1", data_dir="/nonexistent", metrics_port=port)


# ---------------------------------------------------------------- worker deaths

def test_a_stream_outlives_more_worker_deaths_than_task_retries(spark, zk, zk_connect, coordinator, data_dir,
                                                                 tmp_path):
    helpers.fill(data_dir, "wd", [5000] * 2, zk=zk)
    records_dir = tmp_path / "out" / "records"
    # Four deaths of worker 0 over the job's life, more than spark.task.maxFailures - 1 of any
    # default; each restart joins and writes a batch before it dies again, so deaths do not pile
    # up within the (small) window (two may, when the driver hears of one late) and each time
    # the worker is started again. Small batches, and the other worker slow until the kills are
    # done (1 s a batch), leave work for each life of worker 0. One batch a poll: a worker
    # answers a rebalance only between polls, so a poll of many slow batches would hold every
    # rebalance past its timeout and leave worker 0's new lives without partitions.
    result = run_pipeline(spark, zk=zk_connect, data_dir=data_dir, group="gwd", topic="wd", out=str(tmp_path / "out"),
                          workers=2, mode="drain", batch_size=250, fsync=False,
                          consumer_config={**WORKER_CONFIG, "max_poll_records": 250},
                          after_write=KillWorker(tmp_path / "kills", 4, index=0, others_wait_s=1.0), max_worker_deaths=2,
                          death_window_s=0.2)
    assert len(os.listdir(tmp_path / "kills")) == 4
    assert result.summary.restarts == 4 and result.summary.task_failures == 4
    assert result.summary.complete
    assert_output_is_committed(records_dir, {p: 5000 for p in range(2)}, 2)
    assert result.output.counted == 10000 and result.output.overlaps == 0


def test_too_many_deaths_in_the_window_end_the_job_with_the_real_cause(spark, zk, zk_connect, coordinator, data_dir,
                                                                        tmp_path):
    helpers.fill(data_dir, "wx", [3000] * 2, zk=zk)
    job = GroupJob(spark, "gwx", ["wx"], KillWorker(tmp_path / "kills", 1000), zk=zk_connect, data_dir=data_dir,
                   workers=2, mode="stream", duration_s=120, align=500, max_worker_deaths=2, death_window_s=600,
                   consumer_config=WORKER_CONFIG)
    with pytest.raises(SparkJobError) as e:
        job.run()
    message = str(e.value)
    assert "\n" not in message and "py4j" not in message.lower() and "An error occurred" not in message
    assert message.startswith("the Spark job failed: 3 failed worker task attempts within 600 s (at most 2): ")
    assert "Python worker exited unexpectedly" in message, message
    wait_for(lambda: not zk.exists(protocol.ids_path("gwx")) or zk.get_children(protocol.ids_path("gwx")) == [],
             10, message="every worker left the group")


# ---------------------------------------------------------------- reruns after offsets moved back

def test_a_rerun_after_offsets_moved_back_writes_no_record_twice(spark, zk, zk_connect, coordinator, data_dir,
                                                                 tmp_path):
    helpers.fill(data_dir, "rr", [6000, 6000], zk=zk, key=lambda o: f"k{o % 5}".encode())
    out = str(tmp_path / "out")
    opts = dict(zk=zk_connect, data_dir=data_dir, group="grr", topic="rr", out=out, workers=2, batch_size=2000,
                consumer_config=WORKER_CONFIG, fsync=False)
    first = run_pipeline(spark, mode="drain", **opts)
    assert first.output.counted == 12000
    for p in range(2):  # what `groupctl groups reset-offsets --to-offset 500 --execute` writes
        zk.set(protocol.offsets_path("grr", "rr", p), b"500")
    again = run_pipeline(spark, mode="drain", **opts)
    assert again.summary.complete
    assert again.output.overlaps == 0 and again.output.records == 12000 and again.output.counted == 12000
    assert_output_is_committed(os.path.join(out, "records"), {0: 6000, 1: 6000}, 2)


def test_batches_are_cut_around_files_already_written(tmp_path):
    writer = ParquetBatchWriter(str(tmp_path / "records"), fsync=False, align=1000)
    tp = TopicPartition("t", 0)
    os.makedirs(writer.partition_dir(tp))
    for a, b in [(0, 1000), (1000, 1400), (2500, 3000)]:
        open(writer.path(tp, a, b), "wb").close()
    assert writer.existing_end(tp, 1000) == 1400       # a redone batch: as it was cut
    assert writer.existing_end(tp, 500) == 1000        # offsets moved back into a file: up to its end
    assert writer.already_written(tp, 500, 1000) and not writer.already_written(tp, 1000, 1400)
    assert writer.existing_end(tp, 1400) is None       # the multiple of 1000 comes first
    assert writer.existing_end(tp, 2000) == 2500       # ... else the next file's start
    assert writer.existing_end(tp, 3000) is None


# ---------------------------------------------------------------- the master

def test_the_master_comes_from_the_option_the_environment_or_the_default(monkeypatch):
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert spark_master(None, "local[3]") == ("local[3]", "local[3]")
    assert spark_master("spark://h:7077", "local[3]") == ("spark://h:7077", "spark://h:7077")
    monkeypatch.setenv("SPARK_MASTER", "spark://e:7077")
    assert spark_master(None, "local[3]") == ("spark://e:7077", "spark://e:7077")
    assert spark_master("local[1]", "local[3]") == ("local[1]", "local[1]")


# ---------------------------------------------------------------- the data source

def test_spark_reads_a_topic_from_the_groups_offsets(spark, zk, zk_connect, coordinator, data_dir, tmp_path):
    from consumer.spark.source import register

    helpers.fill(data_dir, "ds", [300, 200], zk=zk, key=b"k")
    zk.create(protocol.offsets_path("gds", "ds", 0), b"100", makepath=True)  # the group is at 100 of partition 0
    register(spark)
    df = (spark.read.format("zkgroups").option("zk", zk_connect).option("dataDir", data_dir).option("topic", "ds")
          .option("group", "gds").load())
    rows = df.select("topic", "partition", "offset", "value").collect()
    assert sorted((r.partition, r.offset) for r in rows) == \
        [(0, o) for o in range(100, 300)] + [(1, o) for o in range(200)]
    assert all(r.value == f"ds-{r.partition}-{r.offset}".encode() for r in rows)
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                                        "timestamp:timestamp,timestampType:int,"
                                        "headers:array<struct<key:string,value:binary>>>")

    query = (spark.readStream.format("zkgroups").option("zk", zk_connect).option("dataDir", data_dir)
             .option("topic", "ds").load().writeStream.format("memory").queryName("ds_stream").start())
    try:
        query.processAllAvailable()
        assert spark.sql("select count(*) from ds_stream").first()[0] == 500
        with Log(data_dir) as lg:
            lg.append("ds", 1, [(None, b"late", 0, ())] * 7)
        query.processAllAvailable()
        assert spark.sql("select count(*) from ds_stream").first()[0] == 507
    finally:
        query.stop()
