"""The Consumer API against a real ZooKeeper, a running coordinator and the embedded log."""
from __future__ import annotations

import contextlib
import os
import struct
import json
import threading
import time

import pytest

from coordinator import protocol
from coordinator.errors import CommitFailedError, InvalidConfig, NoOffsetForPartition, ZooKeeperUnavailable
from coordinator.topics import TopicRegistry
from consumer import Consumer, ConsumerRebalanceListener, Producer, TopicPartition, WakeupException
from consumer.log import Log
from consumer.joining import GroupDirectories
from tests.support.groups import read_state
from tests.support.helpers import fill, freeze_until_dropped, wait_for


def polled(*consumers) -> bool:
    """Poll each consumer once (so it takes part in rebalances); always true, for use in conditions."""
    for c in consumers:
        c.poll(50)
    return True


def consume_until(consumer, count, timeout=20.0, **poll):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for recs in consumer.poll(timeout_ms=100, **poll).values():
            got.extend(recs)
    return got


@contextlib.contextmanager
def polling(consumer):
    """Keep ``consumer`` polling on a thread of its own (so it takes part in rebalances)."""
    stop = threading.Event()
    thread = threading.Thread(target=lambda: [consumer.poll(50) for _ in iter(stop.is_set, True)])
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@pytest.fixture
def make_consumer(zk_connect, data_dir):
    made = []

    def make(group="g", topics=("t",), **config):
        config.setdefault("auto_offset_reset", "earliest")
        c = Consumer(group, list(topics) if not isinstance(topics, dict) else topics, zk=zk_connect,
                     data_dir=data_dir, session_timeout_ms=2000, **config)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


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


def test_handed_out_at_is_inside_the_poll_that_returned_the_records(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [50], zk=zk)
    c = make_consumer()
    assert c.handed_out_at is None
    got, deadline = 0, time.monotonic() + 20
    while got < 50 and time.monotonic() < deadline:
        before = time.time()
        batch = c.poll(timeout_ms=100)
        after = time.time()
        if batch:
            got += sum(map(len, batch.values()))
            assert before <= c.handed_out_at <= after
    assert got == 50


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


def test_listener_order_revoked_before_assigned(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [10] * 4, zk=zk)
    calls = []

    class L(ConsumerRebalanceListener):
        def __init__(self, name):
            self.name = name

        def on_partitions_revoked(self, revoked):
            calls.append((self.name, "revoked", frozenset(revoked)))

        def on_partitions_assigned(self, assigned):
            calls.append((self.name, "assigned", frozenset(assigned)))

    a = make_consumer(listener=L("a"))
    wait_for(lambda: polled(a) and len(a.assignment()) == 4, message="a owns all")
    b = make_consumer(listener=L("b"))
    with polling(b):
        wait_for(lambda: polled(a) and len(a.assignment()) == 2 and len(b.assignment()) == 2,
                 message="split 2/2")
    a_calls = [(kind, parts) for name, kind, parts in calls if name == "a"]
    assert a_calls[0][0] == "assigned" and len(a_calls[0][1]) == 4
    assert a_calls[1][0] == "revoked" and len(a_calls[1][1]) == 2  # only what moved
    assert not a_calls[1][1] & a.assignment()
    assert not a.assignment() & b.assignment()


def test_commit_after_losing_partition_fails_and_never_overwrites(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [100] * 2, zk=zk)
    a = make_consumer()
    consume_until(a, 200)
    a.commit()
    b = make_consumer()
    with polling(b):
        wait_for(lambda: polled(a) and len(a.assignment()) == 1 and len(b.assignment()) == 1,
                 message="split")
    lost = next(iter(b.assignment()))
    before = zk.get(protocol.offsets_path("g", lost.topic, lost.partition))[0]
    with pytest.raises(CommitFailedError):
        a.commit({lost: 5})
    assert zk.get(protocol.offsets_path("g", lost.topic, lost.partition))[0] == before


def test_max_poll_interval_evicts_and_rejoins(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [10] * 2, zk=zk)
    slow = make_consumer(max_poll_interval_ms=800)
    consume_until(slow, 20)
    other = make_consumer()
    with polling(other):
        # slow stops polling: it leaves the group, other takes everything.
        wait_for(lambda: len(other.assignment()) == 2, 15, message="other owns all after eviction")
        assert not zk.exists(protocol.ids_path("g", slow.consumer_id))
        slow.poll(100)  # rejoins
        wait_for(lambda: polled(slow) and len(slow.assignment()) == 1, 15, message="slow rejoined")


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


def test_timestamp_start_position_and_offsets_for_times(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [100] * 1, zk=zk, ts=lambda o: 10_000 + o)
    c = make_consumer(start_position="timestamp", start_timestamp_ms=10_060)
    got = consume_until(c, 40)
    assert got[0].offset == 60 and len(got) == 40
    assert c.offsets_for_times({TopicPartition("t", 0): 10_090})[TopicPartition("t", 0)].offset == 90
    # The start offset was recorded for the group (every later owner starts there too).
    assert zk.get(protocol.offsets_path("g", "t", 0))[0] in (b"60", b"100")


def test_auto_offset_reset_none_raises(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [5] * 1, zk=zk)
    c = make_consumer(auto_offset_reset="none")
    with pytest.raises(NoOffsetForPartition):
        for _ in range(100):
            c.poll(100)


def test_latest_reset_skips_old_records(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [5] * 1, zk=zk)
    c = make_consumer(auto_offset_reset="latest")
    wait_for(lambda: polled(c) and c.assignment(), message="assigned")
    with Producer(zk, data_dir) as p:
        p.send("t", b"new", partition=0)
    got = consume_until(c, 1)
    assert [r.value for r in got] == [b"new"]


def test_wakeup_interrupts_poll(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    TopicRegistry(zk).create("t", 1)
    c = make_consumer()
    threading.Timer(0.3, c.wakeup).start()
    started = time.monotonic()
    with pytest.raises(WakeupException):
        c.poll(timeout_ms=10_000)
    assert time.monotonic() - started < 5


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


def test_streams_split_partitions_across_threads(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [100] * 4, zk=zk)
    c = make_consumer(topics={"t": 2})
    streams = c.streams()
    assert len(streams) == 2
    got = [[], []]

    def drain(i):
        for record in streams[i]:
            got[i].append(record)
            if sum(map(len, got)) >= 400:
                break
    threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: sum(map(len, got)) >= 400, 20, message="400 records through 2 streams")
    parts = [{r.partition for r in g} for g in got]
    assert parts[0] and parts[1] and not parts[0] & parts[1]
    c.commit()
    assert sum(c.committed(TopicPartition("t", p)) for p in range(4)) == 400
    c.close()
    for t in threads:
        t.join(5)
        assert not t.is_alive()


class LostRecorder(ConsumerRebalanceListener):
    def __init__(self):
        self.lost = []

    def on_partitions_lost(self, partitions):
        self.lost.append(partitions)


@pytest.fixture
def own_zookeeper(zk_server, tmp_path):
    """A ZooKeeper of this test's own to kill and restart, a client and a coordinator on it."""
    if not zk_server.local:
        pytest.skip("needs a local ZooKeeper to kill and restart")
    from coordinator.zkclient import close_client, start_client
    from coordinator.testing.zkserver import Ensemble
    from tests.support.groups import Cluster
    ens = Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk")).start()
    zk = start_client(ens.connect, 2000)
    cluster = Cluster(ens.connect, session_timeout_ms=2000)
    cluster.node("a")
    try:
        yield ens, zk, cluster
    finally:
        if not ens.servers[0].running:
            ens.restart(0)  # so that the clean-up does not wait for a dead server
        cluster.close()
        close_client(zk)
        ens.close()


def test_no_records_are_handed_out_while_zookeeper_is_away(own_zookeeper, data_dir):
    """Cut off from ZooKeeper, a consumer cannot know whether its session (and so its
    partitions) survives: poll() hands out nothing until the connection is back."""
    ens, zk, _ = own_zookeeper
    fill(data_dir, "t", [15] * 1, zk=zk)
    listener = LostRecorder()
    # The longest session the server grants: its restart below, and the client's reconnection,
    # take longer than 6 s on a loaded machine (the session expired, the partition was lost).
    with Consumer("g", ["t"], zk=ens.connect, data_dir=data_dir, session_timeout_ms=12000,
                  auto_offset_reset="earliest", listener=listener) as consumer:
        assert len(consume_until(consumer, 10, max_records=10)) == 10
        ens.servers[0].kill()
        wait_for(lambda: not consumer.group_metadata().connected, message="the consumer notices")
        assert consumer.poll(timeout_ms=600) == {}  # five records are there, but not handed out
        with pytest.raises(ZooKeeperUnavailable):
            consumer.commit({TopicPartition("t", 0): 10})
        with pytest.raises(ZooKeeperUnavailable):
            consumer.committed(TopicPartition("t", 0))
        ens.restart(0)
        rest = consume_until(consumer, 5)
        assert [r.offset for r in rest] == [10, 11, 12, 13, 14]
        assert not listener.lost  # the same session came back: the partition was never lost


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


def test_a_member_says_once_when_no_coordinator_is_running(zk_connect, data_dir, caplog, monkeypatch):
    from consumer import member
    monkeypatch.setattr(member, "NO_COORDINATOR_WARNING_S", 0.2)
    monkeypatch.setattr(member, "HOUSEKEEPING_S", 0.1)
    with Consumer("lonely", ["t"], zk=zk_connect, data_dir=data_dir):
        wait_for(lambda: [r for r in caplog.records if "no coordinator is running for group lonely" in r.getMessage()],
                 message="the warning")
        time.sleep(0.5)  # several more housekeeping rounds: the warning is not repeated
    assert len([r for r in caplog.records if "no coordinator is running" in r.getMessage()]) == 1


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


def test_a_topic_without_data_under_data_dir_is_named_once(cluster, zk, data_dir, make_consumer, caplog):
    cluster.node("n")
    TopicRegistry(zk).create("elsewhere", 2)
    c = make_consumer(topics=("elsewhere",))
    wait_for(lambda: c.assignment(), message="an assignment")
    c.poll(timeout_ms=100)
    lines = [r.getMessage() for r in caplog.records if "has no data in" in r.getMessage()]
    assert len(lines) == 1 and "topic elsewhere" in lines[0] and data_dir in lines[0]


def test_a_partition_whose_data_cannot_be_opened_is_named_by_poll_and_released(cluster, zk, data_dir,
                                                                              make_consumer, caplog):
    """t-0's directory is a file (NotADirectoryError: what any user, root too, meets): its
    start offset cannot be looked up when the member applies its start-fetcher. poll() raises
    FetchFailed naming it (once per attempt), t-1 keeps flowing, and the member released t-0 (no owner node,
    not in its assignment) rather than owning a partition it cannot read; nothing says
    "unexpected". Once t-0 can be read, the coordinator's next check gives it out again."""
    from coordinator.errors import FetchFailed
    cluster.config.check_interval_ms = 300
    cluster.node("n")
    TopicRegistry(zk).create("t", 2)
    fill(data_dir, "t", [0, 5])
    path = os.path.join(data_dir, "t-0")
    open(path, "w").close()
    c = make_consumer()
    got, errors = [], []

    def poll():
        try:
            got.extend(r.offset for recs in c.poll(timeout_ms=100).values() for r in recs)
        except FetchFailed as e:
            errors.append(e)
        return errors and len(got) == 5
    wait_for(poll, 20, message="t-1's records and t-0's error")
    e = errors[0]
    assert str(e) == f"t-0 cannot be read: Not a directory: {path}" and isinstance(e.cause, NotADirectoryError)
    assert (e.topic, e.partition, e.retriable) == ("t", 0, False)
    wait_for(lambda: not zk.exists(protocol.owners_path("g", "t", 0)) and set(c._member.owned()) == {
        TopicPartition("t", 1)}, 10, message="t-0 released")  # (each new attempt is released the same way)
    assert c.assignment() == {TopicPartition("t", 1)} and zk.exists(protocol.owners_path("g", "t", 1))
    os.unlink(path)
    fill(data_dir, "t", [3])
    wait_for(lambda: [poll()] and len(got) == 8, 20, message="t-0's records, at the coordinator's next check")
    assert sorted(got) == [0, 0, 1, 1, 2, 2, 3, 4]
    assert {str(e) for e in errors} == {f"t-0 cannot be read: Not a directory: {path}"}  # once per attempt
    assert not [r for r in caplog.records if "unexpected" in r.getMessage()]
    assert c.assignment() == {TopicPartition("t", 0), TopicPartition("t", 1)}
