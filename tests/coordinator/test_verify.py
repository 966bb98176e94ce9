"""Verification (:mod:`coordinator.verify`): proving a group's ownership is still what was
verified without reading it all. A fingerprint matches only unchanged zxids and partition
counts; the owner nodes are as assigned only when exactly the assigned partitions have one; a
node taking a group over trusts the record and sends no command. Pure parts from fixtures,
the reads on a real ZooKeeper."""
from __future__ import annotations

from types import SimpleNamespace

from coordinator import protocol, read
from coordinator.topics import TopicRegistry
from coordinator.verify import Fingerprint, owners_as_assigned
from tests.support.groups import command_count, leader_info, read_state, wait_stable
from tests.support.helpers import wait_for

PRINT = Fingerprint(state_mzxid=5, ids_pzxid=6, channel_pzxid=7, owners=(("t", 8),), topics=(("t", 4),))


def stats(state=5, ids=6, channel=7, owners=8):
    return [SimpleNamespace(mzxid=state), SimpleNamespace(pzxid=ids), SimpleNamespace(pzxid=channel),
            SimpleNamespace(pzxid=owners)]


def test_a_fingerprint_matches_only_unchanged_zxids_and_partition_counts():
    assert PRINT.paths("g") == [protocol.state_path("g"), protocol.ids_path("g"), protocol.channel_path("g"),
                                protocol.owners_path("g", "t")]
    assert PRINT.matches(stats(), {"t": 4, "other": 9})
    for changed in (dict(state=50), dict(ids=60), dict(channel=70), dict(owners=80)):
        assert not PRINT.matches(stats(**changed), {"t": 4})
    assert not PRINT.matches(stats(), {"t": 5})  # the topic grew
    missing = stats()
    missing[3] = None  # owners/t deleted
    assert not PRINT.matches(missing, {"t": 4})


def test_owner_nodes_are_as_assigned_only_when_exactly_the_assigned_partitions_have_one(zk):
    for p in (0, 1):
        zk.create(protocol.owners_path("g", "t", p), b"m-0", makepath=True)
    assignment = {"t": {0: "m-0", 1: "m-0"}}
    pzxids = owners_as_assigned(zk, "g", assignment)
    assert pzxids == {"t": zk.exists(protocol.owners_path("g", "t")).pzxid}
    assert owners_as_assigned(zk, "g", {"t": {0: "m-0"}}) is None  # one too many
    zk.delete(protocol.owners_path("g", "t", 1))
    assert owners_as_assigned(zk, "g", assignment) is None  # one missing


def test_new_leader_with_unchanged_membership_sends_no_commands(cluster, zk):
    TopicRegistry(zk).create("t", 4)
    a = cluster.node("a")
    cluster.leader()
    for _ in range(2):
        cluster.member("g", ["t"])
    s = wait_stable(zk, "g", 2)
    before = command_count(zk, "g")
    b = cluster.node("b")
    a.close()
    wait_for(lambda: b.is_leader, message="b leads")
    wait_for(lambda: leader_info(zk).node_id == "b" and read.all_verified(zk), message="b verified all groups")
    assert command_count(zk, "g") == before
    assert read_state(zk, "g").generation == s.generation
