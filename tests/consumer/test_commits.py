"""A consumer's commits (:mod:`consumer.commits`): only changed positions are written, a refused
partition is not recorded as committed, the copy to Kafka comes after ZooKeeper's commit and
its failure is a warning, auto-commit's clock. First against a fake member write (no server),
then a Consumer whose partition moved, on a real ZooKeeper."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from coordinator import protocol
from coordinator.errors import CommitFailedError, ZkGroupsError
from consumer import TopicPartition
from consumer.commits import Commits
from consumer.records import OffsetAndMetadata
from tests.support.consumers import consume_until, make_consumer, polled, polling  # noqa: F401
from tests.support.helpers import fill, wait_for

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


class Plane:
    """The data plane's copy of commits to Kafka: records them, or fails as told."""

    def __init__(self, fail=False):
        self.copies, self.fail = [], fail

    def commit_offsets(self, group, offsets):
        if self.fail:
            raise ZkGroupsError("broker unreachable")
        self.copies.append((group, dict(offsets)))


def commits(positions=None, kafka=False, plane=None, refuse=(), auto_commit=False, interval_ms=60_000):
    """A Commits whose member write records what it is given (and refuses ``refuse`` by name)."""
    config = SimpleNamespace(auto_commit_interval_ms=interval_ms, enable_auto_commit=auto_commit,
                             kafka_commit_offsets=kafka)
    c = Commits("g", lambda: "m", plane or Plane(), config, lambda: dict(positions or {}))
    c.writes = []

    def write(changed):
        c.writes.append(dict(changed))
        refused = set(changed) & set(refuse)
        if refused:
            raise CommitFailedError("commit refused", refused)
    c.write = write
    return c


def test_only_positions_changed_since_the_last_commit_are_written():
    c = commits(positions={T0: 5, T1: 7})
    c.commit()
    c.commit({T0: 5, T1: OffsetAndMetadata(8)})  # objects with .offset too
    c.commit({T0: 5, T1: 8})
    assert c.writes == [{T0: 5, T1: 7}, {T1: 8}]
    c.close()


def test_a_refused_partition_is_not_recorded_as_committed_and_the_others_are():
    c = commits(refuse={T1})
    with pytest.raises(CommitFailedError):
        c.commit({T0: 5, T1: 7})
    assert c.committed.changed({T0: 5, T1: 7}) == {T1: 7}  # T0 was written: not again
    c.close()


def test_the_copy_to_kafka_follows_zookeepers_commit_and_its_failure_is_only_a_warning(caplog):
    plane = Plane()
    c = commits(kafka=True, plane=plane, refuse={T1})
    c.commit({T0: 5})
    with pytest.raises(CommitFailedError):
        c.commit({T1: 9})  # refused by ZooKeeper: nothing copied
    assert plane.copies == [("g", {T0: 5})]
    failing = commits(kafka=True, plane=Plane(fail=True))
    with caplog.at_level(logging.WARNING, logger="zkgroups.consumer"):
        failing.commit({T0: 6})
    assert failing.writes == [{T0: 6}] and failing.committed.changed({T0: 6}) == {}
    assert any("copying offsets to Kafka failed (ZooKeeper has them)" in r.getMessage() for r in caplog.records)
    c.close()
    failing.close()


def test_auto_commit_commits_every_position_once_per_interval_and_a_failure_is_a_warning(caplog):
    due = commits(positions={T0: 3}, auto_commit=True, interval_ms=0)
    due.maybe_auto_commit()
    assert due.writes == [{T0: 3}]
    waiting = commits(positions={T0: 3}, auto_commit=True, interval_ms=60_000)
    waiting.maybe_auto_commit()
    off = commits(positions={T0: 3}, auto_commit=False, interval_ms=0)
    off.maybe_auto_commit()
    assert waiting.writes == [] and off.writes == []
    refused = commits(positions={T0: 3}, auto_commit=True, interval_ms=0, refuse={T0})
    with caplog.at_level(logging.WARNING, logger="zkgroups.consumer"):
        refused.maybe_auto_commit()  # does not raise
    assert any("auto-commit failed" in r.getMessage() for r in caplog.records)
    for c in (due, waiting, off, refused):
        c.close()


def test_commit_async_calls_back_with_the_offsets_and_its_future_fails_as_the_commit_did():
    c = commits(refuse={T1})
    heard = []
    ok = c.commit_async({T0: 4}, lambda offsets, error: heard.append((offsets, error)))
    failed = c.commit_async({T1: 2}, lambda offsets, error: heard.append((offsets, error)))
    assert ok.result(5) is None and isinstance(failed.exception(5), CommitFailedError)
    assert heard[0] == ({T0: OffsetAndMetadata(4)}, None)
    assert heard[1][0] == {T1: OffsetAndMetadata(2)} and isinstance(heard[1][1], CommitFailedError)
    c.close()



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
