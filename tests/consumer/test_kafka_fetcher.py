"""The fetcher over a librdkafka consumer (:mod:`consumer.dataplane.kafka_fetcher`): it reads
librdkafka's queue itself, a bounded read at a time, and hands out the records fetched before a
partition's error first. Consumers on librdkafka's mock Kafka cluster, a real ZooKeeper and a
coordinator (fixtures of ``test_kafka_consumer.py``)."""
from __future__ import annotations

import time

import pytest

from consumer import TopicPartition
from tests.consumer.test_kafka_consumer import consumers, produce, topic  # noqa: F401 (fixtures)
from tests.support.helpers import wait_for

pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.kafka


def test_poll_reads_librdkafkas_queue_itself_a_bounded_read_at_a_time(cluster, zk, kafka_cluster, topic, consumers):
    """librdkafka reads ahead in its own threads: the fetcher starts no thread of its own, and
    one read moves at most READ_RECORDS records (or max_poll_records) into its buffers, each an
    object the cyclic GC goes over until it is handed out."""
    from consumer.dataplane.kafka_fetcher import READ_RECORDS
    cluster.node("n")
    produce(kafka_cluster.bootstrap_servers, topic, 3 * READ_RECORDS, partition=0)
    c = consumers(topic)
    wait_for(lambda: c.poll(timeout_ms=100, max_records=1), 20, message="the first record")
    taken, most = 1, 0  # one record a poll: librdkafka holds far more than a read's worth meanwhile
    deadline = time.monotonic() + 60
    while taken < 3 * READ_RECORDS and time.monotonic() < deadline:
        taken += sum(map(len, c.poll(timeout_ms=100, max_records=1).values()))
        most = max(most, c._fetcher.buffered())
    assert taken == 3 * READ_RECORDS
    assert most < READ_RECORDS
    assert c._fetcher._thread is None


def test_records_fetched_before_a_partition_error_are_handed_out_first(cluster, zk, kafka_cluster, topic, consumers):
    """librdkafka meets a fetch error for a partition after delivering its records (the client
    may not read the topic any more): poll() returns every record, then raises the error once."""
    from coordinator.errors import FetchFailed
    from coordinator.testing.kafkamock import ApiKey, ErrorCode
    cluster.node("n")
    tp = TopicPartition(topic, 1)
    produce(kafka_cluster.bootstrap_servers, topic, 100, partition=1)
    c = consumers(topic, max_poll_records=1000)
    got = wait_for(lambda: [r.offset for r in c.poll(timeout_ms=100, max_records=1).get(tp, [])], 20,
                   message="the first record")
    # Three times: in about one run in ten a single injected error never reached the client;
    # librdkafka reports a repeated error once while it lasts.
    kafka_cluster.push_partition_errors(topic, 1, ApiKey.FETCH, [ErrorCode.TOPIC_AUTHORIZATION_FAILED] * 3)
    errors = []
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        try:
            got += [r.offset for r in c.poll(timeout_ms=100, max_records=30).get(tp, [])]
        except FetchFailed as e:
            errors.append(e)
    assert got == list(range(100))
    assert len(errors) == 1 and (errors[0].topic, errors[0].partition) == (topic, 1)
    assert "TOPIC_AUTHORIZATION_FAILED" in str(errors[0])
    assert c.poll(timeout_ms=200) == {}  # once
