"""The one read API of zkgroups' state (:mod:`coordinator.read`): missing znodes read as
nothing, a damaged one raises or is reported per item, a subtree lists children first, and a
shard has a leader only when the node it is placed on reports it at its epoch. Real ZooKeeper
(a few reads each), the shard leaders' rule from fixtures."""
from __future__ import annotations

import pytest

from coordinator import protocol, read
from coordinator.errors import CorruptZnode
from coordinator.protocol import GroupState, NodeInfo, Registration, ShardAssignment


def test_missing_znodes_read_as_nothing(zk):
    assert read.children(zk, "/nowhere") == [] and read.groups(zk) == []
    assert read.group_state(zk, "g") == GroupState() and read.leader(zk) is None and read.shard_count(zk) is None
    assert read.members(zk, "g") == {} and read.committed_offsets(zk, "g", [("t", 0)]) == {("t", 0): None}


def test_a_damaged_znode_raises_or_is_reported_and_the_others_are_read(zk):
    zk.create(protocol.ids_path("g", "good"), Registration({"t": 1}).encode(), makepath=True)
    zk.create(protocol.ids_path("g", "bad"), b"{", makepath=True)
    zk.create(protocol.offsets_path("g", "t", 0), b"12", makepath=True)
    zk.create(protocol.offsets_path("g", "t", 1), b"twelve")
    with pytest.raises(CorruptZnode):
        read.members(zk, "g")
    problems = {}
    assert list(read.members(zk, "g", problems)) == ["good"] and list(problems) == ["bad"]
    problems = {}
    assert read.committed_offsets(zk, "g", [("t", 0), ("t", 1)], problems) == {("t", 0): 12, ("t", 1): None}
    assert list(problems) == [("t", 1)]


def test_a_subtree_lists_each_node_after_its_children(zk):
    for path in ("/a/b/c", "/a/d"):
        zk.ensure_path(path)
    assert read.subtree(zk, "/a") == ["/a/b/c", "/a/b", "/a/d", "/a"]


def test_a_shard_is_led_only_by_the_node_it_is_placed_on_reporting_it_at_its_epoch():
    assignments = {0: ShardAssignment("n1", 3), 1: ShardAssignment("n1", 4), 2: ShardAssignment("gone", 1)}
    live = {"n1": NodeInfo("n1", "h", 1, 0, {0: {"epoch": 3, "verified": True}, 1: {"epoch": 3, "verified": True}})}
    assert read.shard_leaders_of(4, assignments, live) == {
        0: ("n1", 3, True),   # placed and reported at its epoch
        1: ("", 4, False),    # reported at an older epoch: not led yet
        2: ("", 1, False),    # placed on a node that is gone
        3: ("", 0, False),    # never placed
    }
