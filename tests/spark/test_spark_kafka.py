"""Consumer groups on Spark reading Kafka, ``bin/pipeline --bootstrap-servers``, and the live
demo on Kafka.

A real ZooKeeper, librdkafka's mock Kafka cluster (a real Kafka wire-protocol server in its own
process), a coordinator that mirrors the mock's topics into ZooKeeper as it does for a KRaft
cluster, and local Spark (tests/spark/test_spark.py's module session: ``local[2,4]``, a failed task
retried up to 3 times). No data directory is given anywhere: the workers read the brokers.

Records are written in order, one partition at a time, so partition p's record at offset o has
the value ``"<topic>-<p>-<o>"`` (what ``read_output`` checks) and the key ``k<o % KEYS>``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")

from tests.spark.test_spark import KEYS, WORKER_CONFIG, FailOnce, read_output, spark  # noqa: E402,F401 (spark: the session)
from consumer.dataplane.kafka import KafkaDataPlane  # noqa: E402
from consumer.records import TopicPartition  # noqa: E402
from consumer.spark import read_committed, run_pipeline  # noqa: E402
from coordinator import protocol  # noqa: E402
from coordinator.coordinator import Coordinator, CoordinatorConfig  # noqa: E402
from coordinator.errors import EXIT_RETRIABLE  # noqa: E402
from coordinator.testing.zkserver import free_port  # noqa: E402
from tests.support.helpers import assert_one_line_error, wait_for  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.timeout(240)]

PIPELINE = [sys.executable, "-m", "consumer.cli.pipeline"]
BOUND_S = 30  # every refused start ends within this, whatever it waits for


@pytest.fixture
def coordinator(zk_connect, kafka_cluster):
    """A coordinator node mirroring the mock cluster's topics into this test's chroot."""
    node = Coordinator(zk_connect, "n1", CoordinatorConfig(
        session_timeout_ms=2000, rebalance_timeout_ms=3000, rebalance_backoff_ms=50,
        bootstrap_servers=kafka_cluster.bootstrap_servers)).start()
    wait_for(lambda: node.is_leader, 10, message="coordinator leads")
    yield node
    node.close()


class Writer:
    """Writes a topic on Kafka in order: partition p's next record gets offset ``next[p]``."""

    def __init__(self, servers: str, topic: str, partitions: int):
        self.producer = ck.Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 5})
        self.topic = topic
        self.next = [0] * partitions

    def write(self, per_partition: int) -> None:
        for p, start in enumerate(self.next):
            for o in range(start, start + per_partition):
                self.producer.produce(self.topic, f"{self.topic}-{p}-{o}".encode(), f"k{o % KEYS}".encode(),
                                      partition=p)
            self.next[p] += per_partition
        assert self.producer.flush(20) == 0

    def expected(self):
        return {(self.topic, p, o) for p, end in enumerate(self.next) for o in range(end)}


def kafka_topic(kafka_cluster, name: str, partitions: int, per_partition: int) -> Writer:
    kafka_cluster.create_topic(name, partitions)
    writer = Writer(kafka_cluster.bootstrap_servers, name, partitions)
    writer.write(per_partition)
    return writer


def log_end(servers: str, topic: str, partitions: int) -> dict:
    with KafkaDataPlane(servers) as plane:
        return plane.latest_offsets([TopicPartition(topic, p) for p in range(partitions)])


# ---------------------------------------------------------------- the job on Kafka

def test_pipeline_on_kafka_is_exactly_once_with_records_arriving_and_a_worker_killed(
        spark, zk, zk_connect, kafka_cluster, kafka_topic_name, coordinator, tmp_path):
    topic, servers = kafka_topic_name, kafka_cluster.bootstrap_servers
    writer = kafka_topic(kafka_cluster, topic, 4, 3000)
    secret = f"pw-{uuid.uuid4().hex}"
    out = tmp_path / "out"
    options = dict(zk=zk_connect, bootstrap_servers=servers, kafka={"client.id": "etl", "sasl.password": secret},
                   group="gk", topic=topic, out=str(out), workers=2, batch_size=1000,
                   consumer_config=WORKER_CONFIG, fsync=False)
    stop = threading.Event()

    def keep_writing():  # ~400 records/s a partition while the job runs, at most 4000 more each
        while not stop.wait(0.05) and writer.next[0] < 7000:
            writer.write(20)

    producer = threading.Thread(target=keep_writing, daemon=True)
    producer.start()
    try:
        # A worker is SIGKILLed after writing its second batch, before committing it.
        first = run_pipeline(spark, mode="drain", after_write=FailOnce("kill", tmp_path / "killed"), **options)
    finally:
        stop.set()
        producer.join(30)
    summary = first.summary
    assert (tmp_path / "killed").exists() and summary.task_failures >= 1
    assert any(w.attempt >= 1 for w in summary.workers)  # Spark retried the killed task
    assert summary.complete and summary.committed == summary.end_offsets
    snapshot = [summary.end_offsets[f"{topic}-{p}"] for p in range(4)]
    assert min(snapshot) >= 3000
    assert any(end > taken for end, taken in zip(writer.next, snapshot))  # records arrived during the drain

    # Everything written since the snapshot, in a second drain: the group ends at Kafka's log end.
    second = run_pipeline(spark, mode="drain", **options)
    tps = [TopicPartition(topic, p) for p in range(4)]
    ends = log_end(servers, topic, 4)
    assert ends == {tp: writer.next[tp.partition] for tp in tps}
    assert second.summary.complete and second.summary.committed == {str(tp): ends[tp] for tp in tps}
    assert read_committed(zk, "gk", tps) == ends
    offsets, keys = read_output(str(out / "records"))
    assert set(offsets) == writer.expected() and max(offsets.values()) == 1  # every record, exactly once
    assert second.output.overlaps == 0 and second.output.counted == sum(writer.next) == sum(keys.values())
    assert second.output.distinct_keys == KEYS
    # The librdkafka properties went to the executors in the pickled job only.
    conf = spark.sparkContext.getConf().getAll()
    assert not [k for k, v in conf if secret in k or secret in v]
    assert secret not in json.dumps([first.as_dict(), second.as_dict()], default=str) + summary.table()


# ---------------------------------------------------------------- bin/pipeline on Kafka

def test_cli_pipeline_reads_kafka_and_never_shows_the_kafka_properties(
        zk, zk_connect, kafka_cluster, kafka_topic_name, coordinator, subprocess_env, tmp_path):
    topic, servers = kafka_topic_name, kafka_cluster.bootstrap_servers
    writer = kafka_topic(kafka_cluster, topic, 3, 2500)
    coordinator.request_mirror_refresh()
    wait_for(lambda: zk.exists(protocol.topic_path(topic)), 10, message="the topic mirrored")
    secret = f"pw-{uuid.uuid4().hex}"
    config = tmp_path / "kafka.toml"
    config.write_text(f'[kafka]\n"client.id" = "pipeline-test"\n"sasl.password" = "{secret}"\n')
    out = tmp_path / "out"
    proc = subprocess.run([*PIPELINE, "--zk", zk_connect, "--bootstrap-servers", servers, "--kafka-config", str(config),
                           "--group", "cli", "--topic", topic, "--out", str(out), "--workers", "2",
                           "--batch-size", "1000", "--json"],
                          env=subprocess_env, cwd=str(tmp_path), capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not os.path.exists(tmp_path / "data")  # no data directory: the workers read Kafka
    report = json.loads(proc.stdout)
    assert report["summary"]["complete"] and report["summary"]["records"] == 7500
    assert report["summary"]["committed"] == {f"{topic}-{p}": 2500 for p in range(3)}
    assert report["output"]["counted"] == 7500 and report["output"]["overlaps"] == 0
    assert report["output"]["files"] == 9  # 3 partitions x [0,1000) [1000,2000) [2000,2500)
    offsets, _ = read_output(str(out / "records"))
    assert set(offsets) == writer.expected() and max(offsets.values()) == 1
    # Spark's own log went to <out>/_spark.log: stderr has at most the driver's progress lines
    assert all("zkgroups.spark.progress" in line for line in proc.stderr.splitlines()), proc.stderr[-2000:]
    with open(out / "_spark.log") as f:
        spark_log = f.read()
    assert secret not in proc.stdout + proc.stderr + spark_log


def test_cli_bad_kafka_settings_are_one_line_in_bounded_time(kafka_cluster, kafka_topic_name, zk, zk_connect,
                                                             subprocess_env, tmp_path):
    topic, servers = kafka_topic_name, kafka_cluster.bootstrap_servers
    kafka_cluster.create_topic(topic, 1)
    dead = f"127.0.0.1:{free_port()}"
    lonely = tmp_path / "lonely.toml"
    lonely.write_text('"client.id" = "x"\n')
    refused = tmp_path / "refused.toml"
    refused.write_text('"security.protocol" = "sasl_hunter2"\n"sasl.password" = "hunter2"\n')
    cases = [
        (["--bootstrap-servers", "no-port", "--topic", topic], {}, 2, "is not host:port"),
        (["--topic", topic], {"KAFKA_BOOTSTRAP_SERVERS": "not a server list"}, 2, "is not host:port"),
        (["--bootstrap-servers", dead, "--topic", topic], {}, EXIT_RETRIABLE,
         f"Kafka at {dead} did not answer within 1s"),
        (["--topic", topic], {"KAFKA_BOOTSTRAP_SERVERS": dead}, EXIT_RETRIABLE, "did not answer within 1s"),
        (["--bootstrap-servers", servers, "--topic", "missing"], {}, 1, "topic 'missing' does not exist"),
        (["--kafka-config", str(lonely), "--topic", topic], {}, 2, "--kafka-config needs Kafka's brokers"),
        (["--bootstrap-servers", servers, "--kafka-config", str(refused), "--topic", topic], {}, 1,
         "security.protocol"),
    ]
    for args, env, exit_code, said in cases:
        started = time.monotonic()
        proc = subprocess.run([*PIPELINE, "--zk", zk_connect, "--zk-timeout", "1", "--out", str(tmp_path / "out"),
                               *args], env={**subprocess_env, **env}, capture_output=True, text=True, timeout=60)
        assert proc.returncode == exit_code and time.monotonic() - started < BOUND_S, (args, proc.stderr)
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, said)
        assert "hunter2" not in proc.stdout + proc.stderr
    assert not os.path.exists(tmp_path / "out")  # refused before anything was started or written


# ---------------------------------------------------------------- the live demo on Kafka

@pytest.mark.slow
def test_live_demo_on_kafka(subprocess_env):
    """What ``bin/demo --data-plane kafka`` runs after ``bin/setup`` (its own ZooKeeper, mock
    cluster, three coordinatord nodes, consumers, the Spark pipeline): ~40 s here."""
    proc = subprocess.run([sys.executable, "-m", "consumer.cli.demo", "--data-plane", "kafka"],
                          env=subprocess_env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    out = proc.stdout
    for said in ("Kafka: librdkafka's mock cluster, 3 brokers", "the controller mirrored topic demo from Kafka",
                 "consumer-3 joined", "SIGKILL consumer-2", "the node coordinating group", "consumers kept fetching",
                 "missing 0",
                 "== Kafka's log-end offsets", "OK: every produced record was consumed", "reading Kafka",
                 "drained: yes", "(overlapping offsets: 0)", "Spark pipeline done"):
        assert said in out, out
