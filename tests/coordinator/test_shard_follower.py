"""A node's shard follower (:mod:`coordinator.shard_follower`), the event thread of its groups:
a shard taken over rebalances what changed during the handover, a group deleted and made
again is watched again, a session lost while the node starts leading groups is survived.
Real ZooKeeper and coordinator nodes in this process."""
from __future__ import annotations

import logging

from kazoo.exceptions import NotEmptyError

from coordinator import protocol, read
from coordinator.topics import TopicRegistry
from tests.support.groups import expire_session, read_state, wait_stable
from tests.support.helpers import wait_for


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
