"""kafka-python's documented usage against zkgroups, changed only as docs/guides/migrating.md
says: iteration that hands records out one at a time (a ``break`` loses nothing), ``with``
blocks left by an exception, kafka-python's keywords and calls. Both data planes: the embedded
log here, Kafka (librdkafka's mock cluster) in the ``kafka`` tests at the end."""
from __future__ import annotations

import json
import time

import pytest

from consumer import (Consumer, OffsetAndMetadata, Producer, RecordDeserializationError, TopicPartition)
from coordinator.errors import InvalidConfig
from tests.support.helpers import committed, fill, wait_for

TP = TopicPartition("t", 0)


@pytest.fixture
def make_consumer(zk_connect, data_dir):
    made = []

    def make(group="g", topics=("t",), **config):
        config.setdefault("auto_offset_reset", "earliest")
        c = Consumer(group, list(topics), zk=zk_connect, data_dir=data_dir, session_timeout_ms=2000, **config)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def offsets_until_break(consumer, stop_after: int):
    """``for message in consumer: ... if done: break`` (kafka-python's README), after ``stop_after`` records."""
    seen = []
    for message in consumer:
        seen.append(message.offset)
        if len(seen) == stop_after:
            break
    return seen


# ---------------------------------------------------------------- iteration is at-least-once

@pytest.fixture
def ten_records(cluster, zk, data_dir):
    """A coordinator and topic t with one partition of ten records: one batch for the first poll."""
    cluster.node("n")
    fill(data_dir, "t", [10], zk=zk)


def test_a_loop_left_by_break_leaves_the_rest_of_the_batch_for_the_next_loop(ten_records, make_consumer):
    c = make_consumer(enable_auto_commit=False)
    assert offsets_until_break(c, 3) == [0, 1, 2]
    assert c.position(TP) == 3
    c.commit()
    assert c.committed(TP) == 3
    assert offsets_until_break(c, 7) == list(range(3, 10))


def test_next_and_poll_after_a_break_hand_out_what_the_loop_did_not(ten_records, make_consumer):
    c = make_consumer(enable_auto_commit=False)
    assert next(c).offset == 0
    assert offsets_until_break(c, 2) == [1, 2]
    assert [r.offset for r in c.poll(timeout_ms=2000)[TP]] == list(range(3, 10))  # given back, not skipped
    assert c.position(TP) == 10


def test_auto_commit_and_close_store_only_what_the_loop_yielded(ten_records, make_consumer, zk):
    c = make_consumer(auto_commit_interval_ms=1)
    assert offsets_until_break(c, 3) == [0, 1, 2]
    c.close()  # auto-commit at close: the position after the last record yielded
    assert committed(zk, "g", "t", 1) == {0: 3}
    again = make_consumer()
    assert offsets_until_break(again, 7) == list(range(3, 10))


def test_a_seek_during_iteration_drops_the_records_held_for_it(ten_records, make_consumer):
    c = make_consumer(enable_auto_commit=False)
    assert next(c).offset == 0
    c.seek(TP, 8)
    assert offsets_until_break(c, 2) == [8, 9]


def test_consumer_timeout_ms_ends_the_iteration(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [5], zk=zk)
    c = make_consumer(consumer_timeout_ms=1500)
    assert [m.offset for m in c] == [0, 1, 2, 3, 4]  # then no record for 1.5 s: StopIteration
    assert list(c) == []  # a new loop waits as long again


def test_leaving_a_with_block_by_an_exception_commits_nothing(cluster, zk, data_dir, make_consumer, zk_connect):
    cluster.node("n")
    fill(data_dir, "t", [10], zk=zk)
    with pytest.raises(RuntimeError, match="processing failed"):
        with Consumer("g", ["t"], zk=zk_connect, data_dir=data_dir, auto_offset_reset="earliest",
                      session_timeout_ms=2000) as c:
            for message in c:
                raise RuntimeError("processing failed")
    assert committed(zk, "g", "t", 1) == {0: None}
    with Consumer("g", ["t"], zk=zk_connect, data_dir=data_dir, auto_offset_reset="earliest",
                  session_timeout_ms=2000) as c:
        assert next(c).offset == 0  # nothing was skipped
    assert committed(zk, "g", "t", 1) == {0: 1}  # a clean exit commits what was handed out


# ---------------------------------------------------------------- kafka-python's keywords and calls

def polled_until_error(consumer, timeout: float = 10.0):
    """(the records ``poll()`` returned, the RecordDeserializationError it then raised)."""
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(records)
        except RecordDeserializationError as e:
            return got, e
    raise AssertionError(f"no RecordDeserializationError within {timeout:g}s (got {len(got)} records)")


def test_deserializers_apply_and_a_failing_record_keeps_its_place(cluster, zk, data_dir, make_consumer, zk_connect):
    cluster.node("n")
    def serialize(value):
        return value if isinstance(value, bytes) else json.dumps(value).encode()
    with Producer(zk_connect, data_dir=data_dir, auto_create_topics=True, value_serializer=serialize,
                  key_serializer=str.encode) as producer:
        for i in range(3):
            producer.send("t", {"n": i}, key=f"k{i}", timestamp_ms=5_000 + i)
        producer.send("t", b"not json", key="bad", timestamp_ms=5_003).get(timeout=10)
    c = make_consumer(value_deserializer=json.loads, key_deserializer=bytes.decode, enable_auto_commit=False)
    first, error = polled_until_error(c)
    assert [(r.key, r.value, r.timestamp) for r in first] == [(f"k{i}", {"n": i}, 5_000 + i) for i in range(3)]
    assert "value_deserializer failed on t-0 at offset 3" in str(error)
    assert c.position(TP) == 3  # its place is kept
    with pytest.raises(RecordDeserializationError):
        next(c)
    assert c.position(TP) == 3
    c.seek(TP, 4)  # skip it, as the error says
    assert c.position(TP) == 4


def test_kafka_python_calls(cluster, zk, data_dir, make_consumer, zk_connect):
    cluster.node("n")
    fill(data_dir, "t", [10, 10], zk=zk, ts=lambda o: 10_000 + 10 * o)
    c = make_consumer(enable_auto_commit=False)
    assert "t" in c.topics() and c.partitions_for_topic("t") == {0, 1}
    assert c.partitions_for_topic("no-such-topic") == set()
    found = c.offsets_for_times({TP: 10_015})[TP]
    assert (found.offset, found.timestamp) == (2, 10_020)  # the found record's timestamp, not the one asked
    wait_for(lambda: c.poll(timeout_ms=200), message="records")
    c.commit({TP: OffsetAndMetadata(4, "ignored")})
    assert c.committed(TP) == 4 and c.committed(TP, metadata=True) == OffsetAndMetadata(4, "", -1)
    seen = []
    future = c.commit_async({TP: 5}, callback=lambda offsets, error: seen.append((offsets, error)))
    assert future.result(10) is None and seen == [({TP: OffsetAndMetadata(5)}, None)]
    metrics = c.metrics()  # without metrics_port: the scrape-time view
    assert metrics["zkgroups_consumer_owned_partitions"] == 2
    assert 'zkgroups_consumer_position{partition="0",topic="t"}' in metrics
    with Producer(zk_connect, data_dir=data_dir) as producer:
        assert producer.partitions_for("t") == {0, 1}
        producer.send("t", b"x", partition=0, timestamp_ms=7).get(timeout=10)
        assert producer.metrics()["records_written_total"] == 1


@pytest.mark.parametrize("config,message", [
    ({"security_protocol": "SSL"}, "'security_protocol' is not taken here: security of Kafka connections: kafka="),
    ({"partition_assignment_strategy": []}, "use assignment_strategy="),
    ({"no_such_key": 1}, "unknown key 'no_such_key'"),
    ({"value_deserializer": "json"}, "value_deserializer must be callable"),
    ({"consumer_timeout_ms": -1}, "consumer_timeout_ms must be a number >= 0"),
])
def test_consumer_keywords_it_does_not_take_are_one_line(config, message):
    with pytest.raises(InvalidConfig, match=message.replace("(", r"\(").replace("[", r"\[")):
        Consumer("g", ["t"], zk="127.0.0.1:1", data_dir="/nonexistent", **config)


@pytest.mark.parametrize("config,message", [
    ({"acks": "all"}, "producer config: 'acks' is not taken here: on Kafka pass librdkafka's property"),
    ({"no_such_key": 1}, "producer config: unknown key 'no_such_key'"),
    ({"linger": 5}, "did you mean 'linger_ms'"),
    ({"value_serializer": "json"}, "value_serializer must be callable"),
])
def test_producer_keywords_it_does_not_take_are_one_line(config, message, tmp_path):
    with pytest.raises(InvalidConfig, match=message):
        Producer("127.0.0.1:1", data_dir=str(tmp_path), **config)
    with pytest.raises(InvalidConfig, match=message):
        Producer(bootstrap_servers="127.0.0.1:1", **config)


# ---------------------------------------------------------------- Kafka


@pytest.mark.kafka
def test_a_loop_left_by_break_loses_nothing_on_kafka(cluster, zk, zk_connect, kafka_cluster, kafka_topic_name):
    pytest.importorskip("confluent_kafka")
    from coordinator.topics import TopicRegistry
    cluster.node("n")
    kafka_cluster.create_topic(kafka_topic_name, 1)
    TopicRegistry(zk).create(kafka_topic_name, 1)
    tp = TopicPartition(kafka_topic_name, 0)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers, value_serializer=str.encode) as producer:
        for i in range(10):
            producer.send(kafka_topic_name, f"v{i}", partition=0)
        producer.flush()

    def member(**config):
        return Consumer("g", [kafka_topic_name], zk=zk_connect, bootstrap_servers=kafka_cluster.bootstrap_servers,
                        auto_offset_reset="earliest", session_timeout_ms=3000, value_deserializer=bytes.decode,
                        **config)
    with member(enable_auto_commit=False) as c:
        assert offsets_until_break(c, 3) == [0, 1, 2]
        assert c.position(tp) == 3
        c.commit()
        assert [m.value for m in (next(c), next(c))] == ["v3", "v4"]
    # close() after the two next(): auto-commit is off, so 3 stays the committed offset
    with member() as again:
        assert offsets_until_break(again, 7) == list(range(3, 10))
    with member() as last:  # the clean exit above committed all ten
        assert last.committed(tp) == 10


def test_a_pattern_matches_whole_topic_names_as_kafkas_java_client(cluster, zk, zk_connect, data_dir):
    from coordinator.topics import TopicRegistry
    cluster.node("n")
    for topic in ("orders", "orders-eu", "old-orders"):
        TopicRegistry(zk).create(topic, 1)
    with Consumer("g", pattern="orders", zk=zk_connect, data_dir=data_dir, session_timeout_ms=2000) as exact, \
            Consumer("h", pattern="orders.*", zk=zk_connect, data_dir=data_dir, session_timeout_ms=2000) as prefix:
        wait_for(lambda: exact.poll(50) == {} and exact.assignment() == {TopicPartition("orders", 0)}
                 and prefix.poll(50) == {} and {tp.topic for tp in prefix.assignment()} == {"orders", "orders-eu"},
                 message="each pattern's topics")
