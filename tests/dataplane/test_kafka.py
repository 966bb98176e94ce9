"""The Kafka data plane (:mod:`consumer.dataplane.kafka`) on its own, against librdkafka's mock
Kafka cluster: a topic's partitions and their leaders, records appended and read back by
offset (a read past the end out of range), a group's offsets copied for Kafka's tools and read
back. No ZooKeeper, no consumer. (The mock takes no CreateTopics, so ``create_topic`` and
``create_partitions`` are not run here; ``offsets_for_times`` is, on a consumer, in
``tests/consumer/test_kafka_consumer.py``.)"""
from __future__ import annotations

import pytest

from consumer.records import TopicPartition
from coordinator.errors import OffsetOutOfRange, UnknownTopic
from tests.support.helpers import wait_for

pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.kafka


@pytest.fixture
def plane(kafka_cluster):
    from consumer.dataplane.kafka import KafkaDataPlane
    with KafkaDataPlane(kafka_cluster.bootstrap_servers) as p:
        yield p


def topic(kafka_cluster, plane, name, partitions):
    """A topic made in the mock (it takes no CreateTopics), once the plane's metadata shows it."""
    kafka_cluster.create_topic(name, partitions)
    wait_for(lambda: plane.partition_counts([name]).get(name) == partitions, message="the topic")


def test_a_topics_partitions_are_counted_and_each_has_a_leader(kafka_cluster, plane, kafka_topic_name):
    topic(kafka_cluster, plane, kafka_topic_name, 3)
    leaders = plane.partition_leaders(kafka_topic_name)
    assert sorted(leaders) == [0, 1, 2] and all(leader >= 0 for leader in leaders.values())
    with pytest.raises(UnknownTopic):
        plane.partition_leaders(kafka_topic_name + "-none")


def test_records_appended_are_read_back_by_offset_and_a_read_past_the_end_is_out_of_range(kafka_cluster, plane, kafka_topic_name):
    topic(kafka_cluster, plane, kafka_topic_name, 1)
    tp = TopicPartition(kafka_topic_name, 0)
    first = plane.append(tp, [(b"k%d" % i, b"v%d" % i, 10_000 + i, ()) for i in range(5)])
    assert first == 0 and plane.earliest_offsets([tp]) == {tp: 0} and plane.latest_offsets([tp]) == {tp: 5}
    records = plane.fetch(tp, 2, max_records=2)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in records] == [(2, b"k2", b"v2", 10_002),
                                                                        (3, b"k3", b"v3", 10_003)]
    assert plane.fetch(tp, 5) == []  # at the end: nothing yet
    with pytest.raises(OffsetOutOfRange):
        plane.fetch(tp, 9)


def test_a_groups_offsets_copied_to_kafka_read_back_and_none_where_never_committed(kafka_cluster, plane,
                                                                                     kafka_topic_name):
    topic(kafka_cluster, plane, kafka_topic_name, 2)
    t0, t1 = TopicPartition(kafka_topic_name, 0), TopicPartition(kafka_topic_name, 1)
    plane.commit_offsets("g", {t0: 0})
    assert plane.committed_offsets("g", [t0, t1]) == {t0: 0, t1: None}
