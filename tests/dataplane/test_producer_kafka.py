"""The producer on Kafka (librdkafka's mock cluster): futures, key placement, failures.

Checked: every future tells the partition and offset its record has in Kafka (read back with a
plain confluent-kafka consumer); keys land where Kafka's Java partitioner puts them
(``consumer.hashing.partition_for_key``); a future is resolved by ``get()`` alone, and callbacks
run without ``flush`` (the idle thread); a record Kafka refuses fails its future, its errback
and, once, ``flush`` (without futures: ``flush`` or the next ``send``, once); records still
pending when the producer is closed with a timeout fail their futures (without futures,
``close`` raises once); unknown topics and partitions are refused at ``send``; the data plane
follows ``KAFKA_BOOTSTRAP_SERVERS`` as ``open_data_plane`` does; a configuration librdkafka
refuses is one line that does not show the value.

The mock reports a LogAppendTime of 1234 for every record, so ``RecordMetadata.timestamp`` is
1234 here (real brokers report the record's CreateTime unless the topic uses LogAppendTime).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")

from consumer.compiled import COMPILED, extensions_disabled  # noqa: E402
from consumer.hashing import partition_for_key  # noqa: E402
from consumer.producer import DeliveryFailed, FutureRecordMetadata, Producer  # noqa: E402
from coordinator.errors import IllegalStateError, InvalidConfig, InvalidPartitions, UnknownTopic  # noqa: E402
from coordinator.testing.kafkamock import ALL_BROKERS, ApiKey, MockKafkaCluster  # noqa: E402
from coordinator.topics import TopicRegistry  # noqa: E402
from tests.support.helpers import wait_for  # noqa: E402

pytestmark = pytest.mark.kafka

INVALID_RECORD = 87  # a Kafka error librdkafka does not retry


def read_back(cluster, topic: str, partitions: int, expected: int) -> dict:
    """{(partition, offset): (key, value)} of ``topic``, read with a plain assign()ing consumer."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "reader",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
    got = {}
    try:
        def drain():
            for message in consumer.consume(1000, timeout=0.1):
                assert message.error() is None, message.error()
                got[(message.partition(), message.offset())] = (message.key(), message.value())
            return len(got) >= expected
        wait_for(drain, timeout=30, message=f"{expected} records")
    finally:
        consumer.close()
    return got


def test_futures_tell_where_records_landed_and_keys_land_where_java_puts_them(kafka_cluster, kafka_topic_name):
    topic, partitions = kafka_topic_name, 7
    kafka_cluster.create_topic(topic, partitions)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers) as producer:
        keyed = [producer.send(topic, b"k%d" % i, key=b"user-%d" % i) for i in range(2000)]
        free = [producer.send(topic, b"free-%d" % i) for i in range(300)]
        pinned = producer.send(topic, b"pinned", key=b"user-0", partition=6, headers=[("h", b"1")])
        producer.flush()
    assert all(isinstance(f, FutureRecordMetadata) and f.succeeded() for f in keyed + free + [pinned])
    stored = read_back(kafka_cluster, topic, partitions, 2301)
    assert len(stored) == 2301
    for i, future in enumerate(keyed):
        metadata = future.get(0)
        assert (metadata.topic, metadata.partition) == (topic, partition_for_key(b"user-%d" % i, partitions))
        assert stored[(metadata.partition, metadata.offset)] == (b"user-%d" % i, b"k%d" % i)
    for i, future in enumerate(free):
        metadata = future.get(0)
        assert stored[(metadata.partition, metadata.offset)] == (None, b"free-%d" % i)
    assert pinned.get(0).partition == 6 and stored[(6, pinned.get(0).offset)] == (b"user-0", b"pinned")


def test_get_alone_resolves_a_future_and_callbacks_run_without_flush(kafka_cluster, kafka_topic_name):
    kafka_cluster.create_topic(kafka_topic_name, 2)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers, linger_ms=1) as producer:
        first = producer.send(kafka_topic_name, b"a", partition=1)
        assert first.get(timeout=10).partition == 1  # served by get() itself
        seen = []
        producer.send(kafka_topic_name, b"b", partition=1).add_callback(seen.append)
        wait_for(lambda: seen, timeout=10, message="the callback (served by the idle thread)")
        assert seen[0].offset == first.get().offset + 1


def test_a_record_kafka_refuses_fails_its_future_its_errback_and_flush_once(kafka_cluster, kafka_topic_name):
    topic = kafka_topic_name
    kafka_cluster.create_topic(topic, 2)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers) as producer:
        producer.send(topic, b"warm", partition=0).get(10)
        kafka_cluster.push_partition_errors(topic, 0, ApiKey.PRODUCE, [INVALID_RECORD])
        refused, errors = producer.send(topic, b"refused", partition=0), []
        refused.add_errback(errors.append).add_callback(lambda m: errors.append("success?"))
        with pytest.raises(DeliveryFailed, match=f"for {topic}-0 was not delivered: .*failed to validate record"):
            producer.flush()
        producer.flush()  # raised once
        assert refused.failed() and not refused.exception().retriable
        with pytest.raises(DeliveryFailed):
            refused.get()
        assert errors == [refused.exception()]
        assert producer.send(topic, b"fine", partition=0).get(10).partition == 0  # the producer goes on


def test_without_futures_a_refused_record_is_raised_once_and_the_rest_is_written(kafka_cluster, kafka_topic_name):
    """``futures=False``: no result per record (librdkafka reports failures only); a failed
    delivery is raised once, and flush still returns only once the rest is written."""
    topic = kafka_topic_name
    kafka_cluster.create_topic(topic, 2)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers, futures=False) as producer:
        assert producer.send(topic, b"warm", partition=0) is None
        producer.flush()
        kafka_cluster.push_partition_errors(topic, 0, ApiKey.PRODUCE, [INVALID_RECORD])
        producer.send(topic, b"refused", partition=0)
        for i in range(500):
            producer.send(topic, b"v%d" % i, partition=1)
        with pytest.raises(DeliveryFailed, match=f"for {topic}-0 was not delivered: .*failed to validate record"):
            producer.flush()
        producer.flush()  # raised once
        producer.send(topic, b"after", partition=0)
    stored = read_back(kafka_cluster, topic, 2, 502)
    assert sorted(v for _, v in stored.values()) == sorted([b"warm", b"after"] + [b"v%d" % i for i in range(500)])


def test_without_futures_a_failed_delivery_is_raised_once_by_the_next_send(kafka_cluster, kafka_topic_name):
    """The failure reaches the producer with nobody flushing (the idle thread serves reports):
    the next send raises it, without sending its record; the sends after it go on."""
    topic = kafka_topic_name
    kafka_cluster.create_topic(topic, 2)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers, futures=False) as producer:
        producer.send(topic, b"warm", partition=0)
        producer.flush()
        kafka_cluster.push_partition_errors(topic, 0, ApiKey.PRODUCE, [INVALID_RECORD])
        producer.send(topic, b"refused", partition=0)
        sent, raised = [], []

        def send_until_raised():
            value = b"s%d" % len(sent)
            try:
                producer.send(topic, value, partition=1)
            except DeliveryFailed as e:
                raised.append(e)
                return True
            sent.append(value)
            return False
        wait_for(send_until_raised, timeout=20, interval=0.01, message="a send raising the failed delivery")
        assert f"for {topic}-0 was not delivered" in str(raised[0])
        producer.send(topic, b"after", partition=1)  # raised once
        producer.flush()
    stored = read_back(kafka_cluster, topic, 2, len(sent) + 2)
    assert sorted(v for _, v in stored.values()) == sorted([b"warm", b"after"] + sent)


@pytest.mark.parametrize("futures", [True, False])
def test_records_pending_at_close_fail_their_futures(kafka_topic_name, futures):
    """A broker down: close() with a timeout raises once that records were not delivered, with
    futures or without (each future failing too)."""
    with MockKafkaCluster(brokers=1) as cluster:
        cluster.create_topic(kafka_topic_name, 1)
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, futures=futures)
        producer.send(kafka_topic_name, b"before")
        producer.flush(10)
        cluster.broker_down(ALL_BROKERS)
        pending = [producer.send(kafka_topic_name, b"pending-%d" % i) for i in range(5)]
        with pytest.raises(DeliveryFailed, match="closed before it was delivered"):
            producer.close(timeout=0.5)
        assert all(isinstance(f.exception(0), DeliveryFailed) for f in pending) if futures else pending == [None] * 5
        with pytest.raises(IllegalStateError):
            producer.send(kafka_topic_name, b"after")
        producer.close()  # idempotent


def test_unknown_topics_and_partitions_are_refused_at_send(kafka_cluster, kafka_topic_name):
    kafka_cluster.create_topic(kafka_topic_name, 3)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers) as producer:
        with pytest.raises(UnknownTopic):
            producer.send(kafka_topic_name + "-missing", b"v")
        for bad in (3, -1, True, "1"):
            with pytest.raises(InvalidPartitions, match="does not exist"):
                producer.send(kafka_topic_name, b"v", partition=bad)
        with pytest.raises(TypeError, match="value must be bytes"):
            producer.send(kafka_topic_name, "text")
        with pytest.raises(TypeError, match="timestamp must be"):
            producer.send(kafka_topic_name, b"v", timestamp=1.5)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers, auto_create_topics=True) as producer:
        made = producer.send(kafka_topic_name + "-made", b"v").get(10)  # the brokers create it
    assert made.topic == kafka_topic_name + "-made"


def test_the_data_plane_follows_the_environment(kafka_cluster, kafka_topic_name, zk, data_dir, monkeypatch):
    kafka_cluster.create_topic(kafka_topic_name, 1)
    TopicRegistry(zk).create(kafka_topic_name, 1)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_cluster.bootstrap_servers)
    with Producer() as producer:  # Kafka: no zk, no data_dir needed
        on_kafka = producer.send(kafka_topic_name, b"v").get(10)
    with Producer(zk, data_dir=data_dir, bootstrap_servers="") as producer:  # "": the embedded log
        embedded = producer.send(kafka_topic_name, b"v").get(10)
    assert on_kafka.timestamp == 1234 and embedded.timestamp != 1234  # the mock's LogAppendTime
    with pytest.raises(InvalidConfig, match="fsync: settings of the embedded log"):
        Producer(fsync="always")


def test_a_configuration_librdkafka_refuses_is_one_line_without_the_value(kafka_cluster):
    with pytest.raises(InvalidConfig) as refused:
        Producer(bootstrap_servers=kafka_cluster.bootstrap_servers,
                 kafka={"security.protocol": "hunter2-not-a-protocol"})
    assert "security.protocol" in str(refused.value) and "hunter2" not in str(refused.value)
    with pytest.raises(InvalidConfig, match="set by zkgroups"):
        Producer(bootstrap_servers=kafka_cluster.bootstrap_servers, kafka={"bootstrap.servers": "x:1"})


# ---------------------------------------------------------------- the compiled and the pure-Python send

def test_send_is_the_compiled_fast_path_unless_serializers_stand_in_front(kafka_cluster):
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers) as plain, \
            Producer(bootstrap_servers=kafka_cluster.bootstrap_servers, value_serializer=str.encode) as serializing:
        assert (type(plain.send).__name__ == "FastSend") is COMPILED
        assert type(serializing.send).__name__ == "function"


@pytest.mark.skipif(extensions_disabled(), reason="this is that run")
def test_the_pure_python_send_path_passes_the_same_tests():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, ZKGROUPS_NO_EXTENSIONS="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           os.path.join(here, "test_send_path.py"), __file__],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
