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


def stream_topics(members, partitions):
    """stream id -> the existing topics it is subscribed to (stream ``<cid>-<i>`` takes the
    topics its member asks ``i + 1`` or more streams of)."""
    out = {}
    for cid, sub in members.items():
        for topic, streams in sub.items():
            if topic in partitions:
                for i in range(streams):
                    out.setdefault(stream_id(cid, i), set()).add(topic)
    return out


def totals(members, partitions, ownership):
    """Partitions per stream over all topics, idle streams included as 0."""
    counts = {sid: 0 for sid in stream_topics(members, partitions)}
    for owned in ownership.values():
        for sid in owned.values():
            counts[sid] += 1
    return counts


def kafka_balanced(members, partitions, ownership):
    """Kafka's sticky guarantee (``AbstractStickyAssignor.isBalanced``), per stream: no stream
    with 2 or more fewer partitions than another is subscribed to a topic the other holds."""
    counts = totals(members, partitions, ownership)
    subs = stream_topics(members, partitions)
    for topic, owned in ownership.items():
        fewest = min(counts[sid] for sid, topics in subs.items() if topic in topics)
        if any(counts[holder] >= fewest + 2 for holder in set(owned.values())):
            return False
    return True


def no_better_chain(members, partitions, ownership):
    """The stronger balance ``sticky`` keeps: no stream can hand a partition, directly or through
    a chain of hand-overs (each to a stream subscribed to the partition's topic, which then
    hands on one of its own), to a stream with 2 or more fewer partitions. Equivalently the sum
    of squared totals is the smallest possible."""
    counts = totals(members, partitions, ownership)
    subs = stream_topics(members, partitions)
    held = {sid: set() for sid in counts}
    for topic, owned in ownership.items():
        for sid in owned.values():
            held[sid].add(topic)
    takers = {giver: [sid for sid in counts if sid != giver and held[giver] & subs[sid]] for giver in counts}
    for start in counts:
        seen, todo = {start}, [start]
        while todo:
            for taker in takers[todo.pop()]:
                if taker not in seen:
                    if counts[taker] + 2 <= counts[start]:
                        return False
                    seen.add(taker)
                    todo.append(taker)
    return True


def no_swaps(previous, ownership):
    """Kafka's stickiness check (``isSticky``): no two streams traded partitions of one topic."""
    for topic, owned in ownership.items():
        before = owners_before(previous, topic)
        pairs = {(before[p], sid) for p, sid in owned.items()
                 if isinstance(before.get(p), str) and before[p] != sid}
        if any((new, old) in pairs for old, new in pairs):
            return False
    return True


def squares(counts):
    return sum(n * n for n in counts.values())


def kept_counts(members, partitions, previous):
    """(topic, stream id) -> partitions of that topic the stream held and may keep."""
    subs = stream_topics(members, partitions)
    kept = Counter()
    for topic in partitions:
        for p, sid in owners_before(previous, topic).items():
            if 0 <= p < partitions[topic] and isinstance(sid, str) and topic in subs.get(sid, ()):
                kept[topic, sid] += 1
    return kept


def brute_force_best(members, partitions, previous):
    """(smallest sum of squared stream totals, fewest moves among the assignments with it), by
    trying every assignment of every partition (small inputs only)."""
    subs = stream_topics(members, partitions)
    slots = [(t, p) for t in sorted({t for ts in subs.values() for t in ts}) for p in range(partitions[t])]
    choices = [sorted(sid for sid, topics in subs.items() if t in topics) for t, p in slots]
    before = [owners_before(previous, t).get(p) for t, p in slots]
    best = None
    for owners in itertools.product(*choices):
        counts = Counter(owners)
        score = (sum(n * n for n in counts.values()), sum(1 for o, b in zip(owners, before) if o != b))
        best = score if best is None else min(best, score)
    return best if best is not None else (0, 0)


def flow_best(members, partitions, previous):
    """The same pair by successive shortest paths (Bellman-Ford) on the network topic ->
    stream -> sink, one partition at a time: a stream going from n to n + 1 partitions costs
    W * (2n + 1) (so the sum of squares comes first) and a partition beyond those it held
    costs 1 more. A different algorithm from sticky.py's, for inputs too large to try all."""
    subs = stream_topics(members, partitions)
    topics = sorted({t for ts in subs.values() for t in ts})
    streams = sorted(subs)
    kept = kept_counts(members, partitions, previous)
    weight = sum(partitions[t] for t in topics) + 1
    left = {t: partitions[t] for t in topics}
    x, n = Counter(), Counter()
    nodes = ["src", "sink"] + [("t", t) for t in topics] + [("s", s) for s in streams]
    for _ in range(sum(left.values())):
        arcs = [("src", ("t", t), 0) for t in topics if left[t]]
        for s in streams:
            arcs.append((("s", s), "sink", weight * (2 * n[s] + 1)))
            for t in subs[s]:
                arcs.append((("t", t), ("s", s), 0 if x[t, s] < kept[t, s] else 1))
                if x[t, s]:
                    arcs.append((("s", s), ("t", t), 0 if x[t, s] <= kept[t, s] else -1))
        dist, pred = {"src": 0}, {}
        for _ in range(len(nodes)):
            for a, b, cost in arcs:
                if a in dist and dist[a] + cost < dist.get(b, dist[a] + cost + 1):
                    dist[b], pred[b] = dist[a] + cost, a
        node = "sink"
        while node != "src":
            a = pred[node]
            if a == "src":
                left[node[1]] -= 1
            elif node == "sink":
                n[a[1]] += 1
            elif a[0] == "t":
                x[a[1], node[1]] += 1
            else:
                x[node[1], a[1]] -= 1
            node = a
    moves = sum(partitions[t] for t in topics) - sum(min(x[key], kept[key]) for key in x)
    return sum(c * c for c in n.values()), moves


def best_of(members, partitions, previous, ownership):
    return squares(totals(members, partitions, ownership)), moved(previous, ownership)


def check_sticky(members, partitions, previous, result):
    """What every sticky assignment keeps: the contract, Kafka's balance and stickiness, and the
    stronger balance across chains."""
    check_valid(members, partitions, result)
    assert kafka_balanced(members, partitions, result), totals(members, partitions, result)
    assert no_better_chain(members, partitions, result), totals(members, partitions, result)
    assert no_swaps(previous, result)


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
    ("a member that unsubscribed from a topic loses it there; the totals even out on the other",
     {"a": {"x": 1, "y": 1}, "b": {"y": 1}}, {"x": 2, "y": 2},
     {"x": expand({"a-0": [0], "b-0": [1]}), "y": expand({"a-0": [1], "b-0": [0]})},
     {"x": expand({"a-0": [0, 1]}), "y": expand({"b-0": [0, 1]})}),
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
    # across topics
    ("balanced across topics: 4 topics x 2 partitions over 3 members is 3, 3, 2 (range: 4, 4, 0)",
     {c: {"t0": 1, "t1": 1, "t2": 1, "t3": 1} for c in ("c0", "c1", "c2")},
     {"t0": 2, "t1": 2, "t2": 2, "t3": 2}, None,
     {"t0": expand({"c0-0": [0], "c1-0": [1]}), "t1": expand({"c0-0": [0], "c2-0": [1]}),
      "t2": expand({"c1-0": [0], "c2-0": [1]}), "t3": expand({"c0-0": [0], "c1-0": [1]})}),
    ("unequal subscriptions: forced shares first (Kafka's javadoc example 2: 1, 2, 3)",
     {"c0": {"t0": 1}, "c1": {"t0": 1, "t1": 1}, "c2": {"t0": 1, "t1": 1, "t2": 1}},
     {"t0": 1, "t1": 2, "t2": 3}, None,
     {"t0": {0: "c0-0"}, "t1": expand({"c1-0": [0, 1]}), "t2": expand({"c2-0": [0, 1, 2]})}),
    ("... and when c0 leaves, only its partition moves (5 of 6 stay)",
     {"c1": {"t0": 1, "t1": 1}, "c2": {"t0": 1, "t1": 1, "t2": 1}}, {"t0": 1, "t1": 2, "t2": 3},
     {"t0": {0: "c0-0"}, "t1": expand({"c1-0": [0, 1]}), "t2": expand({"c2-0": [0, 1, 2]})},
     {"t0": {0: "c1-0"}, "t1": expand({"c1-0": [0, 1]}), "t2": expand({"c2-0": [0, 1, 2]})}),
    ("a chain of hand-overs evens 3, 2, 1 out to 2, 2, 2 (Kafka keeps 3, 2, 1: no single move helps)",
     {"a": {"t1": 1}, "b": {"t1": 1, "t2": 1}, "c": {"t2": 1}}, {"t1": 3, "t2": 3},
     {"t1": expand({"a-0": [0, 1, 2]}), "t2": expand({"b-0": [0, 1], "c-0": [2]})},
     {"t1": expand({"a-0": [0, 1], "b-0": [2]}), "t2": expand({"b-0": [0], "c-0": [1, 2]})}),
    # streams
    ("n streams are n consumers: 3 streams of a member take 3 shares",
     {"a": {"t": 3}, "b": {"t": 1}}, {"t": 8}, None,
     {"t": expand({"a-0": [0, 1], "a-1": [2, 3], "a-2": [4, 5], "b-0": [6, 7]})}),
    ("stream i takes only the topics its member asks i + 1 streams of; totals even out over them",
     {"a": {"x": 2, "y": 1}, "b": {"y": 1}}, {"x": 2, "y": 4}, None,
     {"x": expand({"a-1": [0, 1]}), "y": expand({"a-0": [0, 1], "b-0": [2, 3]})}),
]


@pytest.mark.parametrize("members,partitions,previous,expected",
                         [c[1:] for c in STICKY_CASES], ids=[c[0] for c in STICKY_CASES])
def test_sticky_table(members, partitions, previous, expected):
    result = assign("sticky", members, partitions, previous)
    assert result == expected
    check_sticky(members, partitions, previous, result)
    assert sticky_assignor.assign(members, partitions, previous) == expected


# Kafka's StickyAssignorTest / AbstractStickyAssignorTest scenarios, as data. One stream per
# consumer (Kafka's model), so stream "<consumer>-0" is the consumer. Each scenario is a list of
# steps; a step's previous assignment is the one before's result unless it names one
# ("claims": consumer -> [(topic, partition)], for claims Kafka resolves by generation, the
# claims of the newest generation). Expectations, all optional: "totals" (consumer ->
# partitions), "per_topic" (consumer -> topic -> partitions), "moves" (partitions whose stream
# changed, new ones included), "holds" (consumer -> partitions it must still have), "within"
# (consumer -> the only partitions it may have), "exact" (consumer -> all its partitions).
# Every step is also checked for validity, Kafka's balance and stickiness, the balance across
# chains, and, when small, against the brute-force optimum.

def subscribe(**topics_by_consumer):
    return {c: {t: 1 for t in topics} for c, topics in topics_by_consumer.items()}


def tps(topic, *partitions):
    return [(topic, p) for p in partitions]


def numbered(prefix, count, width):
    return [f"{prefix}{i:0{width}d}" for i in range(count)]


def conflicting_generations(members):
    """consumer1's claims (an older generation) all conflict with consumer2's and consumer3's,
    so only those count; everyone ends with 4, the two keeping only what they claimed."""
    newer = {"consumer2": tps("topic", 0, 1) + tps("topic2", 0, 1, 2, 3),
             "consumer3": tps("topic", 2, 3) + tps("topic3", 0, 1, 2, 3)}
    return [dict(members=members, partitions={"topic": 4, "topic2": 4, "topic3": 4}, claims=newer,
                 totals={"consumer1": 4, "consumer2": 4, "consumer3": 4}, moves=4, within=newer)]

KAFKA_SCENARIOS = [
    ("testOneConsumerNoTopic", [dict(members=subscribe(consumer=[]), partitions={}, exact={})]),
    ("testOneConsumerNonexistentTopic",
     [dict(members=subscribe(consumer=["topic"]), partitions={"topic": 0}, exact={"consumer": []})]),
    ("testOneConsumerOneTopic",
     [dict(members=subscribe(consumer=["topic"]), partitions={"topic": 3}, exact={"consumer": tps("topic", 0, 1, 2)})]),
    ("testOnlyAssignsPartitionsFromSubscribedTopics",
     [dict(members=subscribe(consumer=["topic"]), partitions={"topic": 2},
           claims={"consumer": tps("topic", 0, 1) + tps("other", 0, 1)},
           exact={"consumer": tps("topic", 0, 1)}, moves=0)]),
    ("testOneConsumerMultipleTopics",
     [dict(members=subscribe(consumer=["topic1", "topic2"]), partitions={"topic1": 1, "topic2": 2},
           exact={"consumer": tps("topic1", 0) + tps("topic2", 0, 1)})]),
    ("testTwoConsumersOneTopicOnePartition",
     [dict(members=subscribe(consumer1=["topic"], consumer2=["topic"]), partitions={"topic": 1},
           totals={"consumer1": 1, "consumer2": 0})]),
    ("testTwoConsumersOneTopicTwoPartitions",
     [dict(members=subscribe(consumer1=["topic"], consumer2=["topic"]), partitions={"topic": 2},
           exact={"consumer1": tps("topic", 0), "consumer2": tps("topic", 1)})]),
    ("testMultipleConsumersMixedTopicSubscriptions",
     [dict(members=subscribe(consumer1=["topic1"], consumer2=["topic1", "topic2"], consumer3=["topic1"]),
           partitions={"topic1": 3, "topic2": 2},
           per_topic={"consumer1": {"topic1": 2}, "consumer2": {"topic2": 2}, "consumer3": {"topic1": 1}})]),
    ("testTwoConsumersTwoTopicsSixPartitions",
     [dict(members=subscribe(consumer1=["topic1", "topic2"], consumer2=["topic1", "topic2"]),
           partitions={"topic1": 3, "topic2": 3}, totals={"consumer1": 3, "consumer2": 3})]),
    ("testConsumerOwningMinQuotaExpectedMaxQuota",
     [dict(members=subscribe(consumer1=["topic1", "topic2"], consumer2=["topic1", "topic2"]),
           partitions={"topic1": 2, "topic2": 3},
           claims={"consumer1": tps("topic1", 0) + tps("topic2", 1), "consumer2": tps("topic1", 1) + tps("topic2", 2)},
           exact={"consumer1": tps("topic1", 0) + tps("topic2", 0, 1),
                  "consumer2": tps("topic1", 1) + tps("topic2", 2)},
           moves=1)]),
    ("testMaxQuotaConsumerMoreThanNumExpectedMaxCapacityMembers",
     [dict(members=subscribe(consumer1=["topic1", "topic2"], consumer2=["topic1", "topic2"],
                             consumer3=["topic1", "topic2"]),
           partitions={"topic1": 2, "topic2": 2},
           claims={"consumer1": tps("topic1", 0) + tps("topic2", 0), "consumer2": tps("topic1", 1) + tps("topic2", 1)},
           totals={"consumer1": 2, "consumer2": 1, "consumer3": 1}, moves=1)]),
    ("testAllConsumersAreUnderMinQuota",
     [dict(members=subscribe(consumer1=["topic1", "topic2"], consumer2=["topic1", "topic2"],
                             consumer3=["topic1", "topic2"]),
           partitions={"topic1": 2, "topic2": 3},
           claims={"consumer1": tps("topic1", 0), "consumer2": tps("topic1", 1)},
           totals={"consumer1": 2, "consumer2": 2, "consumer3": 1}, moves=3,
           holds={"consumer1": tps("topic1", 0), "consumer2": tps("topic1", 1)})]),
    ("testAddRemoveConsumerOneTopic",
     [dict(members=subscribe(consumer1=["topic"]), partitions={"topic": 3}, exact={"consumer1": tps("topic", 0, 1, 2)}),
      dict(members=subscribe(consumer1=["topic"], consumer2=["topic"]), partitions={"topic": 3},
           exact={"consumer1": tps("topic", 0, 1), "consumer2": tps("topic", 2)}, moves=1),
      dict(members=subscribe(consumer2=["topic"]), partitions={"topic": 3},
           exact={"consumer2": tps("topic", 0, 1, 2)}, moves=2)]),
    ("testTopicBalanceAfterReassignment",
     [dict(members=subscribe(consumer1=["topic1", "topic2"]), partitions={"topic1": 12, "topic2": 12},
           per_topic={"consumer1": {"topic1": 12, "topic2": 12}}),
      dict(members=subscribe(consumer1=["topic1", "topic2"], consumer2=["topic1", "topic2"]),
           partitions={"topic1": 12, "topic2": 12}, moves=12,
           per_topic={c: {"topic1": 6, "topic2": 6} for c in ("consumer1", "consumer2")}),
      dict(members=subscribe(**{c: ["topic1", "topic2"] for c in ("consumer1", "consumer2", "consumer3", "consumer4")}),
           partitions={"topic1": 12, "topic2": 12}, moves=12,
           per_topic={c: {"topic1": 3, "topic2": 3} for c in ("consumer1", "consumer2", "consumer3", "consumer4")}),
      dict(members=subscribe(consumer3=["topic1", "topic2"], consumer4=["topic1", "topic2"]),
           partitions={"topic1": 12, "topic2": 12}, moves=12,
           per_topic={c: {"topic1": 6, "topic2": 6} for c in ("consumer3", "consumer4")})]),
    ("testAddRemoveTwoConsumersTwoTopics",
     [dict(members=subscribe(consumer1=["topic1", "topic2"], consumer2=["topic1", "topic2"]),
           partitions={"topic1": 3, "topic2": 4},
           per_topic={"consumer1": {"topic1": 2, "topic2": 2}, "consumer2": {"topic1": 1, "topic2": 2}}),
      dict(members=subscribe(**{c: ["topic1", "topic2"] for c in ("consumer1", "consumer2", "consumer3", "consumer4")}),
           partitions={"topic1": 3, "topic2": 4}, moves=3,
           totals={"consumer1": 2, "consumer2": 2, "consumer3": 2, "consumer4": 1}),
      dict(members=subscribe(consumer3=["topic1", "topic2"], consumer4=["topic1", "topic2"]),
           partitions={"topic1": 3, "topic2": 4}, moves=4, totals={"consumer3": 4, "consumer4": 3})]),
    ("testPoorRoundRobinAssignmentScenario",
     [dict(members=subscribe(consumer1=["topic1", "topic2", "topic3", "topic4", "topic5"],
                             consumer2=["topic1", "topic3", "topic5"], consumer3=["topic1", "topic3", "topic5"],
                             consumer4=["topic1", "topic2", "topic3", "topic4", "topic5"]),
           partitions={f"topic{i}": i % 2 + 1 for i in range(1, 6)},
           totals={c: 2 for c in ("consumer1", "consumer2", "consumer3", "consumer4")})]),
    ("testAddRemoveTopicTwoConsumers",
     [dict(members=subscribe(consumer1=["topic"], consumer2=["topic"]), partitions={"topic": 3},
           totals={"consumer1": 2, "consumer2": 1}),
      dict(members=subscribe(consumer1=["topic", "topic2"], consumer2=["topic", "topic2"]),
           partitions={"topic": 3, "topic2": 3}, totals={"consumer1": 3, "consumer2": 3}, moves=3,
           holds={"consumer1": tps("topic", 0, 1), "consumer2": tps("topic", 2)}),
      dict(members=subscribe(consumer1=["topic2"], consumer2=["topic2"]), partitions={"topic2": 3}, moves=0)]),
    ("testReassignmentAfterOneConsumerLeaves",
     [dict(members={c: {t: 1 for t in numbered("t", 20, 2)[1:i + 1]} for i, c in enumerate(numbered("c", 20, 2)) if i},
           partitions={t: i for i, t in enumerate(numbered("t", 20, 2)) if i}),
      dict(members={c: {t: 1 for t in numbered("t", 20, 2)[1:i + 1]}
                    for i, c in enumerate(numbered("c", 20, 2)) if i and c != "c10"},
           partitions={t: i for i, t in enumerate(numbered("t", 20, 2)) if i})]),
    ("testReassignmentAfterOneConsumerAdded",
     [dict(members={c: {"topic": 1} for c in numbered("c", 10, 2)[1:]}, partitions={"topic": 20}),
      dict(members={c: {"topic": 1} for c in numbered("c", 11, 2)[1:]}, partitions={"topic": 20}, moves=2,
           totals={c: 2 for c in numbered("c", 11, 2)[1:]})]),
    ("testSameSubscriptions",
     [dict(members={c: {t: 1 for t in numbered("t", 15, 2)[1:]} for c in numbered("c", 9, 1)[1:]},
           partitions={t: i for i, t in enumerate(numbered("t", 15, 2)) if i}),
      dict(members={c: {t: 1 for t in numbered("t", 15, 2)[1:]} for c in numbered("c", 9, 1)[1:] if c != "c5"},
           partitions={t: i for i, t in enumerate(numbered("t", 15, 2)) if i}, moves=13)]),
    ("testNewSubscription",
     [dict(members=subscribe(c0=[], c1=["t1"], c2=["t2", "t3", "t4"]), partitions={f"t{i}": 1 for i in range(1, 5)}),
      dict(members=subscribe(c0=["t1"], c1=["t1"], c2=["t2", "t3", "t4"]), partitions={f"t{i}": 1 for i in range(1, 5)},
           moves=0, totals={"c0": 0, "c1": 1, "c2": 3})]),
    ("testMoveExistingAssignments (a chain: Kafka keeps 1, 2, 3; here 2, 2, 2 in 2 moves)",
     [dict(members=subscribe(consumer1=["topic1", "topic2"], consumer2=["topic1", "topic2", "topic3", "topic4"],
                             consumer3=["topic2", "topic3", "topic4", "topic5", "topic6"]),
           partitions={f"topic{i}": 1 for i in range(1, 7)},
           claims={"consumer1": tps("topic1", 0), "consumer2": tps("topic2", 0) + tps("topic3", 0),
                   "consumer3": tps("topic4", 0) + tps("topic5", 0) + tps("topic6", 0)},
           totals={"consumer1": 2, "consumer2": 2, "consumer3": 2}, moves=2)]),
    ("testStickiness",
     [dict(members=subscribe(**{c: ["topic1"] for c in ("consumer1", "consumer2", "consumer3", "consumer4")}),
           partitions={"topic1": 3}, totals={"consumer1": 1, "consumer2": 1, "consumer3": 1, "consumer4": 0}),
      dict(members=subscribe(**{c: ["topic1"] for c in ("consumer2", "consumer3", "consumer4")}),
           partitions={"topic1": 3}, totals={"consumer2": 1, "consumer3": 1, "consumer4": 1}, moves=1)]),
    ("testAssignmentUpdatedForDeletedTopic",
     [dict(members=subscribe(consumer=["topic1", "topic2", "topic3"]), partitions={"topic1": 1, "topic3": 100},
           totals={"consumer": 101})]),
    ("testNoExceptionThrownWhenOnlySubscribedTopicDeleted",
     [dict(members=subscribe(consumer=["topic"]), partitions={"topic": 3}, totals={"consumer": 3}),
      dict(members=subscribe(consumer=["topic"]), partitions={}, exact={})]),
    ("testAllConsumersReachExpectedQuotaAndAreConsideredFilled",
     [dict(members=subscribe(consumer1=["topic"], consumer2=["topic"], consumer3=["topic"]), partitions={"topic": 4},
           claims={"consumer1": tps("topic", 0, 1), "consumer2": tps("topic", 2)},
           exact={"consumer1": tps("topic", 0, 1), "consumer2": tps("topic", 2), "consumer3": tps("topic", 3)})]),
    ("testOwnedPartitionsAreInvalidatedForConsumerWithStaleGeneration",
     [dict(members=subscribe(consumer1=["topic", "topic2"], consumer2=["topic", "topic2"]),
           partitions={"topic": 3, "topic2": 3},
           claims={"consumer1": tps("topic", 0, 2) + tps("topic2", 1)},
           exact={"consumer1": tps("topic", 0, 2) + tps("topic2", 1),
                  "consumer2": tps("topic", 1) + tps("topic2", 0, 2)})]),
    ("testPartitionsTransferringOwnershipIncludeThePartitionClaimedByMultipleConsumersInSameGeneration",
     [dict(members=subscribe(consumer1=["topic"], consumer2=["topic"], consumer3=["topic"]), partitions={"topic": 3},
           claims={"consumer1": tps("topic", 1), "consumer2": tps("topic", 2)},
           exact={"consumer1": tps("topic", 1), "consumer2": tps("topic", 2), "consumer3": tps("topic", 0)})]),
    ("testEnsurePartitionsAssignedToHighestGeneration",
     [dict(members=subscribe(**{c: ["topic", "topic2", "topic3"] for c in ("consumer1", "consumer2", "consumer3")}),
           partitions={"topic": 3, "topic2": 3, "topic3": 3},
           claims={"consumer1": tps("topic", 0) + tps("topic2", 0) + tps("topic3", 0),
                   "consumer2": tps("topic", 1) + tps("topic2", 1) + tps("topic3", 1), "consumer3": tps("topic3", 2)},
           exact={"consumer1": tps("topic", 0) + tps("topic2", 0) + tps("topic3", 0),
                  "consumer2": tps("topic", 1) + tps("topic2", 1) + tps("topic3", 1),
                  "consumer3": tps("topic", 2) + tps("topic2", 2) + tps("topic3", 2)})]),
    ("testNoReassignmentOnCurrentMembers",
     [dict(members=subscribe(**{c: ["topic", "topic1", "topic2", "topic3"]
                                for c in ("consumer1", "consumer2", "consumer3", "consumer4")}),
           partitions={"topic": 3, "topic1": 3, "topic2": 3, "topic3": 3},
           claims={"consumer2": tps("topic", 0) + tps("topic2", 0) + tps("topic1", 0),
                   "consumer3": tps("topic3", 2) + tps("topic2", 2) + tps("topic1", 1),
                   "consumer4": tps("topic3", 1) + tps("topic", 1, 2)},
           exact={"consumer1": tps("topic1", 2) + tps("topic2", 1) + tps("topic3", 0),
                  "consumer2": tps("topic", 0) + tps("topic2", 0) + tps("topic1", 0),
                  "consumer3": tps("topic3", 2) + tps("topic2", 2) + tps("topic1", 1),
                  "consumer4": tps("topic3", 1) + tps("topic", 1, 2)})]),
    ("testOwnedPartitionsAreInvalidatedForConsumerWithMultipleGeneration",
     [dict(members=subscribe(consumer1=["topic", "topic2"], consumer2=["topic", "topic2"]),
           partitions={"topic": 3, "topic2": 3},
           claims={"consumer1": tps("topic", 0, 1) + tps("topic2", 1), "consumer2": tps("topic2", 2)},
           exact={"consumer1": tps("topic", 0, 1) + tps("topic2", 1),
                  "consumer2": tps("topic", 2) + tps("topic2", 0, 2)})]),
    ("testAllConsumersHaveOwnedPartitionInvalidatedWhenClaimedByMultipleConsumersInSameGeneration"
     "WithUnequalPartitionsPerConsumer",
     [dict(members=subscribe(consumer1=["topic"], consumer2=["topic"], consumer3=["topic"]), partitions={"topic": 4},
           claims={"consumer1": tps("topic", 1), "consumer2": tps("topic", 2)},
           totals={"consumer1": 2, "consumer2": 1, "consumer3": 1}, moves=2,
           holds={"consumer1": tps("topic", 1), "consumer2": tps("topic", 2)})]),
    ("testAssignmentWithMultipleGenerations1 (equal subscriptions)",
     [dict(members=subscribe(**{c: ["topic", "topic2"] for c in ("consumer1", "consumer2", "consumer3")}),
           partitions={"topic": 6, "topic2": 6}, totals={"consumer1": 4, "consumer2": 4, "consumer3": 4}),
      dict(members=subscribe(consumer1=["topic", "topic2"], consumer2=["topic", "topic2"]),
           partitions={"topic": 6, "topic2": 6}, totals={"consumer1": 6, "consumer2": 6}, moves=4),
      dict(members=subscribe(consumer2=["topic", "topic2"], consumer3=["topic", "topic2"]),
           partitions={"topic": 6, "topic2": 6}, totals={"consumer2": 6, "consumer3": 6}, moves=6)]),
    ("testAssignmentWithMultipleGenerations1 (unequal subscriptions)",
     [dict(members=subscribe(consumer1=["topic", "topic2"], consumer2=["topic"], consumer3=["topic", "topic2"]),
           partitions={"topic": 6, "topic2": 6}, totals={"consumer1": 4, "consumer2": 4, "consumer3": 4}),
      dict(members=subscribe(consumer1=["topic", "topic2"], consumer2=["topic"]),
           partitions={"topic": 6, "topic2": 6}, totals={"consumer1": 6, "consumer2": 6})]),
    ("testAssignmentWithMultipleGenerations2 (unequal subscriptions)",
     [dict(members=subscribe(consumer1=["topic"], consumer2=["topic", "topic2", "topic3"],
                             consumer3=["topic", "topic2"]),
           partitions={"topic": 4, "topic2": 4, "topic3": 4},
           totals={"consumer1": 4, "consumer2": 4, "consumer3": 4}),
      dict(members=subscribe(consumer2=["topic", "topic2", "topic3"]),
           partitions={"topic": 4, "topic2": 4, "topic3": 4}, totals={"consumer2": 12}, moves=8)]),
    ("testAssignmentWithConflictingPreviousGenerations (equal subscriptions)",
     conflicting_generations(subscribe(**{c: ["topic", "topic2", "topic3"]
                                          for c in ("consumer1", "consumer2", "consumer3")}))),
    ("testAssignmentWithConflictingPreviousGenerations (unequal subscriptions)",
     conflicting_generations(subscribe(consumer1=["topic"], consumer2=["topic", "topic2"],
                                       consumer3=["topic", "topic2", "topic3"]))),
    ("testSubscriptionNotEqualAndAssignSamePartitionWith3Generation",
     [dict(members=subscribe(consumer1=["topic"], consumer2=["topic"], consumer3=["topic"], consumer4=["topic1"]),
           partitions={"topic": 6, "topic1": 1},
           claims={"consumer1": tps("topic", 0), "consumer2": tps("topic", 1, 2, 3), "consumer3": tps("topic", 4, 5),
                   "consumer4": tps("topic1", 0)},
           totals={"consumer1": 2, "consumer2": 2, "consumer3": 2, "consumer4": 1}, moves=1)]),
    # the StickyAssignor javadoc's examples
    ("javadoc example 1: 3, 3, 2 over four topics; C1 leaves and C0, C2 keep everything",
     [dict(members=subscribe(C0=["t0", "t1", "t2", "t3"], C1=["t0", "t1", "t2", "t3"], C2=["t0", "t1", "t2", "t3"]),
           partitions={"t0": 2, "t1": 2, "t2": 2, "t3": 2}, totals={"C0": 3, "C1": 3, "C2": 2}),
      dict(members=subscribe(C0=["t0", "t1", "t2", "t3"], C2=["t0", "t1", "t2", "t3"]),
           partitions={"t0": 2, "t1": 2, "t2": 2, "t3": 2}, totals={"C0": 4, "C2": 4}, moves=3)]),
    ("javadoc example 2: 1, 2, 3; C0 leaves and 5 of 6 stay",
     [dict(members=subscribe(C0=["t0"], C1=["t0", "t1"], C2=["t0", "t1", "t2"]), partitions={"t0": 1, "t1": 2, "t2": 3},
           exact={"C0": tps("t0", 0), "C1": tps("t1", 0, 1), "C2": tps("t2", 0, 1, 2)}),
      dict(members=subscribe(C1=["t0", "t1"], C2=["t0", "t1", "t2"]), partitions={"t0": 1, "t1": 2, "t2": 3},
           exact={"C1": tps("t0", 0) + tps("t1", 0, 1), "C2": tps("t2", 0, 1, 2)}, moves=1)]),
]


def claimed(claims):
    """consumer -> [(topic, partition)] -> an ownership naming each consumer's stream 0."""
    out = {}
    for consumer, partitions in claims.items():
        for topic, partition in partitions:
            out.setdefault(topic, {})[partition] = stream_id(consumer, 0)
    return out


def held_by_consumer(ownership):
    out = {}
    for topic, owned in ownership.items():
        for partition, sid in owned.items():
            out.setdefault(consumer_of_stream(sid), set()).add((topic, partition))
    return out


@pytest.mark.parametrize("steps", [s[1] for s in KAFKA_SCENARIOS], ids=[s[0] for s in KAFKA_SCENARIOS])
def test_sticky_kafka_scenarios(steps):
    previous = None
    for number, step in enumerate(steps):
        members, partitions = step["members"], step["partitions"]
        if "claims" in step:
            previous = claimed(step["claims"])
        result = assign("sticky", members, partitions, previous)
        where = f"step {number}: {result}"
        check_sticky(members, partitions, previous or {}, result)
        counts = totals(members, partitions, result)
        mine = held_by_consumer(result)
        if "totals" in step:
            assert {c: counts[stream_id(c, 0)] for c in step["totals"]} == step["totals"], where
        for consumer, per_topic in step.get("per_topic", {}).items():
            assert dict(Counter(t for t, p in mine.get(consumer, ()))) == per_topic, where
        if "moves" in step:
            assert moved(previous or {}, result) == step["moves"], where
        for consumer, partitions_held in step.get("holds", {}).items():
            assert set(partitions_held) <= mine.get(consumer, set()), where
        for consumer, allowed in step.get("within", {}).items():
            assert mine.get(consumer, set()) <= set(allowed), where
        if "exact" in step:
            expected = {c: set(v) for c, v in step["exact"].items()}
            assert {c: mine.get(c, set()) for c in expected} == expected, where
            assert set(mine) <= set(step["exact"]), where
        if sum(partitions.values()) <= 8 and len(stream_topics(members, partitions)) <= 4:
            assert best_of(members, partitions, previous or {}, result) == \
                brute_force_best(members, partitions, previous or {}), where
        previous = result


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


def equal_subscriptions_group(rng):
    """Members on the same topics, each with its own number of streams for all of them: every
    stream is subscribed to every topic."""
    partitions = {f"t{j}": rng.randint(0, 40) for j in range(rng.randint(1, 4))}
    members = {}
    for m in range(rng.randint(2, 12)):
        streams = rng.randint(1, 3)
        members[f"g_host-{rng.randint(1, 99)}-{m:03x}"] = {t: streams for t in partitions}
    return members, partitions


@pytest.mark.parametrize("seed", range(30))
def test_sticky_member_leaving_random_group(seed):
    """Equal subscriptions, from a balanced previous assignment of the same partitions: removing
    a member moves exactly that member's partitions and no other. (With unequal subscriptions
    evening the totals out may need more: see the chain case in STICKY_CASES.)"""
    rng = random.Random(3000 + seed)
    members, partitions = equal_subscriptions_group(rng)
    previous = assign("sticky", members, partitions, random_previous(rng, members, partitions))
    leaver = rng.choice(sorted(members))
    left = {cid: sub for cid, sub in members.items() if cid != leaver}
    result = assign("sticky", left, partitions, previous)
    check_sticky(left, partitions, previous, result)
    for topic, owned in result.items():
        for p, sid in owned.items():
            if previous[topic][p] != sid:
                assert consumer_of_stream(previous[topic][p]) == leaver, (topic, p)


@pytest.mark.parametrize("seed", range(60))
def test_sticky_is_balanced_across_topics(seed):
    """Kafka's guarantee and the stronger one across chains, whatever ``previous`` holds,
    garbage included."""
    rng = random.Random(4000 + seed)
    members, partitions = random_group(rng)
    previous = random_previous(rng, members, partitions, garbage=seed % 2 == 0)
    result = assign("sticky", members, partitions, previous)
    check_sticky(members, partitions, previous, result)


@pytest.mark.parametrize("seed", range(30))
def test_sticky_equal_subscriptions_balance_totals_and_topics(seed):
    """Every stream on every topic, no previous: totals differ by at most one, and so does
    each topic's count per stream (per-topic balance costs nothing here)."""
    rng = random.Random(4500 + seed)
    members, partitions = equal_subscriptions_group(rng)
    result = assign("sticky", members, partitions)
    counts = totals(members, partitions, result)
    assert max(counts.values()) - min(counts.values()) <= 1
    for topic, owned in result.items():
        per_topic = per_stream_counts(members, topic, owned).values()
        assert max(per_topic) - min(per_topic) <= 1, topic


@pytest.mark.parametrize("seed", range(40))
def test_sticky_moves_the_fewest_partitions(seed):
    """Against successive shortest paths on the flow network (another algorithm): the same
    smallest sum of squared totals and the same fewest moves."""
    rng = random.Random(5000 + seed)
    partitions = {f"t{j}": rng.randint(0, 15) for j in range(rng.randint(1, 4))}
    members = {}
    for m in range(rng.randint(1, 6)):
        topics = rng.sample(sorted(partitions) + ["gone"], rng.randint(1, len(partitions) + 1))
        members[f"m{m}"] = {t: rng.randint(1, 2) for t in topics}
    previous = random_previous(rng, members, partitions, garbage=seed % 3 == 0)
    result = assign("sticky", members, partitions, previous)
    check_sticky(members, partitions, previous, result)
    assert best_of(members, partitions, previous, result) == flow_best(members, partitions, previous)


@pytest.mark.parametrize("seed", range(80))
def test_sticky_moves_the_fewest_partitions_brute_force(seed):
    """Small groups: against every possible assignment, the smallest sum of squared totals and,
    among those, the fewest moves."""
    rng = random.Random(6000 + seed)
    partitions = {t: rng.randint(0, 3) for t in ("x", "y", "z")}
    members = {c: {t: rng.randint(1, 2) for t in rng.sample(["x", "y", "z"], rng.randint(1, 3))}
               for c in "abc"[:rng.randint(1, 3)]}
    while sum(partitions.values()) > 7:  # keep the search space small
        partitions[max(partitions, key=partitions.get)] -= 1
    while len(stream_topics(members, partitions)) > 4:
        cid = max(members, key=lambda c: max(members[c].values()))
        members[cid] = {t: min(n, 1) for t, n in members[cid].items()}
    previous = random_previous(rng, members, partitions, garbage=seed % 2 == 1)
    result = assign("sticky", members, partitions, previous)
    check_sticky(members, partitions, previous, result)
    assert best_of(members, partitions, previous, result) == brute_force_best(members, partitions, previous)


def test_sticky_evens_out_chains_that_kafka_balance_accepts():
    """The documented difference from Kafka: 3, 2, 1 along a chain of subscriptions already
    satisfies Kafka's guarantee (0 moves), yet 2, 2, 2 is possible; sticky takes it."""
    members = {"a": {"t1": 1}, "b": {"t1": 1, "t2": 1}, "c": {"t2": 1}}
    partitions = {"t1": 3, "t2": 3}
    previous = {"t1": expand({"a-0": [0, 1, 2]}), "t2": expand({"b-0": [0, 1], "c-0": [2]})}
    assert kafka_balanced(members, partitions, previous)
    assert not no_better_chain(members, partitions, previous)
    result = assign("sticky", members, partitions, previous)
    assert totals(members, partitions, result) == {"a-0": 2, "b-0": 2, "c-0": 2}
    assert moved(previous, result) == 2


@pytest.mark.parametrize("seed", range(6))
def test_sticky_random_subscriptions_and_changes(seed):
    """Kafka's randomized scenario: 20-40 consumers on 10-20 topics (topic i has i + 1
    partitions), then everyone re-subscribes at random and the previous assignment is kept
    where it can be."""
    rng = random.Random(6500 + seed)
    topics = {f"t{i:02d}": i + 1 for i in range(rng.randint(10, 19))}
    names = sorted(topics)

    def resubscribe():
        return {f"c{i:02d}": {t: 1 for t in rng.sample(names, rng.randint(1, len(names)))}
                for i in range(n_consumers)}
    n_consumers = rng.randint(20, 39)
    members = resubscribe()
    first = assign("sticky", members, topics)
    check_sticky(members, topics, {}, first)
    members = resubscribe()
    second = assign("sticky", members, topics, first)
    check_sticky(members, topics, first, second)


@pytest.mark.parametrize("seed", range(20))
def test_sticky_is_a_fixed_point(seed):
    """Fed its own output with the same group, it changes nothing (so the coordinator does not
    see a new assignment where nothing changed); fed nothing, it is range whenever range's
    totals are balanced (always on a single topic)."""
    rng = random.Random(7000 + seed)
    members, partitions = random_group(rng)
    once = assign("sticky", members, partitions, random_previous(rng, members, partitions, garbage=True))
    assert assign("sticky", members, partitions, once) == once
    assert json.dumps(assign("sticky", members, partitions, once)) == json.dumps(once)
    ranged = assign("range", members, partitions)
    if no_better_chain(members, partitions, ranged):
        assert assign("sticky", members, partitions, ranged) == ranged
        assert assign("sticky", members, partitions) == ranged
        assert assign("sticky", members, partitions, {}) == ranged
    else:
        assert len(ranged) > 1
    single = {t: partitions[t] for t in sorted(partitions)[:1]}
    ranged = assign("range", members, single)
    assert assign("sticky", members, single) == ranged
    assert assign("sticky", members, single, ranged) == ranged


def test_switching_from_roundrobin_to_sticky_keeps_a_balanced_layout():
    members = {f"m{i}": {"t": 2} for i in range(7)}
    partitions = {"t": 100}
    dealt = assign("roundrobin", members, partitions)
    assert assign("sticky", members, partitions, dealt) == dealt
    # on several topics too: roundrobin's totals are balanced when subscriptions are equal
    members = {f"m{i}": {"a": 1, "b": 1, "c": 1} for i in range(7)}
    partitions = {"a": 10, "b": 11, "c": 12}
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


@pytest.mark.parametrize("change", ["join", "leave"])
def test_sticky_500_members_5000_partitions(change):
    """The scale a rebalance must handle quickly: 500 members on 4 topics, 5,000 partitions.
    One member joining takes about 10 partitions from others; one leaving gives its away; no
    other partition moves, and the totals stay within one of each other."""
    topics = {"a": 2000, "b": 1500, "c": 1000, "d": 500}
    members = {f"m{i:03d}": {t: 1 for t in topics} for i in range(500)}
    previous = assign("sticky", members, topics)
    check_valid(members, topics, previous)
    if change == "join":
        changed = {**members, "m250x": {t: 1 for t in topics}}
    else:
        changed = {cid: sub for cid, sub in members.items() if cid != "m250"}
    result = assign("sticky", changed, topics, previous)
    check_valid(changed, topics, result)
    counts = totals(changed, topics, result)
    assert max(counts.values()) - min(counts.values()) <= 1  # so no chain can do better either
    assert kafka_balanced(changed, topics, result) and no_swaps(previous, result)
    if change == "join":
        assert moved(previous, result) == 9 == counts["m250x-0"]
    else:
        assert moved(previous, result) == 10
        assert all(consumer_of_stream(previous[t][p]) == "m250"
                   for t, owned in result.items() for p, sid in owned.items() if previous[t][p] != sid)


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
    assert DEFAULT_STRATEGY == "sticky"


# ---------------------------------------------------------------- choose_strategy

CHOOSE_CASES = [
    ("no members: the default", {}, "sticky"),
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
