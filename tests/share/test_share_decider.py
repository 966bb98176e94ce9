"""The group coordinator decides a share group's time: locks that end, delays that end, members
that left — a real ZooKeeper and a real coordinator node; the members in this process or as
processes (SIGKILL, SIGSTOP past the lock)."""
from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest

from consumer import AcknowledgeType
from tests.share.conftest import configure, drain, state
from tests.support.helpers import fill, wait_for

pytestmark = pytest.mark.zk


@pytest.fixture(autouse=True)
def coordinator(cluster, zk):
    """One coordinator node: it leads every shard, so it decides the share groups' time. Beside
    the tests' group, a bare one (no members, no partitions yet) that must not get in its way."""
    from coordinator.protocol.share import share_group_path
    zk.ensure_path(share_group_path("bare"))
    cluster.node("n1")
    cluster.leader()


def test_a_lock_that_ends_refuses_the_late_acknowledgement_and_redelivers(zk, make, data_dir):
    fill(data_dir, "t", [3], zk=zk)
    configure(zk, share_auto_offset_reset="earliest", share_record_lock_duration_ms=1000)
    slow = make(share_acknowledgement_mode="explicit")
    got = drain(slow, 3)
    other = make()
    again = drain(other, 3, timeout=10)   # after the lock's second, on the coordinator's clock
    assert sorted((r.offset, r.delivery_count) for r in again) == [(0, 2), (1, 2), (2, 2)]
    for r in got:
        slow.acknowledge(r)
    results = slow.commit_sync()
    assert results[("t", 0)].offsets == [0, 1, 2]
    other.commit_sync()
    assert state(zk).start == 3


def test_renew_keeps_a_slow_record_from_redelivery(zk, make, data_dir):
    fill(data_dir, "t", [1], zk=zk)
    configure(zk, share_auto_offset_reset="earliest", share_record_lock_duration_ms=2000)
    slow = make(share_acknowledgement_mode="explicit")
    (record,) = drain(slow, 1)
    other = make()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:   # working for 2.5 lock durations, renewing ten times a lock
        slow.acknowledge(record, AcknowledgeType.RENEW)
        slow.commit_sync()
        assert other.poll(200) == []
    slow.acknowledge(record)
    assert slow.commit_sync() == {("t", 0): None}


def test_a_release_with_a_delay_is_not_redelivered_before_it(zk, make, data_dir):
    fill(data_dir, "t", [1], zk=zk)
    configure(zk, share_auto_offset_reset="earliest")
    c = make(share_acknowledgement_mode="explicit")
    (record,) = drain(c, 1)
    c.acknowledge(record, AcknowledgeType.RELEASE, delay_ms=1500)
    released = time.monotonic()
    c.commit_sync()
    (again,) = drain(c, 1, timeout=10)
    assert time.monotonic() - released >= 1.5 and again.delivery_count == 2


WORKER = textwrap.dedent("""
    import sys, time
    from consumer import ShareConsumer
    c = ShareConsumer("q", ["t"], zk=sys.argv[1], data_dir=sys.argv[2], session_timeout_ms=1000,
                      share_acknowledgement_mode="explicit")
    got = []
    while len(got) < 5:
        got += c.poll(100)
    print("held", len(got), flush=True)
    sys.stdin.readline()   # (killed, or paused and woken up here)
    for r in got:
        c.acknowledge(r)
    refused = c.commit_sync()[("t", 0)]
    print("refused", refused.offsets if refused else [], flush=True)
    c.close()
""")


@pytest.mark.parametrize("how", ["sigkill", "sigstop"])
def test_a_member_killed_or_paused_has_its_records_delivered_to_another(zk, make, data_dir, zk_connect, cluster,
                                                                         subprocess_env, how):
    fill(data_dir, "t", [5], zk=zk)
    configure(zk, share_auto_offset_reset="earliest", share_record_lock_duration_ms=2000)
    proc = cluster.spawn("-c", WORKER, zk_connect, data_dir, env=subprocess_env)
    assert proc.stdout.readline().strip() == "held 5"
    os.kill(proc.pid, signal.SIGKILL if how == "sigkill" else signal.SIGSTOP)
    killed = time.monotonic()
    other = make()
    again = drain(other, 5, timeout=15)
    took = time.monotonic() - killed
    assert sorted(r.offset for r in again) == [0, 1, 2, 3, 4] and {r.delivery_count for r in again} == {2}
    print(f"redelivered {took:.2f} s after the {how} (lock 2 s, session 1 s)")
    other.commit_sync()
    if how == "sigstop":   # its late acknowledgement is refused: the records were delivered again
        os.kill(proc.pid, signal.SIGCONT)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline().strip()
        assert line == "refused [0, 1, 2, 3, 4]", proc.stderr.read()[-2000:]
    assert state(zk).start == 5


def test_a_coordinator_that_fails_over_mid_flight_hands_the_clocks_to_the_next(zk, make, data_dir, cluster):
    """The node leading the group's shard goes away while a member holds records: the node that
    takes the shard over reads the state, starts the lock's clock afresh, and ends it — the records go to another member; the late acknowledgement of
    the first is refused."""
    from coordinator import read
    fill(data_dir, "t", [4], zk=zk)
    configure(zk, share_auto_offset_reset="earliest", share_record_lock_duration_ms=1500)
    cluster.node("n2")
    slow = make(share_acknowledgement_mode="explicit")
    held = drain(slow, 4)
    leader = wait_for(lambda: read.group_coordinator(zk, "q"), 10, message="a node leads the group")
    victim = next(n for n in cluster.nodes if n.node_id == leader)
    victim.close()
    survivor = wait_for(lambda: (read.group_coordinator(zk, "q") or leader) != leader
                        and read.group_coordinator(zk, "q"), 20, message="the other node leads the group")
    other = make()
    again = drain(other, 4, timeout=20)
    assert sorted((r.offset, r.delivery_count) for r in again) == [(0, 2), (1, 2), (2, 2), (3, 2)]
    for r in held:
        slow.acknowledge(r)
    assert slow.commit_sync()[("t", 0)].offsets == [0, 1, 2, 3]
    other.commit_sync()
    assert state(zk).start == 4 and survivor != leader


def test_a_share_group_of_a_bad_name_or_a_corrupt_partition_does_not_stop_the_others(zk, make, data_dir, caplog):
    from coordinator.protocol.share import SHARE_GROUPS, share_partitions_path
    zk.ensure_path(f"{SHARE_GROUPS}/bad name!")
    zk.ensure_path(share_partitions_path("broken", "t", 0))
    zk.set(share_partitions_path("broken", "t", 0), b"not json")
    fill(data_dir, "t", [2], zk=zk)
    configure(zk, share_auto_offset_reset="earliest", share_record_lock_duration_ms=1000)
    slow = make(share_acknowledgement_mode="explicit")
    drain(slow, 2)
    again = drain(make(), 2, timeout=10)   # the clocks of the good group ran
    assert {r.delivery_count for r in again} == {2}
    lines = [r.getMessage() for r in caplog.records if r.name == "zkgroups.coordinator" and r.levelname == "ERROR"]
    assert sum("broken" in line for line in lines) == 1 and sum("bad name" in line for line in lines) == 1


def test_a_member_whose_session_expires_loses_what_it_held_and_goes_on(zk, make, data_dir, zk_connect):
    """A true session expiry (another client closes the member's session): the coordinator
    releases its records to another member, its late acknowledgement is refused, it registers
    again and is given new records."""
    from tests.support.groups import expire_session
    fill(data_dir, "t", [4], zk=zk)
    configure(zk, share_auto_offset_reset="earliest")   # a 30 s lock: only the expiry can release them
    victim = make(share_acknowledgement_mode="explicit", max_poll_records=2)
    held = drain(victim, 2)
    expire_session(victim._client, zk_connect)
    other = make()
    again = drain(other, 4, timeout=15)
    assert sorted((r.offset, r.delivery_count) for r in again) == [(0, 2), (1, 2), (2, 1), (3, 1)]
    other.close()
    for r in held:
        victim.acknowledge(r)
    assert victim.commit_sync()[("t", 0)].offsets == [0, 1]
    fill(data_dir, "t", [2], zk=zk)
    assert sorted(r.offset for r in drain(victim, 2, timeout=15)) == [4, 5]   # registered again


def test_a_member_whose_session_expires_while_it_registers_joins_on_the_next_session(zk, data_dir, zk_connect):
    """The session ends (for real) just as the member sends its registration: the join waits
    for the client's next session and registers on it, as a consumer-group member's does,
    instead of failing the constructor with SessionExpiredError."""
    from consumer import ShareConsumer
    from coordinator.protocol.share import share_members_path
    from coordinator.zkclient import close_client, session_id, start_client
    from tests.support.groups import expire_session
    fill(data_dir, "t", [3], zk=zk)
    configure(zk, share_auto_offset_reset="earliest")
    client = start_client(zk_connect, 2000)
    create, expired = client.create, []

    def create_after_expiry(path, *args, **kwargs):
        if kwargs.get("ephemeral") and not expired:
            expired.append(session_id(client))
            expire_session(client, zk_connect)
        return create(path, *args, **kwargs)
    client.create = create_after_expiry
    try:
        with ShareConsumer("q", ["t"], zk=client, data_dir=data_dir) as member:
            assert expired, "the registration was never sent"
            _, stat = zk.get(share_members_path("q", member.member_id))
            assert stat.ephemeralOwner == session_id(client) != expired[0]
            assert sorted(r.offset for r in drain(member, 3, timeout=15)) == [0, 1, 2]
    finally:
        close_client(client)
