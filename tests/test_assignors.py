"""Table-driven tests of the assignment strategies (pure functions; no ZooKeeper)."""
from __future__ import annotations

import copy
import itertools
import json
import random
from collections import Counter

import pytest

from coordinator.assignors import (DEFAULT_STRATEGY, STRATEGIES, assign, choose_strategy)
from coordinator.assignors import range as range_assignor
from coordinator.assignors import roundrobin as roundrobin_assignor
from coordinator.assignors import sticky as sticky_assignor
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


def random_previous(rng, members, partitions, garbage=False):
    """A previous assignment for ``members``: the output of some strategy for an earlier
    version of the group (members gone or new, stream counts and partition counts changed), or
    a random, possibly unbalanced one. With ``garbage``, also entries a corrupt or foreign
    state znode could hold: departed streams, partitions beyond P, wrong types."""
    streams = sorted({stream_id(cid, i)
                      for cid, sub in members.items() for i in range(max(sub.values(), default=0))})
    departed = [stream_id(f"gone-{k}", i) for k in range(3) for i in range(2)]
    if rng.random() < 0.5:
        old_members = {cid: {t: max(1, n + rng.randint(-1, 1)) for t, n in sub.items()}
                       for cid, sub in members.items() if rng.random() < 0.8}
        for k in range(rng.randint(0, 3)):
            old_members[f"gone-{k}"] = {t: rng.randint(1, 2) for t in partitions}
        old_partitions = {t: max(0, n + rng.randint(-5, 2)) for t, n in partitions.items()}
        previous = assign(rng.choice(STRATEGY_NAMES), old_members, old_partitions)
    else:
        previous = {t: {p: rng.choice(streams + departed) for p in range(n) if rng.random() < 0.8}
                    for t, n in partitions.items() if rng.random() < 0.9 and streams}
    if garbage:
        junk_keys = [-1, 10**6, "3", None, 2.0, True, (1, 2)]
        junk_values = [None, 7, ["a-0"], "", "nobody", "-0"] + departed + streams[:3]
        for t in list(previous) + ["gone-topic"]:
            owned = previous.setdefault(t, {})
            for _ in range(rng.randint(0, 6)):
                key = rng.choice(junk_keys + [partitions.get(t, 0) + rng.randint(0, 3)])
                owned[key] = rng.choice(junk_values)
            if owned and rng.random() < 0.5:
                p = rng.choice(sorted(k for k in owned if type(k) is int) or [0])
                owned[p] = rng.choice(junk_values)
        previous["not-a-map"] = ["a-0", "b-0"]
        if partitions and rng.random() < 0.3:
            previous[rng.choice(sorted(partitions))] = "a-0"
    return previous


def owners_before(previous, topic):
    """What a partition's previous owner was, reading ``previous`` the way sticky must: only int
    partitions (not bools, not floats equal to an int) of a topic mapped to a dict."""
    owned = previous.get(topic) if isinstance(previous, dict) else None
    if not isinstance(owned, dict):
        return {}
    return {p: sid for p, sid in owned.items() if type(p) is int}


def moved(previous, ownership):
    """Partitions whose owner is not the one ``previous`` named (new partitions and partitions of
    departed or garbage owners count too: they all get a new owner)."""
    total = 0
    for topic, owned in ownership.items():
        before = owners_before(previous, topic)
        total += sum(1 for p, sid in owned.items() if before.get(p) != sid)
    return total


def subscribed_streams(members, topic):
    return sorted(((cid, i) for cid, sub in members.items() for i in range(sub.get(topic, 0))))


def fewest_moves(members, partitions, previous):
    """The fewest partitions that must change owner for a per-topic balanced assignment (counts
    floor(P/S) or ceil(P/S)), computed independently of the greedy in sticky.py: a knapsack over
    which streams get the ``P % S`` larger shares."""
    total = 0
    for topic in sorted({t for sub in members.values() for t in sub if t in partitions}):
        count = partitions[topic]
        sids = [stream_id(cid, i) for cid, i in subscribed_streams(members, topic)]
        before = owners_before(previous, topic)
        kept = Counter(sid for p, sid in before.items() if 0 <= p < count and sid in sids)
        base, extra = divmod(count, len(sids))
        best = {0: 0}  # number of larger shares given so far -> most partitions that stay
        for sid in sids:
            step = {}
            for used, stay in best.items():
                for bigger in (0, 1):
                    if used + bigger <= extra:
                        value = stay + min(kept[sid], base + bigger)
                        step[used + bigger] = max(step.get(used + bigger, -1), value)
            best = step
        total += count - best[extra]
    return total


def brute_force_fewest_moves(members, partitions, previous):
    """The same minimum by trying every assignment of every topic (small inputs only)."""
    total = 0
    for topic in sorted({t for sub in members.values() for t in sub if t in partitions}):
        count = partitions[topic]
        sids = [stream_id(cid, i) for cid, i in subscribed_streams(members, topic)]
        before = owners_before(previous, topic)
        base = count // len(sids)
        fewest = None
        for owners in itertools.product(sids, repeat=count):
            counts = Counter(owners)
            if all(base <= counts[sid] <= base + 1 for sid in sids):
                n = sum(1 for p, sid in enumerate(owners) if before.get(p) != sid)
                fewest = n if fewest is None else min(fewest, n)
        total += fewest
    return total


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


# ---------------------------------------------------------------- sticky

def ten_members(n=10, partitions=100):
    members = {f"m{i}": {"t": 1} for i in range(n)}
    return members, {"t": partitions}


STICKY_CASES = [
    ("no previous: same as range",
     {"a": {"t": 1}, "b": {"t": 1}, "c": {"t": 1}}, {"t": 7}, None,
     {"t": expand({"a-0": [0, 1, 2], "b-0": [3, 4], "c-0": [5, 6]})}),
    ("unchanged group: nothing moves, even from a non-range layout",
     {"a": {"t": 1}, "b": {"t": 1}}, {"t": 4}, {"t": expand({"a-0": [0, 2], "b-0": [1, 3]})},
     {"t": expand({"a-0": [0, 2], "b-0": [1, 3]})}),
    ("the larger share goes to the stream that kept most, not the first",
     {"a": {"t": 1}, "b": {"t": 1}, "c": {"t": 1}}, {"t": 7},
     {"t": expand({"a-0": [0, 1], "c-0": [2, 3, 4, 5, 6]})},
     {"t": expand({"a-0": [0, 1], "b-0": [5, 6], "c-0": [2, 3, 4]})}),
    ("a stream over its share keeps its lowest partitions; the pool fills streams in order",
     {"a": {"t": 1}, "b": {"t": 1}}, {"t": 4}, {"t": expand({"b-0": [0, 1, 2, 3]})},
     {"t": expand({"a-0": [2, 3], "b-0": [0, 1]})}),
    ("new partitions go to the streams with room",
     {"a": {"t": 1}, "b": {"t": 1}}, {"t": 6}, {"t": expand({"a-0": [0, 1], "b-0": [2, 3]})},
     {"t": expand({"a-0": [0, 1, 4], "b-0": [2, 3, 5]})}),
    ("a member that unsubscribed from a topic loses it there, keeps the others",
     {"a": {"x": 1, "y": 1}, "b": {"y": 1}}, {"x": 2, "y": 2},
     {"x": expand({"a-0": [0], "b-0": [1]}), "y": expand({"a-0": [1], "b-0": [0]})},
     {"x": expand({"a-0": [0, 1]}), "y": expand({"a-0": [1], "b-0": [0]})}),
    ("fewer streams: a member's dropped stream gives its partitions up",
     {"a": {"t": 1}, "b": {"t": 1}}, {"t": 4},
     {"t": expand({"a-0": [0], "a-1": [1], "b-0": [2, 3]})},
     {"t": expand({"a-0": [0, 1], "b-0": [2, 3]})}),
    ("more streams than partitions: streams without kept partitions stay idle",
     {"a": {"t": 1}, "b": {"t": 1}, "c": {"t": 1}}, {"t": 2}, {"t": {0: "c-0", 1: "b-0"}},
     {"t": {0: "c-0", 1: "b-0"}}),
    ("partitions beyond P (topic shrank, or garbage) are ignored",
     {"a": {"t": 1}, "b": {"t": 1}}, {"t": 2}, {"t": {5: "a-0", 6: "a-0", 1: "a-0"}},
     {"t": {0: "b-0", 1: "a-0"}}),
    ("garbage previous: wrong types, unknown streams, non-map topics; never an error",
     {"a": {"t": 1, "u": 1}, "b": {"t": 1}}, {"t": 4, "u": 1},
     {"t": {"1": "b-0", 2.0: "a-0", None: "a-0", -1: "a-0", 9: "b-0", 0: ["b-0"], 1: 5, 3: "gone-0"},
      "u": "a-0", "gone": {0: "a-0"}},
     {"t": expand({"a-0": [0, 1], "b-0": [2, 3]}), "u": {0: "a-0"}}),
    ("a bool partition is not partition 1",
     {"a": {"t": 1}, "b": {"t": 1}}, {"t": 2}, {"t": {True: "a-0"}},
     {"t": {0: "a-0", 1: "b-0"}}),
    ("previous not a map at all", {"a": {"t": 1}}, {"t": 2}, ["a-0"], {"t": expand({"a-0": [0, 1]})}),
    ("subscribed topic with 0 partitions is present and empty",
     {"a": {"t": 1, "empty": 1}}, {"t": 1, "empty": 0}, {"empty": {0: "a-0"}},
     {"t": {0: "a-0"}, "empty": {}}),
    ("no members", {}, {"t": 3}, {"t": {0: "a-0"}}, {}),
    ("numeric stream order when filling (c-2 before c-10)",
     {"c": {"t": 11}}, {"t": 11}, {"t": {p: "c-0" for p in range(11)}},
     {"t": {0: "c-0", **{p: f"c-{p}" for p in range(1, 11)}}}),
]


@pytest.mark.parametrize("members,partitions,previous,expected",
                         [c[1:] for c in STICKY_CASES], ids=[c[0] for c in STICKY_CASES])
def test_sticky_table(members, partitions, previous, expected):
    result = assign("sticky", members, partitions, previous)
    assert result == expected
    check_valid(members, partitions, result)
    assert sticky_assignor.assign(members, partitions, previous) == expected


@pytest.mark.parametrize("newcomer", ["a", "m10", "z"])  # sorts first, in the middle, last
def test_sticky_member_joining_moves_only_what_it_needs(newcomer):
    members, partitions = ten_members()
    previous = assign("range", members, partitions)
    joined = {**members, newcomer: {"t": 1}}
    result = assign("sticky", joined, partitions, previous)
    check_valid(joined, partitions, result)
    changed = {p for p, sid in result["t"].items() if previous["t"][p] != sid}
    assert len(changed) == 9
    assert {result["t"][p] for p in changed} == {f"{newcomer}-0"}
    assert Counter(Counter(result["t"].values()).values()) == {9: 10, 10: 1}
    # range, by comparison, shifts every range after the newcomer's
    assert moved(previous, assign("range", joined, partitions)) > 30


@pytest.mark.parametrize("leaver", ["m0", "m4", "m9"])
def test_sticky_member_leaving_moves_only_its_own_partitions(leaver):
    members, partitions = ten_members()
    previous = assign("range", members, partitions)
    left = {cid: sub for cid, sub in members.items() if cid != leaver}
    result = assign("sticky", left, partitions, previous)
    check_valid(left, partitions, result)
    changed = {p for p, sid in result["t"].items() if previous["t"][p] != sid}
    assert changed == {p for p, sid in previous["t"].items() if sid == f"{leaver}-0"}
    assert Counter(Counter(result["t"].values()).values()) == {11: 8, 12: 1}


@pytest.mark.parametrize("seed", range(30))
def test_sticky_member_leaving_random_group(seed):
    """From a balanced previous assignment of the same partitions, removing a member moves
    exactly that member's partitions and no other."""
    rng = random.Random(3000 + seed)
    members, partitions = random_group(rng, n_members=rng.randint(2, 12))
    previous = assign("sticky", members, partitions, random_previous(rng, members, partitions))
    leaver = rng.choice(sorted(members))
    left = {cid: sub for cid, sub in members.items() if cid != leaver}
    result = assign("sticky", left, partitions, previous)
    check_valid(left, partitions, result)
    for topic, owned in result.items():
        for p, sid in owned.items():
            if previous[topic][p] != sid:
                assert consumer_of_stream(previous[topic][p]) == leaver, (topic, p)


@pytest.mark.parametrize("seed", range(60))
def test_sticky_balance_is_range_balance(seed):
    """Per topic, the same multiset of partition counts as range (so they differ by at most
    one), whatever ``previous`` holds, garbage included."""
    rng = random.Random(4000 + seed)
    members, partitions = random_group(rng)
    previous = random_previous(rng, members, partitions, garbage=seed % 2 == 0)
    result = assign("sticky", members, partitions, previous)
    check_valid(members, partitions, result)
    ranged = assign("range", members, partitions)
    assert set(result) == set(ranged)
    for topic, owned in result.items():
        counts = sorted(per_stream_counts(members, topic, owned).values())
        assert counts == sorted(per_stream_counts(members, topic, ranged[topic]).values()), topic
        assert not counts or counts[-1] - counts[0] <= 1, topic


@pytest.mark.parametrize("seed", range(60))
def test_sticky_moves_the_fewest_partitions(seed):
    rng = random.Random(5000 + seed)
    members, partitions = random_group(rng)
    previous = random_previous(rng, members, partitions, garbage=seed % 3 == 0)
    result = assign("sticky", members, partitions, previous)
    assert moved(previous, result) == fewest_moves(members, partitions, previous)


@pytest.mark.parametrize("seed", range(80))
def test_sticky_moves_the_fewest_partitions_brute_force(seed):
    """Small groups: against every possible balanced assignment."""
    rng = random.Random(6000 + seed)
    partitions = {t: rng.randint(0, 6) for t in ("x", "y")}
    members = {c: {t: rng.randint(1, 2) for t in rng.sample(["x", "y"], rng.randint(1, 2))}
               for c in "abc"[:rng.randint(1, 3)]}
    for topic in partitions:  # keep the search space small: at most 4 streams per topic
        while sum(sub.get(topic, 0) for sub in members.values()) > 4:
            cid = next(c for c in sorted(members) if members[c].get(topic, 0) > 1)
            members[cid][topic] -= 1
    previous = random_previous(rng, members, partitions, garbage=seed % 2 == 1)
    result = assign("sticky", members, partitions, previous)
    check_valid(members, partitions, result)
    assert moved(previous, result) == brute_force_fewest_moves(members, partitions, previous) \
        == fewest_moves(members, partitions, previous)


@pytest.mark.parametrize("seed", range(20))
def test_sticky_is_a_fixed_point(seed):
    """Fed its own output with the same group, it changes nothing (so the coordinator does not
    see a new assignment where nothing changed); fed nothing, it is range."""
    rng = random.Random(7000 + seed)
    members, partitions = random_group(rng)
    once = assign("sticky", members, partitions, random_previous(rng, members, partitions, garbage=True))
    assert assign("sticky", members, partitions, once) == once
    assert json.dumps(assign("sticky", members, partitions, once)) == json.dumps(once)
    ranged = assign("range", members, partitions)
    assert assign("sticky", members, partitions, ranged) == ranged
    assert assign("sticky", members, partitions) == ranged
    assert assign("sticky", members, partitions, {}) == ranged


def test_switching_from_roundrobin_to_sticky_keeps_a_balanced_layout():
    members = {f"m{i}": {"t": 2} for i in range(7)}
    partitions = {"t": 100}
    dealt = assign("roundrobin", members, partitions)
    assert assign("sticky", members, partitions, dealt) == dealt


@pytest.mark.parametrize("strategy", ["range", "roundrobin"])
@pytest.mark.parametrize("seed", range(10))
def test_range_and_roundrobin_ignore_previous(strategy, seed):
    rng = random.Random(8000 + seed)
    members, partitions = random_group(rng)
    previous = random_previous(rng, members, partitions, garbage=seed % 2 == 0)
    expected = assign(strategy, members, partitions)
    assert assign(strategy, members, partitions, previous) == expected
    assert STRATEGIES[strategy](members, partitions, previous) == expected
    stuck = assign("sticky", members, partitions, previous)
    assert assign(strategy, members, partitions, stuck) == expected


def test_sticky_large_group_member_joins():
    """100k partitions, 4000 streams, one member joins: only its share moves."""
    members = {f"m{i:04d}": {"big": 4} for i in range(1000)}
    partitions = {"big": 100_000}
    previous = assign("sticky", members, partitions)
    joined = {**members, "m0500x": {"big": 4}}
    result = assign("sticky", joined, partitions, previous)
    # 4004 streams: 3904 get 25 (all old streams that kept 25), 100 get 24 (96 old ones, which
    # give up one partition each, and the 4 new ones, which get those 96)
    assert moved(previous, result) == 96
    assert Counter(result["big"][p] for p in range(100_000) if result["big"][p] != previous["big"][p]) \
        == {f"m0500x-{i}": 24 for i in range(4)}


# ---------------------------------------------------------------- both strategies

@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("seed", range(25))
def test_contract_on_random_groups(strategy, seed):
    rng = random.Random(seed)
    members, partitions = random_group(rng)
    check_valid(members, partitions, assign(strategy, members, partitions))
    previous = random_previous(rng, members, partitions, garbage=seed % 2 == 1)
    check_valid(members, partitions, assign(strategy, members, partitions, previous))


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("seed", range(10))
def test_deterministic_whatever_the_dict_order(strategy, seed):
    rng = random.Random(1000 + seed)
    members, partitions = random_group(rng)
    previous = random_previous(rng, members, partitions, garbage=seed % 2 == 1)
    expected = assign(strategy, members, partitions, previous)
    for _ in range(5):
        again = assign(strategy, shuffled(members, rng), shuffled(partitions, rng), shuffled(previous, rng))
        assert again == expected
        assert json.dumps(again) == json.dumps(expected)  # even the key order


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_inputs_are_not_modified(strategy):
    rng = random.Random(7)
    members, partitions = random_group(rng)
    previous = random_previous(rng, members, partitions, garbage=True)
    before = copy.deepcopy([members, partitions, previous])
    assign(strategy, members, partitions, previous)
    assert [members, partitions, previous] == before
    assert repr([members, partitions, previous]) == repr(before)  # key order too


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
    with pytest.raises(NoCommonStrategy,
                       match="unknown assignment strategy 'cooperative-sticky'.*range, roundrobin, sticky"):
        assign("cooperative-sticky", {"a": {"t": 1}}, {"t": 1})


def test_registry():
    assert STRATEGIES == {"range": range_assignor.assign, "roundrobin": roundrobin_assignor.assign,
                          "sticky": sticky_assignor.assign}
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
     {"a": ["cooperative-sticky", "roundrobin", "range"], "b": ["roundrobin"]}, "roundrobin"),
    ("majority vote", {"a": ["range", "roundrobin"], "b": ["roundrobin", "range"],
                       "c": ["roundrobin", "range"]}, "roundrobin"),
    ("majority vote, other way", {"a": ["roundrobin", "range"], "b": ["range", "roundrobin"],
                                  "c": ["range", "roundrobin"]}, "range"),
    ("tie: smallest consumer id's preference wins",
     {"a": ["roundrobin", "range"], "b": ["range", "roundrobin"]}, "roundrobin"),
    ("tie, ids swapped", {"b": ["roundrobin", "range"], "a": ["range", "roundrobin"]}, "range"),
    ("a vote for a strategy others lack goes to the member's next choice",
     {"a": ["cooperative-sticky", "roundrobin"], "b": ["range", "roundrobin"], "c": ["roundrobin"]},
     "roundrobin"),
    ("rolling upgrade to sticky: stays on range while an old member remains",
     {"a": ["sticky", "range"], "b": ["range"], "c": ["sticky", "range"]}, "range"),
    ("rolling upgrade to sticky: switches once every member lists it",
     {"a": ["sticky", "range"], "b": ["sticky", "range"]}, "sticky"),
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
     ["all 2 members", "[range] by a", "[roundrobin] by b", "known: range, roundrobin, sticky)"]),
    ({"a": ["cooperative-sticky"]}, ["[cooperative-sticky] by a", "unknown: cooperative-sticky"]),
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
