"""Table-driven tests of the assignment strategies (pure functions; no ZooKeeper)."""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from coordinator.assignors import (DEFAULT_STRATEGY, STRATEGIES, assign, choose_strategy)
from coordinator.assignors import range as range_assignor
from coordinator.assignors import roundrobin as roundrobin_assignor
from coordinator.errors import NoCommonStrategy, ZkGroupsError
from coordinator.protocol import consumer_of_stream, stream_id

STRATEGY_NAMES = sorted(STRATEGIES)


# ---------------------------------------------------------------- helpers

def check_valid(members, partitions, ownership):
    """The contract every strategy keeps (see coordinator/assignors/__init__.py)."""
    subscribed = {t for sub in members.values() for t in sub if t in partitions}
    assert set(ownership) == subscribed
    for topic, owned in ownership.items():
        assert sorted(owned) == list(range(partitions[topic])), topic
        for partition, sid in owned.items():
            cid = consumer_of_stream(sid)
            index = int(sid.rsplit("-", 1)[1])
            assert cid in members, sid
            assert topic in members[cid], f"{sid} owns {topic}-{partition} but does not subscribe to it"
            assert 0 <= index < members[cid][topic], sid


def per_stream_counts(members, topic, owned):
    """Partitions of one topic per subscribed stream, idle streams included as 0."""
    counts = {stream_id(cid, i): 0 for cid, sub in members.items() for i in range(sub.get(topic, 0))}
    counts.update(Counter(owned.values()))
    return counts


def expand(spec):
    """{stream id: [partitions]} -> {partition: stream id}; keeps expected tables readable."""
    return {p: sid for sid, parts in spec.items() for p in parts}


def shuffled(mapping, rng):
    items = list(mapping.items())
    rng.shuffle(items)
    return {k: (shuffled(v, rng) if isinstance(v, dict) else v) for k, v in items}


def naive_roundrobin(members, partitions):
    """Reference: Kafka's RoundRobinAssignor walk, one ring step at a time."""
    ring = sorted((cid, i) for cid, sub in members.items() for i in range(max(sub.values(), default=0)))
    out, cursor = {}, 0
    for topic in sorted({t for sub in members.values() for t in sub if t in partitions}):
        owned = {}
        for p in range(partitions[topic]):
            while True:
                cid, i = ring[cursor % len(ring)]
                cursor += 1
                if members[cid].get(topic, 0) > i:
                    owned[p] = stream_id(cid, i)
                    break
        out[topic] = owned
    return out


def random_group(rng, n_members=None, n_topics=None):
    n_members = rng.randint(1, 12) if n_members is None else n_members
    n_topics = rng.randint(1, 5) if n_topics is None else n_topics
    partitions = {f"t{j}": rng.randint(0, 40) for j in range(n_topics)}
    members = {}
    for m in range(n_members):
        topics = rng.sample(sorted(partitions) + ["gone"], rng.randint(1, n_topics + 1))
        members[f"g_host-{rng.randint(1, 99)}-{m:03x}"] = {t: rng.randint(1, 12) for t in topics}
    return members, partitions


# ---------------------------------------------------------------- range

RANGE_CASES = [
    ("even split",
     {"a": {"t": 1}, "b": {"t": 1}}, {"t": 4},
     {"t": expand({"a-0": [0, 1], "b-0": [2, 3]})}),
    ("uneven split: first P % S streams get one more",
     {"a": {"t": 1}, "b": {"t": 1}, "c": {"t": 1}}, {"t": 7},
     {"t": expand({"a-0": [0, 1, 2], "b-0": [3, 4], "c-0": [5, 6]})}),
    ("more streams than partitions: last streams idle",
     {"a": {"t": 1}, "b": {"t": 1}, "c": {"t": 1}}, {"t": 2},
     {"t": expand({"a-0": [0], "b-0": [1]})}),
    ("multiple streams per member",
     {"a": {"t": 2}, "b": {"t": 1}}, {"t": 5},
     {"t": expand({"a-0": [0, 1], "a-1": [2, 3], "b-0": [4]})}),
    ("per topic: ranges restart at the first stream of every topic",
     {"a": {"x": 1, "y": 1}, "b": {"x": 1, "y": 1}}, {"x": 3, "y": 3},
     {"x": expand({"a-0": [0, 1], "b-0": [2]}), "y": expand({"a-0": [0, 1], "b-0": [2]})}),
    ("different subscriptions in one group",
     {"a": {"x": 1, "y": 1}, "b": {"y": 1}}, {"x": 2, "y": 3},
     {"x": expand({"a-0": [0, 1]}), "y": expand({"a-0": [0, 1], "b-0": [2]})}),
    ("different stream counts per topic",
     {"a": {"x": 2, "y": 1}, "b": {"x": 1, "y": 1}}, {"x": 3, "y": 2},
     {"x": expand({"a-0": [0], "a-1": [1], "b-0": [2]}), "y": expand({"a-0": [0], "b-0": [1]})}),
    ("topic nobody subscribes to is absent",
     {"a": {"t": 1}}, {"t": 2, "other": 5},
     {"t": expand({"a-0": [0, 1]})}),
    ("subscribed topic missing from partitions is ignored",
     {"a": {"t": 1, "deleted": 1}}, {"t": 1},
     {"t": {0: "a-0"}}),
    ("subscribed topic with 0 partitions is present and empty",
     {"a": {"t": 1, "empty": 2}}, {"t": 1, "empty": 0},
     {"t": {0: "a-0"}, "empty": {}}),
    ("member with an empty subscription gets nothing",
     {"a": {}, "b": {"t": 1}}, {"t": 2},
     {"t": expand({"b-0": [0, 1]})}),
    ("no members", {}, {"t": 3}, {}),
    ("no members, no topics", {}, {}, {}),
    ("12 streams of one member: index order is numeric (c-2 before c-10)",
     {"c": {"t": 12}}, {"t": 12},
     {"t": {p: f"c-{p}" for p in range(12)}}),
    ("consumer id order first, then numeric index",
     {"b": {"t": 1}, "a": {"t": 11}}, {"t": 12},
     {"t": {**{p: f"a-{p}" for p in range(11)}, 11: "b-0"}}),
    ("consumer ids containing dashes (legacy group_host-timestamp-uuid form)",
     {"g_h-1700-ff": {"t": 2}, "g_h-1600-aa": {"t": 1}}, {"t": 3},
     {"t": expand({"g_h-1600-aa-0": [0], "g_h-1700-ff-0": [1], "g_h-1700-ff-1": [2]})}),
]


@pytest.mark.parametrize("members,partitions,expected",
                         [c[1:] for c in RANGE_CASES], ids=[c[0] for c in RANGE_CASES])
def test_range_table(members, partitions, expected):
    result = assign("range", members, partitions)
    assert result == expected
    check_valid(members, partitions, result)
    assert range_assignor.assign(members, partitions) == expected


# ---------------------------------------------------------------- roundrobin

ROUNDROBIN_CASES = [
    ("even split: partitions dealt in turn",
     {"a": {"t": 1}, "b": {"t": 1}}, {"t": 4},
     {"t": expand({"a-0": [0, 2], "b-0": [1, 3]})}),
    ("ring position carries over to the next topic",
     {"a": {"x": 1, "y": 1}, "b": {"x": 1, "y": 1}}, {"x": 3, "y": 2},
     {"x": expand({"a-0": [0, 2], "b-0": [1]}), "y": expand({"b-0": [0], "a-0": [1]})}),
    ("topics in name order, partitions in numeric order",
     {"a": {"y": 1, "x": 1}, "b": {"x": 1, "y": 1}}, {"y": 11, "x": 1},
     {"x": {0: "a-0"}, "y": {p: ("b-0" if p % 2 == 0 else "a-0") for p in range(11)}}),
    ("more streams than partitions: last streams idle",
     {"a": {"t": 2}, "b": {"t": 2}}, {"t": 3},
     {"t": expand({"a-0": [0], "a-1": [1], "b-0": [2]})}),
    ("multiple streams per member",
     {"a": {"t": 2}, "b": {"t": 1}}, {"t": 5},
     {"t": expand({"a-0": [0, 3], "a-1": [1, 4], "b-0": [2]})}),
    # Kafka's RoundRobinAssignor javadoc example: C0 [t0], C1 [t0, t1], C2 [t0, t1, t2]
    ("different subscriptions: unsubscribed streams are skipped (Kafka's example)",
     {"c0": {"t0": 1}, "c1": {"t0": 1, "t1": 1}, "c2": {"t0": 1, "t1": 1, "t2": 1}},
     {"t0": 1, "t1": 2, "t2": 3},
     {"t0": {0: "c0-0"}, "t1": {0: "c1-0", 1: "c2-0"}, "t2": expand({"c2-0": [0, 1, 2]})}),
    ("different stream counts per topic: stream i subscribes while i < n",
     {"a": {"x": 2, "y": 1}, "b": {"x": 1, "y": 1}}, {"x": 3, "y": 2},
     {"x": expand({"a-0": [0], "a-1": [1], "b-0": [2]}), "y": expand({"a-0": [0], "b-0": [1]})}),
    ("topic nobody subscribes to is absent",
     {"a": {"t": 1}}, {"t": 2, "other": 5},
     {"t": expand({"a-0": [0, 1]})}),
    ("subscribed topic with 0 partitions is present and empty",
     {"a": {"t": 1, "empty": 1}}, {"t": 1, "empty": 0},
     {"t": {0: "a-0"}, "empty": {}}),
    ("member with an empty subscription gets nothing",
     {"a": {}, "b": {"t": 1}}, {"t": 2},
     {"t": expand({"b-0": [0, 1]})}),
    ("no members", {}, {"t": 3}, {}),
    ("11 streams: index order is numeric (a-2 before a-10)",
     {"a": {"t": 11}, "b": {"t": 1}}, {"t": 12},
     {"t": {**{p: f"a-{p}" for p in range(11)}, 11: "b-0"}}),
]


@pytest.mark.parametrize("members,partitions,expected",
                         [c[1:] for c in ROUNDROBIN_CASES], ids=[c[0] for c in ROUNDROBIN_CASES])
def test_roundrobin_table(members, partitions, expected):
    result = assign("roundrobin", members, partitions)
    assert result == expected
    check_valid(members, partitions, result)
    assert result == naive_roundrobin(members, partitions)


@pytest.mark.parametrize("seed", range(40))
def test_roundrobin_matches_step_by_step_walk(seed):
    members, partitions = random_group(random.Random(seed))
    assert roundrobin_assignor.assign(members, partitions) == naive_roundrobin(members, partitions)


# ---------------------------------------------------------------- both strategies

@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("seed", range(25))
def test_contract_on_random_groups(strategy, seed):
    members, partitions = random_group(random.Random(seed))
    check_valid(members, partitions, assign(strategy, members, partitions))


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("seed", range(10))
def test_deterministic_whatever_the_dict_order(strategy, seed):
    rng = random.Random(1000 + seed)
    members, partitions = random_group(rng)
    expected = assign(strategy, members, partitions)
    for _ in range(5):
        again = assign(strategy, shuffled(members, rng), shuffled(partitions, rng))
        assert again == expected
        assert json.dumps(again) == json.dumps(expected)  # even the key order


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_inputs_are_not_modified(strategy):
    members, partitions = random_group(random.Random(7))
    before = json.dumps([members, partitions])
    assign(strategy, members, partitions)
    assert json.dumps([members, partitions]) == before


def test_range_balance_500_partitions_50_members_per_topic():
    rng = random.Random(5)
    members = {f"m{i:02d}": {t: rng.randint(1, 3) for t in ("a", "b", "c")} for i in range(50)}
    partitions = {"a": 500, "b": 499, "c": 7}
    result = assign("range", members, partitions)
    check_valid(members, partitions, result)
    for topic, owned in result.items():
        counts = per_stream_counts(members, topic, owned).values()
        assert max(counts) - min(counts) <= 1, topic


def test_range_500_partitions_50_single_stream_members_get_ten_each():
    members = {f"m{i}": {"t": 1} for i in range(50)}
    result = assign("range", members, {"t": 500})
    assert set(Counter(result["t"].values()).values()) == {10}


@pytest.mark.parametrize("streams", [1, 3])
def test_roundrobin_balance_overall_with_equal_subscriptions(streams):
    topics = {"a": 123, "b": 200, "c": 170, "d": 7}  # 500 partitions
    members = {f"m{i}": {t: streams for t in topics} for i in range(50)}
    result = assign("roundrobin", members, topics)
    check_valid(members, topics, result)
    counts = Counter(sid for owned in result.values() for sid in owned.values())
    all_streams = [stream_id(f"m{i}", s) for i in range(50) for s in range(streams)]
    overall = [counts.get(sid, 0) for sid in all_streams]
    assert sum(overall) == 500
    assert max(overall) - min(overall) <= 1


def test_range_favours_first_streams_across_topics_roundrobin_does_not():
    """Why roundrobin exists: 3 topics x 1 partition, 3 members."""
    members = {c: {"x": 1, "y": 1, "z": 1} for c in "abc"}
    partitions = {"x": 1, "y": 1, "z": 1}
    ranged = Counter(s for o in assign("range", members, partitions).values() for s in o.values())
    dealt = Counter(s for o in assign("roundrobin", members, partitions).values() for s in o.values())
    assert ranged == {"a-0": 3}
    assert dealt == {"a-0": 1, "b-0": 1, "c-0": 1}


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_large_group_with_sparse_subscriptions(strategy):
    """100k partitions, 4000 streams; one topic only the last stream subscribes to (the worst
    case of a step-by-step ring walk). Must stay fast: O(P log S)."""
    members = {f"m{i:04d}": {"big": 4} for i in range(1000)}
    members["m0999"]["lonely"] = 1
    partitions = {"big": 90_000, "lonely": 10_000}
    result = assign(strategy, members, partitions)
    assert set(result["lonely"].values()) == {"m0999-0"}
    assert len(result["big"]) == 90_000


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("members,partitions", [
    ({"a": {"t": 0}}, {"t": 1}),
    ({"a": {"t": -1}}, {"t": 1}),
    ({"a": {"t": True}}, {"t": 1}),
    ({"a": {"t": "2"}}, {"t": 1}),
    ({"": {"t": 1}}, {"t": 1}),
    ({"a": {"t": 1}}, {"t": -1}),
])
def test_malformed_input_is_rejected(strategy, members, partitions):
    with pytest.raises(ValueError):
        assign(strategy, members, partitions)


def test_unknown_strategy_name():
    with pytest.raises(NoCommonStrategy, match="unknown assignment strategy 'sticky'.*range, roundrobin"):
        assign("sticky", {"a": {"t": 1}}, {"t": 1})


def test_registry():
    assert STRATEGIES == {"range": range_assignor.assign, "roundrobin": roundrobin_assignor.assign}
    assert DEFAULT_STRATEGY == "range"


# ---------------------------------------------------------------- choose_strategy

CHOOSE_CASES = [
    ("no members: the default", {}, "range"),
    ("one member", {"a": ["roundrobin", "range"]}, "roundrobin"),
    ("everyone agrees", {"a": ["range"], "b": ["range"]}, "range"),
    ("everyone prefers roundrobin",
     {"a": ["roundrobin", "range"], "b": ["roundrobin", "range"]}, "roundrobin"),
    ("rolling upgrade: old member only knows range",
     {"a": ["roundrobin", "range"], "b": ["range"], "c": ["roundrobin", "range"]}, "range"),
    ("unknown names are ignored",
     {"a": ["sticky", "roundrobin", "range"], "b": ["roundrobin"]}, "roundrobin"),
    ("majority vote", {"a": ["range", "roundrobin"], "b": ["roundrobin", "range"],
                       "c": ["roundrobin", "range"]}, "roundrobin"),
    ("majority vote, other way", {"a": ["roundrobin", "range"], "b": ["range", "roundrobin"],
                                  "c": ["range", "roundrobin"]}, "range"),
    ("tie: smallest consumer id's preference wins",
     {"a": ["roundrobin", "range"], "b": ["range", "roundrobin"]}, "roundrobin"),
    ("tie, ids swapped", {"b": ["roundrobin", "range"], "a": ["range", "roundrobin"]}, "range"),
    ("a vote for a strategy others lack goes to the member's next choice",
     {"a": ["sticky", "roundrobin"], "b": ["range", "roundrobin"], "c": ["roundrobin"]}, "roundrobin"),
    ("duplicates in a list", {"a": ["range", "range", "roundrobin"], "b": ["roundrobin", "range"],
                              "c": ["roundrobin"]}, "roundrobin"),
    ("tuples are fine", {"a": ("roundrobin",)}, "roundrobin"),
]


@pytest.mark.parametrize("member_strategies,expected",
                         [c[1:] for c in CHOOSE_CASES], ids=[c[0] for c in CHOOSE_CASES])
def test_choose_strategy(member_strategies, expected):
    assert choose_strategy(member_strategies) == expected
    assert choose_strategy(dict(reversed(list(member_strategies.items())))) == expected


@pytest.mark.parametrize("member_strategies,fragments", [
    ({"a": ["range"], "b": ["roundrobin"]},
     ["all 2 members", "[range] by a", "[roundrobin] by b", "known: range, roundrobin"]),
    ({"a": ["sticky"]}, ["[sticky] by a", "unknown: sticky"]),
    ({"a": [], "b": ["range"]}, ["[] by a"]),
    ({f"c{i:02d}": ["range"] for i in range(20)} | {"z": ["roundrobin"]},
     ["all 21 members", "[range] by c00, c01, c02 and 17 more", "[roundrobin] by z"]),
])
def test_no_common_strategy(member_strategies, fragments):
    with pytest.raises(NoCommonStrategy) as info:
        choose_strategy(member_strategies)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    assert isinstance(info.value, ZkGroupsError) and not info.value.retriable


def test_no_common_strategy_message_is_bounded_for_many_lists():
    members = {f"c{i}": [f"custom{i}"] for i in range(200)}
    with pytest.raises(NoCommonStrategy) as info:
        choose_strategy(members)
    assert "195 other lists" in str(info.value)
    assert "and 190 more" in str(info.value) and len(str(info.value)) < 600


def test_strategies_must_be_a_list():
    with pytest.raises(ValueError):
        choose_strategy({"a": "range"})
