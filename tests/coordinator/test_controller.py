"""The controller (:mod:`coordinator.controller`): its writes are fenced by its epoch; it makes
the shards (the count written once, an assignment and an epoch znode per shard, a damaged
count rewritten from the shards that exist, a missing epoch restored above every one
recorded) and places every shard on a live node. Real ZooKeeper, the controller's steps called
one by one (no election)."""
from __future__ import annotations

import logging

import pytest

from coordinator import protocol
from coordinator.controller import Controller
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.fencing import Deposed, Leadership


def test_a_deposed_controller_cannot_write(zk, zk_connect):
    """A controller whose epoch is no longer current (another node was elected behind its
    back) can write neither the leader znode nor the shards; it does not delete the new
    controller's znode either."""
    old = Coordinator(zk_connect, "old")
    old.client = zk  # not started: only its writes are exercised
    zk.ensure_path(protocol.EPOCH)
    old_epoch = zk.set(protocol.EPOCH, b"1").version
    new_epoch = zk.set(protocol.EPOCH, b"2").version  # another node was elected since
    new_info = protocol.LeaderInfo("new", "h", 1, new_epoch, protocol.now_ms())
    zk.create(protocol.LEADER, new_info.encode(), ephemeral=True)
    old_info = protocol.LeaderInfo("old", "h", 2, old_epoch, protocol.now_ms())

    with pytest.raises(Deposed):
        old._publish_leader(old_info)
    with pytest.raises(Deposed):
        Controller(zk, CoordinatorConfig(), "old", Leadership(old_epoch))._ensure_shards()
    assert not zk.exists(protocol.SHARDS)
    old._unpublish_leader(old_info)
    assert protocol.LeaderInfo.decode(zk.get(protocol.LEADER)[0]) == new_info


def controller(zk, shards=3):
    """A controller elected just now (the controller epoch bumped), its steps called by hand."""
    zk.ensure_path(protocol.EPOCH)
    epoch = zk.set(protocol.EPOCH, b"").version
    return Controller(zk, CoordinatorConfig(shards=shards), "n", Leadership(epoch))


def test_the_first_controller_makes_the_shards_and_a_later_one_keeps_their_count(zk, caplog):
    assert controller(zk, shards=3)._ensure_shards() == 3
    assert protocol.ShardsInfo.decode(zk.get(protocol.SHARDS)[0]).count == 3
    assert all(zk.exists(protocol.shard_path(s)) and zk.exists(protocol.shard_epoch_path(s)) for s in range(3))
    with caplog.at_level(logging.WARNING, logger="zkgroups.controller"):
        assert controller(zk, shards=5)._ensure_shards() == 3  # fixed at first start
    assert any("this installation has 3 shards" in r.getMessage() for r in caplog.records)


def test_a_damaged_shard_count_is_rewritten_from_the_shards_that_exist(zk, caplog):
    controller(zk, shards=3)._ensure_shards()
    zk.set(protocol.SHARDS, b"not json")
    with caplog.at_level(logging.ERROR):
        assert controller(zk, shards=16)._ensure_shards() == 3
    assert protocol.ShardsInfo.decode(zk.get(protocol.SHARDS)[0]).count == 3
    assert any("rewriting it with 3 shards" in r.getMessage() for r in caplog.records)


def test_a_missing_shard_epoch_is_restored_above_the_epoch_its_assignment_records(zk):
    controller(zk, shards=2)._ensure_shards()
    zk.set(protocol.shard_path(1), protocol.ShardAssignment("gone", 4).encode())
    zk.delete(protocol.shard_epoch_path(1))
    controller(zk, shards=2)._ensure_shards()
    assert zk.exists(protocol.shard_epoch_path(1)).version >= 4  # members ignore commands below what they applied


def test_every_shard_is_placed_on_a_live_node_at_a_fresh_epoch_and_a_second_look_changes_nothing(zk):
    c = controller(zk, shards=2)
    c.count = c._ensure_shards()
    zk.create(protocol.node_path("n1"), b"", ephemeral=True, makepath=True)
    c._reconcile()
    placed = [(protocol.ShardAssignment.decode(zk.get(protocol.shard_path(s))[0], "shard"),
               zk.exists(protocol.shard_epoch_path(s)).version) for s in range(2)]
    assert all(a.node_id == "n1" and a.epoch == version for a, version in placed)
    c._reconcile()
    assert [zk.exists(protocol.shard_epoch_path(s)).version for s in range(2)] == [v for _, v in placed]
