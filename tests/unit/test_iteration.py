"""consumer.iteration.Unyielded: what a ``for record in consumer`` loop holds between records
(pure: a small stand-in for the fetcher's positions, generation and give_back)."""
import pytest

from consumer.iteration import Unyielded
from consumer.records import ConsumerRecord, TopicPartition
from coordinator.errors import IllegalStateError

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def records(tp, first, n):
    return [ConsumerRecord(tp.topic, tp.partition, o, 0, None, b"v%d" % o) for o in range(first, first + n)]


class Fetcher:
    """The fetcher after a poll of A 0-2 and B 10-11."""

    def __init__(self):
        self.positions, self.generation, self.given_back = {A: 3, B: 12}, 1, []

    def position(self, tp):
        if tp not in self.positions:
            raise IllegalStateError(f"partition {tp} is not assigned")
        return self.positions[tp]

    def give_back(self, taken):
        self.given_back.append(taken)


@pytest.fixture
def fetcher():
    return Fetcher()


@pytest.fixture
def held(fetcher):
    u = Unyielded(fetcher)
    u.fill({A: records(A, 0, 3), B: records(B, 10, 2)}, generation=1)
    return u


def test_records_come_out_in_poll_order_and_positions_follow_what_was_yielded(held):
    assert held.first_offset(A, 3) == 0 and held.first_offset(B, 12) == 10
    assert [held.pop().offset for _ in range(4)] == [0, 1, 2, 10]
    assert held.first_offset(A, 3) is None  # all of A yielded: the fetcher's position stands
    assert held.first_offset(B, 12) == 11
    assert held.pop().offset == 11 and held.pop() is None and not held


def test_what_was_not_yielded_goes_back_to_the_fetcher(held, fetcher):
    held.pop()
    held.give_back([A])
    assert fetcher.given_back == [{A: records(A, 1, 2)}]
    assert held.take() == {B: records(B, 10, 2)} and not held
    held.give_back()
    assert len(fetcher.given_back) == 1  # nothing held: nothing given back


def test_a_failing_conversion_leaves_the_record_next(held):
    def fail(record):
        raise ValueError("bad")
    with pytest.raises(ValueError):
        held.pop(fail)
    assert held.pop().offset == 0


def test_records_of_a_revoked_or_repositioned_partition_are_dropped_once_the_generation_moves(held, fetcher):
    del fetcher.positions[A]  # revoked
    assert held.pop().offset == 0  # same generation: not looked at again
    fetcher.positions[B] = 50  # sought
    fetcher.generation = 2
    assert held.pop() is None and not held


def test_next_polls_when_nothing_is_held_and_stops_at_its_timeout(fetcher):
    u = Unyielded(fetcher)
    polls = []

    def poll(timeout_ms, max_records):
        polls.append(timeout_ms)
        return {A: records(A, 0, 1)} if len(polls) == 1 else {}
    assert u.next(poll, None, 50, lambda: True).offset == 0
    with pytest.raises(StopIteration):
        u.next(poll, None, 50, lambda: True)
    with pytest.raises(StopIteration):
        u.next(poll, None, None, lambda: False)  # closed: no poll


def test_a_stale_position_is_not_reported(held):
    assert held.first_offset(A, 7) is None  # the fetcher moved on: these records no longer count


def test_the_generator_hands_out_the_same_records_and_a_break_keeps_the_rest(held, fetcher):
    def poll(timeout_ms, max_records):
        return {}
    loop = held.records(poll, None, 0, lambda: True)
    assert [next(loop).offset for _ in range(2)] == [0, 1]
    loop.close()  # the for loop's break
    assert held.first_offset(A, 3) == 2
    assert [r.offset for r in held.records(poll, None, 0, lambda: True)] == [2, 10, 11]


def test_the_generator_looks_again_when_something_moved_under_it(held, fetcher):
    loop = held.records(lambda *_: {}, None, 0, lambda: True)
    assert next(loop).offset == 0
    held.take([A])  # a seek of A
    assert next(loop).offset == 10
    fetcher.positions[B] = 40  # B sought by the fetcher...
    fetcher.generation = 2  # ...which says so
    assert list(loop) == []
