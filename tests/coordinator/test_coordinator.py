"""The elected coordinator against a real ZooKeeper: election, rebalances, failures."""
from __future__ import annotations

import logging
import signal
import dataclasses

import pytest
from kazoo.exceptions import NotEmptyError

from coordinator import protocol, read
from consumer.records import TopicPartition
from coordinator.topics import TopicRegistry
from coordinator.zkclient import TransactionFailed, close_client, commit
from tests.support.groups import (Cluster, assert_exclusive_and_complete, command_count, expire_session, leader_info,
                          owned_by, read_state, wait_stable)
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


def test_new_owner_waits_for_a_held_partition_and_gives_way_to_newer_commands(zk_connect, zk):
    """An owner node still held (a previous owner whose session has not ended) blocks only that
    partition; a newer command interrupts the wait, and the partition is claimed once freed."""
    cluster = Cluster(zk_connect, rebalance_timeout_ms=30000)  # waiting must not count as not acking
    try:
        TopicRegistry(zk).create("t", 2)
        holder = cluster.client()
        holder.create(protocol.owners_path("g", "t", 0), b"previous-owner", ephemeral=True, makepath=True)
        cluster.node("n")
        m1 = cluster.member("g", ["t"])
        t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
        wait_for(lambda: set(m1.owned()) == {t1}, message="m1 holds the free partition, waits for the other")
        assert read_state(zk, "g").state == protocol.REBALANCING
        m2 = cluster.member("g", ["t"])  # range: t-0 stays with m1, t-1 moves to m2
        # m2 can only get t-1 if m1 stopped waiting for t-0 and applied the newer command.
        wait_for(lambda: set(m2.owned()) == {t1}, message="m2 owns t-1 while t-0 is still held")
        assert t0 not in m1.owned()
        close_client(holder)
        cluster.clients.remove(holder)
        wait_stable(zk, "g", 2)
        wait_for(lambda: m1.recorder.owned == {t0} and m2.recorder.owned == {t1}, message="t-0 claimed once free")
    finally:
        cluster.close()


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


def test_member_session_expiry_reregisters_and_gets_partitions_back(cluster, zk, zk_connect):
    TopicRegistry(zk).create("t", 2)
    cluster.node("n")
    m = cluster.member("g", ["t"])
    s = wait_stable(zk, "g", 1)
    expire_session(m.client, zk_connect)
    wait_for(lambda: any(e[0] == "lost" for e in m.recorder.events), message="partitions lost")
    wait_stable(zk, "g", 1, after_generation=s.generation)
    wait_for(lambda: len(m.recorder.owned) == 2, message="owned again")
    assert zk.exists(protocol.ids_path("g", m.consumer_id))


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


def test_a_topic_grown_during_a_shard_handover_is_rebalanced_by_the_takeover(cluster, zk, caplog, monkeypatch):
    """The node leading g's shard shuts down (close(): what coordinatord does on SIGTERM) and
    the other takes the shard over; t grows while the takeover's first run of g is between its
    read of g's members and learning their subscriptions: held there (no timing) until the
    growth is in the new node's view of the topics, whose event then finds no group known to
    use t. The takeover itself rebalances g onto the new partition, not the periodic check
    (60 s here: none has run)."""
    caplog.set_level(logging.INFO, logger="zkgroups.coordinator")
    TopicRegistry(zk).create("t", 2)
    a, b = cluster.node("a"), cluster.node("b")
    cluster.leader()
    m = cluster.member("g", ["t"])
    s = wait_stable(zk, "g", 1)
    wait_for(lambda: read.all_verified(zk) and read_state(zk, "g").verified and any(n.groups.leads("g") for n in (a, b)),
             message="g verified by the node leading its shard")
    leaving = next(n for n in (a, b) if n.groups.leads("g"))
    taking = b if leaving is a else a
    grown = []
    learn = taking.groups.index.update

    def update(group, registrations):  # the takeover's run learns g's subscriptions here
        if group == "g" and not grown:
            grown.append(True)
            TopicRegistry(zk).add_partitions("t", 3)
            wait_for(lambda: taking.groups.follower.topics.get("t") == 3, message="the growth in the new node's view")
        learn(group, registrations)
    monkeypatch.setattr(taking.groups.index, "update", update)
    leaving.close()
    wait_for(lambda: grown, 20, message="the takeover's run of g")
    after = wait_stable(zk, "g", 1, after_generation=s.generation, timeout=20)
    assert after.assignment == {"t": {0: m.consumer_id + "-0", 1: m.consumer_id + "-0", 2: m.consumer_id + "-0"}}
    assert taking.groups.follower.checks == 0  # rebalanced without a periodic check
    wait_for(lambda: len(m.recorder.owned) == 3, message="the member owns the new partition")
    lines = wait_for(lambda: [r.getMessage() for r in caplog.records
                              if f"group g generation {after.generation} " in r.getMessage()], message="its line")
    assert "reason=ownership differs from the computed assignment" in lines[0], lines


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


def _deleted(zk, path) -> bool:
    """Delete ``path`` and all below it, as an admin would; False if a child appeared meanwhile
    (the coordinator may still be writing the group's timeline for the rebalance to Empty)."""
    try:
        zk.delete(path, recursive=True)
    except NotEmptyError:
        return False
    return True


def test_a_deleted_group_that_comes_back_is_watched_again(cluster, zk):
    """An admin deletes an empty group's znodes; a member later joins under the same name and
    the leader assigns it at once (its watches follow the group, not the first znode)."""
    TopicRegistry(zk).create("t", 2)
    cluster.node("n")
    m = cluster.member("g", ["t"])
    wait_stable(zk, "g", 1)
    m.close()
    cluster.members.remove(m)
    wait_for(lambda: read_state(zk, "g").state == protocol.EMPTY, message="group Empty")
    wait_for(lambda: _deleted(zk, protocol.group_path("g")), message="the group's znodes deleted")
    wait_for(lambda: not zk.exists(protocol.group_path("g")), message="deleted")
    again = cluster.member("g", ["t"])
    wait_stable(zk, "g", 1, timeout=10)
    wait_for(lambda: len(again.recorder.owned) == 2, message="the new member owns both partitions")
    third = cluster.member("g", ["t"])
    wait_stable(zk, "g", 2, timeout=10)
    wait_for(lambda: len(third.recorder.owned) == 1, message="later joins are seen too")


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


def delete_subtree(zk, path: str) -> bool:
    """Delete ``path`` and everything under it in one transaction, children first (as
    ``groupctl groups delete`` does); False if something changed under it meanwhile (nothing
    was deleted)."""
    def subtree(p):
        return [q for child in zk.get_children(p) for q in subtree(f"{p}/{child}")] + [p]
    t = zk.transaction()
    for p in subtree(path):
        t.delete(p)
    try:
        commit(t)
        return True
    except TransactionFailed:
        return False


def test_a_group_deleted_during_its_rebalance_ends_it_with_one_line(zk_connect, zk, caplog):
    """An administrator deletes a group's znodes (all at once, a registration left by a member
    that never acks included) while the coordinator waits for that member's ack: the rebalance
    ends with one line saying the group was deleted, no error, no traceback, and nothing of the
    group is written again."""
    caplog.set_level(logging.INFO, logger="zkgroups.coordinator")
    cluster = Cluster(zk_connect, rebalance_timeout_ms=60000)
    try:
        TopicRegistry(zk).create("t", 2)
        cluster.node("n")
        cluster.member("g", ["t"])
        wait_stable(zk, "g", 1)
        mute = cluster.client()  # registers, never reads its channel
        mute.ensure_path(protocol.channel_path("g", "g_mute-1-0"))
        mute.create(protocol.ids_path("g", "g_mute-1-0"), protocol.Registration({"t": 1}).encode(), ephemeral=True)
        for m in cluster.members:
            m.close(timeout=5)
        cluster.members.clear()
        wait_for(lambda: (lambda st: st.state == protocol.REBALANCING and st.members == ["g_mute-1-0"])(
            read_state(zk, "g")), message="a rebalance waiting for the mute member")
        wait_for(lambda: delete_subtree(zk, protocol.group_path("g")), message="the group deleted")
        wait_for(lambda: [r for r in caplog.records if "was deleted" in r.getMessage()], 15,
                 message="the line saying the group is gone")
        assert not zk.exists(protocol.group_path("g"))
        deleted = [r for r in caplog.records if "was deleted" in r.getMessage()]
        assert len(deleted) == 1 and deleted[0].levelno == logging.INFO, [r.getMessage() for r in deleted]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], \
            [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    finally:
        cluster.close()


def test_a_session_lost_while_a_node_starts_leading_groups_is_survived(cluster, zk, monkeypatch, caplog):
    """The node's session expires (for real) in the middle of its start: it says so in one line,
    starts again on its new session, and leads the group (it used to stop leading groups for good)."""
    TopicRegistry(zk).create("t", 2)
    real = TopicRegistry.all_partitions
    expired = []

    def all_partitions(registry):
        if not expired:  # the first read of the node's start: its session ends under it
            expired.append(True)
            expire_session(registry.client, cluster.connect)
        return real(registry)
    monkeypatch.setattr(TopicRegistry, "all_partitions", all_partitions)
    with caplog.at_level(logging.WARNING, logger="zkgroups.coordinator"):
        cluster.node("n")
        cluster.member("g", ["t"])
        wait_stable(zk, "g", 1, timeout=30)
    assert expired
    assert any("cannot start leading groups yet (SessionExpiredError)" in r.getMessage() for r in caplog.records)
