"""What a share member acquired and has not handed out yet (pure: no server)."""
import time

from consumer.records import ShareRecord, TopicPartition
from consumer.share_buffer import MAX_DEPTH, Prefetched

TP = TopicPartition("t", 0)


def records(first, last):
    return [ShareRecord("t", 0, o, 0, None, b"", (), 1) for o in range(first, last + 1)]


def test_take_hands_out_oldest_first_and_notes_each_token():
    b = Prefetched()
    b.add(TP, 1, time.monotonic(), records(0, 2))
    b.add(TP, 2, time.monotonic(), records(3, 5))
    handed = {}
    assert [r.offset for r in b.take(4, handed, 30_000)] == [0, 1, 2, 3]
    assert handed[TP] == {0: 1, 1: 1, 2: 1, 3: 2} and b.size == 2


def test_a_buffer_emptied_fast_doubles_the_next_acquisition_up_to_the_fair_share():
    b = Prefetched()
    for _ in range(10):
        b.add(TP, 1, time.monotonic(), records(0, 0))
        b.take(1, {}, 30_000)
    assert b.depth == MAX_DEPTH
    assert b.acquisition_size(500, 10_000) == 500 * MAX_DEPTH and b.acquisition_size(500, 250) == 250


def test_a_slow_buffer_halves_the_next_acquisition():
    b = Prefetched()
    b.depth = 4
    b.add(TP, 1, time.monotonic() - 10, records(0, 0))
    b.take(1, {}, 30_000)
    assert b.depth == 2


def test_records_that_waited_half_a_lock_are_given_back_in_ranges():
    b = Prefetched()
    b.add(TP, 7, time.monotonic() - 20, records(0, 2) + records(5, 5))
    b.add(TP, 8, time.monotonic(), records(6, 6))
    b.drop_stale(30_000)
    assert b.undelivered == {TP: [(7, 0, 2), (7, 5, 5)]} and b.size == 1
    b.give_back_all()
    assert b.undelivered[TP][-1] == (8, 6, 6) and not b


def test_after_a_lost_session_nothing_is_handed_out_or_given_back():
    b = Prefetched()
    b.add(TP, 1, time.monotonic(), records(0, 3))
    b.drop_stale(0)
    b.add(TP, 2, time.monotonic(), records(4, 5))
    b.forget()
    assert not b and b.take(10, {}, 30_000) == [] and b.undelivered == {}
