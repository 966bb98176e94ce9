"""The rebalance timeline's pure parts: what an entry says about a rebalance, and the ring's
bound and format (the recorder writing it is exercised by tests/console/test_console_api.py)."""
import json

import pytest

from coordinator import protocol, timeline
from coordinator.errors import CorruptZnode
from coordinator.protocol import GroupState, RebalanceRecord, StaticMember


def state(members, assignment, generation=2, static=None, error=""):
    return GroupState(generation, protocol.STABLE, list(members), assignment, "range", error, 1,
                      static=static or {})


def entry(members, topics=None, held=None, generation=1):
    return RebalanceRecord(generation, 1000, protocol.STABLE, members_after=len(members), members=list(members),
                           topics=topics or {"t": 2}, held=held or {})


TWO = {"t": {0: "a-0", 1: "b-0"}}


@pytest.mark.parametrize("previous, now, reasons, joined, left", [
    (None, state(["a"], {"t": {0: "a-0", 1: "a-0"}}, generation=1), [timeline.JOIN], ["a"], []),
    (None, state(["a"], {"t": {0: "a-0", 1: "a-0"}}), [timeline.CHANGED], [], []),
    (entry(["a"]), state(["a", "b"], TWO), [timeline.JOIN], ["b"], []),
    (entry(["a", "b"]), state(["a"], {"t": {0: "a-0", 1: "a-0"}}), [timeline.LEAVE], [], ["b"]),
    (entry(["a", "b"]), state(["b", "c"], TWO), [timeline.JOIN, timeline.LEAVE], ["c"], ["a"]),
    (entry(["a", "b"]), state(["a", "b"], {"t": {0: "a-0", 1: "b-0", 2: "a-0"}}), [timeline.TOPIC_GREW], [], []),
    (entry(["a", "b"]), state(["a", "b"], {**TWO, "u": {0: "a-0"}}), [timeline.TOPIC_ADDED], [], []),
    (entry(["a", "b"]), state(["a", "b"], TWO), [timeline.REPAIRED], [], []),
    (entry(["a", "b"], held={"b": 5000}), state(["a"], {"t": {0: "a-0", 1: "a-0"}}), [timeline.STATIC_EXPIRED],
     [], ["b"]),
])
def test_reasons_come_from_the_previous_entry_and_the_state(previous, now, reasons, joined, left):
    record = timeline.build_record(now, previous, protocol.STABLE, 2000, "n1", 3)
    assert (record.reasons, record.joined, record.left) == (reasons, joined, left)
    assert record.members_after == len(now.members)
    assert record.members_before == (previous.members_after if previous else 0 if now.generation == 1 else None)
    assert record.members == sorted(now.members) and (record.node, record.epoch) == ("n1", 3)


def test_static_members_away_and_back_and_members_not_acking():
    away = StaticMember("i1", 3000, {"t": 1}, away_since=1000)
    now = state(["a", "g_static-i1"], TWO, static={"g_static-i1": away})
    record = timeline.build_record(now, entry(["a", "g_static-i1"]), timeline.HELD, 2000, "n", 1)
    assert record.reasons == [timeline.STATIC_AWAY] and record.held == {"g_static-i1": 4000}
    back = timeline.build_record(state(["a", "g_static-i1"], TWO), record, protocol.STABLE, 3000, "n", 1,
                                 detail=["static members ['g_static-i1'] returned"], moved=1)
    assert back.reasons == [timeline.STATIC_BACK] and back.held == {} and back.moved == 1
    retried = timeline.build_record(state(["a"], {"t": {0: "a-0", 1: "a-0"}}), entry(["a", "b"]), protocol.STABLE,
                                    3000, "n", 1, excluded=["b"])
    assert retried.reasons == [timeline.LEAVE, timeline.NOT_ACKED] and retried.excluded == ["b"]


def test_the_ring_keeps_the_newest_entries_and_only_the_newest_keeps_its_members():
    entries = [entry([f"m{i}"], generation=i) for i in range(protocol.TIMELINE_ENTRIES + 5)]
    raw = protocol.encode_timeline(entries)
    back = protocol.decode_timeline(raw, "/t")
    assert [e.generation for e in back] == list(range(5, protocol.TIMELINE_ENTRIES + 5))
    assert [e.members for e in back[:-1]] == [None] * (protocol.TIMELINE_ENTRIES - 1)
    assert back[-1].members == [f"m{protocol.TIMELINE_ENTRIES + 4}"]
    assert "members" not in json.loads(raw)["entries"][0]


def test_entries_name_a_bounded_number_of_members_and_the_znode_stays_small():
    members = [f"group_host-{i:05d}-0123456789abcdef" for i in range(protocol.TIMELINE_MEMBERS)]
    big = state(members, {"t": {p: f"{members[p % len(members)]}-0" for p in range(5000)}}, error="x" * 200)
    first = timeline.build_record(big, entry([]), protocol.STABLE, 1, "n", 1)
    assert len(first.encode()["joined"]) == protocol.TIMELINE_IDS and first.members_after == len(members)
    ring = [first] * protocol.TIMELINE_ENTRIES
    assert len(protocol.encode_timeline(ring)) < 200_000  # far below ZooKeeper's 1 MB


@pytest.mark.parametrize("raw, problem", [
    (b"[]", "not a JSON object"), (b'{"version": 2, "entries": []}', "unsupported version"),
    (b'{"version": 1}', "no 'entries'"), (b'{"version": 1, "entries": [{"generation": "x"}]}', "malformed"),
])
def test_a_damaged_timeline_names_its_path(raw, problem):
    with pytest.raises(CorruptZnode, match=problem):
        protocol.decode_timeline(raw, "/consumers/groups/g/timeline")
