"""The scale benchmark's light members speak the member protocol: a coordinator brings their
groups to Stable, their owner nodes are what the state assigns, their offsets znodes carry
the fencing token, and a membership change moves only what the new assignment says."""
from __future__ import annotations

import pytest

from coordinator import protocol
from coordinator.topics import TopicRegistry
from tests.benchmarks.lightmembers import MemberPool
from tests.support.groups import wait_stable
from tests.support.helpers import wait_for

pytestmark = pytest.mark.zk


def owners(zk, group, topic):
    return {int(p): zk.get(protocol.owners_path(group, topic, int(p)))[0].decode()
            for p in zk.get_children(protocol.owners_path(group, topic))}


def test_light_members_reach_stable_and_own_what_is_assigned(cluster, zk):
    TopicRegistry(zk).create("t", 6)
    cluster.node("a")
    cluster.leader()
    clients = [cluster.client(session_ms=6000) for _ in range(2)]
    pool = MemberPool(clients, ["g1", "g2"], 3, "t").start()
    try:
        for group in ("g1", "g2"):
            state = wait_stable(zk, group, 3)
            wait_for(lambda: owners(zk, group, "t") == state.assignment["t"], message="owners as assigned")
            assert {p: zk.get(protocol.offsets_path(group, "t", p))[1].version for p in range(6)} == \
                {p: 0 for p in range(6)}
            assert all(not zk.get_children(protocol.channel_path(group, cid)) for cid in state.members)
        assert all(m.rebalances >= 1 for m in pool.members)
        # Two members of g1 leave (owner nodes released and registration deleted in one
        # transaction, as a member leaves): the third takes all six partitions over.
        before = wait_stable(zk, "g1", 3)
        gone = [m for m in pool.members if m.group == "g1"][:2]
        for m in gone:
            assert pool.leave(m)
        state = wait_stable(zk, "g1", 1, after_generation=before.generation)
        wait_for(lambda: owners(zk, "g1", "t") == state.assignment["t"], message="the survivor owns every partition")
    finally:
        pool.stop()
