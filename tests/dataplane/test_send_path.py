"""consumer/send_path.py: ``Producer.send_many`` (the batch path) on both data planes, and ``send``'s fast
path on Kafka.

Checked: a batch lands whole and in order in each partition (keys where Java's partitioner puts
them, an explicit partition for all, keyless records spread), its futures tell each record's
offset in order, and without futures it returns None; bad input (a value or key that is not
bytes, keys and values of different lengths) is one TypeError naming the first bad record, and
nothing of the batch is sent; errors once sending started (the producer closed, an unknown
topic or partition) carry ``sent``; kafka-python's serializers apply to a batch.

``send``'s fast path (Kafka, a topic it has sent to): after a topic is known, bad values, keys,
timestamps and headers still get their one line; a failed delivery is still raised once by the
next send although the sends before it took the fast path; after ``close`` a send raises
IllegalStateError.
"""
from __future__ import annotations

import gc

import json
import time

import pytest

from consumer.hashing import partition_for_key
from consumer.log import Log
from consumer.producer import DeliveryFailed, Producer
from coordinator.errors import IllegalStateError, InvalidPartitions, UnknownTopic
from coordinator.topics import TopicRegistry
from tests.support.helpers import wait_for

INVALID_RECORD = 87  # a Kafka error librdkafka does not retry


def read_kafka(cluster, topic: str, partitions: int, expected: int) -> dict:
    """{partition: [(key, value), ...] in offset order} of ``topic``."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "reader",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
    got, count = {p: {} for p in range(partitions)}, [0]
    try:
        def drain():
            for message in consumer.consume(1000, timeout=0.1):
                assert message.error() is None, message.error()
                got[message.partition()][message.offset()] = (message.key(), message.value())
                count[0] += 1
            return count[0] >= expected
        wait_for(drain, timeout=30, message=f"{expected} records")
    finally:
        consumer.close()
    return {p: [records[o] for o in sorted(records)] for p, records in got.items()}


def read_log(data_dir: str, topic: str, partition: int) -> list:
    with Log(data_dir) as log:
        return [(r.key, r.value) for r in log.fetch(topic, partition, 0, max_records=100_000)]


# ---------------------------------------------------------------- Kafka

@pytest.mark.kafka
def test_a_batch_lands_in_order_and_its_futures_tell_each_offset(kafka_cluster, kafka_topic_name):
    topic, partitions = kafka_topic_name, 3
    kafka_cluster.create_topic(topic, partitions)
    keys = [b"user-%d" % (i % 7) for i in range(2500)]  # more than SERVE_EVERY: several chunks
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers) as producer:
        keyed = producer.send_many(topic, [b"k%d" % i for i in range(2500)], keys=keys)
        pinned = producer.send_many(topic, (b"p%d" % i for i in range(1200)), partition=2)  # any iterable
        free = producer.send_many(topic, [bytearray(b"free-%d" % i) for i in range(300)])
        assert producer.send_many(topic, []) == []
        producer.flush()
    assert len(keyed) == 2500 and len(pinned) == 1200 and len(free) == 300
    stored = read_kafka(kafka_cluster, topic, partitions, 4000)
    called = []
    keyed[0].add_callback(called.append)
    assert called == [keyed[0].get(0)] and keyed[0].succeeded()
    for i, future in enumerate(keyed):
        metadata = future.get(0)
        assert metadata.topic == topic and metadata.timestamp > 0
        assert metadata.partition == partition_for_key(keys[i], partitions)
        assert stored[metadata.partition][metadata.offset] == (keys[i], b"k%d" % i)
    offsets = [f.get(0).offset for f in pinned]
    assert {f.get(0).partition for f in pinned} == {2} and offsets == sorted(offsets)
    assert [v for k, v in stored[2] if v.startswith(b"p")] == [b"p%d" % i for i in range(1200)]
    assert sorted(v for p in stored.values() for k, v in p if k is None and v.startswith(b"free")) == \
        sorted(b"free-%d" % i for i in range(300))
    for partition in stored.values():  # records of one key in the order they were given
        for key in set(keys):
            mine = [int(v[1:]) for k, v in partition if k == key]
            assert mine == sorted(mine)
    # the caller keeps a batch's futures: each keeps where its record landed, not librdkafka's
    # message (a copy of its key and value)
    kept = {type(o).__name__ for f in keyed[:50] + free[:50] for o in gc.get_referents(f)}
    assert "Message" not in kept, kept


@pytest.mark.kafka
def test_a_batch_without_futures_returns_none_and_lands_whole(kafka_cluster, kafka_topic_name):
    kafka_cluster.create_topic(kafka_topic_name, 1)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers, futures=False) as producer:
        assert producer.send_many(kafka_topic_name, [b"v%d" % i for i in range(3000)]) is None
        producer.send(kafka_topic_name, b"after")
    stored = read_kafka(kafka_cluster, kafka_topic_name, 1, 3001)
    assert [v for _, v in stored[0]] == [b"v%d" % i for i in range(3000)] + [b"after"]


@pytest.mark.kafka
@pytest.mark.parametrize("futures", [True, False])
def test_bad_input_in_a_batch_is_one_line_and_nothing_is_sent(kafka_cluster, kafka_topic_name, futures):
    topic = kafka_topic_name
    kafka_cluster.create_topic(topic, 1)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers, futures=futures) as producer:
        with pytest.raises(TypeError, match=r"^values\[2\] must be bytes, got str$"):
            producer.send_many(topic, [b"a", b"b", "c", 4])
        with pytest.raises(TypeError, match=r"^keys\[1\] must be bytes, got int$"):
            producer.send_many(topic, [b"a", b"b"], keys=[b"k", 1])
        with pytest.raises(TypeError, match=r"^send_many: 1 keys for 2 values$"):
            producer.send_many(topic, [b"a", b"b"], keys=[b"k"])
        with pytest.raises(UnknownTopic) as unknown:
            producer.send_many(topic + "-missing", [b"a"])
        with pytest.raises(InvalidPartitions, match="does not exist") as invalid:
            producer.send_many(topic, [b"a"], partition=1)
        assert unknown.value.sent == invalid.value.sent == 0
        producer.send(topic, b"only")
    assert read_kafka(kafka_cluster, topic, 1, 1) == {0: [(None, b"only")]}
    with pytest.raises(IllegalStateError, match="closed") as closed:
        producer.send_many(topic, [b"a"])
    assert closed.value.sent == 0


@pytest.mark.kafka
def test_a_batch_goes_through_the_serializers(kafka_cluster, kafka_topic_name):
    kafka_cluster.create_topic(kafka_topic_name, 1)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers, value_serializer=lambda v: json.dumps(v).encode(),
                  key_serializer=str.encode) as producer:
        futures = producer.send_many(kafka_topic_name, [{"n": 1}, {"n": 2}], keys=["a", None])
        producer.flush()
    assert [f.get(0).offset for f in futures] == [0, 1]
    assert read_kafka(kafka_cluster, kafka_topic_name, 1, 2) == {0: [(b"a", b'{"n": 1}'), (None, b'{"n": 2}')]}


@pytest.mark.kafka
def test_the_fast_path_keeps_every_check_of_send(kafka_cluster, kafka_topic_name):
    """Once a topic is known (its sends take the fast path), bad input is refused as before."""
    kafka_cluster.create_topic(kafka_topic_name, 2)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers) as producer:
        first = producer.send(kafka_topic_name, b"known")
        with pytest.raises(TypeError, match="value must be bytes, got str"):
            producer.send(kafka_topic_name, "text")
        with pytest.raises(TypeError, match="value must be bytes, got NoneType"):
            producer.send(kafka_topic_name, None)
        with pytest.raises(TypeError, match="key must be bytes, got int"):
            producer.send(kafka_topic_name, b"v", key=1)
        with pytest.raises(TypeError, match="timestamp must be"):
            producer.send(kafka_topic_name, b"v", timestamp_ms=1.5)
        with pytest.raises(TypeError, match="headers must be"):
            producer.send(kafka_topic_name, b"v", headers=[("h", 1)])
        with pytest.raises(InvalidPartitions):
            producer.send(kafka_topic_name, b"v", partition=2)
        converted = producer.send(kafka_topic_name, memoryview(b"view"), key=bytearray(b"k"))
        stamped = producer.send(kafka_topic_name, b"v", timestamp=1_700_000_000_000, headers=[("h", b"1")])
        producer.flush()
        assert first.get(0).topic == kafka_topic_name and converted.succeeded() and stamped.succeeded()
    with pytest.raises(IllegalStateError):
        producer.send(kafka_topic_name, b"after close")


@pytest.mark.kafka
def test_a_failed_delivery_is_raised_once_by_the_next_send_after_fast_sends(kafka_cluster, kafka_topic_name):
    """``futures=False``, sends on the fast path (a key, no partition): the refused record's
    failure reaches the producer (the idle thread serves it) and the next send raises it once,
    without sending its record. The refused record is alone on partition 0 (the mock fails its
    whole batch); the others' key puts them on partition 1."""
    topic = kafka_topic_name
    kafka_cluster.create_topic(topic, 2)
    key = next(b"k%d" % i for i in range(100) if partition_for_key(b"k%d" % i, 2) == 1)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers, futures=False) as producer:
        producer.send(topic, b"warm", key=key)
        producer.flush()
        kafka_cluster.push_partition_errors(topic, 0, 0, [INVALID_RECORD])  # 0: Produce
        producer.send(topic, b"refused", partition=0)
        sent, deadline = [], time.monotonic() + 20
        with pytest.raises(DeliveryFailed, match=f"for {topic}-0 was not delivered"):
            while time.monotonic() < deadline:  # fails (not raised) after 20 s
                value = b"s%d" % len(sent)
                producer.send(topic, value, key=key)
                sent.append(value)
                time.sleep(0.01)
        producer.send(topic, b"after", key=key)  # raised once
        producer.flush()
    stored = read_kafka(kafka_cluster, topic, 2, len(sent) + 2)
    assert stored[0] == [] and [v for _, v in stored[1]] == [b"warm"] + sent + [b"after"]


# ---------------------------------------------------------------- the embedded log

def test_a_batch_on_the_embedded_log_lands_in_order_with_its_offsets(zk, data_dir):
    TopicRegistry(zk).create("t", 2)
    with Producer(zk, data_dir=data_dir) as producer:
        futures = producer.send_many("t", [b"v%d" % i for i in range(500)], partition=1)
        keyed = producer.send_many("t", [b"a", b"b"], keys=[b"x", b"x"])
        with pytest.raises(TypeError, match=r"^values\[1\] must be bytes, got int$"):
            producer.send_many("t", [b"ok", 1])
        with pytest.raises(InvalidPartitions) as invalid:
            producer.send_many("t", [b"ok"], partition=2)
        assert invalid.value.sent == 0
        producer.flush()
    assert [f.get(0).offset for f in futures] == list(range(500))
    assert read_log(data_dir, "t", 1)[:500] == [(None, b"v%d" % i) for i in range(500)]
    where = partition_for_key(b"x", 2)
    assert [f.get(0).partition for f in keyed] == [where, where]
    assert [v for k, v in read_log(data_dir, "t", where) if k == b"x"] == [b"a", b"b"]
    with Producer(zk, data_dir=data_dir, futures=False) as producer:
        assert producer.send_many("t", [b"w"], partition=0) is None
    assert read_log(data_dir, "t", 0)[-1] == (None, b"w")
