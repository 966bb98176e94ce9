"""A share group on Kafka (librdkafka's mock cluster: a real Kafka wire protocol): the same
queue as on the embedded log, records read by offset ranges with assign-only reads, dead
letters produced to a Kafka topic."""
from __future__ import annotations

import pytest

from consumer import AcknowledgeType, Producer, ShareConsumer
from tests.share.conftest import configure, drain, state
from tests.support.helpers import wait_for

pytestmark = [pytest.mark.zk, pytest.mark.kafka]


@pytest.fixture
def kafka_share(cluster, zk, zk_connect, kafka_cluster, kafka_topic_name):
    """A coordinator node, a 2-partition Kafka topic of 20 records (10 per partition), its
    dead-letter topic, and a maker of ShareConsumers on Kafka."""
    pytest.importorskip("confluent_kafka")
    cluster.node("n1")
    cluster.leader()
    topic, dlq = kafka_topic_name, kafka_topic_name + ".dlq"
    kafka_cluster.create_topic(topic, 2)
    kafka_cluster.create_topic(dlq, 1)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers) as producer:
        for i in range(20):
            producer.send(topic, f"v{i}".encode(), key=f"k{i}".encode(), partition=i % 2)
        producer.flush()
    configure(zk, share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq)
    made = []

    def make(**config):
        c = ShareConsumer("q", [topic], zk=zk_connect, bootstrap_servers=kafka_cluster.bootstrap_servers,
                          session_timeout_ms=3000, **config)
        made.append(c)
        return c
    yield topic, dlq, make
    for c in made:
        c.close()


def test_a_rejected_record_is_dead_lettered_in_kafka_with_its_origin(kafka_share, zk, kafka_cluster):
    topic, dlq, make = kafka_share
    c = make(share_acknowledgement_mode="explicit")
    seen = drain(c, 20, timeout=30)
    for r in seen:
        c.acknowledge(r, AcknowledgeType.REJECT if r.value == b"v7" else AcknowledgeType.ACCEPT)
    c.commit_sync()
    assert sorted(r.value for r in seen) == sorted(f"v{i}".encode() for i in range(20))
    wait_for(lambda: c.poll(50) == [] and all(state(zk, topic=topic, partition=p).start == 10 for p in (0, 1)),
             20, message="both partitions done, the letter written")
    (letter,) = _read_all(kafka_cluster, dlq)
    headers = {k: v for k, v in letter.headers}
    assert (letter.key, letter.value) == (b"k7", b"v7")
    assert (headers["zkgroups.dlq.topic"], headers["zkgroups.dlq.partition"], headers["zkgroups.dlq.offset"],
            headers["zkgroups.dlq.reason"]) == (topic.encode(), b"1", b"3", b"rejected")


def test_two_members_on_kafka_get_every_record_once(kafka_share):
    _, _, make = kafka_share
    a, b = make(max_poll_records=3), make(max_poll_records=3)
    seen = []
    wait_for(lambda: seen.extend(a.poll(50) + b.poll(50)) or len(seen) >= 20, 30, message="every record")
    assert sorted(r.value for r in seen) == sorted(f"v{i}".encode() for i in range(20)), \
        sorted((r.partition, r.offset, r.delivery_count) for r in seen)
    assert {r.delivery_count for r in seen} == {1}


def _read_all(kafka_cluster, topic):
    from consumer.dataplane import open_data_plane
    from consumer.records import TopicPartition
    with open_data_plane(bootstrap_servers=kafka_cluster.bootstrap_servers) as plane:
        return plane.fetch(TopicPartition(topic, 0), 0, max_records=100)
