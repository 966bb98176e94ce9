"""Groups spread over every coordinator node: the pure placement, then real nodes.

``place_shards`` as a table and as properties over random clusters (balanced, sticky, only what
must move moves). Then ``coordinatord`` processes on a real ZooKeeper, with members in this
process: one node leads everything; a node joining takes shards without a single command
being written; a node SIGKILLed or frozen past its session loses exactly its shards — only its
groups get a new coordinator, at a new shard epoch, and nothing is written under an old one.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest

from coordinator import protocol, read
from coordinator.shards import place_shards
from coordinator.topics import TopicRegistry
from tests.support.groups import command_count, read_state
from tests.support.helpers import wait_for

# ---------------------------------------------------------------- placement (pure)

PLACEMENTS = [
    # name, count, nodes, current, expected
    ("one node leads everything", 4, ["a"], {}, {0: "a", 1: "a", 2: "a", 3: "a"}),
    ("no nodes, no placement", 4, [], {0: "a"}, {}),
    ("balanced from nothing", 5, ["a", "b"], {}, {0: "a", 1: "a", 2: "a", 3: "b", 4: "b"}),
    ("a node joins: it takes only what it must", 4, ["a", "b"], {0: "a", 1: "a", 2: "a", 3: "a"},
     {0: "a", 1: "a", 2: "b", 3: "b"}),
    ("a node leaves: only its shards move", 6, ["a", "c"], {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"},
     {0: "a", 1: "a", 2: "a", 3: "c", 4: "c", 5: "c"}),
    ("unknown owners and out-of-range shards are ignored", 2, ["a"], {0: "zz", 7: "a"}, {0: "a", 1: "a"}),
    ("the most loaded keep the extra shard", 3, ["a", "b"], {0: "b", 1: "b", 2: "b"}, {0: "b", 1: "b", 2: "a"}),
]


@pytest.mark.parametrize("count,nodes,current,expected", [p[1:] for p in PLACEMENTS], ids=[p[0] for p in PLACEMENTS])
def test_place_shards(count, nodes, current, expected):
    assert place_shards(count, nodes, current) == expected
    assert place_shards(count, list(reversed(nodes)), dict(reversed(list(current.items())))) == expected


def test_placement_properties_over_random_clusters():
    rng = random.Random(7)
    for _ in range(2000):
        count = rng.randint(1, 40)
        everyone = [f"n{i}" for i in range(rng.randint(1, 8))]
        before = rng.sample(everyone, rng.randint(1, len(everyone)))
        current = place_shards(count, before, {s: rng.choice(everyone) for s in range(count) if rng.random() < 0.5})
        now = rng.sample(everyone, rng.randint(1, len(everyone)))
        placed = place_shards(count, now, current)
        assert sorted(placed) == list(range(count)) and set(placed.values()) <= set(now)
        loads = [sum(1 for n in placed.values() if n == node) for node in now]
        assert max(loads) - min(loads) <= 1, "balanced"
        # sticky: a shard moves only if its node is gone or held more than it may keep
        for s, node in placed.items():
            if current.get(s) != node and current.get(s) in now:
                keeps = sum(1 for t, n in placed.items() if n == current[s] and current.get(t) == n)
                assert keeps >= count // len(now), f"shard {s} left {current[s]} needlessly"


# ---------------------------------------------------------------- real nodes

SESSION_MS = 1500


@pytest.fixture
def nodes(zk_connect, subprocess_env, tmp_path):
    procs = {}

    def start(name, shards=8):
        log = open(tmp_path / f"{name}.log", "w")
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "consumer.cli.coordinatord", "--zk", zk_connect, "--node-id", name,
             "--session-timeout-ms", str(SESSION_MS), "--shards", str(shards), "--rebalance-timeout-ms", "3000"],
            env=subprocess_env, stdout=subprocess.DEVNULL, stderr=log)
        return procs[name]
    yield start
    for p in procs.values():
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait(10)


def groups_of(zk, groups):
    """{group: (coordinating node, shard epoch, generation, commands ever written)}."""
    leaders = read.shard_leaders(zk)
    count = read.shard_count(zk)
    out = {}
    for g in groups:
        node, epoch, _ = leaders[protocol.shard_of(g, count)]
        out[g] = (node, epoch, read_state(zk, g).generation, command_count(zk, g))
    return out


def settled(zk, groups, nodes):
    """Every shard led and verified, by exactly ``nodes``, every group Stable."""
    leaders = read.shard_leaders(zk)
    return (read.all_verified(zk) and {n for n, _, _ in leaders.values()} == set(nodes)
            and all(read_state(zk, g).state == protocol.STABLE for g in groups))


@pytest.fixture
def twelve_groups(zk, cluster):
    TopicRegistry(zk).create("t", 2)
    groups = [f"g{i}" for i in range(12)]
    for g in groups:
        cluster.member(g, ["t"], session_ms=4000)
    return groups


def test_one_node_leads_every_shard(zk, nodes, twelve_groups):
    nodes("a")
    wait_for(lambda: settled(zk, twelve_groups, ["a"]), 20, message="a leads all")
    assert read.shard_count(zk) == 8
    assert all(node == "a" for node, _, _, _ in groups_of(zk, twelve_groups).values())


def test_a_node_joining_takes_shards_without_a_command(zk, nodes, twelve_groups):
    nodes("a")
    wait_for(lambda: settled(zk, twelve_groups, ["a"]), 20, message="a leads all")
    before = groups_of(zk, twelve_groups)
    nodes("b")
    wait_for(lambda: settled(zk, twelve_groups, ["a", "b"]), 20, message="a and b share the shards")
    after = groups_of(zk, twelve_groups)
    leaders = read.shard_leaders(zk)
    assert sorted(sum(1 for n, _, _ in leaders.values() if n == x) for x in "ab") == [4, 4]
    moved = [g for g in twelve_groups if after[g][0] != before[g][0]]
    assert moved and all(after[g][0] == "b" and after[g][1] > before[g][1] for g in moved)
    for g in twelve_groups:  # ownership was right: the new coordinator wrote nothing to members
        assert after[g][2:] == before[g][2:], f"{g} was rebalanced: {before[g]} -> {after[g]}"


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_node_lost_moves_only_its_groups(zk, nodes, twelve_groups, fault):
    """A node dies (SIGKILL) or freezes past its session (SIGSTOP, then SIGCONT): only the
    groups of its shards get a new coordinator, at a new epoch; nobody else's moves; and the
    frozen node, resumed, writes nothing under its old epochs."""
    procs = {name: nodes(name) for name in ("a", "b", "c")}
    wait_for(lambda: settled(zk, twelve_groups, ["a", "b", "c"]), 30, message="three nodes share the shards")
    controller = read.leader(zk).node_id
    victim = next(n for n in ("a", "b", "c") if n != controller)  # keep the controller: its failover is elsewhere
    before = groups_of(zk, twelve_groups)
    pid = procs[victim].pid
    os.kill(pid, signal.SIGKILL if fault == "SIGKILL" else signal.SIGSTOP)
    survivors = [n for n in ("a", "b", "c") if n != victim]
    wait_for(lambda: settled(zk, twelve_groups, survivors), 30, message="the survivors lead every shard")
    after = groups_of(zk, twelve_groups)
    for g in twelve_groups:
        was, now = before[g], after[g]
        if was[0] == victim:
            assert now[1] > was[1], f"{g} kept the epoch of the lost node"
        else:
            assert now[:2] == was[:2], f"{g} moved although its node lived: {was} -> {now}"
        assert now[2:] == was[2:], f"{g} was rebalanced: {was} -> {now}"  # membership was unchanged
    if fault == "SIGSTOP":
        # Resumed, the node registers again and the controller gives it a fair share back
        # (new epochs); what it did under its old epochs must not have reached any group.
        os.kill(pid, signal.SIGCONT)
        wait_for(lambda: settled(zk, twelve_groups, ["a", "b", "c"]), 30, message="the frozen node is back")
        back = groups_of(zk, twelve_groups)
        for g in twelve_groups:
            assert back[g][2:] == before[g][2:], f"{g} was rebalanced: {before[g]} -> {back[g]}"
            assert read_state(zk, g).epoch <= back[g][1]
