"""Consumers on the Kafka data plane: a real ZooKeeper, a coordinator, and librdkafka's mock
Kafka cluster (a real Kafka wire-protocol server in its own process).

Topics are created in the mock and registered in ZooKeeper as a Kafka cluster in ZooKeeper mode
writes them (``/brokers/topics``, Kafka's format); records are produced with a plain
confluent-kafka producer placing keys as Java clients do. The fetcher's own tests (librdkafka's
queue read a bounded read at a time, records before a partition's error): ``test_kafka_fetcher.py``.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from consumer import Consumer, ConsumerRecord, TopicPartition
from coordinator import protocol, read
from coordinator.errors import CommitFailedError
from coordinator.topics import TopicRegistry
from tests.support.consumers import consume_until as consume
from tests.support.groups import read_state, wait_stable
from tests.support.helpers import GROUPCTL, check_consumed, wait_for
from tests.consumer.test_consumer import polled

ck = pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.kafka


@pytest.fixture
def topic(zk, kafka_cluster, kafka_topic_name):
    """A 4-partition topic in the mock cluster, registered in ZooKeeper as Kafka would."""
    kafka_cluster.create_topic(kafka_topic_name, 4)
    TopicRegistry(zk).create(kafka_topic_name, 4)
    return kafka_topic_name


def produce(servers, topic, n, start=0, partition=None):
    producer = ck.Producer({"bootstrap.servers": servers, "partitioner": "murmur2_random", "linger.ms": 5})
    for i in range(start, start + n):
        if partition is None:
            producer.produce(topic, b"v%d" % i, key=b"k%d" % i)
        else:
            producer.produce(topic, b"v%d" % i, key=b"k%d" % i, partition=partition)
    assert producer.flush(20) == 0


@pytest.fixture
def consumers(zk_connect, kafka_cluster):
    made = []

    def make(topic, group="g", **config):
        config = {"auto_offset_reset": "earliest", "session_timeout_ms": 3000, **config}
        c = Consumer(group, [topic], zk=zk_connect, bootstrap_servers=kafka_cluster.bootstrap_servers, **config)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def positioned(consumer, partitions: int) -> bool:
    """Whether ``consumer`` owns ``partitions`` partitions and knows where to read each."""
    try:
        return len([consumer.position(tp) for tp in consumer.assignment()]) == partitions
    except Exception:
        return False


def test_everything_once_committed_in_zookeeper_and_copied_to_kafka(cluster, zk, kafka_cluster, topic, consumers):
    cluster.node("n")
    produce(kafka_cluster.bootstrap_servers, topic, 2000)
    c = consumers(topic, kafka_commit_offsets=True)
    got = consume(c, 2000)
    assert len(got) == 2000 and len({(r.partition, r.offset) for r in got}) == 2000
    assert all(r.key == b"k" + r.value[1:] for r in got)
    assert all(isinstance(r, ConsumerRecord) for r in got)
    shipped = pickle.loads(pickle.dumps(got))  # as to a Spark task: plain ConsumerRecords of the same values
    assert shipped == got and {type(r) for r in shipped} == {ConsumerRecord}
    c.commit()
    tps = [TopicPartition(topic, p) for p in range(4)]
    ends = c.end_offsets(tps)
    assert sum(ends.values()) == 2000
    assert {tp: c.committed(tp) for tp in tps} == ends
    plain = ck.Consumer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": "g"})
    try:  # Kafka's own tools see the group's progress
        found = plain.committed([ck.TopicPartition(topic, p) for p in range(4)], timeout=10)
    finally:
        plain.close()
    assert {TopicPartition(k.topic, k.partition): k.offset for k in found} == ends


def test_start_positions_and_offsets_on_kafka(cluster, zk, kafka_cluster, topic, consumers):
    cluster.node("n")
    produce(kafka_cluster.bootstrap_servers, topic, 100, partition=0)
    latest = consumers(topic, group="late", auto_offset_reset="latest")
    wait_for(lambda: not consume(latest, 1, timeout=0.05) and positioned(latest, 4), message="assigned at the end")
    produce(kafka_cluster.bootstrap_servers, topic, 10, start=100, partition=0)
    assert sorted(r.offset for r in consume(latest, 10)) == list(range(100, 110))
    tp = TopicPartition(topic, 0)
    assert latest.beginning_offsets([tp]) == {tp: 0} and latest.end_offsets([tp]) == {tp: 110}
    found = latest.offsets_for_times({tp: 0})[tp]
    assert found is None or found.offset == 0  # the mock answers -1 (no offset) to ListOffsets by time
    fixed = consumers(topic, group="fixed", start_position="earliest")
    assert len(consume(fixed, 110)) == 110
    assert read.committed_offsets(zk, "fixed", [(topic, 0)])[(topic, 0)] == 0  # the start point, fixed at once


def test_seek_pause_resume_and_fair_max_poll_records(cluster, zk, kafka_cluster, topic, consumers):
    cluster.node("n")
    produce(kafka_cluster.bootstrap_servers, topic, 3000, partition=0)  # a backlog on one partition
    for p in (1, 2, 3):
        produce(kafka_cluster.bootstrap_servers, topic, 5, partition=p)
    c = consumers(topic, max_poll_records=100)
    seen = Counter()
    for _ in range(100):
        batch = c.poll(timeout_ms=200)
        assert sum(map(len, batch.values())) <= 100
        for tp, records in batch.items():
            seen[tp.partition] += len(records)
        if all(seen[p] == 5 for p in (1, 2, 3)):
            break
    assert all(seen[p] == 5 for p in (1, 2, 3)), f"small partitions starved behind the backlog: {seen}"
    tp0 = TopicPartition(topic, 0)
    c.pause(tp0)
    assert all(tp != tp0 for tp in c.poll(timeout_ms=300))
    c.seek(tp0, 2990)
    c.resume(tp0)
    assert sorted(r.offset for r in consume(c, 10)) == list(range(2990, 3000))


def test_an_offset_kafka_no_longer_holds_is_reset_as_configured(cluster, zk, kafka_cluster, topic, consumers):
    cluster.node("n")
    produce(kafka_cluster.bootstrap_servers, topic, 50, partition=2)
    c = consumers(topic)
    assert len(consume(c, 50)) == 50
    c.commit()
    tp = TopicPartition(topic, 2)
    c.seek(tp, 10)
    kafka_cluster.delete_records(topic, 2, 40)  # retention, as far as the consumer can tell
    produce(kafka_cluster.bootstrap_servers, topic, 5, start=50, partition=2)
    got = consume(c, 15)  # offset 10 is gone: reset to the earliest held (40)
    assert sorted(r.offset for r in got) == list(range(40, 55))


def test_a_member_that_lost_its_partition_cannot_commit_on_kafka(cluster, zk, zk_connect, kafka_cluster, topic,
                                                                consumers):
    cluster.node("n")
    produce(kafka_cluster.bootstrap_servers, topic, 400)
    a = consumers(topic)
    consume(a, 400)
    a.commit()
    b = consumers(topic)
    wait_for(lambda: polled(a, b) and len(a.assignment()) == 2 and len(b.assignment()) == 2,
             message="a and b share the topic")
    moved = next(iter(b.assignment()))
    b.commit({moved: 3})
    with pytest.raises(CommitFailedError):
        a.commit({moved: 1})
    assert b.committed(moved) == 3


def test_a_broker_down_for_a_while_loses_nothing_and_moves_nothing(cluster, zk, zk_connect, kafka_topic_name):
    """Its own cluster (the shared one must stay whole): a broker leading some partitions goes
    down under a consuming group and a producer, and comes back."""
    from coordinator.testing.kafkamock import MockKafkaCluster
    with MockKafkaCluster(brokers=3) as own:
        own.create_topic(kafka_topic_name, 4)
        TopicRegistry(zk).create(kafka_topic_name, 4)
        cluster.node("n")
        c = Consumer("g", [kafka_topic_name], zk=zk_connect, bootstrap_servers=own.bootstrap_servers,
                     auto_offset_reset="earliest", session_timeout_ms=3000)
        try:
            produce(own.bootstrap_servers, kafka_topic_name, 200)
            assert len(consume(c, 200)) == 200
            generation = wait_stable(zk, "g", 1).generation
            stop = threading.Event()
            sent = []

            writer = threading.Thread(
                target=produce_until, args=(stop, own.bootstrap_servers, kafka_topic_name, sent, 200, 1, 0.002),
                kwargs={"enable.idempotence": True})
            writer.start()
            got = []
            own.broker_down(1)
            deadline = time.monotonic() + 3  # the fault lasts this long while work goes on
            while time.monotonic() < deadline:
                for records in c.poll(timeout_ms=100).values():
                    got.extend(records)
            own.broker_up(1)
            stop.set()
            writer.join()
            got += consume(c, len(sent) - len(got), timeout=30)
            assert sorted(int(r.value[1:]) for r in got) == sorted(sent)
            assert read_state(zk, "g").generation == generation, "a broker outage must not rebalance the group"
        finally:
            c.close()


@pytest.mark.slow
def test_every_record_consumed_on_kafka_through_joins_kills_and_leader_failover(
        zk, zk_connect, kafka_cluster, topic, subprocess_env, tmp_path):
    """groupctl consume processes on Kafka while records keep coming: members join, one is
    SIGKILLed, the leading coordinator is SIGKILLed, one leaves cleanly. Nothing is lost, every
    duplicate was printed by the killed member after its last commit, and the committed offsets
    reach the log end."""
    env = dict(subprocess_env, KAFKA_BOOTSTRAP_SERVERS=kafka_cluster.bootstrap_servers)
    procs = {}

    def start(name, *args):
        with open(tmp_path / f"{name}.out", "w") as out, open(tmp_path / f"{name}.err", "w") as err:
            procs[name] = subprocess.Popen([sys.executable, "-m", *args], env=env, stdout=out, stderr=err)

    def coordinator(name):
        start(name, "consumer.cli.coordinatord", "--zk", zk_connect, "--node-id", name,
              "--session-timeout-ms", "2000", "--rebalance-timeout-ms", "3000")

    def consumer(name):  # sessions of 2 s: short for the test, long enough for a loaded machine
        start(name, *GROUPCTL[2:], "--zk", zk_connect, "consume", "g", topic, "--consumer-id", f"g_{name}",
              "--session-timeout-ms", "2000", "--with-metadata")

    def members():
        return set(read.children(zk, protocol.ids_path("g")))

    def printed(name):
        return (tmp_path / f"{name}.out").read_text().count("\n")

    def stable_with(n):
        s = read_state(zk, "g")
        return s.state == protocol.STABLE and len(s.members) == n == len(members())

    stop = threading.Event()
    sent = []

    writer = threading.Thread(target=produce_until,
                              args=(stop, kafka_cluster.bootstrap_servers, topic, sent, 0, 20, 0.01))
    try:
        coordinator("c1")
        coordinator("c2")
        wait_for(lambda: read.leader(zk), 20, message="a leader")
        writer.start()
        consumer("a")
        consumer("b")
        wait_for(lambda: stable_with(2) and printed("a") and printed("b"), 60, message="a and b consuming")
        consumer("c")
        wait_for(lambda: stable_with(3) and printed("c"), 30, message="c joined and consuming")
        state = read_state(zk, "g")
        windows = {p: read.committed_offsets(zk, "g", [(topic, p)])[(topic, p)] or 0
                   for p, stream in state.assignment[topic].items() if protocol.consumer_of_stream(stream) == "g_c"}
        procs["c"].send_signal(signal.SIGKILL)
        procs["c"].wait()
        wait_for(lambda: "g_c" not in members() and stable_with(2), 30, message="c's partitions moved")
        old = read.leader(zk)
        procs[old.node_id].send_signal(signal.SIGKILL)
        coordinator("c3")
        wait_for(lambda: read.leader(zk) and read.leader(zk).epoch > old.epoch, 30, message="a new leader")
        consumer("d")
        wait_for(lambda: stable_with(3) and printed("d"), 30, message="d joined and consuming")
        procs["b"].send_signal(signal.SIGTERM)
        assert procs["b"].wait(30) == 0
        wait_for(lambda: stable_with(2), 30, message="b left")
        stop.set()
        writer.join()
        ends = log_end_offsets(kafka_cluster.bootstrap_servers, topic)
        wait_for(lambda: all(read.committed_offsets(zk, "g", [(topic, p)])[(topic, p)] == ends[p] for p in ends), 60,
                 message="everything committed")
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert sum(ends.values()) == len(sent) > 500
    check_consumed([tmp_path / f"{name}.out" for name in "abcd"], ends, tmp_path / "c.out", windows)
    for name in ("a", "d"):
        assert procs[name].returncode == 0, (tmp_path / f"{name}.err").read_text()[-2000:]


def produce_until(stop, servers, topic, sent, first, per_round, pause, **props):
    """Produce records b"v<i>" (key b"k<i>") from ``first`` on, ``per_round`` at a time with a
    ``pause`` between rounds, until ``stop`` is set; every i produced is appended to ``sent``."""
    producer = ck.Producer({"bootstrap.servers": servers, "partitioner": "murmur2_random", "linger.ms": 5, **props})
    i = first
    while not stop.is_set():
        for _ in range(per_round):
            producer.produce(topic, b"v%d" % i, key=b"k%d" % i)
            sent.append(i)
            i += 1
        producer.poll(0)
        time.sleep(pause)
    assert producer.flush(30) == 0


def log_end_offsets(servers, topic):
    """{partition: log-end offset} as a plain Kafka client sees them."""
    plain = ck.Consumer({"bootstrap.servers": servers, "group.id": "probe"})
    try:
        return {p: plain.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in range(4)}
    finally:
        plain.close()
