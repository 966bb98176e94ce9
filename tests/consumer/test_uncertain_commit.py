"""A commit whose answer never came (the write may or may not have applied) is checked at the
next commit; when that check gets no answer either, the commit fails as ZooKeeper being
unreachable, never with kazoo's bare ConnectionLoss (``groupctl consume`` waits out the one and
exited on the other: found by ``bin/chaos`` under connections that kept dropping).

The ZooKeeper server of this test's own is frozen (SIGSTOP) while a request is out: its
answer never comes and the client drops the connection after its read timeout, as a network
cut that drops the answers does.
"""
from __future__ import annotations

import os
import signal

import pytest
from kazoo.exceptions import ConnectionLoss

import consumer.offsets as offsets_module
from consumer import Consumer, TopicPartition
from consumer.member import GroupMember
from coordinator import protocol
from coordinator.errors import CommitFailedError, ZooKeeperUnavailable
from coordinator.testing.zkserver import Ensemble, local_classpath
from coordinator.zkclient import close_client, start_client
from tests.support.consumers import consume_until
from tests.support.helpers import fill, stopped, wait_for
from tests.support.members import ActingLeader, claim_as_another_member, committed

pytestmark = [pytest.mark.zk, pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")]

TP = TopicPartition("t", 0)
SESSION_MS = 6000  # the read timeout (2/3 of it) ends each frozen request; the session outlives the freeze


def test_a_commit_checking_an_unanswered_write_without_an_answer_is_zookeeper_unavailable(tmp_path):
    with Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk")) as ensemble:
        server = ensemble.servers[0].proc
        zk = start_client(ensemble.connect, 20000)
        data_dir = str(tmp_path / "data")
        fill(data_dir, "t", [50], zk=zk)
        leader = ActingLeader(zk, "g")
        a = Consumer("g", ["t"], zk=ensemble.connect, data_dir=data_dir, auto_offset_reset="earliest",
                     session_timeout_ms=SESSION_MS)
        try:
            leader.assign({a.consumer_id: [0]})
            assert len(consume_until(a, 50)) == 50
            a.commit({TP: 10})

            for offset in (20, 30):  # 20: the write gets no answer; 30: nor does the check of 20
                os.kill(server.pid, signal.SIGSTOP)
                wait_for(lambda: stopped(server.pid), message="the server stopped")  # every thread, not just signalled
                try:
                    with pytest.raises(ZooKeeperUnavailable):
                        a.commit({TP: offset})
                finally:
                    os.kill(server.pid, signal.SIGCONT)
                wait_for(lambda: a._client.connected, timeout=SESSION_MS / 1000, message="the member reconnects")

            a.commit({TP: 40})  # the check is answered now: whether 20 applied or not, 40 goes through
            assert committed(zk) == b"40"
        finally:
            a.close()
            close_client(zk)


# ---------------------------------------------------------------- checking an unanswered write

def lose_next_answer(monkeypatch, applied: bool) -> None:
    """The member's next transaction ends as one whose answer never came: sent and applied
    (``applied``), or lost on the way; either way the member sees a ConnectionLoss."""
    real = offsets_module.commit

    def lost(transaction, timeout=None):
        monkeypatch.setattr(offsets_module, "commit", real)
        if applied:
            real(transaction, timeout)
        raise ConnectionLoss()
    monkeypatch.setattr(offsets_module, "commit", lost)


def read_as_a_server_behind(monkeypatch, client, path: str) -> None:
    """From now on ``client`` reads ``path`` as a server that has not applied the writes made
    from now on answers (the answer ZooKeeper gives now), until it sends a sync: ZooKeeper
    guarantees that a read after a sync sees every write committed before the sync. A session
    reconnected after a lost answer may land on such a server: it is only as new as what the
    session saw."""
    stale = client.get_async(path)
    stale.get()
    get_async, sync_async = client.get_async, client.sync_async
    synced = []

    def get(p, *args, **kwargs):
        return stale if p == path and not synced else get_async(p, *args, **kwargs)

    def sync(p):
        synced.append(p)
        return sync_async(p)
    monkeypatch.setattr(client, "get_async", get)
    monkeypatch.setattr(client, "sync_async", sync)


@pytest.fixture
def member(zk, zk_connect):
    """Member m of group g, owning t-0 (committed: 5)."""
    client = start_client(zk_connect, 4000)
    leader = ActingLeader(zk, "g")
    m = GroupMember(client, "g", {"t": 1}, consumer_id="m").start()
    leader.assign({"m": [0]})
    # The ack goes with the claim's transaction; the member records what it holds just after.
    wait_for(lambda: leader.acked("m") and TP in m.owned(), message="m claimed t-0")
    m.commit({TP: 5})
    yield m
    m.close()
    close_client(client)


def test_a_write_whose_answer_was_lost_is_found_applied_by_a_server_behind_it(zk, member, monkeypatch):
    """m's commit of 10 applies, but its answer is lost (ZooKeeper lost its quorum), and m's
    session then reads from a server that has not applied that write yet. m's next commit
    still goes through: its check of the lost write reads after a sync. Before, m took the
    write for not applied, kept a token one version behind, and every commit of t-0 after it
    was refused as claimed by another member (seen in bin/chaos, seed 812)."""
    read_as_a_server_behind(monkeypatch, member.client, protocol.offsets_path("g", "t", 0))
    lose_next_answer(monkeypatch, applied=True)
    with pytest.raises(ZooKeeperUnavailable):
        member.commit({TP: 10})
    assert committed(zk) == b"10"
    member.commit({TP: 20})
    assert committed(zk) == b"20"


def test_a_lost_write_is_not_taken_for_applied_after_another_member_claimed_the_partition(
        zk, zk_connect, member, monkeypatch):
    """m commits 5 again, and that write is lost on the way. Meanwhile t-0 moves: m's owner
    node is deleted under it and another member claims t-0, which rewrites the offsets znode
    with the same data one version on. m's check of its lost write must not take that for
    its own: its next commit is refused, naming t-0, and the new owner's offset stands.
    Before, the same data at the next version passed for m's write, and m's commit landed
    under the new owner."""
    lose_next_answer(monkeypatch, applied=False)
    with pytest.raises(ZooKeeperUnavailable):
        member.commit({TP: 5})
    zk.delete(protocol.owners_path("g", "t", 0))
    other = start_client(zk_connect, 4000)
    try:
        claim_as_another_member(other, "g", TP)
        with pytest.raises(CommitFailedError, match="t-0 is no longer held by this member"):
            member.commit({TP: 20})
        assert committed(zk) == b"5"
        assert zk.exists(protocol.owners_path("g", "t", 0)).ephemeralOwner == other.client_id[0]
    finally:
        close_client(other)
