"""The batch path, ``Consumer.poll_batch()``: librdkafka's own messages on Kafka, the log's
Columns on the embedded log — with poll()'s fairness, positions, commits, pause and seek, and
mixed with poll() without losing or repeating a record."""
from __future__ import annotations

import pytest

from consumer import Consumer, TopicPartition
from tests.consumer.test_kafka_consumer import consumers, produce, topic  # noqa: F401 (fixtures)
from tests.support.helpers import fill, wait_for

ck = pytest.importorskip("confluent_kafka")


def batch_offsets(consumer, count, max_records=None, timeout=30.0):
    """Offsets {partition: [...]} of ``count`` messages taken by poll_batch (Kafka's Messages)."""
    got = {}
    wait_for(lambda: [got.setdefault(tp.partition, []).extend(m.offset() for m in messages)
                      for tp, messages in consumer.poll_batch(100, max_records).items()] is not None
             and sum(map(len, got.values())) >= count, timeout, message=f"{count} messages")
    return got


@pytest.mark.kafka
def test_poll_batch_on_kafka_hands_out_messages_fairly_with_positions_and_commits(cluster, kafka_cluster, topic,
                                                                                   consumers):
    cluster.node("n")
    produce(kafka_cluster.bootstrap_servers, topic, 2000, partition=0)   # a backlog on one partition
    for p in (1, 2, 3):
        produce(kafka_cluster.bootstrap_servers, topic, 5, partition=p)
    c = consumers(topic, max_poll_records=100)
    wait_for(lambda: len(c.assignment()) == 4, 20, message="all four partitions")
    seen = {}
    for _ in range(100):
        batch = c.poll_batch(timeout_ms=200)
        assert sum(map(len, batch.values())) <= 100
        for tp, messages in batch.items():
            assert all(isinstance(m, ck.Message) and m.error() is None for m in messages)
            seen.setdefault(tp.partition, []).extend(m.offset() for m in messages)
        if all(len(seen.get(p, ())) == 5 for p in (1, 2, 3)):
            break
    assert all(seen[p] == [0, 1, 2, 3, 4] for p in (1, 2, 3)), "small partitions starved behind the backlog"
    tp0 = TopicPartition(topic, 0)
    assert c.position(tp0) == len(seen.get(0, []))
    c.commit()
    assert c.committed(tp0) == c.position(tp0)
    c.seek(tp0, 1990)   # positions, seek and poll() mixed with the batch path
    records = [r for r in c.poll(timeout_ms=2000).get(tp0, [])]
    assert records and records[0].offset == 1990
    rest = batch_offsets(c, 10 - len(records))
    assert [r.offset for r in records] + rest.get(0, []) == list(range(1990, 2000))


@pytest.mark.zk
def test_poll_batch_on_the_embedded_log_is_poll_columns(cluster, zk, zk_connect, data_dir):
    cluster.node("n")
    fill(data_dir, "t", [30], zk=zk)
    with Consumer("g", ["t"], zk=zk_connect, data_dir=data_dir, auto_offset_reset="earliest",
                  session_timeout_ms=2000, max_poll_records=20) as c:
        got = []
        wait_for(lambda: got.extend(c.poll_batch(200).get(TopicPartition("t", 0), [])) or
                 sum(col.count for col in got) >= 30, 20, message="30 records in columns")
        assert [r.offset for col in got for r in col.records("t", 0)] == list(range(30))
        assert c.position(TopicPartition("t", 0)) == 30
