"""ParallelConsumer on the Kafka data plane (librdkafka's mock cluster, a real ZooKeeper and a
coordinator): key order with many records in flight, the completed set committed with the
offset and read back by the next consumer, a poison record dead-lettered to a Kafka topic."""
from __future__ import annotations

import threading

import pytest

from coordinator import protocol
from coordinator.topics import TopicRegistry
from tests.consumer.test_kafka_consumer import produce
from tests.consumer.test_parallel import Recorder, start
from tests.support.helpers import committed, wait_for

ck = pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.kafka


def test_parallel_consumer_on_kafka(cluster, zk, zk_connect, kafka_cluster, kafka_topic_name):
    from consumer import Consumer, ParallelConsumer, TopicPartition
    cluster.node("n")
    topic, dead = kafka_topic_name, kafka_topic_name + "-dead"
    for name, parts in ((topic, 2), (dead, 1)):
        kafka_cluster.create_topic(name, parts)
        TopicRegistry(zk).create(name, parts)
    produce(kafka_cluster.bootstrap_servers, topic, 200)
    rec, release = Recorder(), threading.Event()
    poison = []

    def fn(record):
        if record.value == b"v7":
            poison.append(record.offset)
            raise ValueError("poison")
        if record.value == b"v11":
            release.wait(30)  # holds its partition's point while the rest finish
        rec(record)

    pc = ParallelConsumer("g", [topic], zk=zk_connect, bootstrap_servers=kafka_cluster.bootstrap_servers,
                          auto_offset_reset="earliest", session_timeout_ms=3000, max_concurrency=16,
                          commit_interval_ms=100, max_attempts=2, retry_backoff_ms=20, dead_letter_topic=dead)
    t, errors = start(pc, fn)
    wait_for(lambda: rec.count() >= 198, 60, message="all but the held record processed")
    with Consumer("ends", [topic], zk=zk_connect, bootstrap_servers=kafka_cluster.bootstrap_servers) as c:
        ends = {tp.partition: o for tp, o in c.end_offsets([TopicPartition(topic, p) for p in range(2)]).items()}
    def completed_above():
        out = {}
        for p in range(2):
            path = protocol.completed_path("g", topic, p)
            out[p] = protocol.decode_completed(zk.get(path)[0], path) if zk.exists(path) else None
        return out
    wait_for(lambda: any(v and v[1] for v in completed_above().values()), 20, message="a completed set committed")
    release.set()
    wait_for(lambda: committed(zk, "g", topic, 2) == ends, 30, message="every partition committed to its end")
    pc.close()
    t.join(30)
    assert not errors
    assert rec.overlaps == 0 and rec.in_key_order() and len(poison) == 2
    assert pc.metrics()["dead_lettered"] == 1
    with Consumer("reader", [dead], zk=zk_connect, bootstrap_servers=kafka_cluster.bootstrap_servers,
                  auto_offset_reset="earliest") as reader:
        got = wait_for(lambda: [r for rs in reader.poll(500).values() for r in rs], 30, message="the dead letter")
    assert got[0].value == b"v7" and dict(got[0].headers)["zkgroups.attempts"] == b"2"
