"""Consumer groups on Spark (consumer.spark) and the example pipeline (bin/pipeline).

One local[2,4] SparkSession for the whole module (two task slots; a failed task is retried
up to 3 times). A coordinator runs in-process in every test; the log is written with
``Log.append``. What needs no Spark session is in the file named after its module:
``test_spark_sink.py``, ``test_spark_publisher.py``, ``test_spark_progress.py``.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None:
    pytest.skip("pyspark needs a Java runtime", allow_module_level=True)

from coordinator import protocol  # noqa: E402
from coordinator.coordinator import Coordinator, CoordinatorConfig  # noqa: E402
from coordinator.errors import CorruptZnode  # noqa: E402
from consumer.spark.sink import run_pipeline  # noqa: E402
from coordinator.topics import TopicRegistry  # noqa: E402
from consumer.consumer import Consumer  # noqa: E402
from consumer.log import Log  # noqa: E402
from consumer.records import TopicPartition  # noqa: E402
from consumer.spark import GroupJob, SparkJobError, check_spark_conf, local_session, read_committed  # noqa: E402
from tests.support import helpers  # noqa: E402
from tests.support.helpers import wait_for  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

WORKER_CONFIG = {"session_timeout_ms": 2000}
KEYS = 7


@pytest.fixture(scope="module")
def spark():
    session = local_session("local[2,4]", "zkgroups-tests", {"spark.task.maxFailures": "4"}, log_level="ERROR")
    yield session
    session.stop()


@pytest.fixture
def coordinator(zk_connect):
    # Acks may be slow on a busy machine (Python workers starting): a generic rebalance timeout,
    # and a failed group retried soon rather than after the default 30 s. A dead worker's ack is
    # not waited for: its session (2 s) ends and the rebalance starts again without it.
    node = Coordinator(zk_connect, "n1", CoordinatorConfig(session_timeout_ms=2000, rebalance_timeout_ms=10000,
                                                           rebalance_backoff_ms=50,
                                                           failed_retry_interval_ms=1000)).start()
    wait_for(lambda: node.is_leader, 10, message="coordinator leads")
    yield node
    node.close()


def fill(zk, data_dir, topic, partitions, per_partition, first=0):
    """``per_partition`` records in each partition (from offset ``first``), keyed k<offset % KEYS>."""
    helpers.fill(data_dir, topic, [per_partition] * partitions, zk=zk, key=lambda o: f"k{o % KEYS}".encode(),
                 first=first)


class RangeRecorder:
    """A picklable ``process``: appends each batch's ranges to <dir>/<consumer id>.txt."""

    def __init__(self, directory, append_on_first=None):
        self.dir = str(directory)
        self.append_on_first = append_on_first  # (data_dir, topic, partition, n): grow the log mid-job

    def __call__(self, batch):
        if self.append_on_first:  # in the job's first batch, whichever worker processes it
            try:
                os.close(os.open(os.path.join(self.dir, "appended"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                data_dir, topic, partition, n = self.append_on_first
                with Log(data_dir) as lg:
                    lg.append(topic, partition, [(None, b"late", 0, ())] * n)
        # On the embedded log a batch comes as the log's columns; its records are built from them.
        columns = batch.columns
        assert columns is not None and set(columns) == set(batch.records)
        # Each record's own offset, so a test can tell a contiguous run from a claimed one.
        with open(os.path.join(self.dir, f"{batch.worker.consumer_id}.txt"), "a") as f:
            for tp, recs in batch.records.items():
                assert [r.offset for r in recs] == list(range(recs[0].offset, recs[-1].offset + 1))
                assert (columns[tp][0].base, columns[tp][-1].end) == (recs[0].offset, recs[-1].offset + 1)
                f.write(f"{tp.topic} {tp.partition} {recs[0].offset} {recs[-1].offset + 1}\n")


class Producer:
    """Appends to every partition of ``topic`` in a thread until stopped."""

    def __init__(self, data_dir, topic, partitions, per_round, pause_s=0.02):
        self.args = data_dir, topic, partitions, per_round, pause_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        data_dir, topic, partitions, per_round, pause_s = self.args
        with Log(data_dir) as lg:
            while not self.done.wait(pause_s):
                for p in range(partitions):
                    lg.append(topic, p, [(b"k", b"v", 0, ())] * per_round)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(10)


def seen(directory):
    """Counter of (topic, partition, offset) processed, from RangeRecorder files."""
    out = Counter()
    for path in glob.glob(os.path.join(str(directory), "*.txt")):
        with open(path) as f:
            for line in f:
                t, p, a, b = line.split()
                out.update((t, int(p), o) for o in range(int(a), int(b)))
    return out


def read_output(records_dir):
    """Counter of (topic, partition, offset) in the pipeline's Parquet files, plus keys."""
    import pyarrow.parquet as pq

    offsets, keys = Counter(), Counter()
    for path in glob.glob(os.path.join(records_dir, "topic=*", "partition=*", "*.parquet")):
        table = pq.read_table(path).to_pydict()
        for t, p, o, k, v in zip(table["topic"], table["partition"], table["offset"], table["key"], table["value"]):
            assert v == f"{t}-{p}-{o}".encode()
            offsets[(t, p, o)] += 1
            keys[k] += 1
    return offsets, keys


def expected(topic, partitions, per_partition):
    return {(topic, p, o) for p in range(partitions) for o in range(per_partition)}


def members(zk, group):
    try:
        return zk.get_children(protocol.ids_path(group))
    except Exception:
        return []


# ---------------------------------------------------------------- drain

def test_drain_processes_every_record_once_and_ends(spark, zk, zk_connect, coordinator, data_dir, tmp_path):
    fill(zk, data_dir, "t", 4, 3000)
    out = tmp_path / "seen"
    out.mkdir()
    # The first batch appends 500 records to t-0: after the snapshot, so not drained.
    job = GroupJob(spark, "g", ["t"], RangeRecorder(out, (data_dir, "t", 0, 500)), zk=zk_connect, data_dir=data_dir,
                   workers=2, mode="drain", consumer_config={**WORKER_CONFIG, "max_poll_records": 700})
    summary = job.run()
    got = seen(out)
    assert set(got) == expected("t", 4, 3000)
    assert max(got.values()) == 1
    assert summary.records == 12000 and summary.complete
    assert summary.end_offsets == {f"t-{p}": 3000 for p in range(4)}
    assert summary.committed == {f"t-{p}": 3000 for p in range(4)}  # not 3500: the snapshot bounds the drain
    assert sorted(w.index for w in summary.workers) == [0, 1]
    assert all(w.stop_reason == "drained" and w.attempt == 0 for w in summary.workers)
    assert {p for w in summary.workers for p in w.partitions} == {f"t-{p}" for p in range(4)}
    assert summary.time_to_first_record_s is not None and summary.task_failures == 0
    assert members(zk, "g") == []  # every worker left the group
    assert "drained: yes" in summary.table()
    # A second drain of the same group with nothing new finds nothing to do and ends.
    again = GroupJob(spark, "g", ["t"], RangeRecorder(out), zk=zk_connect, data_dir=data_dir, workers=2,
                     mode="drain").run()
    assert again.records == 500 and again.complete  # the 500 late records, now inside the snapshot


# ---------------------------------------------------------------- failures: exactly-once output

class FailOnce:
    """after_write hook: the first task attempt to finish writing its second batch fails right
    there — its files are in place, its offsets not committed. Once per test (a marker file)."""

    def __init__(self, how, marker):
        self.how, self.marker = how, str(marker)

    def __call__(self, batch):
        ctx = batch.worker
        if ctx.attempt == 0 and ctx.batches == 1:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("injected failure after writing a batch")


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_failed_worker_is_retried_and_output_is_exactly_once(spark, zk, zk_connect, coordinator, data_dir, tmp_path,
                                                             how):
    fill(zk, data_dir, "t", 4, 4000)
    out = tmp_path / "out"
    result = run_pipeline(spark, zk=zk_connect, data_dir=data_dir, group="g", topic="t", out=str(out), workers=2,
                          mode="drain", batch_size=1000, consumer_config=WORKER_CONFIG,
                          after_write=FailOnce(how, tmp_path / "failed"),
                          fsync=False)
    summary = result.summary
    assert summary.task_failures >= 1
    assert (tmp_path / "failed").exists()
    assert any(w.attempt >= 1 for w in summary.workers)  # Spark retried the failed task
    assert summary.complete
    # (worker summaries come from successful attempts only; the output and the progress znodes count the rest)
    assert result.output.written == 16000
    assert summary.records_all_attempts >= summary.records
    offsets, keys = read_output(str(out / "records"))
    assert set(offsets) == expected("t", 4, 4000)
    assert max(offsets.values()) == 1  # ... but written exactly once
    assert result.output.overlaps == 0 and result.output.records == 16000
    assert result.output.counted == 16000 and result.output.distinct_keys == KEYS
    assert not glob.glob(str(out / "records" / "topic=*" / "partition=*" / ".*.tmp"))
    # The per-key counts written by Spark are exact.
    import pyarrow.parquet as pq
    counts = pq.read_table(result.output.counts_dir).to_pydict()
    assert dict(zip(counts["key"], counts["count"])) == dict(keys)
    assert sum(keys.values()) == 16000 and len(keys) == KEYS


class KillOnceReported:
    """process hook: the first attempt to reach its second batch waits (bounded) until its
    progress znode counts what it processed before this batch, while this ``process`` call
    holds its loop; notes that count in <dir>/<consumer id> and SIGKILLs its Python worker.
    Once per test (the note)."""

    def __init__(self, zk_connect, directory):
        self.zk_connect, self.dir = zk_connect, str(directory)

    def __call__(self, batch):
        ctx = batch.worker
        if ctx.attempt != 0 or ctx.batches != 1:
            return
        try:
            os.close(os.open(os.path.join(self.dir, "once"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        from coordinator.zkclient import close_client, start_client
        client = start_client(self.zk_connect)
        path = f"{protocol.spark_progress_path(ctx.run_id)}/{ctx.consumer_id}"
        try:
            wait_for(lambda: client.exists(path) and protocol.decode_spark_progress(
                client.get(path)[0], path).records == ctx.records, 20, message="progress published")
        except Exception:
            pass  # not published: the summary's count says so
        finally:
            close_client(client)
        with open(os.path.join(self.dir, ctx.consumer_id), "w") as f:
            f.write(str(ctx.records))
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_attempts_progress_is_what_it_processed_a_second_before(spark, zk, zk_connect, coordinator,
                                                                          data_dir, tmp_path):
    """A killed attempt counts in ``records_all_attempts`` with what it had processed a second
    before its death, although its loop never came round again: here its second ``process``
    call (of several batches of one poll) holds the loop until the first is in ZooKeeper."""
    fill(zk, data_dir, "t", 2, 3000)
    notes = tmp_path / "notes"
    notes.mkdir()
    job = GroupJob(spark, "gk", ["t"], KillOnceReported(zk_connect, notes), zk=zk_connect, data_dir=data_dir,
                   workers=2, align=500, consumer_config=WORKER_CONFIG)
    summary = job.run()
    (victim,) = set(os.listdir(notes)) - {"once"}
    assert summary.complete and summary.task_failures >= 1
    processed = int((notes / victim).read_text())
    assert processed >= 500 and summary.attempts[victim] == processed
    assert summary.records_all_attempts == summary.records + processed


def always_fail(batch):
    raise ValueError(f"bad record at {batch!r}")


def test_a_job_that_keeps_failing_reports_one_line(spark, zk, zk_connect, coordinator, data_dir):
    fill(zk, data_dir, "t", 1, 100)
    job = GroupJob(spark, "gf", ["t"], always_fail, zk=zk_connect, data_dir=data_dir, workers=1,
                   consumer_config=WORKER_CONFIG)
    with pytest.raises(SparkJobError) as e:
        job.run()
    message = str(e.value)
    assert "\n" not in message
    assert message == ("the Spark job failed: 4 failed worker task attempts within 60 s (at most 3): "
                       "ValueError: bad record at Batch(t-0[0:100))")
    assert read_committed(zk, "gf", [TopicPartition("t", 0)]) == {TopicPartition("t", 0): None}
    wait_for(lambda: members(zk, "gf") == [], 10, message="failed attempts left the group")


# ---------------------------------------------------------------- worker deaths under Spark's task retries

class KillWorker:
    """process hook: SIGKILLs its Python worker (``how="raise"``: raises instead), worker
    ``index`` only unless None, at a batch after its attempt's first while fewer than ``kills``
    markers exist (each kill leaves one) and at least ``spacing_s`` after the last kill. The
    others go slowly (``others_wait_s``) until the kills are done; after them, every batch of
    the victim marks its attempt in ``survivors`` (if given)."""

    def __init__(self, marks, kills, index=None, others_wait_s=0.0, spacing_s=0.0, how="kill", survivors=None):
        self.marks, self.kills, self.index, self.others_wait_s = str(marks), kills, index, others_wait_s
        self.spacing_s, self.how, self.survivors = spacing_s, how, survivors and str(survivors)

    def __call__(self, batch):
        os.makedirs(self.marks, exist_ok=True)
        marks = os.listdir(self.marks)
        if self.index not in (None, batch.worker.index):
            if len(marks) < self.kills:
                time.sleep(self.others_wait_s)  # the others go slowly until the kills are done: work is left for it
            return
        if len(marks) >= self.kills:
            if self.survivors:
                os.makedirs(self.survivors, exist_ok=True)
                open(os.path.join(self.survivors, batch.worker.consumer_id), "w").close()
            return
        if batch.worker.batches >= 1 and self._spaced(marks):
            open(os.path.join(self.marks, batch.worker.consumer_id), "w").close()
            if self.how == "raise":
                raise RuntimeError(f"injected death {len(marks) + 1} of worker {batch.worker.index}")
            os.kill(os.getpid(), signal.SIGKILL)

    def _spaced(self, marks):
        if not self.spacing_s or not marks:
            return True
        last = max(os.path.getmtime(os.path.join(self.marks, m)) for m in marks)
        return time.time() - last >= self.spacing_s


def run_in_thread(job):
    """Start ``job.run()`` in a thread; the dict it returns gets ``summary`` or ``error``."""
    result = {}

    def run():
        try:
            result["summary"] = job.run()
        except Exception as e:
            result["error"] = e

    result["thread"] = threading.Thread(target=run, daemon=True)
    result["thread"].start()
    return result


def test_sessions_zkgroups_builds_record_every_task_end_at_once(spark):
    # With Spark's default 100 ms, a death within 100 ms of its stage's last write is recorded
    # only at the stage's next write, seconds later with the next death: two deaths spaced
    # wider than the budget's window would be counted together and end the job.
    assert spark.sparkContext.getConf().get("spark.ui.liveUpdate.period") == "0ms"


def test_a_stream_survives_worker_deaths_spaced_wider_than_the_budget_under_task_retries(
        spark, zk, zk_connect, coordinator, data_dir, tmp_path):
    # local[2,4]: Spark retries a failed task three times inside the worker's job, as on a
    # cluster. Eight kills of worker 0, each 2.5 s or more after the last, against a budget of
    # one death within 0.5 s: two of its jobs fail after four deaths each and are started
    # again, six deaths are retried by Spark inside a job; each counts when it happens.
    fill(zk, data_dir, "k", 4, 100)
    kills, survivors = tmp_path / "kills", tmp_path / "survivors"
    with Producer(data_dir, "k", 4, 5, pause_s=0.05):
        job = GroupJob(spark, "gk", ["k"], KillWorker(kills, 8, index=0, spacing_s=2.5, survivors=survivors),
                       zk=zk_connect, data_dir=data_dir, workers=2, mode="stream", duration_s=150,
                       max_worker_deaths=1, death_window_s=0.5, consumer_config=WORKER_CONFIG,
                       progress_interval_s=None)
        result = run_in_thread(job)
        wait_for(lambda: len(os.listdir(kills)) == 8 or "error" in result, 120, message="eight kills")
        wait_for(lambda: os.path.isdir(survivors) or "error" in result, 60,
                 message="worker 0 processing after the eighth kill")
        job.request_stop()
        result["thread"].join(60)
    assert "error" not in result, result["error"]
    summary = result["summary"]
    assert summary.task_failures == 8 and summary.restarts == 2
    assert [w.consumer_id.rsplit("-", 3)[1:] for w in sorted(summary.workers, key=lambda w: w.index)] == \
        [["p0", "r2", "a0"], ["p1", "r0", "a0"]]
    assert {w.stop_reason for w in summary.workers} == {"stopped"}
    assert all(summary.committed[f"k-{p}"] > 100 for p in range(4))
    wait_for(lambda: members(zk, "gk") == [], 10, message="every worker left the group")


def test_deaths_closer_than_the_budget_end_a_stream_under_task_retries_in_one_line(
        spark, zk, zk_connect, coordinator, data_dir, tmp_path):
    # Three deaths of worker 0 inside one job that Spark would retry once more (its fourth
    # attempt lives): the third spends a budget of two, and the stream ends then, naming it
    # (the Python error the attempt recorded: Spark's own account comes only if the job fails).
    fill(zk, data_dir, "c", 2, 100)
    with Producer(data_dir, "c", 2, 5, pause_s=0.05):
        job = GroupJob(spark, "gc", ["c"], KillWorker(tmp_path / "kills", 3, index=0, how="raise"),
                       zk=zk_connect, data_dir=data_dir, workers=2, mode="stream", duration_s=60,
                       max_worker_deaths=2, death_window_s=600, consumer_config=WORKER_CONFIG,
                       progress_interval_s=None)
        with pytest.raises(SparkJobError) as e:
            job.run()
    assert str(e.value) == ("the Spark job failed: 3 failed worker task attempts within 600 s (at most 2): "
                            "RuntimeError: injected death 3 of worker 0")
    wait_for(lambda: members(zk, "gc") == [], 10, message="every worker left the group")


def test_pipeline_runs_continue_exactly_once_after_a_lost_commit(spark, zk, zk_connect, coordinator, data_dir,
                                                                 tmp_path, caplog):
    fill(zk, data_dir, "r", 2, 2500)
    out = str(tmp_path / "out")
    opts = dict(zk=zk_connect, data_dir=data_dir, group="gp", topic="r", out=out, workers=2, batch_size=1000,
                consumer_config=WORKER_CONFIG, fsync=False)
    caplog.set_level(logging.INFO, logger="zkgroups.spark.progress")
    stop_file = tmp_path / "STOP"

    def committed(p):
        raw = zk.exists(protocol.offsets_path("gp", "r", p)) and zk.get(protocol.offsets_path("gp", "r", p))[0]
        return int(raw) if raw else 0

    def stop_once_whole_batches_are_committed():  # the tails [2000, 2500) stay partial until the stop
        wait_for(lambda: min(committed(0), committed(1)) >= 2000, 60, message="whole batches committed")
        stop_file.touch()

    stopper = threading.Thread(target=stop_once_whole_batches_are_committed, daemon=True)
    stopper.start()
    first = run_pipeline(spark, mode="stream", duration_s=90, stop_file=str(stop_file), progress_interval_s=0.3,
                         **opts)
    stopper.join(5)
    # The driver logged the run's progress while it ran, from the workers' progress znodes.
    lines = [r.getMessage() for r in caplog.records if r.name == "zkgroups.spark.progress"]
    assert lines and all(f"group gp run {first.summary.run_id}: " in line and "workers up, lag" in line
                         for line in lines), lines
    assert first.summary.committed == {"r-0": 2500, "r-1": 2500}  # the partial batches were flushed on stop
    assert sorted(os.listdir(os.path.join(out, "records", "topic=r", "partition=0")))[-1] == \
        "00000000000000002000-00000000000000002500.parquet"
    # As if the worker had died after writing [2000, 2500) but before committing it.
    for p in range(2):
        zk.set(protocol.offsets_path("gp", "r", p), b"2000")
    with Log(data_dir) as lg:
        for p in range(2):
            lg.append("r", p, [(b"k0", f"r-{p}-{o}".encode(), 0, ()) for o in range(2500, 3600)])
    second = run_pipeline(spark, mode="drain", **opts)
    assert second.summary.complete and second.summary.records == 2 * 1600
    offsets, _ = read_output(os.path.join(out, "records"))
    assert set(offsets) == {("r", p, o) for p in range(2) for o in range(3600)} and max(offsets.values()) == 1
    assert second.output.overlaps == 0 and second.output.counted == 7200
    # [2000, 2500) was redone as it was first cut, then the multiples of 1000 again.
    assert sorted(os.listdir(os.path.join(out, "records", "topic=r", "partition=1")))[-3:] == [
        "00000000000000002000-00000000000000002500.parquet", "00000000000000002500-00000000000000003000.parquet",
        "00000000000000003000-00000000000000003600.parquet"]
    # Spark reads the output as it is, from the root, with its Kafka source's schema.
    df = spark.read.parquet(os.path.join(out, "records"))
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == KAFKA_FIELDS
    assert df.count() == 7200 and df.select("topic", "partition", "offset").distinct().count() == 7200
    assert df.filter("timestampType != 0 OR topic != 'r'").count() == 0
    # The clean end left a manifest of what is in place.
    manifest = json.loads((tmp_path / "out" / "records" / "_SUCCESS").read_text())
    assert manifest["complete"] and manifest["run_id"] == second.summary.run_id
    assert manifest["ranges"] == {"r-0": [[0, 3600]], "r-1": [[0, 3600]]} and manifest["records"] == 7200
    assert second.output.written == 2 * 1100  # new files only: [2000, 2500) was rewritten in place


KAFKA_FIELDS = [("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
                ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int"),
                ("headers", "array<struct<key:string,value:binary>>")]


def test_worker_progress_znodes_round_trip_and_bad_ones_are_one_clear_error():
    progress = protocol.SparkProgress(records=1200, batches=3, lag=None, at=1.5)
    assert protocol.decode_spark_progress(protocol.encode_spark_progress(progress), "/p") == progress
    for raw in (b"", b"[]", b'{"records": "x", "batches": 1, "at": 0}', b'{"batches": 1, "at": 0}'):
        with pytest.raises(CorruptZnode) as e:
            protocol.decode_spark_progress(raw, "/zkgroups-spark/runs/r/progress/w")
        assert "/zkgroups-spark/runs/r/progress/w" in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- stream

def test_stream_stops_on_time_and_commits_what_it_processed(spark, zk, zk_connect, coordinator, data_dir, tmp_path):
    fill(zk, data_dir, "s", 2, 1000)
    out = tmp_path / "seen"
    out.mkdir()
    with Producer(data_dir, "s", 2, 50, pause_s=0.05):
        started = time.monotonic()
        summary = GroupJob(spark, "gs", ["s"], RangeRecorder(out), zk=zk_connect, data_dir=data_dir, workers=2,
                           mode="stream", duration_s=4, align=300, consumer_config=WORKER_CONFIG).run()
    elapsed = time.monotonic() - started
    assert 4 <= elapsed < 4 + 6, elapsed
    assert all(w.stop_reason == "deadline" for w in summary.workers)
    assert all(w.duration_s <= 4 + 1 for w in summary.workers)
    got = seen(out)
    assert max(got.values()) == 1
    # Processed exactly up to the committed offsets (the partial aligned batches were flushed
    # on stop), and new records kept coming in while it ran.
    for p in range(2):
        committed = summary.committed[f"s-{p}"]
        assert {o for (t, q, o) in got if q == p} == set(range(committed))
        assert committed > 1000
    assert members(zk, "gs") == []


def test_stream_stops_on_request_and_on_stop_file(spark, zk, zk_connect, coordinator, data_dir, tmp_path):
    fill(zk, data_dir, "s", 2, 500)
    out = tmp_path / "seen"
    out.mkdir()
    job = GroupJob(spark, "gr", ["s"], RangeRecorder(out), zk=zk_connect, data_dir=data_dir, workers=2,
                   mode="stream", duration_s=60, consumer_config=WORKER_CONFIG)
    result = {}
    runner = threading.Thread(target=lambda: result.update(summary=job.run()), daemon=True)
    runner.start()
    wait_for(lambda: sum(seen(out).values()) == 1000, 30, message="all records processed")
    asked = time.monotonic()
    job.request_stop()
    runner.join(20)
    assert not runner.is_alive() and time.monotonic() - asked < 5
    assert all(w.stop_reason == "stopped" for w in result["summary"].workers)

    stop_file = tmp_path / "STOP"
    job = GroupJob(spark, "gr", ["s"], RangeRecorder(out), zk=zk_connect, data_dir=data_dir, workers=1,
                   mode="stream", duration_s=60, stop_file=str(stop_file), consumer_config=WORKER_CONFIG)
    runner = threading.Thread(target=lambda: result.update(summary=job.run()), daemon=True)
    runner.start()
    wait_for(lambda: members(zk, "gr"), 30, message="worker joined")
    stop_file.write_text("")
    runner.join(20)
    assert not runner.is_alive()
    assert [w.stop_reason for w in result["summary"].workers] == ["stopped"]
    assert result["summary"].records == 0  # the group had committed everything already


# ---------------------------------------------------------------- mixed group

class PidRecorder:
    """A picklable ``process``: writes its Python worker's pid to <dir>/<consumer id>."""

    def __init__(self, directory):
        self.dir = str(directory)

    def __call__(self, batch):
        with open(os.path.join(self.dir, batch.worker.consumer_id), "w") as f:
            f.write(str(os.getpid()))


def test_worker_tasks_leave_their_python_worker_to_be_reused(spark, zk, zk_connect, coordinator, data_dir, tmp_path):
    """pyspark reuses a Python worker only after a task that read its input to the end; a
    worker task that does not costs every worker start a fresh process and its imports. Four
    one-worker jobs in a row on two task slots: some Python worker runs two of them."""
    fill(zk, data_dir, "pid", 1, 10)
    pids = []
    for run in range(4):
        out = tmp_path / f"pids-{run}"
        out.mkdir()
        summary = GroupJob(spark, f"gpid{run}", ["pid"], PidRecorder(out), zk=zk_connect, data_dir=data_dir,
                           workers=1, mode="drain", consumer_config=WORKER_CONFIG).run()
        assert summary.complete and summary.records == 10
        pids += [int((out / name).read_text()) for name in os.listdir(out)]
    assert len(pids) == 4 and len(set(pids)) < 4, pids


def test_spark_workers_and_a_plain_consumer_share_a_group(spark, zk, zk_connect, coordinator, data_dir, tmp_path):
    fill(zk, data_dir, "m", 4, 4000)
    out = tmp_path / "seen"
    out.mkdir()
    plain_seen, plain_partitions = Counter(), set()
    done = threading.Event()
    ready = threading.Event()

    def plain():
        with Consumer("gm", ["m"], zk=zk_connect, data_dir=data_dir, enable_auto_commit=False,
                      auto_offset_reset="earliest", max_poll_records=50, session_timeout_ms=2000) as c:
            while not done.is_set():
                records = c.poll(100)
                for tp, recs in records.items():
                    plain_partitions.add(tp.partition)
                    plain_seen.update(("m", tp.partition, r.offset) for r in recs)
                if records:
                    ready.set()
                    c.commit()
                    time.sleep(0.02)  # a slow consumer: it still holds partitions when Spark joins

    thread = threading.Thread(target=plain, daemon=True)
    thread.start()
    try:
        assert ready.wait(20), "the plain consumer got nothing"
        summary = GroupJob(spark, "gm", ["m"], RangeRecorder(out), zk=zk_connect, data_dir=data_dir, workers=2,
                           mode="drain", consumer_config=WORKER_CONFIG).run()
    finally:
        done.set()
        thread.join(20)
    spark_seen = seen(out)
    assert summary.complete
    assert not set(spark_seen) & set(plain_seen)  # no record was processed by both
    assert max((spark_seen + plain_seen).values()) == 1
    assert set(spark_seen) | set(plain_seen) == expected("m", 4, 4000)
    assert spark_seen and plain_seen
    assert {p for w in summary.workers for p in w.partitions}  # the workers owned partitions
    committed = read_committed(zk, "gm", [TopicPartition("m", p) for p in range(4)])
    assert set(committed.values()) == {4000}


# ---------------------------------------------------------------- guards and the CLI

def test_speculation_is_refused(zk, zk_connect, coordinator, data_dir, subprocess_env, tmp_path):
    from pyspark import SparkConf

    with pytest.raises(SparkJobError, match="spark.speculation is true"):
        check_spark_conf(SparkConf(loadDefaults=False).set("spark.speculation", "true"))
    check_spark_conf(SparkConf(loadDefaults=False).set("spark.speculation", "false"))

    class SpeculatingContext:  # what GroupJob.run reads first
        defaultParallelism = 2

        def getConf(self):
            return {"spark.speculation": "TRUE"}

    fill(zk, data_dir, "t", 1, 10)
    job = GroupJob(SpeculatingContext(), "g", ["t"], print, zk=zk_connect, data_dir=data_dir)
    with pytest.raises(SparkJobError) as e:
        job.run()
    assert "\n" not in str(e.value)
    assert members(zk, "g") == []

    proc = subprocess.run([sys.executable, "-m", "consumer.cli.pipeline", "--zk", zk_connect, "--data-dir", data_dir,
                           "--topic", "t", "--out", str(tmp_path / "out"), "--conf", "spark.speculation=true"],
                          env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: spark.speculation is true: a speculative copy of a worker task would join the group as an extra "
        "member; set spark.speculation=false"]


def test_cli_errors_are_one_line(zk, zk_connect, coordinator, data_dir, subprocess_env, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "consumer.cli.pipeline", "--zk", zk_connect, "--data-dir", data_dir,
                           "--topic", "nope", "--out", str(tmp_path / "out")],
                          env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: topic 'nope' does not exist"


def test_cli_drain_writes_records_and_counts(zk, zk_connect, coordinator, data_dir, subprocess_env, tmp_path):
    fill(zk, data_dir, "c", 3, 2500)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "consumer.cli.pipeline", "--zk", zk_connect, "--data-dir", data_dir,
                           "--group", "cli", "--topic", "c", "--out", str(out), "--workers", "2", "--batch-size", "1000",
                           "--json"],
                          env=subprocess_env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["summary"]["complete"] and report["summary"]["records"] == 7500
    assert report["output"]["counted"] == 7500 and report["output"]["overlaps"] == 0
    assert report["output"]["files"] == 9  # 3 partitions x [0,1000) [1000,2000) [2000,2500)
    offsets, keys = read_output(str(out / "records"))
    assert set(offsets) == expected("c", 3, 2500) and max(offsets.values()) == 1
    # Spark's own log went to <out>/_spark.log: stderr has at most the driver's progress lines
    assert all("zkgroups.spark.progress" in line for line in proc.stderr.splitlines()), proc.stderr[-2000:]
    assert (out / "records" / "_SUCCESS").exists()


def test_cli_stream_stops_cleanly_on_sigterm_and_a_rerun_writes_the_rest_once(zk, zk_connect, coordinator, data_dir,
                                                                               subprocess_env, tmp_path):
    """SIGTERM to a streaming pipeline (as a service manager stops it) stops it after the
    batch in flight, long before its --duration: exit 0 with its summary, nothing written
    twice; a drain afterwards, with more records come meanwhile, writes exactly the rest."""
    fill(zk, data_dir, "sig", 2, 20_000)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "consumer.cli.pipeline", "--zk", zk_connect, "--data-dir", data_dir,
            "--group", "sig", "--topic", "sig", "--out", str(out), "--workers", "2", "--batch-size", "500", "--json"]
    proc = subprocess.Popen(args + ["--mode", "stream", "--duration", "300", "--trigger-interval", "0.5"],
                            env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: read_output(str(out / "records"))[0] or proc.poll() is not None, timeout=120)
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-2000:]
    report = json.loads(stdout)
    assert report["output"]["overlaps"] == 0 and 0 < report["summary"]["records"] <= 40_000
    fill(None, data_dir, "sig", 2, 5_000, first=20_000)  # more records while it was stopped
    rest = subprocess.run(args, env=subprocess_env, capture_output=True, text=True, timeout=150)
    assert rest.returncode == 0, rest.stderr[-2000:]
    assert json.loads(rest.stdout)["summary"]["complete"]
    offsets, _ = read_output(str(out / "records"))
    assert set(offsets) == expected("sig", 2, 25_000) and max(offsets.values()) == 1


def test_spark_submit_runs_the_pipeline_on_its_master(zk, zk_connect, coordinator, data_dir, subprocess_env,
                                                       tmp_path):
    """The pipeline's module as spark-submit's application: the master given to spark-submit is
    the one the job runs on, and the output is exactly once."""
    import pyspark

    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    fill(zk, data_dir, "sub", 2, 1500)
    out = tmp_path / "out"
    env = {**subprocess_env, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("SPARK_MASTER", None)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([submit, "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                           os.path.join(root, "consumer", "cli", "pipeline.py"), "--zk", zk_connect,
                           "--data-dir", data_dir, "--group", "submitted", "--topic", "sub", "--out", str(out),
                           "--workers", "1", "--batch-size", "1000", "--json"],
                          env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["summary"]["master"] == "local[1]"
    assert report["summary"]["complete"] and report["output"]["overlaps"] == 0
    offsets, _ = read_output(str(out / "records"))
    assert set(offsets) == expected("sub", 2, 1500) and max(offsets.values()) == 1


# ---------------------------------------------------------------- TLS to ZooKeeper

@pytest.mark.zk
@pytest.mark.timeout(400)  # a ZooKeeper of its own beside the Spark session: slower than the module's others
def test_a_drain_over_a_tls_only_zookeeper_carries_file_names_only(spark, data_dir, tmp_path):
    """A ZooKeeper with only a TLS port (client certificates required): the driver and both
    workers connect with the job's ``zk_tls``, which reaches the executors as file names (no
    key, no password); a literal key password is refused before anything starts."""
    from coordinator.errors import InvalidConfig
    from coordinator.testing.zkserver import Ensemble, local_classpath
    from coordinator.zkclient import close_client, start_client
    if local_classpath() is None or shutil.which("openssl") is None:
        pytest.skip("needs a local ZooKeeper install and openssl")
    with Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk"), tls=True) as ensemble:
        connect = ensemble.connect + "/spark-tls"
        workers = ensemble.client_tls("spark-workers")
        node = Coordinator(connect, "n1", CoordinatorConfig(session_timeout_ms=2000, rebalance_timeout_ms=10000,
                                                            rebalance_backoff_ms=50, failed_retry_interval_ms=1000,
                                                            zk_tls=ensemble.client_tls("coordinator"))).start()
        client = start_client(connect, tls=workers)
        try:
            fill(client, data_dir, "t", 2, 300)
            out = tmp_path / "seen"
            out.mkdir()
            job = GroupJob(spark, "g", ["t"], RangeRecorder(out), zk=connect, data_dir=data_dir, workers=2,
                           mode="drain", consumer_config={**WORKER_CONFIG, "zk_tls": workers})
            assert job.consumer_config["zk_tls"] == {**workers, "verify_hostname": True}  # names, not contents
            summary = job.run()
            assert summary.complete and summary.records == 600, summary.table()
            assert set(seen(out)) == expected("t", 2, 300)
            assert read_committed(client, "g", [TopicPartition("t", p) for p in range(2)]) == \
                {TopicPartition("t", p): 300 for p in range(2)}
            locked = ensemble.ca.issue("locked", password="s3cret")
            with pytest.raises(InvalidConfig, match="key password as @FILE") as refused:
                GroupJob(spark, "g", ["t"], RangeRecorder(out), zk=connect, data_dir=data_dir, consumer_config={
                    "zk_tls": {"ca": ensemble.ca.cert, "cert": locked.cert, "key": locked.key,
                               "key_password": "s3cret"}})
            assert "s3cret" not in str(refused.value)
        finally:
            close_client(client)
            node.close()
