"""The elected coordinator against a real ZooKeeper: election, rebalances, failures.

What chiefly exercises one part of a node is in the file named after it:
``test_shard_follower.py`` (takeovers, watches, a node's start), ``test_rebalance_handlers.py``
(how a run ends), ``test_controller.py`` (the controller's fenced writes, the shards),
``test_verify.py`` (a takeover that trusts the verification)."""
from __future__ import annotations

import logging
import signal
import dataclasses

import pytest

from coordinator import protocol, read
from coordinator.topics import TopicRegistry
from tests.support.groups import (Cluster, assert_exclusive_and_complete, expire_session, leader_info, owned_by,
                                  read_state, wait_stable)
from tests.support.helpers import wait_for


def test_one_leader_with_epoch_and_identity(cluster, zk):
    nodes = [cluster.node(f"n{i}") for i in range(3)]
    leader = cluster.leader()
    wait_for(lambda: read.all_verified(zk), message="every shard led and verified")
    info = leader_info(zk)
    assert info.node_id == leader.node_id and info.epoch == leader.epoch >= 1
    assert sum(n.is_leader for n in nodes) == 1
    contenders = zk.Election(protocol.ELECTION).contenders()
    assert sorted(contenders) == ["n0", "n1", "n2"]


def test_clean_close_hands_over_at_once_with_higher_epoch(cluster, zk):
    cluster.config = dataclasses.replace(cluster.config, session_timeout_ms=30_000)
    a = cluster.node("a")
    cluster.leader()
    b = cluster.node("b")
    first = a.epoch
    a.close()
    # Well within a's 30 s session: the hand-over did not wait for the session to expire.
    wait_for(lambda: b.elected.is_set(), 10, message="b leads")  # set once its leader znode is written
    assert b.epoch == first + 1
    assert leader_info(zk).node_id == "b"


def test_members_join_and_leave_get_exclusive_complete_ownership(cluster, zk):
    TopicRegistry(zk).create("t", 6)
    cluster.node("n")
    m1 = cluster.member("g", ["t"])
    wait_stable(zk, "g", 1)
    # Stable is written once the acks are in; the member calls its listener just after acking.
    wait_for(lambda: len(m1.recorder.owned) == 6, message="m1 owns all 6")
    m2 = cluster.member("g", ["t"])
    m3 = cluster.member("g", ["t"])
    s = wait_stable(zk, "g", 3)
    wait_for(lambda: [len(m.recorder.owned) for m in (m1, m2, m3)] == [2, 2, 2], message="2 each")
    assert_exclusive_and_complete([m1, m2, m3], "t", 6)
    assert s.strategy == "range"
    m2.close()
    cluster.members.remove(m2)
    wait_stable(zk, "g", 2, after_generation=s.generation)
    wait_for(lambda: sorted(len(m.recorder.owned) for m in (m1, m3)) == [3, 3], message="3 each")
    assert_exclusive_and_complete([m1, m3], "t", 6)
    # Owner nodes match what members believe.
    owners = {int(p) for p in zk.get_children(protocol.owners_path("g", "t"))}
    assert owners == set(range(6))


def test_sticky_group_moves_only_what_it_must(cluster, zk):
    """With ``sticky`` a joining member takes one partition from each of the others, which
    keep the rest without a revoke; a leaving member's partitions are all that move."""
    TopicRegistry(zk).create("t", 12)
    cluster.node("n")
    old = [cluster.member("g", ["t"], strategies=("sticky", "range")) for _ in range(3)]
    s = wait_stable(zk, "g", 3)
    assert s.strategy == "sticky"
    wait_for(lambda: [len(m.recorder.owned) for m in old] == [4, 4, 4], message="4 each")
    before = owned_by(old)
    for m in old:
        m.recorder.events.clear()
    new = cluster.member("g", ["t"], strategies=("sticky",))
    s = wait_stable(zk, "g", 4, after_generation=s.generation)
    wait_for(lambda: len(new.recorder.owned) == 3, message="the newcomer owns 3")
    assert_exclusive_and_complete(old + [new], "t", 12)
    for m, had in zip(old, before):
        assert m.recorder.owned <= had and len(m.recorder.owned) == 3
        assert m.recorder.events == [("revoked", had - m.recorder.owned)]  # nothing else moved
    staying = owned_by(old)
    new.close()
    cluster.members.remove(new)
    wait_stable(zk, "g", 3, after_generation=s.generation)
    wait_for(lambda: [len(m.recorder.owned) for m in old] == [4, 4, 4], message="4 each again")
    for m, kept in zip(old, staying):
        assert kept <= m.recorder.owned
    assert_exclusive_and_complete(old, "t", 12)


def test_member_killed_its_partitions_move_after_session_expiry(cluster, zk, zk_connect, subprocess_env):
    TopicRegistry(zk).create("t", 4)
    cluster.node("n")
    m1 = cluster.member("g", ["t"])
    proc = cluster.spawn("-m", "tests.support.procs.member", zk_connect, "g", "t", "--session-ms", "800", env=subprocess_env)
    s = wait_stable(zk, "g", 2, timeout=20)
    wait_for(lambda: len(m1.recorder.owned) == 2, message="half each")
    proc.send_signal(signal.SIGKILL)
    proc.wait(5)
    wait_stable(zk, "g", 1, after_generation=s.generation, timeout=20)
    wait_for(lambda: len(m1.recorder.owned) == 4, message="survivor owns all")


def test_partitions_added_are_assigned(cluster, zk):
    reg = TopicRegistry(zk)
    reg.create("t", 2)
    cluster.node("n")
    m1, m2 = cluster.member("g", ["t"]), cluster.member("g", ["t"])
    s = wait_stable(zk, "g", 2)
    reg.add_partitions("t", 6)
    wait_stable(zk, "g", 2, after_generation=s.generation)
    wait_for(lambda: len(m1.recorder.owned) + len(m2.recorder.owned) == 6, message="6 owned")
    assert_exclusive_and_complete([m1, m2], "t", 6)


def test_topic_created_after_the_group_subscribed(cluster, zk):
    cluster.node("n")
    m = cluster.member("g", ["later"])
    wait_for(lambda: read_state(zk, "g").state == protocol.STABLE, message="stable, nothing to own")
    assert m.recorder.owned == set()
    TopicRegistry(zk).create("later", 3)
    wait_for(lambda: len(m.recorder.owned) == 3, message="new topic assigned")


def test_white_and_black_lists_pick_up_new_topics(cluster, zk):
    reg = TopicRegistry(zk)
    reg.create("logs.a", 1)
    reg.create("metrics", 1)
    cluster.node("n")
    white = cluster.member("w", {r"logs\..*": 1}, pattern=protocol.PATTERN_WHITE_LIST)
    black = cluster.member("b", {r"logs\..*": 1}, pattern=protocol.PATTERN_BLACK_LIST)
    wait_for(lambda: {p.topic for p in white.recorder.owned} == {"logs.a"}, message="white list")
    wait_for(lambda: {p.topic for p in black.recorder.owned} == {"metrics"}, message="black list")
    reg.create("logs.b", 2)
    reg.create("events", 1)
    wait_for(lambda: {p.topic for p in white.recorder.owned} == {"logs.a", "logs.b"}, message="white list grows")
    wait_for(lambda: {p.topic for p in black.recorder.owned} == {"metrics", "events"}, message="black list grows")


def test_different_subscriptions_in_one_group(cluster, zk):
    reg = TopicRegistry(zk)
    reg.create("a", 2)
    reg.create("b", 2)
    cluster.node("n")
    both = cluster.member("g", ["a", "b"])
    only_b = cluster.member("g", ["b"])
    wait_stable(zk, "g", 2)
    wait_for(lambda: {p.topic for p in both.recorder.owned} == {"a", "b"} and len(only_b.recorder.owned) == 1,
             message="split")
    assert {p.topic for p in only_b.recorder.owned} == {"b"}
    assert_exclusive_and_complete([both, only_b], "b", 2)


def test_member_that_never_acks_is_excluded_then_group_fails_then_recovers(cluster, zk, caplog):
    TopicRegistry(zk).create("t", 4)
    cluster.node("n")
    good = cluster.member("g", ["t"])
    wait_stable(zk, "g", 1)
    # A registration whose owner never reads its channel.
    mute = cluster.client()
    reg = protocol.Registration({"t": 1})
    mute.ensure_path(protocol.channel_path("g", "g_mute-1-0"))
    mute.create(protocol.ids_path("g", "g_mute-1-0"), reg.encode(), ephemeral=True)
    # First attempt times out; the retry leaves the mute member out: the group works.
    wait_for(lambda: (lambda s: s if s.state == protocol.STABLE and s.members == [good.consumer_id]
                          and s.generation >= 3 else None)(read_state(zk, "g")), 20, message="stable without mute")
    assert len(good.recorder.owned) == 4
    assert not zk.get_children(protocol.channel_path("g", "g_mute-1-0")), "stale commands removed"
    # Only mute members: every attempt fails -> Failed, visible, retried later.
    good.close()
    cluster.members.remove(good)
    wait_for(lambda: read_state(zk, "g").state == protocol.FAILED, 20, message="Failed")
    assert "did not ack" in read_state(zk, "g").error
    # Recovery: the mute member goes away, a live one joins; the group is Stable again.
    mute.delete(protocol.ids_path("g", "g_mute-1-0"))
    healthy = cluster.member("g", ["t"])
    wait_for(lambda: len(healthy.recorder.owned) == 4, 20, message="recovered")
    # The member acks before the coordinator records the generation as Stable.
    wait_for(lambda: read_state(zk, "g").state == protocol.STABLE, 10, message="Stable again")


def test_leader_session_expiry_another_node_takes_over(cluster, zk, zk_connect):
    TopicRegistry(zk).create("t", 2)
    a = cluster.node("a")
    cluster.leader()
    b = cluster.node("b")
    m = cluster.member("g", ["t"])
    wait_stable(zk, "g", 1)
    old = a.epoch
    expire_session(a.client, zk_connect)
    new = wait_for(lambda: next((n for n in (a, b) if n.is_leader and n.epoch > old), None), 10,
                   message="new leader")
    assert new.epoch > old
    m2 = cluster.member("g", ["t"])
    wait_stable(zk, "g", 2)
    wait_for(lambda: len(m.recorder.owned) == 1 and len(m2.recorder.owned) == 1, message="split")


def test_deposed_leader_cannot_write(cluster, zk, caplog):
    TopicRegistry(zk).create("t", 2)
    a = cluster.node("a")
    cluster.leader()
    cluster.member("g", ["t"])
    s = wait_stable(zk, "g", 1)
    # g's shard moved on behind a's back (as after a pause longer than its session).
    epoch_path = protocol.shard_epoch_path(protocol.shard_of("g", read.shard_count(zk)))
    _, stat = zk.get(epoch_path)
    zk.set(epoch_path, b"", version=stat.version)
    with caplog.at_level(logging.INFO):
        cluster.member("g", ["t"])  # a's fenced write fails; the controller places the shard afresh
        st = wait_stable(zk, "g", 2, after_generation=s.generation)
    # a lost the shard at that moment (its next write would have failed the fence) and leads it again at the
    # epoch the controller gave it afresh; nothing was written under the stale epoch
    assert any(f"leads shard {protocol.shard_of('g', read.shard_count(zk))} at epoch {s.epoch + 2}" in r.getMessage()
               for r in caplog.records)
    assert st.epoch == s.epoch + 2


def test_malformed_registration_is_rejected_others_carry_on(cluster, zk, caplog):
    TopicRegistry(zk).create("t", 2)
    cluster.node("n")
    good = cluster.member("g", ["t"])
    other_group = cluster.member("h", ["t"])
    wait_stable(zk, "g", 1)
    bad = cluster.client()
    bad.create(protocol.ids_path("g", "g_bad-1-0"), b"{not json", ephemeral=True)
    bad.create(protocol.ids_path("g", "g_v9-1-0"), b'{"version":9,"subscription":{"t":1}}', ephemeral=True)
    with caplog.at_level(logging.ERROR):
        wait_for(lambda: "g_bad-1-0" in read_state(zk, "g").error and "g_v9-1-0" in read_state(zk, "g").error,
                 message="rejection recorded")
    assert read_state(zk, "g").members == [good.consumer_id]
    assert len(good.recorder.owned) == 2 and len(other_group.recorder.owned) == 2
    assert any("g_bad-1-0" in r.getMessage() for r in caplog.records)


def test_zookeeper_restart_leader_resumes_and_group_stays_consistent(zk_server, tmp_path):
    """A ZooKeeper that goes away and comes back: leader steps down or survives, no split."""
    if not zk_server.local:
        pytest.skip("needs a local ZooKeeper to restart")
    from coordinator.testing.zkserver import Ensemble
    ens = Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk")).start()
    try:
        from coordinator.zkclient import start_client, close_client
        zk = start_client(ens.connect, 4000)
        TopicRegistry(zk).create("t", 4)
        c = Cluster(ens.connect, session_timeout_ms=4000)
        try:
            c.node("a")
            c.leader()
            m1 = c.member("g", ["t"], session_ms=4000)
            c.member("g", ["t"], session_ms=4000)
            s = wait_stable(zk, "g", 2)
            ens.servers[0].kill()
            ens.restart(0)
            c.leader(timeout=20)
            m3 = c.member("g", ["t"], session_ms=4000)
            wait_stable(zk, "g", 3, after_generation=s.generation, timeout=30)
            wait_for(lambda: sum(len(m.recorder.owned) for m in c.members) == 4, 20, message="all owned")
            assert_exclusive_and_complete(c.members, "t", 4)
            assert m1.recorder.owned and m3.recorder.owned  # the first member and the late one both hold some
        finally:
            c.close()
            close_client(zk)
    finally:
        ens.close()


def test_corrupt_state_znode_is_rewritten(cluster, zk, caplog):
    TopicRegistry(zk).create("t", 2)
    cluster.node("n")
    m = cluster.member("g", ["t"])
    s = wait_stable(zk, "g", 1)
    zk.set(protocol.state_path("g"), b"\x00garbage")
    with caplog.at_level(logging.ERROR):
        cluster.member("g", ["t"])
        wait_stable(zk, "g", 2)
    assert any("group state is not JSON" in r.getMessage() for r in caplog.records)
    wait_for(lambda: len(m.recorder.owned) == 1, message="split after the rewrite")
    assert read_state(zk, "g").generation > s.generation  # members never see a generation go back


def test_a_member_gone_mid_rebalance_is_not_waited_for(zk_connect, zk):
    """A member whose session ends while the others apply a generation: the leader drops that
    generation at once for one without it, instead of waiting out the rebalance timeout."""
    cluster = Cluster(zk_connect, rebalance_timeout_ms=60000)
    try:
        TopicRegistry(zk).create("t", 4)
        cluster.node("n")
        good = cluster.member("g", ["t"])
        s = wait_stable(zk, "g", 1)
        mute = cluster.client()  # registers, never reads its channel, then its session expires
        mute.ensure_path(protocol.channel_path("g", "g_mute-1-0"))
        mute.create(protocol.ids_path("g", "g_mute-1-0"), protocol.Registration({"t": 1}).encode(), ephemeral=True)
        wait_for(lambda: read_state(zk, "g").state == protocol.REBALANCING, message="waiting for the mute member")
        expire_session(mute, zk_connect)
        wait_stable(zk, "g", 1, after_generation=s.generation, timeout=15)
        wait_for(lambda: len(good.recorder.owned) == 4, message="the live member owns everything")
    finally:
        cluster.close()
