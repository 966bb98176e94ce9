"""A group member (:mod:`consumer.member`) as a whole: a session that expires is followed by a
new registration and the partitions back; a member with no coordinator running says so once.
Its parts have files of their own (``test_claims.py``, ``test_channel.py``, ``test_offsets.py``,
``test_registration.py``, ``test_joining.py``, ``tests/unit/test_lease.py``). Real ZooKeeper."""
from __future__ import annotations

import time

from consumer import Consumer
from coordinator import protocol
from coordinator.topics import TopicRegistry
from tests.support.groups import expire_session, wait_stable
from tests.support.helpers import wait_for


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


def test_a_member_says_once_when_no_coordinator_is_running(zk_connect, data_dir, caplog, monkeypatch):
    from consumer import member
    monkeypatch.setattr(member, "NO_COORDINATOR_WARNING_S", 0.2)
    monkeypatch.setattr(member, "HOUSEKEEPING_S", 0.1)
    with Consumer("lonely", ["t"], zk=zk_connect, data_dir=data_dir):
        wait_for(lambda: [r for r in caplog.records if "no coordinator is running for group lonely" in r.getMessage()],
                 message="the warning")
        time.sleep(0.5)  # several more housekeeping rounds: the warning is not repeated
    assert len([r for r in caplog.records if "no coordinator is running" in r.getMessage()]) == 1


def test_a_member_waiting_under_a_running_leader_looks_for_it_once(zk, monkeypatch):
    """10,000 members waiting for their first assignment asked for the leader every second."""
    from consumer import member
    monkeypatch.setattr(member, "NO_COORDINATOR_WARNING_S", 0.1)
    monkeypatch.setattr(member, "HOUSEKEEPING_S", 0.05)
    zk.create(protocol.LEADER, b"", makepath=True)  # a leader that never assigns
    asked = []
    exists = zk.exists
    monkeypatch.setattr(zk, "exists", lambda path, *a, **kw: (asked.append(path), exists(path, *a, **kw))[1])
    m = member.GroupMember(zk, "waiting", {"t": 1}, listener=member.MemberListener()).start()
    try:
        wait_for(lambda: protocol.LEADER in asked, message="the leader looked for")
        time.sleep(0.5)  # ten more housekeeping rounds without an assignment
        assert asked.count(protocol.LEADER) == 1
    finally:
        m.close()
