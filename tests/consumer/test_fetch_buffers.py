"""FetchBuffers (:mod:`consumer.fetch_buffers`): a fetcher's partitions under one lock, with no
log and no thread — the buffers filled by hand as a read would (``_keep``), then taken out by
the fair round-robin (``_drain``), given back, repositioned, paused and parked. Fast; no server."""
from __future__ import annotations

from array import array

import pytest

from consumer.fetch_buffers import FetchBuffers
from consumer.log.batch import Columns
from consumer.records import ConsumerRecord, TopicPartition
from coordinator.errors import IllegalStateError, OffsetOutOfRange

P0, P1, P2 = (TopicPartition("t", p) for p in range(3))


def records(tp, first, n):
    return [ConsumerRecord(tp.topic, tp.partition, o, o, None, b"v%d" % o) for o in range(first, first + n)]


def columns(first, n):
    return Columns(b"x" * n, first, n, array("q", range(n)), None, 0, 1, None, None, None)


def filled(counts, positions=None):
    """Buffers with ``counts[tp]`` records read for each partition from its position (default 0)."""
    b = FetchBuffers()
    b.assign({tp: (positions or {}).get(tp, 0) for tp in counts})
    with b._lock:
        for tp, n in counts.items():
            st = b._parts[tp]
            b._keep(st, [records(tp, st.fetch_offset, n)], n)
            st.fetch_offset += n
    return b


def drain(b, n, columns=False):
    drained = []
    with b._lock:
        taken = b._drain(n, columns, drained)
    return {tp: [r.offset for r in items] for tp, items in taken.items()} if not columns else taken, drained


def test_a_drain_takes_greedily_from_the_rotating_start_and_the_next_starts_after_where_it_stopped():
    b = filled({P0: 5, P1: 5, P2: 5})
    assert drain(b, 7)[0] == {P0: [0, 1, 2, 3, 4], P1: [0, 1]}
    assert drain(b, 4)[0] == {P2: [0, 1, 2, 3]}  # after P1, where the last one stopped
    assert drain(b, 10)[0] == {P1: [2, 3, 4], P2: [4]}  # P0 is empty: skipped
    assert b.buffered() == 0


def test_a_partition_with_records_is_served_within_one_round_however_large_another_backlog():
    b = filled({P0: 10_000, P1: 1})
    served = [set(drain(b, 500)[0]) for _ in range(2)]
    assert P1 in served[0] | served[1]


def test_positions_advance_only_over_records_taken():
    b = filled({P0: 10})
    drain(b, 3)
    assert (b.position(P0), b.buffered(P0), b.holding()) == (3, 7, {P0})


def test_nothing_buffered_is_known_without_a_walk_until_records_arrive_or_partitions_resume():
    b = filled({P0: 2})
    drain(b, 10)
    assert drain(b, 10)[0] == {} and not b._drainable
    b.pause([P0])
    b.resume([P0])
    assert b._drainable


def test_paused_partitions_keep_their_buffers_but_are_not_handed_out():
    b = filled({P0: 3, P1: 3})
    b.pause([P0, TopicPartition("t", 9)])  # not assigned: ignored
    assert b.paused() == {P0}
    assert drain(b, 10)[0] == {P1: [0, 1, 2]}
    b.resume([P0])
    assert drain(b, 10)[0] == {P0: [0, 1, 2]}


def test_given_back_records_come_first_again_and_the_position_moves_back():
    b = filled({P0: 10})
    with b._lock:
        taken = b._drain(4, False, [])
    b.give_back(taken)
    assert b.position(P0) == 0
    assert drain(b, 20)[0] == {P0: list(range(10))}


def test_a_give_back_after_a_seek_or_a_revoke_is_dropped():
    b = filled({P0: 10, P1: 10})
    with b._lock:
        taken = b._drain(15, False, [])
    b.seek(P0, 7)
    b.revoke([P1])
    b.give_back(taken)
    assert (b.position(P0), b.buffered(), b.assigned()) == (7, 0, {P0})


def switch_to_columns(b):
    with b._lock:
        b._switch_form(True)


@pytest.mark.parametrize("change", [
    lambda b: b.assign({P2: 0}), lambda b: b.assign({P0: 3}), lambda b: b.seek(P0, 5),
    lambda b: b.revoke([P1]), switch_to_columns])
def test_every_repositioning_changes_the_generation(change):
    b = filled({P0: 1, P1: 1})
    before = b.generation
    change(b)
    assert b.generation > before


@pytest.mark.parametrize("change", [
    lambda b: b.pause([P0]), lambda b: b.resume([P0]), lambda b: b.revoke([P2]), lambda b: drain(b, 1)])
def test_what_does_not_reposition_leaves_the_generation_alone(change):
    b = filled({P0: 1, P1: 1})
    before = b.generation
    change(b)
    assert b.generation == before


def test_a_revoke_keeps_both_rotations_on_the_same_partitions():
    b = filled({P0: 1, P1: 1, P2: 1})
    b._poll_next = b._fetch_next = 2  # both at P2
    b.revoke([P0])
    assert b._order[b._poll_next] == P2 and b._order[b._fetch_next] == P2
    b.revoke([P2])
    assert (b._poll_next, b._fetch_next) == (0, 0)


def test_an_assign_of_a_partition_already_assigned_repositions_it_and_keeps_its_pause():
    b = filled({P0: 5})
    b.pause([P0])
    b.assign({P0: 3, P1: 0}, paused=False)
    assert (b.position(P0), b.buffered(P0), b.paused()) == (3, 0, {P0})
    b.assign({P2: 0}, paused=True)
    assert b.paused() == {P0, P2}


def test_a_read_is_current_only_while_its_partition_was_not_repositioned_or_revoked():
    b = filled({P0: 1})
    with b._lock:
        st, epoch = b._parts[P0], b._parts[P0].epoch
        assert b._current(st, epoch)
    b.seek(P0, 0)
    with b._lock:
        assert not b._current(st, epoch)
    b.revoke([P0])
    with b._lock:
        assert not b._current(st, st.epoch)


def test_a_parked_partition_reports_at_once_with_nothing_buffered_else_with_its_last_record():
    b = filled({P0: 0, P1: 2})
    with b._lock:
        assert b._park(b._parts[P0], 0, OSError("disk")) is True
        assert b._park(b._parts[P1], 2, OffsetOutOfRange("t", 1, 2, 0, 1)) is False
        assert b._parts[P1].highwater == 1
    taken, drained = drain(b, 1)
    assert (taken, drained) == ({P1: [0]}, [])
    taken, drained = drain(b, 1)
    assert taken == {P1: [1]} and [(tp, offset) for tp, offset, _ in drained] == [(P1, 2)]
    assert drain(b, 1)[1] == []  # reported once


def test_a_switch_to_columns_drops_the_records_and_reads_again_from_the_positions():
    b = filled({P0: 10})
    drain(b, 4)
    with b._lock:
        b._switch_form(True)
        st = b._parts[P0]
        assert (st.fetch_offset, st.count, b._columns) == (4, 0, True)
        b._keep(st, [columns(4, 3), columns(7, 3)], 6)
    taken, _ = drain(b, 5, columns=True)
    assert [(c.base, c.count) for c in taken[P0]] == [(4, 3), (7, 2)]
    assert b.position(P0) == 9


def test_records_given_back_in_the_other_form_are_dropped():
    b = filled({P0: 10})
    with b._lock:
        taken = b._drain(4, False, [])
        b._switch_form(True)
    b.give_back(taken)
    assert (b.position(P0), b.buffered(P0)) == (4, 0)


def test_positions_of_partitions_not_assigned_are_refused_and_their_counts_are_zero():
    b = FetchBuffers()
    with pytest.raises(IllegalStateError, match="not assigned"):
        b.position(P0)
    with pytest.raises(IllegalStateError):
        b.seek(P0, 1)
    assert (b.buffered(P0), b.buffered(), b.holding(), b.paused()) == (0, 0, set(), set())


def test_the_buffers_alone_are_never_closed_and_the_fetcher_refuses_an_assign_once_closed():
    from consumer.fetcher import Fetcher
    b = FetchBuffers()
    b.assign({P0: 0})
    fetcher = Fetcher(log=None)
    fetcher.close()
    with pytest.raises(IllegalStateError, match="closed"):
        fetcher.assign({P0: 0})
