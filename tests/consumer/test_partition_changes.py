"""How a change of a consumer's partitions reaches its fetcher, poll thread and listener
(:mod:`consumer.partition_changes`): start positions, the listener's order, fetch errors, a
partition that cannot be opened. First its pure parts against fakes (no server), then a
Consumer on a real ZooKeeper with a coordinator."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from coordinator import protocol
from coordinator.errors import FetchFailed, NoOffsetForPartition, OffsetOutOfRange
from coordinator.topics import TopicRegistry
from consumer import ConsumerRebalanceListener, Producer, TopicPartition
from consumer.handoff import Handoff
from consumer.partition_changes import CommittedPositions, PartitionChanges
from tests.support.consumers import consume_until, make_consumer, polled, polling  # noqa: F401
from tests.support.helpers import fill, wait_for

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


class Fetcher:
    def __init__(self):
        self.started, self.seeks, self.woken = {}, [], 0

    def assign(self, positions, paused):
        self.started.update({tp: (offset, paused) for tp, offset in positions.items()})

    def assigned(self):
        return set(self.started)

    def seek(self, tp, offset):
        self.seeks.append((tp, offset))

    def wakeup(self):
        self.woken += 1

    def holding(self):
        return set()


class Plane:
    """A data plane whose partition ``broken`` cannot be opened."""

    def __init__(self, broken=()):
        self.broken = set(broken)

    def earliest_offsets(self, tps):
        for tp in tps:
            if tp in self.broken:
                raise NotADirectoryError(20, "Not a directory", f"/data/{tp}")
        return {tp: 0 for tp in tps}

    def has_data(self, topic):
        return True


def changes(auto_offset_reset="earliest", plane=None):
    config = SimpleNamespace(auto_offset_reset=auto_offset_reset, start_position="committed")
    consumer = SimpleNamespace(config=config, consumer_id="m", poll_interval=SimpleNamespace(in_poll=False))
    return PartitionChanges(consumer, plane or Plane(), Fetcher(), Handoff(), CommittedPositions())


def test_committed_positions_say_what_a_commit_would_change():
    c = CommittedPositions()
    c.known({T0: 5, T1: None})
    c.known({T0: 3})  # already known: kept
    assert c.changed({T0: 5, T1: 2}) == {T1: 2}
    c.record({T1: 2})
    assert c.changed({T0: 5, T1: 2}) == {}
    c.forget([T0])
    assert c.changed({T0: 5, T1: 2}) == {T0: 5}


def test_assigned_partitions_start_paused_at_their_committed_offset_and_one_that_cannot_be_opened_is_refused():
    pc = changes(plane=Plane(broken={T1}))
    refused = pc.assign({T0: "m-0", T1: "m-0"}, {T0: 7, T1: None})
    assert pc.fetcher.started == {T0: (7, True)} and pc.reached() == {T0}
    assert set(refused) == {T1} and isinstance(refused[T1], NotADirectoryError)
    lost, revocations, assigned, error = pc.handoff.take(set)
    assert assigned == {T0: 7} and isinstance(error, FetchFailed) and (error.topic, error.partition) == ("t", 1)


def test_an_offset_out_of_range_is_reset_as_configured_and_other_fetch_errors_wait_for_poll():
    out_of_range = OffsetOutOfRange("t", 0, 3, 10, 20)
    for reset, target in (("earliest", 10), ("latest", 20)):
        pc = changes(auto_offset_reset=reset)
        pc.on_fetch_error(T0, out_of_range)
        assert pc.fetcher.seeks == [(T0, target)] and pc.handoff.take(set)[3] is None
    pc = changes(auto_offset_reset="none")
    pc.on_fetch_error(T0, out_of_range)
    assert pc.fetcher.seeks == [] and pc.handoff.take(set)[3] is out_of_range
    pc.on_fetch_error(T1, OSError("disk gone"))
    error = pc.handoff.take(set)[3]
    assert isinstance(error, FetchFailed) and error.partition == 1 and pc.fetcher.woken == 2  # named, cause kept



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
