"""consumer.iteration.Unyielded: what a ``for record in consumer`` loop holds between records
(pure: a dict stands in for the fetcher's positions)."""
import pytest

from consumer.iteration import Unyielded
from consumer.records import ConsumerRecord, TopicPartition

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def records(tp, first, n):
    return [ConsumerRecord(tp.topic, tp.partition, o, 0, None, b"v%d" % o) for o in range(first, first + n)]


@pytest.fixture
def positions():
    return {A: 3, B: 12}  # the fetcher's, after a poll of A 0-2 and B 10-11


@pytest.fixture
def held(positions):
    u = Unyielded(lambda tp, end: positions.get(tp) == end)
    u.fill({A: records(A, 0, 3), B: records(B, 10, 2)}, generation=1)
    return u


def test_records_come_out_in_poll_order_and_positions_follow_what_was_yielded(held):
    assert held.first_offset(A, 3) == 0 and held.first_offset(B, 12) == 10
    assert [held.pop(1).offset for _ in range(4)] == [0, 1, 2, 10]
    assert held.first_offset(A, 3) is None  # all of A yielded: the fetcher's position stands
    assert held.first_offset(B, 12) == 11
    assert held.pop(1).offset == 11 and held.pop(1) is None and not held


def test_take_returns_what_was_not_yielded_for_give_back(held):
    held.pop(1)
    assert held.take([A]) == {A: records(A, 1, 2)}
    assert held.take() == {B: records(B, 10, 2)} and not held


def test_a_failing_conversion_leaves_the_record_next(held):
    def fail(record):
        raise ValueError("bad")
    with pytest.raises(ValueError):
        held.pop(1, fail)
    assert held.pop(1).offset == 0


def test_records_of_a_revoked_or_repositioned_partition_are_dropped_once_the_generation_moves(held, positions):
    del positions[A]  # revoked
    assert held.pop(1).offset == 0  # same generation: not looked at again
    positions[B] = 50  # sought
    assert held.pop(2) is None and not held


def test_a_stale_position_is_not_reported(held):
    assert held.first_offset(A, 7) is None  # the fetcher moved on: these records no longer count
