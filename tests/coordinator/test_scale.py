"""Many groups and large groups: the periodic check reads only versions, yet still fixes a
group whose ownership went wrong; a generation too large for one ZooKeeper request is written
in fenced parts."""
from __future__ import annotations

import pytest
from kazoo.protocol.serialization import Transaction

from coordinator import protocol
from coordinator.shard_follower import FULL_CHECK_EVERY
from coordinator.fencing import Deposed, Fence
from coordinator.plan import Plan, Snapshot
from coordinator.rebalance import write_commands
from coordinator.verify import still_as_recorded
from coordinator.topics import TopicRegistry
from coordinator.zkclient import MAX_REQUEST_BYTES
from tests.support.groups import Cluster, command_count, read_state, wait_stable
from tests.support.helpers import wait_for

pytestmark = pytest.mark.zk


@pytest.fixture
def checking(zk_connect):
    """A cluster whose nodes check every group every 100 ms."""
    c = Cluster(zk_connect, check_interval_ms=100)
    yield c
    c.close()


def counting_runs(node):
    """Count the node's full group runs (each reads the group's members and owner nodes)."""
    rebalancer = node.groups.rebalancer
    runs = []
    real = rebalancer.run

    def run(group, *args, **kwargs):
        runs.append(group)
        return real(group, *args, **kwargs)

    rebalancer.run = run
    return runs


def test_unchanged_groups_are_not_read_again_by_the_periodic_check(checking, zk):
    TopicRegistry(zk).create("t", 4)
    node = checking.node("a")
    checking.leader()
    for group in ("g1", "g2"):
        for _ in range(2):
            checking.member(group, ["t"])
    for group in ("g1", "g2"):
        wait_stable(zk, group, 2)
    wait_for(lambda: set(node.groups.rebalancer.verified) == {"g1", "g2"}, message="both groups verified")
    # Between two full checks (every FULL_CHECK_EVERY-th check reads every group in full).
    wait_for(lambda: node.groups.follower.checks % FULL_CHECK_EVERY == 1, message="a full check done")
    runs = counting_runs(node)
    commands = command_count(zk, "g1")
    wait_for(lambda: node.groups.follower.checks % FULL_CHECK_EVERY == FULL_CHECK_EVERY - 1, message="light checks")
    assert runs == []
    assert command_count(zk, "g1") == commands


def test_a_state_rewritten_by_someone_is_noticed_by_the_periodic_check_and_fixed(checking, zk):
    TopicRegistry(zk).create("t", 2)
    node = checking.node("a")
    checking.leader()
    member = checking.member("g", ["t"])
    good = wait_stable(zk, "g", 1)
    wait_for(lambda: "g" in node.groups.rebalancer.verified, message="g verified")
    # No watch fires for this (the coordinator watches members, not its own state znode).
    bogus = protocol.GroupState(good.generation, protocol.STABLE, [], {}, good.strategy, "", good.epoch)
    zk.set(protocol.state_path("g"), bogus.encode())
    fixed = wait_stable(zk, "g", 1, after_generation=good.generation)
    assert fixed.members == [member.consumer_id]
    assert fixed.assignment == good.assignment


def test_a_group_too_large_for_one_request_is_written_in_fenced_parts(zk):
    members = 500
    partitions = 20000  # the state and the commands: about 1.4 MB
    cids = [f"g_member-{i:04d}" for i in range(members)]
    zk.ensure_path(protocol.shard_epoch_path(0))
    for cid in cids:
        zk.ensure_path(protocol.channel_path("g", cid))
    assignment = {"t": {p: f"{cids[p % members]}-0" for p in range(partitions)}}
    plan = Plan({cid: {"t": 1} for cid in cids}, "range", assignment)
    snapshot = Snapshot("g", {}, {}, {"t": partitions}, protocol.GroupState(), None)
    sizes = []
    real = zk.transaction

    def transaction():
        t = real()
        real_commit = t.commit_async

        def commit_async():
            sizes.append(8 + len(Transaction(t.operations).serialize()))
            return real_commit()
        t.commit_async = commit_async
        return t

    zk.transaction = transaction
    epoch = zk.exists(protocol.shard_epoch_path(0)).version
    fence = Fence(protocol.shard_epoch_path(0), epoch)
    written = write_commands(zk, fence, snapshot, plan, 1, [])
    assert len(sizes) > 1 and max(sizes) <= MAX_REQUEST_BYTES, sizes
    assert sorted(written) == cids
    for cid in cids:
        stop, start = written[cid]
        assert sorted(zk.get_children(protocol.channel_path("g", cid))) == [stop.rsplit("/", 1)[1],
                                                                              start.rsplit("/", 1)[1]]
        assert protocol.Command.decode(zk.get(start)[0], start).ownership == {
            "t": {p: s for p, s in assignment["t"].items() if s.startswith(cid)}}
    zk.set(protocol.shard_epoch_path(0), b"")  # the shard moved on: nothing more lands
    state = protocol.GroupState.decode(zk.get(protocol.state_path("g"))[0], "state")
    snapshot = Snapshot("g", {}, {}, {"t": partitions}, state, zk.exists(protocol.state_path("g")).version)
    with pytest.raises(Deposed):
        write_commands(zk, fence, snapshot, plan, 2, [])
    assert all(len(zk.get_children(protocol.channel_path("g", cid))) == 2 for cid in cids)


def test_a_node_taking_groups_over_trusts_a_recorded_verification_only_while_nothing_changed(checking, zk,
                                                                                             monkeypatch):
    from coordinator import rebalance
    reads = []
    real = rebalance.read_owners

    def counted(client, group, *args, **kwargs):
        reads.append(group)
        return real(client, group, *args, **kwargs)

    monkeypatch.setattr(rebalance, "read_owners", counted)
    TopicRegistry(zk).create("t", 4)
    a = checking.node("a")
    checking.leader()
    groups = ("same", "changed")
    for group in groups:
        for _ in range(2):
            checking.member(group, ["t"])
    for group in groups:
        wait_stable(zk, group, 2)
        wait_for(lambda: read_state(zk, group).verified, message=f"{group}: its verification recorded")
    before = {g: (read_state(zk, g).generation, command_count(zk, g)) for g in groups}
    # a must not find the change itself (its 100 ms check would verify and record it afresh).
    monkeypatch.setattr(a.groups.follower, "_periodic_check", lambda full: None)
    owner = sorted(zk.get_children(protocol.owners_path("changed", "t")))[0]
    stream = zk.get(protocol.owners_path("changed", "t", owner))[0]
    zk.delete(protocol.owners_path("changed", "t", owner))  # the recorded verification no longer holds
    zk.create(protocol.owners_path("changed", "t", owner), stream)
    reads.clear()  # before b can take a shard
    b = checking.node("b")
    a.close()
    wait_for(lambda: all(b.groups.rebalancer.verified.get(g) for g in groups), timeout=20,
             message="b verified both groups")
    assert reads[:1] == ["changed"]
    assert {g: (read_state(zk, g).generation, command_count(zk, g)) for g in groups} == before


def test_a_shard_taken_over_trusts_only_a_verification_that_still_holds(cluster, zk):
    TopicRegistry(zk).create("t", 4)
    TopicRegistry(zk).create("u", 4)
    node = cluster.node("a")
    cluster.leader()
    for group, topic in (("g1", "t"), ("g1", "t"), ("g2", "u")):
        cluster.member(group, [topic])
    wait_stable(zk, "g1", 2)
    wait_stable(zk, "g2", 1)
    wait_for(lambda: read_state(zk, "g1").verified and read_state(zk, "g2").verified,
             message="the verifications recorded")
    node.close()  # nobody rewrites the states or the owner nodes from here on
    assert set(still_as_recorded(zk, ["g1", "g2", "absent"])) == {"g1", "g2"}
    TopicRegistry(zk).add_partitions("t", 5)              # a partition was added since (read, not passed in)
    assert set(still_as_recorded(zk, ["g1", "g2"])) == {"g2"}
    zk.delete(protocol.owners_path("g2", "u", 0))          # an owner node went
    assert still_as_recorded(zk, ["g1", "g2"]) == {}
