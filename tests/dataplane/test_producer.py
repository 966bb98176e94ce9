"""The producer: Kafka-compatible key hashing, partition choice, batching, topics in ZooKeeper."""
from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter

import pytest

from consumer.hashing import murmur2, partition_for_key
from consumer.log import Log
from consumer.producer import Producer
from coordinator.errors import IllegalStateError, InvalidConfig, InvalidPartitions, UnknownTopic
from coordinator.topics import TopicRegistry
from tests.support.helpers import start_together, wait_for


def read_partition(data_dir: str, topic: str, partition: int):
    with Log(data_dir) as log:
        out, offset = [], 0
        while True:
            batch = log.fetch(topic, partition, offset, max_records=100_000)
            if not batch:
                return out
            out += batch
            offset = batch[-1].offset + 1


# ---------------------------------------------------------------- hashing

# From Kafka's UtilsTest.testMurmur2 (signed 32-bit results).
KAFKA_MURMUR2 = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
                 b"a-little-bit-longer-string": -1486304829,
                 b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}
# Partitions Kafka's default partitioner picks among 1000 (as checked by kafka-python's tests).
KAFKA_PARTITION_OF_1000 = {b"": 681, b"a": 524, b"ab": 434, b"abc": 107, b"123456789": 566, b"\x00 ": 742}


@pytest.mark.parametrize("key, expected", KAFKA_MURMUR2.items())
def test_murmur2_matches_kafka(key, expected):
    assert murmur2(key) == expected


@pytest.mark.parametrize("key, expected", KAFKA_PARTITION_OF_1000.items())
def test_default_partitioner_matches_kafka(key, expected):
    assert partition_for_key(key, 1000) == expected


def test_key_partitions_are_the_same_in_another_process_and_spread_evenly(subprocess_env):
    keys = [b"user-%d" % i for i in range(8000)]
    here = [partition_for_key(k, 8) for k in keys]
    script = ("from consumer.hashing import partition_for_key\n"
              "print(','.join(str(partition_for_key(b'user-%d' % i, 8)) for i in range(8000)))")
    env = dict(subprocess_env, PYTHONHASHSEED="12345")
    there = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert [int(p) for p in there.stdout.strip().split(",")] == here
    counts = Counter(here)
    assert set(counts) == set(range(8)) and max(counts.values()) < 1.15 * min(counts.values())


# ---------------------------------------------------------------- partition choice and batching

def test_sent_records_land_where_expected(zk, data_dir):
    TopicRegistry(zk).create("t", 3)
    with Producer(zk, data_dir) as producer:
        for i in range(30):
            producer.send("t", b"k%d" % i, key=b"key-%d" % (i % 5), timestamp=1_000 + i, headers=[("n", b"%d" % i)])
        for i in range(300):
            producer.send("t", b"free-%d" % i)
        producer.send("t", b"pinned", key=b"key-0", partition=2)
        producer.flush()
    partitions = {p: read_partition(data_dir, "t", p) for p in range(3)}
    assert sum(map(len, partitions.values())) == 331
    for p, records in partitions.items():
        assert [r.offset for r in records] == list(range(len(records)))
        for r in records:
            if r.key is not None and r.value != b"pinned":
                assert partition_for_key(r.key, 3) == p
                assert r.headers == (("n", r.value[1:]),) and r.timestamp == 1_000 + int(r.value[1:])
        free = [int(r.value[5:]) for r in records if r.value.startswith(b"free-")]
        assert len(free) == 100 and free == sorted(free)  # round robin, in send order
    assert partitions[2][-1].value == b"pinned"


def test_explicit_partition_is_checked_against_the_registry(zk, data_dir):
    TopicRegistry(zk).create("t", 3)
    with Producer(zk, data_dir) as producer:
        for bad in (3, -1, True, "1"):
            with pytest.raises(InvalidPartitions, match="does not exist"):
                producer.send("t", b"v", partition=bad)
        producer.send("t", b"v", partition=2)
    assert [r.value for r in read_partition(data_dir, "t", 2)] == [b"v"]


def test_unknown_topic_and_auto_create(zk, data_dir):
    with Producer(zk, data_dir) as producer:
        with pytest.raises(UnknownTopic):
            producer.send("missing", b"v")
    assert TopicRegistry(zk).list() == []
    with Producer(zk, data_dir, auto_create_topics=True, auto_create_partitions=4) as producer:
        producer.send("created", b"v")
    assert TopicRegistry(zk).partitions("created") == 4


def test_bad_values_and_config(zk, data_dir):
    TopicRegistry(zk).create("t", 1)
    with Producer(zk, data_dir) as producer:
        with pytest.raises(TypeError, match="value must be bytes"):
            producer.send("t", "text")
        with pytest.raises(TypeError, match="key must be bytes"):
            producer.send("t", b"v", key=42)
        with pytest.raises(TypeError, match="headers must be"):
            producer.send("t", b"v", headers=[("h", "text")])
        with pytest.raises(TypeError, match="timestamp must be"):
            producer.send("t", b"v", timestamp=1.5)
        producer.send("t", bytearray(b"ok"), key=memoryview(b"k"))
    assert [(r.key, r.value) for r in read_partition(data_dir, "t", 0)] == [(b"k", b"ok")]
    with pytest.raises(InvalidConfig):
        Producer(zk, data_dir, batch_size=0)


def test_linger_writes_without_a_flush(zk, data_dir):
    TopicRegistry(zk).create("t", 1)
    with Producer(zk, data_dir, linger_ms=20) as producer, Log(data_dir) as log:
        producer.send("t", b"v")
        wait_for(lambda: log.latest_offset("t", 0) == 1, timeout=5, message="the lingering record")


def test_full_batches_are_written_at_once(zk, data_dir):
    TopicRegistry(zk).create("t", 1)
    with Producer(zk, data_dir, linger_ms=60_000, batch_size=10) as producer, Log(data_dir) as log:
        for i in range(25):
            producer.send("t", b"%d" % i)
        assert log.latest_offset("t", 0) == 20  # two full batches; five still buffered
        producer.flush()
        assert log.latest_offset("t", 0) == 25


def test_added_partitions_get_used(zk, data_dir):
    registry = TopicRegistry(zk)
    registry.create("t", 1)
    with Producer(zk, data_dir, metadata_max_age_ms=50) as producer:
        for _ in range(10):
            producer.send("t", b"before")
        registry.add_partitions("t", 3)
        producer.send("t", b"pinned", partition=2)  # an unknown partition triggers a refresh at once

        def spread():
            for _ in range(10):
                producer.send("t", b"after")
            producer.flush()
            return len(read_partition(data_dir, "t", 1)) > 0
        wait_for(spread, timeout=10, message="round robin to use the new partitions")
    assert {r.value for r in read_partition(data_dir, "t", 0)} >= {b"before"}
    assert read_partition(data_dir, "t", 2)[0].value == b"pinned"


def test_close_flushes_and_later_sends_fail(zk, data_dir):
    TopicRegistry(zk).create("t", 1)
    producer = Producer(zk, data_dir, linger_ms=60_000)
    producer.send("t", b"v")
    producer.close()
    assert len(read_partition(data_dir, "t", 0)) == 1
    with pytest.raises(IllegalStateError):
        producer.send("t", b"v")
    producer.close()  # idempotent


class SlowLog:
    """A log whose appends wait until the test lets them go."""

    def __init__(self):
        self.appending, self.release, self.records = threading.Event(), threading.Event(), []

    def append(self, topic, partition, records):
        self.appending.set()
        assert self.release.wait(10)
        self.records += records
        return 0


def test_close_while_the_linger_thread_writes_does_not_hang(zk):
    TopicRegistry(zk).create("t", 1)
    log = SlowLog()
    producer = Producer(zk, log=log, linger_ms=1)
    producer.send("t", b"first")
    assert log.appending.wait(5)  # the linger thread is inside its write
    closer = threading.Thread(target=producer.close)
    closer.start()
    log.release.set()
    closer.join(10)
    assert not closer.is_alive()
    assert [r[1] for r in log.records] == [b"first"]


def test_close_never_hangs_whatever_the_linger_thread_is_doing(zk):
    # Regression: a close() that crossed the linger thread's write could leave the thread
    # waiting for a wake-up that had already been consumed, and close() joined it forever.
    TopicRegistry(zk).create("t", 1)
    log = SlowLog()
    log.release.set()
    for i in range(200):
        producer = Producer(zk, log=log, linger_ms=1, metadata_max_age_ms=60_000)
        log.appending.clear()
        producer.send("t", b"%d" % i)
        if i % 2:  # half the time close right after the linger thread wrote, else at once
            assert log.appending.wait(5)
        closer = threading.Thread(target=producer.close)
        closer.start()
        closer.join(10)
        assert not closer.is_alive(), f"close() hung in round {i}"
    assert len(log.records) == 200


@pytest.mark.parametrize("futures", [True, False])
def test_a_failed_write_is_reported(zk, data_dir, futures):
    TopicRegistry(zk).create("t", 1)
    log = Log(data_dir)
    producer = Producer(zk, log=log, linger_ms=60_000, futures=futures)
    assert (producer.send("t", b"v") is None) is not futures
    log.close()
    with pytest.raises(IllegalStateError, match="log is closed"):
        producer.flush()


def test_without_futures_records_land_as_with_them(zk, data_dir):
    TopicRegistry(zk).create("t", 2)
    with Producer(zk, data_dir, batch_size=7, futures=False) as producer:
        assert {producer.send("t", b"v%d" % i, partition=i % 2) for i in range(30)} == {None}
    with Log(data_dir) as log:
        assert [r.value for r in log.fetch("t", 0, 0, max_records=100)] == [b"v%d" % i for i in range(0, 30, 2)]


# ---------------------------------------------------------------- futures

def test_futures_tell_where_each_record_landed(zk, data_dir):
    TopicRegistry(zk).create("t", 3)
    with Producer(zk, data_dir, batch_size=7) as producer:  # several batches per partition
        keyed = [producer.send("t", b"k%d" % i, key=b"key-%d" % i, timestamp=5_000 + i) for i in range(40)]
        free = [producer.send("t", b"free-%d" % i) for i in range(60)]
        pinned = producer.send("t", b"pinned", partition=1)
        producer.flush()
    partitions = {p: read_partition(data_dir, "t", p) for p in range(3)}
    for i, future in enumerate(keyed):
        metadata = future.get(0)
        assert (metadata.topic, metadata.partition) == ("t", partition_for_key(b"key-%d" % i, 3))
        assert metadata.timestamp == 5_000 + i
        assert partitions[metadata.partition][metadata.offset].value == b"k%d" % i
    for i, future in enumerate(free):
        metadata = future.get(0)
        assert partitions[metadata.partition][metadata.offset].value == b"free-%d" % i
    assert pinned.get(0).partition == 1
    assert partitions[1][pinned.get(0).offset].value == b"pinned"
    every = [f.get(0) for f in keyed + free + [pinned]]
    assert len({(m.partition, m.offset) for m in every}) == len(every) == 101


def test_futures_resolve_when_their_batch_is_written(zk, data_dir):
    TopicRegistry(zk).create("t", 1)
    with Producer(zk, data_dir, linger_ms=60_000, batch_size=10) as producer:
        futures = [producer.send("t", b"%d" % i) for i in range(25)]
        assert all(f.is_done for f in futures[:20]) and not any(f.is_done for f in futures[20:])
        assert [f.get(0).offset for f in futures[:20]] == list(range(20))
        seen, done = [], []
        futures[22].add_callback(seen.append).add_errback(seen.append).add_done_callback(done.append)
        assert seen == [] and repr(futures[22]) == "<FutureRecordMetadata pending>"
        with pytest.raises(TimeoutError):
            futures[24].get(timeout=0.05)
        with pytest.raises(TimeoutError):
            futures[24].exception(timeout=0.05)
        waiter = threading.Thread(target=lambda: seen.append(("waited", futures[24].get(10).offset)))
        waiter.start()
        producer.flush()
        waiter.join(10)
        assert not waiter.is_alive()
        assert ("waited", 24) in seen and futures[22].get(0) in seen and done == [futures[22]]
        assert futures[22].succeeded() and not futures[22].failed() and futures[22].exception() is None
        late = []
        futures[0].add_callback(late.append)  # already resolved: runs at once, in the caller
        assert late == [futures[0].get()]


def test_a_failed_write_fails_its_futures(zk, data_dir):
    TopicRegistry(zk).create("t", 1)
    log = Log(data_dir)
    producer = Producer(zk, log=log, linger_ms=60_000)
    future = producer.send("t", b"v")
    errors = []
    future.add_errback(errors.append).add_callback(lambda m: errors.append("success?"))
    log.close()
    with pytest.raises(IllegalStateError):
        producer.flush()
    assert future.failed() and isinstance(future.exception(), IllegalStateError)
    with pytest.raises(IllegalStateError, match="log is closed"):
        future.get()
    assert len(errors) == 1 and isinstance(errors[0], IllegalStateError)
    producer.close()


def test_a_callback_that_raises_is_logged_and_the_others_still_run(zk, data_dir, caplog):
    TopicRegistry(zk).create("t", 1)
    with Producer(zk, data_dir, linger_ms=60_000) as producer:
        future = producer.send("t", b"v")
        ran = []
        future.add_callback(lambda m: 1 / 0).add_callback(ran.append)
    assert ran == [future.get()] and "a callback of a sent record failed" in caplog.text


# ---------------------------------------------------------------- two processes

PRODUCER = """
import sys
from consumer.producer import Producer
from coordinator.zkclient import close_client, start_client
connect, data_dir, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
zk = start_client(connect)
with Producer(zk, data_dir, batch_size=500) as producer:
    producer.send("shared", b"%s-start" % name.encode())  # topic metadata loaded, log open
    print("ready", flush=True)
    sys.stdin.readline()  # both start together
    for i in range(count):
        producer.send("shared", b"%s-%d" % (name.encode(), i))
close_client(zk)
"""


def test_two_producer_processes_on_one_topic(zk, zk_connect, data_dir, subprocess_env):
    TopicRegistry(zk).create("shared", 2)
    count = 30_000
    start_together(PRODUCER, [(zk_connect, data_dir, name, str(count)) for name in ("a", "b")], subprocess_env)
    seen, switches = Counter(), 0
    for p in range(2):
        records = read_partition(data_dir, "shared", p)
        assert [r.offset for r in records] == list(range(len(records)))  # dense
        writers = [r.value[:1] for r in records if not r.value.endswith(b"-start")]
        switches += sum(a != b for a, b in zip(writers, writers[1:]))
        for name in (b"a", b"b"):
            mine = [int(r.value.split(b"-")[1]) for r in records
                    if r.value.startswith(name + b"-") and not r.value.endswith(b"-start")]
            assert mine == sorted(mine)  # each producer's order kept within a partition
            seen.update({name: len(mine)})
    assert seen == {b"a": count, b"b": count}
    assert switches > 2  # the two really wrote at the same time


def test_zk_may_be_a_connect_string_or_a_client_and_nothing_else(zk, zk_connect, data_dir):
    from consumer import InvalidConfig
    TopicRegistry(zk).create("s", 1)
    with Producer(zk_connect, data_dir=data_dir) as producer:  # its own client, closed with it
        producer.send("s", b"x")
    client = producer._client
    assert not client.connected
    with Producer(zk, data_dir=data_dir) as producer:  # a shared client stays open
        producer.send("s", b"y")
    assert zk.connected
    with pytest.raises(InvalidConfig, match="connect string or a started kazoo client"):
        Producer(42, data_dir=data_dir)
