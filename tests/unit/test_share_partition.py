"""The rules of a share-partition's state (:mod:`coordinator.share_partition`; pure: no server). Its
schema's decoder and the group settings: ``test_protocol_share.py``."""
import pytest

from coordinator.errors import CorruptZnode
from coordinator.protocol.share import (ACCEPTED, ACQUIRED, AVAILABLE, DEAD_LETTER, DELAYED,
                                        DELIVERY_LIMIT, REJECTED, WRITING, ShareGroupConfig, SharePartitionState)
from coordinator.share_partition import (AcknowledgeType as A, acknowledge, acquire, claim_dead_letters, counts,
                                         dead_letters_written, delayed, expire, expire_holder, initial, promote,
                                         release_undelivered, reset)

CONFIG = ShareGroupConfig(max_record_locks=100, delivery_count_limit=3)


def roundtrip(state):
    """Every state the rules make is one the decoder accepts."""
    return SharePartitionState.decode(state.encode(), "/p")


def test_fresh_records_are_acquired_in_one_range_under_one_token():
    s = initial(10)
    token, taken = acquire(s, "m1", 5, range(10, 30), CONFIG)
    assert taken == [(10, 14, 1)] and s.start == 10 and s.end == 15
    assert s.ranges == [[10, 14, ACQUIRED, 1, token, 0]] and s.held == {token: ["m1", 0]}
    assert roundtrip(s) == s


def test_the_window_never_grows_past_the_lock_limit():
    s = initial(0)
    acquire(s, "m1", 500, range(0, 500), CONFIG)
    assert s.end == 100
    assert acquire(s, "m2", 500, range(100, 500), CONFIG)[1] == []


def test_gaps_in_the_log_are_done_at_once():
    s = initial(0)
    acquire(s, "m1", 10, [0, 1, 5, 6], CONFIG)
    assert s.ranges[1] == [2, 4, ACCEPTED, 0, 0, 0] and s.end == 7


def test_accept_moves_the_start_and_leaves_no_ranges():
    s = initial(0)
    t, _ = acquire(s, "m1", 10, range(10), CONFIG)
    assert acknowledge(s, "m1", t, [(0, 9, A.ACCEPT, 0)], CONFIG) == []
    assert (s.start, s.end, s.ranges, s.held) == (10, 10, [], {})


def test_an_accept_in_the_middle_keeps_the_start_at_the_first_record_not_done():
    s = initial(0)
    t, _ = acquire(s, "m1", 10, range(10), CONFIG)
    acknowledge(s, "m1", t, [(3, 5, A.ACCEPT, 0)], CONFIG)
    assert s.start == 0 and counts(s) == {ACQUIRED: 7, ACCEPTED: 3}
    acknowledge(s, "m1", t, [(0, 2, A.ACCEPT, 0)], CONFIG)
    assert s.start == 6


def test_released_records_go_to_the_next_acquirer_with_their_count():
    s = initial(0)
    t, _ = acquire(s, "m1", 4, range(4), CONFIG)
    acknowledge(s, "m1", t, [(1, 2, A.RELEASE, 0), (0, 0, A.ACCEPT, 0), (3, 3, A.ACCEPT, 0)], CONFIG)
    t2, taken = acquire(s, "m2", 10, range(4, 6), CONFIG)
    assert taken == [(1, 2, 2), (4, 5, 1)]
    assert roundtrip(s) == s


def test_an_acknowledgement_by_another_member_or_token_is_refused():
    s = initial(0)
    t, _ = acquire(s, "m1", 4, range(4), CONFIG)
    assert acknowledge(s, "m2", t, [(0, 3, A.ACCEPT, 0)], CONFIG) == [(0, 3)]
    assert acknowledge(s, "m1", t + 1, [(0, 3, A.ACCEPT, 0)], CONFIG) == [(0, 3)]
    assert counts(s) == {ACQUIRED: 4}


def test_an_expired_lock_refuses_the_late_acknowledgement_and_redelivers():
    s = initial(0)
    t, _ = acquire(s, "m1", 4, range(4), CONFIG)
    assert expire(s, t, CONFIG) == 4
    assert acknowledge(s, "m1", t, [(0, 3, A.ACCEPT, 0)], CONFIG) == [(0, 3)]
    t2, taken = acquire(s, "m2", 10, [], CONFIG)
    assert taken == [(0, 3, 2)]
    assert acknowledge(s, "m2", t2, [(0, 3, A.ACCEPT, 0)], CONFIG) == [] and s.start == 4


def test_at_most_one_accept_takes_effect():
    s = initial(0)
    t, _ = acquire(s, "m1", 2, range(2), CONFIG)
    acknowledge(s, "m1", t, [(0, 0, A.ACCEPT, 0)], CONFIG)
    assert acknowledge(s, "m1", t, [(0, 0, A.ACCEPT, 0)], CONFIG) == [(0, 0)]


def test_past_the_delivery_limit_a_record_is_archived():
    s = initial(0)
    for n in range(1, 4):
        t, taken = acquire(s, "m1", 1, range(1), CONFIG)
        assert taken == [(0, 0, n)]
        expire(s, t, CONFIG)
    assert (s.start, s.ranges) == (1, [])   # archived (no dead-letter topic): done


def test_reject_with_a_dead_letter_topic_waits_for_its_letter_then_is_done():
    config = ShareGroupConfig(dead_letter_topic="dlq", max_record_locks=100)
    s = initial(0)
    t, _ = acquire(s, "m1", 3, range(3), config)
    acknowledge(s, "m1", t, [(0, 0, A.REJECT, 0), (1, 2, A.ACCEPT, 0)], config)
    assert s.ranges == [[0, 0, DEAD_LETTER, 1, 0, REJECTED], [1, 2, ACCEPTED, 0, 0, 0]] and s.start == 0
    w, letters = claim_dead_letters(s, "m2", 10, dead_letter_end=7)
    assert letters == [(0, 0, 1, REJECTED)] and s.dlq_scan == 7 and s.ranges[0][2] == WRITING
    assert roundtrip(s) == s
    assert dead_letters_written(s, "m2", w) and (s.start, s.ranges, s.dlq_scan) == (3, [], -1)


def test_an_expired_dead_letter_claim_is_pending_again_with_its_scan_start():
    config = ShareGroupConfig(dead_letter_topic="dlq", delivery_count_limit=2, max_record_locks=100)
    s = initial(0)
    for _ in range(2):
        t, _ = acquire(s, "m1", 1, range(1), config)
        expire(s, t, config)
    assert s.ranges == [[0, 0, DEAD_LETTER, 2, 0, DELIVERY_LIMIT]]
    w, _ = claim_dead_letters(s, "m1", 10, 4)
    expire(s, w, config)
    assert s.ranges[0][2] == DEAD_LETTER and s.dlq_scan == 4
    assert not dead_letters_written(s, "m1", w)


def test_a_release_with_a_delay_waits_for_the_decider():
    s = initial(0)
    t, _ = acquire(s, "m1", 2, range(2), CONFIG)
    acknowledge(s, "m1", t, [(0, 1, A.RELEASE, 500)], CONFIG)
    assert s.ranges == [[0, 1, DELAYED, 1, t, 500]]
    assert acquire(s, "m2", 10, [], CONFIG)[1] == []
    assert not promote(s, 0, t + 7) and promote(s, 0, t)
    assert acquire(s, "m2", 10, [], CONFIG)[1] == [(0, 1, 2)]


def test_a_record_delayed_later_is_not_promoted_by_the_clock_of_its_neighbour():
    # Found by the share-group model (bin/model share, invariant 7): two records of one token
    # released with the same delay at different times were merged into one delayed range, so
    # the decider's clock of the first (keyed by the range's first offset and token) promoted
    # the second early.
    s = initial(0)
    t, _ = acquire(s, "m1", 2, range(2), CONFIG)
    acknowledge(s, "m1", t, [(0, 0, A.RELEASE, 1000)], CONFIG)
    assert delayed(s) == [(0, t, 1000)]           # the decider starts a clock for (0, t)
    acknowledge(s, "m1", t, [(1, 1, A.RELEASE, 1000)], CONFIG)
    assert delayed(s) == [(0, t, 1000), (1, t, 1000)]   # 1 gets a clock of its own
    assert promote(s, 0, t) and counts(s) == {AVAILABLE: 1, DELAYED: 1}
    assert roundtrip(s) == s


def test_the_group_backoff_delays_expired_and_released_records_doubling():
    config = ShareGroupConfig(backoff_ms=100, backoff_max_ms=250, delivery_count_limit=5, max_record_locks=100)
    assert [config.redelivery_delay_ms(n) for n in (1, 2, 3, 4)] == [100, 200, 250, 250]
    s = initial(0)
    t, _ = acquire(s, "m1", 1, range(1), config)
    expire(s, t, config)
    assert s.ranges[0][2] == DELAYED and s.ranges[0][5] == 100


def test_renew_counts_on_the_token_and_is_refused_to_others():
    s = initial(0)
    t, _ = acquire(s, "m1", 2, range(2), CONFIG)
    assert acknowledge(s, "m1", t, [(0, 0, A.RENEW, 0)], CONFIG) == []
    assert s.held[t] == ["m1", 1]
    assert acknowledge(s, "m2", t, [(0, 0, A.RENEW, 0)], CONFIG) == [(0, 0)]


def test_a_holder_that_left_has_everything_released():
    s = initial(0)
    acquire(s, "m1", 2, range(2), CONFIG)
    acquire(s, "m2", 2, range(2, 4), CONFIG)
    acquire(s, "m1", 2, range(4, 6), CONFIG)
    assert expire_holder(s, "m1", CONFIG) == 4
    assert counts(s) == {AVAILABLE: 4, ACQUIRED: 2} and list(s.held.values()) == [["m2", 0]]


def test_records_never_handed_out_go_back_uncounted():
    s = initial(0)
    t, _ = acquire(s, "m1", 4, range(4), CONFIG)
    release_undelivered(s, "m1", t, 2, 3)
    assert s.ranges[1] == [2, 3, AVAILABLE, 0, 0, 0]
    assert acquire(s, "m2", 10, [], CONFIG)[1] == [(2, 3, 1)]


def test_reset_refuses_while_records_are_held():
    s = initial(0)
    acquire(s, "m1", 2, range(2), CONFIG)
    with pytest.raises(ValueError):
        reset(s, 100)
    assert reset(initial(3), 100).start == 100


def test_the_znode_stays_under_zookeepers_limit_however_the_window_is_cut():
    """The widest window (10,000), one range per record, the most tokens held (500), each by a
    member of the longest id, at 13-digit offsets: under 700 KB (ZooKeeper refuses 1 MB)."""
    from coordinator.protocol.share import MAX_HELD_TOKENS, MAX_WINDOW
    config = ShareGroupConfig(max_record_locks=MAX_WINDOW, delivery_count_limit=10)
    base = 10 ** 12
    s = initial(base)
    for i in range(MAX_HELD_TOKENS):
        acquire(s, f"{i:03d}" + "m" * 246, 1, [base + i], config)
    assert acquire(s, "one-more", 1, [base + MAX_HELD_TOKENS], config)[1] == []   # no token left
    t = next(iter(s.held))
    for i in range(MAX_HELD_TOKENS, MAX_WINDOW):   # the rest of the window: every other record accepted
        s.ranges.append([base + i, base + i, ACCEPTED if i % 2 else AVAILABLE, 9, 0, 0])
        s.end = base + i + 1
    assert len(s.ranges) > MAX_WINDOW - 10 and t
    size = len(s.encode())
    assert size < 700_000, size
    assert roundtrip(s).held == s.held


def test_a_state_keeps_the_ids_of_its_last_writes():
    from coordinator.protocol.share import RECENT_WRITES
    from coordinator.share_partition import note_write
    s = initial(0)
    for i in range(RECENT_WRITES + 3):
        note_write(s, f"m:{i}")
    assert s.writes[0] == "m:3" and len(s.writes) == RECENT_WRITES and roundtrip(s).writes == s.writes
    with pytest.raises(CorruptZnode):
        SharePartitionState.decode(
            b'{"version":1,"start":0,"end":0,"next_token":1,"dlq_scan":-1,"ranges":[],"held":{},"writes":[1]}', "/p")
