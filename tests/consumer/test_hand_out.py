"""``poll()``'s hand-out (:mod:`consumer.hand_out`): records only while the member can prove it
owns their partitions (connected, within its lease), ``handed_out_at``, ``wakeup()``. First
against a fake member and fetcher (no server), then a Consumer on a real ZooKeeper."""
from __future__ import annotations

import threading
import time

import pytest

from coordinator.errors import ZooKeeperUnavailable
from coordinator.topics import TopicRegistry
from consumer import Consumer, TopicPartition, WakeupException
from consumer.hand_out import HandOut
from tests.support.consumers import LostRecorder, consume_until, make_consumer, own_zookeeper  # noqa: F401
from tests.support.helpers import fill, wait_for

TP = TopicPartition("t", 0)


class Member:
    """A member's connection and lease as ``HandOut`` asks for them: ``leases`` answers
    ``holds_lease()`` in turn (then True), ``renewals`` answers ``renew_lease()``."""

    def __init__(self, connected=True, leases=(), renewals=()):
        self.connected, self.leases, self.renewals = connected, list(leases), list(renewals)
        self.renewed = 0

    def wait_connected(self, timeout):
        if not self.connected:
            time.sleep(min(timeout, 0.01))
        return self.connected

    def holds_lease(self):
        return self.leases.pop(0) if self.leases else True

    def renew_lease(self, timeout):
        self.renewed += 1
        renewed = self.renewals.pop(0) if self.renewals else True
        if not renewed:
            time.sleep(min(timeout, 0.01))  # a round trip that got no answer in time
        return renewed


class Fetcher:
    """Hands out ``batches`` in turn (then nothing, after a short wait); records what is given back."""

    def __init__(self, batches=()):
        self.batches, self.given_back, self.woken = list(batches), [], 0

    def take(self, max_records, timeout):
        if self.given_back:
            return self.given_back.pop(0)
        if self.batches:
            return self.batches.pop(0)
        time.sleep(min(timeout, 0.01))
        return {}

    def give_back(self, records):
        self.given_back.append(records)

    def wakeup(self):
        self.woken += 1


class Changes:
    def __init__(self):
        self.runs = 0

    def run_callbacks(self):
        self.runs += 1


def hand_out_of(member, fetcher, commits=None):
    return HandOut(member, Changes(), fetcher, lambda: commits.append("auto-commit") if commits is not None else None)


def test_records_within_the_lease_are_handed_out_after_the_callbacks_and_auto_commit():
    commits, batch = [], {TP: ["r0", "r1"]}
    out = hand_out_of(Member(), Fetcher([batch]), commits)
    before = time.time()
    assert out.poll(1000, None, out.fetcher.take) == batch
    assert before <= out.handed_out_at <= time.time()
    assert commits == ["auto-commit"] and out.changes.runs == 1


def test_records_fetched_while_the_lease_lapsed_are_given_back_until_a_round_trip_renews_it():
    """The lease held when the read began and lapsed while it waited (a frozen process): the
    records go back to the fetcher, and come out once the lease is renewed."""
    member, batch = Member(leases=[True, False, False, True]), {TP: ["r0"]}
    out = hand_out_of(member, Fetcher([batch]))
    assert out.poll(1000, None, out.fetcher.take) == batch
    assert member.renewed == 1 and out.fetcher.given_back == []


def test_nothing_is_handed_out_while_not_connected_or_without_a_lease():
    for member in (Member(connected=False), Member(leases=[False] * 100, renewals=[False] * 100)):
        commits = []
        out = hand_out_of(member, Fetcher([{TP: ["r0"]}]), commits)
        assert out.poll(50, None, out.fetcher.take) == {}
        assert out.handed_out_at is None and commits == [] and out.fetcher.batches  # never read


def test_wakeup_from_another_thread_interrupts_the_poll_in_progress_or_the_next():
    out = hand_out_of(Member(), Fetcher())
    threading.Timer(0.05, out.wakeup).start()
    started = time.monotonic()
    with pytest.raises(WakeupException):
        out.poll(10_000, None, out.fetcher.take)
    assert time.monotonic() - started < 5 and out.fetcher.woken == 1
    out.wakeup()
    with pytest.raises(WakeupException):
        out.poll(0, None, out.fetcher.take)
    assert out.poll(0, None, out.fetcher.take) == {}  # once



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


def test_wakeup_interrupts_poll(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    TopicRegistry(zk).create("t", 1)
    c = make_consumer()
    threading.Timer(0.3, c.wakeup).start()
    started = time.monotonic()
    with pytest.raises(WakeupException):
        c.poll(timeout_ms=10_000)
    assert time.monotonic() - started < 5


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
