"""The Consumer API against a real ZooKeeper, a running coordinator and the embedded log.

What chiefly exercises one of the Consumer's parts is in the test file named after that part:
``test_hand_out.py``, ``test_commits.py``, ``test_partition_changes.py``, ``test_poll_interval.py``,
``test_streams.py`` (the member's: ``test_claims.py``, ``test_channel.py``, ``test_offsets.py``, ...)."""
from __future__ import annotations

import os
import struct
import json
import threading
import time

import pytest

from coordinator import protocol
from coordinator.errors import InvalidConfig
from coordinator.topics import TopicRegistry
from consumer import Consumer, TopicPartition
from consumer.log import Log
from consumer.joining import GroupDirectories
# Fixtures, and helpers test_kafka_consumer.py imports from here.
from tests.support.consumers import LostRecorder, consume_until, make_consumer, own_zookeeper, polled  # noqa: F401
from tests.support.groups import read_state
from tests.support.helpers import fill, freeze_until_dropped, wait_for


def test_consumes_everything_once_and_commits(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [200] * 3, zk=zk)
    c = make_consumer()
    got = consume_until(c, 600)
    assert len(got) == 600 and len({(r.partition, r.offset) for r in got}) == 600
    c.commit()
    for p in range(3):
        assert c.committed(TopicPartition("t", p)) == 200
        assert zk.get(protocol.offsets_path("g", "t", p))[0] == b"200"


def test_max_poll_records_and_fairness_under_a_backlog(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    TopicRegistry(zk).create("t", 4)
    log = Log(data_dir)
    log.append("t", 0, [(None, b"x", 1, ())] * 50_000)  # a large backlog on one partition
    for p in (1, 2, 3):
        log.append("t", p, [(None, b"y", 1, ())] * 20)
    log.close()
    c = make_consumer(max_poll_records=100)
    seen = set()
    polls = 0
    while seen != {0, 1, 2, 3} and polls < 60:
        batch = c.poll(timeout_ms=200)
        assert sum(len(r) for r in batch.values()) <= 100
        seen |= {tp.partition for tp in batch}
        polls += 1
    assert seen == {0, 1, 2, 3}, f"starved partitions after {polls} polls"


def test_pause_resume_and_seek(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [50] * 2, zk=zk)
    c = make_consumer()
    wait_for(lambda: polled(c) and len(c.assignment()) == 2, message="assigned")
    p0, p1 = TopicPartition("t", 0), TopicPartition("t", 1)
    c.seek(p0, 0)
    c.seek(p1, 0)
    c.pause(p0)
    assert c.paused() == {p0}
    got = consume_until(c, 50, timeout=3)
    assert {r.partition for r in got} == {1}
    c.resume(p0)
    got = consume_until(c, 50)
    assert {r.partition for r in got} == {0} and got[0].offset == 0
    c.seek(p0, 40)
    got = consume_until(c, 10)
    assert [r.offset for r in got] == list(range(40, 50))


def test_unknown_config_key_is_rejected(zk_connect, data_dir):
    with pytest.raises(InvalidConfig, match="max_poll_record"):
        Consumer("g", ["t"], zk=zk_connect, data_dir=data_dir, max_poll_record=5)


def test_close_commits_and_leaves(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [30] * 2, zk=zk)
    c = make_consumer()
    consume_until(c, 60)
    cid = c.consumer_id
    c.close()
    assert not zk.exists(protocol.ids_path("g", cid))
    assert [zk.get(protocol.offsets_path("g", "t", p))[0] for p in range(2)] == [b"30", b"30"]
    assert not zk.get_children(protocol.owners_path("g", "t"))
    wait_for(lambda: read_state(zk, "g").state == protocol.EMPTY, message="group empty")


def test_config_from_toml_and_environment(cluster, zk, zk_connect, data_dir, tmp_path, monkeypatch):
    cluster.node("n")
    fill(data_dir, "t", [10] * 1, zk=zk)
    path = tmp_path / "consumer.toml"
    path.write_text(f'[consumer]\nzk = "{zk_connect}"\ndata_dir = "{data_dir}"\nauto_offset_reset = "earliest"\n'
                    "max_poll_records = 3\n")
    with Consumer.from_config(str(path), "g", ["t"]) as c:
        got = consume_until(c, 3)
        assert len(got) == 3
    monkeypatch.setenv("ZK_CONNECT", zk_connect)
    monkeypatch.setenv("ZKGROUPS_DATA_DIR", data_dir)
    with Consumer("g2", ["t"], auto_offset_reset="earliest") as c:
        assert len(consume_until(c, 10)) == 10
    path.write_text("[consumer]\nmax_poll_recs = 3\n")
    with pytest.raises(InvalidConfig, match="max_poll_recs"):
        Consumer.from_config(str(path), "g", ["t"])


def test_close_with_zookeeper_gone_does_not_hang(own_zookeeper, data_dir):
    """A consumer and a coordinator closed while ZooKeeper is down finish closing: the consumer
    waits one session timeout for it, reports its partitions lost, and leaves by session end."""
    ens, zk, cluster = own_zookeeper
    fill(data_dir, "t", [5] * 2, zk=zk)
    listener = LostRecorder()
    consumer = Consumer("g", ["t"], zk=ens.connect, data_dir=data_dir, session_timeout_ms=2000,
                        auto_offset_reset="earliest", listener=listener)
    assert len(consume_until(consumer, 10)) == 10
    ens.servers[0].kill()
    wait_for(lambda: not consumer.group_metadata().connected, message="the consumer notices")
    closing = threading.Thread(target=lambda: (consumer.close(), cluster.close()), daemon=True)
    closing.start()
    closing.join(30)
    assert not closing.is_alive(), "close() hangs while ZooKeeper is down"
    assert listener.lost == [{TopicPartition("t", 0), TopicPartition("t", 1)}]


def test_a_connection_lost_while_the_consumer_joins_is_waited_out(own_zookeeper, data_dir, monkeypatch):
    """The consumer has connected; then, as it joins its group, ZooKeeper stops answering until
    the client drops the connection (as when it loses its quorum). The constructor waits for
    the connection, joins, and the consumer consumes. Before, it raised ZooKeeperUnavailable
    ('cannot join group g: ConnectionLoss'; groupctl consume exited 75: seen in bin/chaos)."""
    ens, zk, _ = own_zookeeper
    fill(data_dir, "t", [10], zk=zk)
    real = GroupDirectories.make

    def frozen_first(directories, *args, **kwargs):
        monkeypatch.setattr(GroupDirectories, "make", real)
        freeze_until_dropped(ens.servers[0].proc.pid, directories.client)
        return real(directories, *args, **kwargs)
    monkeypatch.setattr(GroupDirectories, "make", frozen_first)
    with Consumer("g", ["t"], zk=ens.connect, data_dir=data_dir, session_timeout_ms=2000,
                  auto_offset_reset="earliest") as consumer:
        assert [r.offset for r in consume_until(consumer, 10, timeout=30)] == list(range(10))


def test_a_topic_name_given_as_a_string_is_one_topic(zk_connect, data_dir):
    with Consumer("g", "orders", zk=zk_connect, data_dir=data_dir) as c:
        assert c.subscription() == {"orders"}


@pytest.mark.parametrize("strategies", [["bogus"], ("range", "bogus"), []])
def test_unknown_assignment_strategies_are_rejected_before_joining(zk_connect, data_dir, tmp_path, strategies):
    with pytest.raises(InvalidConfig, match="assignment_strategy"):
        Consumer("g", ["t"], zk=zk_connect, data_dir=data_dir, assignment_strategy=strategies)
    config = tmp_path / "consumer.toml"
    config.write_text(f"[consumer]\nassignment_strategy = {json.dumps(list(strategies))}\n")
    with pytest.raises(InvalidConfig, match="assignment_strategy"):
        Consumer.from_config(str(config), "g", ["t"], zk=zk_connect, data_dir=data_dir)


def test_a_damaged_partition_raises_once_from_poll_and_the_others_keep_flowing(cluster, zk, data_dir, make_consumer):
    """A batch of t-0 is damaged on disk: poll() delivers every intact record before it, raises
    LogCorrupted once (naming partition, offset and file), keeps delivering t-1, and a seek to
    the error's resume_offset goes on after the damage."""
    from coordinator.errors import LogCorrupted
    cluster.node("n")
    TopicRegistry(zk).create("t", 2)
    with Log(data_dir) as log:
        for base in range(0, 1000, 100):
            for p in range(2):
                log.append("t", p, [(None, f"{p}-{base + i}".encode(), 1, ()) for i in range(100)])
    path = os.path.join(data_dir, "t-0", "00000000000000000000.log")
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    for _ in range(5):  # skip batches 0..4: each starts with its length (u32, little-endian)
        pos += 4 + struct.unpack_from("<I", data, pos)[0]
    with open(path, "r+b") as f:  # damage the body of batch 5 (offsets 500..599)
        f.seek(pos + 60)
        f.write(b"\xff\xff\xff\xff")
    c = make_consumer(max_poll_records=1000)
    got, errors = [], []
    deadline = time.monotonic() + 20
    while len(got) < 1900 and time.monotonic() < deadline:
        try:
            for recs in c.poll(timeout_ms=100).values():
                got.extend(recs)
        except LogCorrupted as e:
            errors.append(e)
            c.seek(TopicPartition(e.topic, e.partition), e.resume_offset)
    assert len(errors) == 1
    e = errors[0]
    assert (e.topic, e.partition, e.offset, e.resume_offset, e.path) == ("t", 0, 500, 600, path)
    assert sorted(r.offset for r in got if r.partition == 0) == [o for o in range(1000) if not 500 <= o < 600]
    assert sorted(r.offset for r in got if r.partition == 1) == list(range(1000))
