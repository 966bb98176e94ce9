"""The mock Kafka cluster (coordinator/testing/kafkamock.py and its child, kafkamock_server.py) as the Kafka data plane's tests use it.

Checked: topics made through the mock API are seen by a plain confluent-kafka client in this
process; keyed records produced with ``murmur2_random`` land where Kafka's Java partitioner puts
them and read back completely with ``assign()`` alone; watermarks; a broker down under a producer
and an assigned consumer loses and duplicates nothing; injected OffsetCommit errors reach the
client (or are retried inside librdkafka) and an assign-only consumer never joins a Kafka group;
an injected Fetch error reaches its partition only; an advertised address is what Metadata names;
bad commands are refused while the server keeps serving; the child ends with its parent (close,
SIGKILL); a start-up failure and a missing mock symbol each give one line.
"""
from __future__ import annotations

import collections
import ctypes
import subprocess
import sys
import time

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402

from consumer.hashing import partition_for_key  # noqa: E402
from coordinator.testing import kafkamock_server  # noqa: E402
from coordinator.testing.kafkamock import (ApiKey, ErrorCode, MockKafkaCluster, MockKafkaError,  # noqa: E402
                                           MockKafkaUnavailable)
from tests.support.helpers import wait_for  # noqa: E402

pytestmark = pytest.mark.kafka


@pytest.fixture
def own_cluster():
    """A cluster of this test's own, for faults that must not reach other tests."""
    with MockKafkaCluster(brokers=3) as cluster:
        yield cluster


def make_producer(cluster, **config) -> Producer:
    return Producer({"bootstrap.servers": cluster.bootstrap_servers, "partitioner": "murmur2_random",
                     "linger.ms": 5, "enable.idempotence": True, **config})


def make_assigned_consumer(cluster, topic: str, partitions: int, **config) -> Consumer:
    """A consumer that only assign()s every partition from offset 0: no Kafka group protocol."""
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": f"g-{topic}",
                         "enable.auto.commit": False, "auto.offset.reset": "error", **config})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    return consumer


def records(start: int, stop: int):
    return [(f"key-{i}".encode(), f"value-{i}".encode()) for i in range(start, stop)]


class Reader:
    """Collects (partition, offset, key, value) from a consumer; any error fails the test."""

    def __init__(self, consumer: Consumer):
        self.consumer, self.got = consumer, []

    def drain(self, timeout: float = 0.05) -> int:
        for message in self.consumer.consume(num_messages=1000, timeout=timeout):
            assert message.error() is None, message.error()
            self.got.append((message.partition(), message.offset(), message.key(), message.value()))
        return len(self.got)

    def read_until(self, count: int, timeout: float = 30.0) -> None:
        wait_for(lambda: self.drain() >= count, timeout, interval=0, message=f"{count} records")


def produce_all(producer: Producer, topic: str, batch) -> list:
    """Produce ``batch`` and flush; return the delivery reports as (key, partition)."""
    delivered = []

    def on_delivery(err, message):
        assert err is None, err
        delivered.append((message.key(), message.partition()))

    for key, value in batch:
        producer.produce(topic, value, key, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0
    return delivered


def process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # a zombie has ended; only its parent's wait() is missing


# ---------------------------------------------------------------- data plane


def test_topic_made_through_the_mock_api_is_seen_by_a_client(kafka_cluster, kafka_topic_name):
    kafka_cluster.create_topic(kafka_topic_name, partitions=4)
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": "g"})
    try:
        metadata = consumer.list_topics(kafka_topic_name, timeout=10)
    finally:
        consumer.close()
    assert metadata.topics[kafka_topic_name].error is None
    assert sorted(metadata.topics[kafka_topic_name].partitions) == [0, 1, 2, 3]
    assert sorted(metadata.brokers) == [1, 2, 3]


def test_keyed_records_land_as_with_java_and_read_back_with_assign_only(kafka_cluster, kafka_topic_name):
    kafka_cluster.create_topic(kafka_topic_name, partitions=4)
    batch = records(0, 2000)
    delivered = produce_all(make_producer(kafka_cluster), kafka_topic_name, batch)
    assert all(partition == partition_for_key(key, 4) for key, partition in delivered)

    reader = Reader(make_assigned_consumer(kafka_cluster, kafka_topic_name, 4))
    try:
        reader.read_until(len(batch))
    finally:
        reader.consumer.close()
    assert sorted((key, value) for _, _, key, value in reader.got) == sorted(batch)
    for partition in range(4):
        offsets = [offset for p, offset, _, _ in reader.got if p == partition]
        assert offsets == list(range(len(offsets)))  # in order, no gap
        assert all(partition_for_key(key, 4) == p for p, _, key, _ in reader.got)


def test_watermarks(kafka_cluster, kafka_topic_name):
    kafka_cluster.create_topic(kafka_topic_name, partitions=4)
    delivered = produce_all(make_producer(kafka_cluster), kafka_topic_name, records(0, 500))
    per_partition = collections.Counter(partition for _, partition in delivered)
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": "g"})
    try:
        marks = {p: consumer.get_watermark_offsets(TopicPartition(kafka_topic_name, p), timeout=10)
                 for p in range(4)}
    finally:
        consumer.close()
    assert marks == {p: (0, per_partition[p]) for p in range(4)}


def test_broker_down_under_producer_and_assigned_consumer_loses_and_duplicates_nothing(own_cluster):
    topic, partitions = "orders", 6
    own_cluster.create_topic(topic, partitions, replication_factor=1)
    consumer_errors = []
    producer = make_producer(own_cluster)
    reader = Reader(make_assigned_consumer(own_cluster, topic, partitions, error_cb=consumer_errors.append))
    try:
        metadata = producer.list_topics(topic, timeout=10)
        down = metadata.topics[topic].partitions[0].leader
        down_address = f"{metadata.brokers[down].host}:{metadata.brokers[down].port}"
        produce_all(producer, topic, records(0, 600))
        reader.read_until(600)

        own_cluster.broker_down(down)
        try:
            # The fault lasts a few seconds (past the clients' first reconnect backoffs) while
            # records keep flowing; then it must have been seen by both clients.
            delivery_errors, sent, down_at = [], 600, time.monotonic()
            while time.monotonic() - down_at < 3.0:
                for key, value in records(sent, sent + 10):
                    producer.produce(topic, value, key,
                                     on_delivery=lambda err, _: err and delivery_errors.append(err))
                sent += 10
                producer.poll(0)
                reader.drain()

            def consumer_saw_the_broker_go():
                reader.drain()  # also serves the consumer's error callbacks
                return any(e.code() == KafkaError._TRANSPORT and down_address in e.str() for e in consumer_errors)

            wait_for(consumer_saw_the_broker_go, timeout=10, interval=0, message="the consumer to see the broker go")
            assert len(producer) > 0  # records for the down broker's partitions are waiting
        finally:
            own_cluster.broker_up(down)

        assert producer.flush(30) == 0 and not delivery_errors
        reader.read_until(sent)
    finally:
        reader.consumer.close()
    produced = collections.Counter(records(0, sent))
    read = collections.Counter((key, value) for _, _, key, value in reader.got)
    assert read == produced  # every record exactly once
    assert len(set((p, o) for p, o, _, _ in reader.got)) == sent


def test_injected_offset_commit_errors_and_no_group_protocol(own_cluster):
    topic = "commits"
    own_cluster.create_topic(topic, partitions=1)
    produce_all(make_producer(own_cluster), topic, records(0, 10))
    consumer = make_assigned_consumer(own_cluster, topic, 1)
    own_cluster.start_request_tracking()
    try:
        own_cluster.push_request_errors(ApiKey.OFFSET_COMMIT, [ErrorCode.REBALANCE_IN_PROGRESS])
        with pytest.raises(KafkaException) as raised:
            consumer.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
        assert raised.value.args[0].code() == KafkaError.REBALANCE_IN_PROGRESS

        # Coordinator errors are retried inside librdkafka: the commit succeeds.
        own_cluster.push_request_errors(ApiKey.OFFSET_COMMIT, [ErrorCode.NOT_COORDINATOR])
        consumer.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
        assert consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 7
        tracked = own_cluster.requests()
    finally:
        consumer.close()
    api_keys = collections.Counter(request.api_key for request in tracked)
    assert api_keys[ApiKey.OFFSET_COMMIT] >= 3  # the failed one, the retried one and its retry
    assert all(api_keys[key] == 0 for key in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP,
                                              ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP))
    assert all(1 <= request.broker_id <= 3 for request in tracked)


def test_injected_partition_error_reaches_that_partition_only(kafka_cluster, kafka_topic_name):
    kafka_cluster.create_topic(kafka_topic_name, partitions=2)
    produce_all(make_producer(kafka_cluster), kafka_topic_name, records(0, 100))  # both partitions get some
    kafka_cluster.push_partition_errors(kafka_topic_name, 1, ApiKey.FETCH, [ErrorCode.OFFSET_OUT_OF_RANGE])
    consumer = make_assigned_consumer(kafka_cluster, kafka_topic_name, 2)  # auto.offset.reset=error
    errors, partitions_read = [], set()

    def saw_the_error_and_partition_0():
        for message in consumer.consume(num_messages=100, timeout=0.05):
            if message.error():
                errors.append((message.partition(), message.error().code()))
            else:
                partitions_read.add(message.partition())
        return errors and 0 in partitions_read

    try:
        wait_for(saw_the_error_and_partition_0, timeout=10, interval=0, message="the injected error")
    finally:
        consumer.close()
    assert errors == [(1, KafkaError._AUTO_OFFSET_RESET)]


def test_bad_commands_are_refused_and_the_server_keeps_serving(kafka_cluster, kafka_topic_name):
    kafka_cluster.create_topic(kafka_topic_name, partitions=2)
    with pytest.raises(MockKafkaError, match="TOPIC_ALREADY_EXISTS") as raised:
        kafka_cluster.create_topic(kafka_topic_name, partitions=2)
    assert raised.value.code == 36
    with pytest.raises(MockKafkaError, match="broker must be a broker id"):
        kafka_cluster.set_partition_leader(kafka_topic_name, 0, -1)  # would crash the mock
    with pytest.raises(MockKafkaError, match="partition must be in 0..1"):
        kafka_cluster.set_partition_leader(kafka_topic_name, 2, 1)
    with pytest.raises(MockKafkaError, match="unknown topic"):
        kafka_cluster.push_partition_errors(kafka_topic_name + "-x", 0, ApiKey.FETCH, [ErrorCode.NOT_LEADER_OR_FOLLOWER])
    with pytest.raises(MockKafkaError, match="replication_factor must be in 1..3"):
        kafka_cluster.create_topic(kafka_topic_name + "-x", partitions=1, replication_factor=4)
    with pytest.raises(MockKafkaError, match="bad topic name"):
        kafka_cluster.create_topic("a/b", partitions=1)

    kafka_cluster.set_partition_leader(kafka_topic_name, 1, 3)
    metadata = Consumer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": "g"})
    try:
        wait_for(lambda: metadata.list_topics(kafka_topic_name, timeout=5).topics[kafka_topic_name]
                 .partitions[1].leader == 3, message="the new leader in metadata")
    finally:
        metadata.close()
    kafka_cluster.delete_topic(kafka_topic_name)
    with pytest.raises(MockKafkaError, match="UNKNOWN_TOPIC_OR_PART"):
        kafka_cluster.delete_topic(kafka_topic_name)
    assert kafka_cluster.running


def test_advertised_address_is_what_metadata_names_for_every_broker(own_cluster):
    """What bin/chaos uses for a mock in a network namespace of its own: the brokers keep
    listening on the child's loopback, Metadata names another address with the same ports."""
    ports = own_cluster.ports
    assert len(ports) == 3 and own_cluster.bootstrap_servers == ",".join(f"127.0.0.1:{p}" for p in ports)
    with pytest.raises(MockKafkaError, match="bad host"):
        own_cluster.advertise("a host")
    own_cluster.advertise("localhost")
    assert own_cluster.bootstrap_servers == ",".join(f"localhost:{p}" for p in ports)
    metadata = Consumer({"bootstrap.servers": f"127.0.0.1:{ports[0]}", "group.id": "g"})
    try:
        brokers = metadata.list_topics(timeout=5).brokers
    finally:
        metadata.close()
    assert {b.id: (b.host, b.port) for b in brokers.values()} == {i: ("localhost", p) for i, p in enumerate(ports, 1)}


# ---------------------------------------------------------------- the child process


def test_child_exits_by_itself_when_closed():
    cluster = MockKafkaCluster(brokers=1).start()
    pid = cluster.pid
    cluster.close()
    assert cluster.exit_code == 0  # it saw stdin close; not killed
    assert process_gone(pid)
    with pytest.raises(MockKafkaError, match="closed"):
        cluster.create_topic("late", partitions=1)
    cluster.close()  # a second close is a no-op


PARENT = """
import sys
from coordinator.testing.kafkamock import MockKafkaCluster
cluster = MockKafkaCluster(brokers=1).start()
print(cluster.pid, flush=True)
sys.stdin.read()
"""


def test_child_dies_when_its_parent_is_sigkilled(subprocess_env):
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env=subprocess_env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), parent.stderr.read()
        child = int(line)
        assert not process_gone(child)
    finally:
        parent.kill()
        parent.communicate(timeout=10)
    wait_for(lambda: process_gone(child), timeout=10, message=f"mock server {child} to end")


def test_start_failure_is_one_clear_error(tmp_path, monkeypatch):
    broken = tmp_path / "confluent_kafka"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('simulated broken install')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    cluster = MockKafkaCluster(brokers=1)
    with pytest.raises(MockKafkaUnavailable) as raised:
        cluster.start(timeout=20)
    message = str(raised.value)
    assert "\n" not in message and "did not start" in message and "simulated broken install" in message
    assert cluster.exit_code == 2


def test_missing_mock_symbol_is_one_line(monkeypatch, capsys):
    path = kafkamock_server.find_librdkafka()
    with pytest.raises(MockKafkaUnavailable) as raised:
        kafkamock_server.bind_librdkafka(ctypes.CDLL(path), {"rd_kafka_mock_no_such_function": (None, [])}, path)
    assert "\n" not in str(raised.value) and "rd_kafka_mock_no_such_function" in str(raised.value)

    # The server's own start-up: one line on stderr, exit 2, nothing created.
    monkeypatch.setitem(kafkamock_server.SIGNATURES, "rd_kafka_mock_no_such_function", (None, []))
    monkeypatch.setattr(kafkamock_server, "_die_with_parent", lambda parent_pid: None)  # not for pytest itself
    assert kafkamock_server.main(["--brokers", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("kafkamock: error: ") and "rd_kafka_mock_no_such_function" in err
