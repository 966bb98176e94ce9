"""What the member thread and the fetcher leave for the poll thread (:mod:`consumer.handoff`):
everything taken at once and once, a lost partition no longer assigned, a revocation withdrawn,
a partition's error held back while records of it wait to be handed out. No server."""
from __future__ import annotations

from coordinator.errors import FetchFailed, ZooKeeperUnavailable
from consumer import TopicPartition
from consumer.handoff import Handoff, partition_of

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def nothing_buffered():
    return set()


def test_the_poll_thread_takes_everything_left_at_once_and_only_once():
    h = Handoff()
    r = h.revoke({T0})
    h.assigned({T1: 5})
    assert h.pending_assigned() == {T1}
    lost, revocations, assigned, error = h.take(nothing_buffered)
    assert (lost, revocations, assigned, error) == (set(), [r], {T1: 5}, None)
    assert r.partitions == {T0} and not r.done.is_set()
    assert h.take(nothing_buffered) == (set(), [], {}, None)


def test_a_lost_partition_is_no_longer_assigned_and_a_withdrawn_revocation_is_not_run():
    h = Handoff()
    h.assigned({T0: 1, T1: 2})
    h.lost({T0})
    r = h.revoke({T1})
    h.withdraw(r)
    h.withdraw(r)  # twice: nothing more
    assert h.take(nothing_buffered) == ({T0}, [], {T1: 2}, None)


def test_one_error_per_take_and_a_partitions_error_waits_behind_its_buffered_records():
    h = Handoff()
    of_t0 = FetchFailed("t", 0, OSError("disk"))
    h.error(of_t0)
    h.error(ZooKeeperUnavailable("no quorum"))  # of no partition
    assert h.take(lambda: {T0})[3].__class__ is ZooKeeperUnavailable  # t-0's waits for its records
    assert h.take(lambda: {T0})[3] is None
    assert h.take(nothing_buffered)[3] is of_t0
    assert h.take(nothing_buffered)[3] is None


def test_the_partition_an_error_is_about():
    assert partition_of(FetchFailed("t", 1, OSError())) == T1
    assert partition_of(ZooKeeperUnavailable("x")) is None
