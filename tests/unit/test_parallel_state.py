"""The completed-offsets codec (round trip, its bound, and outside bytes: only CorruptZnode) and
a parallel consumer's progress and lanes (pure, no ZooKeeper)."""
import base64
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from coordinator import protocol
from coordinator.errors import CorruptZnode
from consumer.parallel_state import Lanes, Progress, Work
from consumer.records import ConsumerRecord, TopicPartition

PATH = "/consumers/groups/g/completed/t/0"
SPAN = protocol.MAX_COMPLETED_SPAN


@given(st.integers(0, 2 ** 40), st.sets(st.integers(1, SPAN)))
def test_completed_offsets_round_trip(base, deltas):
    done = {base + d for d in deltas}
    assert protocol.decode_completed(protocol.encode_completed(base, done), PATH) == (base, frozenset(done))


def test_the_encoding_is_bounded_and_refuses_what_is_outside_the_span():
    assert len(protocol.encode_completed(0, range(1, SPAN + 1, 2))) < 1000  # compressed: a few hundred bytes
    with pytest.raises(ValueError):
        protocol.encode_completed(10, [10])
    with pytest.raises(ValueError):
        protocol.encode_completed(10, [11 + SPAN])


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_outside_bytes_raise_only_corrupt_znode(raw):
    try:
        protocol.decode_completed(raw, PATH)
    except CorruptZnode:
        pass


@pytest.mark.parametrize("obj", [
    b'{"version":2,"base":1,"bitmap":""}', b'{"version":1,"base":-1,"bitmap":""}',
    b'{"version":1,"base":true,"bitmap":""}', b'{"version":1,"base":1,"bitmap":"@@"}',
    b'{"version":1,"base":1,"bitmap":"' + base64.b64encode(zlib.compress(bytes(SPAN // 8 + 1))) + b'"}',
    b'{"version":1,"base":1,"bitmap":"' + base64.b64encode(b"not zlib") + b'"}', b'[1]'])
def test_malformed_records_name_the_path(obj):
    with pytest.raises(CorruptZnode, match=PATH):
        protocol.decode_completed(obj, PATH)


def test_the_point_stops_at_the_lowest_unfinished_record_and_skips_what_was_finished():
    p = Progress(1, 100, skip={103})
    assert [p.take(o) for o in (100, 101, 102, 103, 104)] == [True, True, True, False, True]
    p.finish(101)
    p.finish(104)
    assert p.committable() == (100, frozenset({101, 103, 104}))
    p.finish(100)
    p.finish(102)
    assert p.committable() == (105, frozenset())
    p.committed((105, frozenset()))
    assert p.committable() is None


def record(offset, key):
    return ConsumerRecord("t", 0, offset, 0, key, b"", ())


@pytest.mark.parametrize("ordering, first", [("key", [0, 1]), ("partition", [0]), ("unordered", [0, 1, 2])])
def test_lanes_hand_out_one_record_of_a_lane_at_a_time(ordering, first):
    tp = TopicPartition("t", 0)
    lanes = Lanes(ordering)
    for offset, key in [(0, b"a"), (1, b"b"), (2, b"a")]:
        r = record(offset, key)
        lanes.add(Work(r, tp, 1, lanes.lane_of(r, tp, 1), 0.0))
    taken = []
    while (w := lanes.take()) is not None:
        taken.append(w)
    assert [w.record.offset for w in taken] == first
    lanes.finish(taken[0])
    assert [w.record.offset for w in iter(lanes.take, None)] == {"key": [2], "partition": [1],
                                                                  "unordered": []}[ordering]
    assert lanes.drop(tp) == {"key": 0, "partition": 1, "unordered": 0}[ordering]  # queued, dropped at a revoke
    assert lanes.queued == 0 and lanes.take() is None
