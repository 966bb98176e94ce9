"""How a member claims and releases partitions (:mod:`consumer.claims`): the reads a claim
makes, its transactions and fencing tokens, owner nodes of its own session adopted, a claim
superseded by a newer command, releases in parts, partitions the listener cannot serve. Real
ZooKeeper, the leader played by hand (:class:`~tests.support.members.ActingLeader`); the last
tests against a fake client (no server)."""
from __future__ import annotations

import logging
import threading

import pytest
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from consumer import TopicPartition
from consumer.claims import Claims, _children
from consumer.lease import Lease
from consumer.member import GroupMember
from consumer.offsets import COMMIT_PARTITIONS, Holdings
from consumer.ownership import CLAIM_PARTITIONS
from coordinator import protocol
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from tests.support.consumers import consume_until
from tests.support.groups import Cluster, Recorder, read_state, wait_stable
from tests.support.helpers import fill, wait_for
from tests.support.members import TP, ActingLeader, Keeper, Sent, committed, consumers  # noqa: F401 (a fixture)


def test_a_claim_reads_only_offsets_znodes_that_exist_and_fences_every_partition(zk, zk_connect):
    """Member m gets partitions 0-249 of t. 0 has an offsets znode m saw when it joined, 1 one
    made after that (as another member's claim or a reader's commit makes one), the others
    none (new: the topic grew). The claim reads those two and no other offsets znode, and
    claims in transactions of at most CLAIM_PARTITIONS partitions, the ack in the last; the
    others are sent together, the last only once their answers were read. Every
    partition's offsets znode was then written by the claim: a write at a version from before
    it is refused, and m commits through its own tokens."""
    zk.create(protocol.offsets_path("g", "t", 0), b"7", makepath=True)
    client = start_client(zk_connect, session_timeout_ms=10000)  # 250 partitions on a loaded machine
    try:
        leader = ActingLeader(zk, "g")
        keeper = Keeper()
        member = GroupMember(client, "g", {"t": 1}, consumer_id="m", listener=keeper).start()
        zk.create(protocol.offsets_path("g", "t", 1), b"5")
        sent = Sent(client)
        leader.assign({"m": list(range(250))})
        wait_for(lambda: leader.acked("m"), message="m claimed its partitions")
        # the listener hears of a claim once its last transaction (the one with the ack) is done
        wait_for(lambda: len(keeper.committed) == 250, message="m handed its partitions to the listener")

        offsets = protocol.offsets_path("g", "t")
        assert sorted(p for p in sent.reads if p.startswith(offsets + "/")) == [f"{offsets}/0", f"{offsets}/1"]
        owners = protocol.owners_path("g", "t")
        assert sent.counts("Create", owners) == [CLAIM_PARTITIONS, CLAIM_PARTITIONS, 250 - 2 * CLAIM_PARTITIONS]
        claims = sent.with_ops_under(owners)
        assert sent.with_ops_under(protocol.channel_path("g", "m")) == [claims[-1]]  # the ack, with the last
        first, second, last = claims
        # the first two pipelined (one round trip), the last sent once their answers were read
        assert [e for e in sent.events if e[1] in claims] == [
            ("commit", first), ("commit", second), ("answer", first), ("answer", second),
            ("commit", last), ("answer", last)]
        assert keeper.committed[TopicPartition("t", 0)] == 7 and keeper.committed[TopicPartition("t", 1)] == 5
        assert all(keeper.committed[TopicPartition("t", p)] is None for p in range(2, 250))

        for p in (0, 1):  # rewritten by the claim (same data, next version): an older token is refused
            assert zk.get(protocol.offsets_path("g", "t", p))[1].version == 1
            with pytest.raises(BadVersionError):
                zk.set(protocol.offsets_path("g", "t", p), b"99", version=0)
        with pytest.raises(NodeExistsError):  # created by the claim: no one else creates it now
            zk.create(protocol.offsets_path("g", "t", 2), b"99")
        member.commit({TopicPartition("t", p): 40 + p for p in (0, 1, 2)})
        assert [zk.get(protocol.offsets_path("g", "t", p))[0] for p in (0, 1, 2)] == [b"40", b"41", b"42"]
        member.close()
    finally:
        close_client(client)


def test_a_claim_transaction_that_fails_among_pipelined_ones_holds_back_only_the_ack(zk, zk_connect):
    """m gets 350 partitions: four claim transactions, the first three pipelined. Just as the
    second is sent another session takes an owner node of one of its partitions, so it fails.
    The first and the third apply and are m's; the ack is held back. m claims the rest of the
    second at once, waits for the one taken, and claims it and acks once it is released."""
    client = start_client(zk_connect, session_timeout_ms=10000)
    try:
        leader = ActingLeader(zk, "g")
        member = GroupMember(client, "g", {"t": 1}, consumer_id="m", listener=Keeper()).start()
        taken = protocol.owners_path("g", "t", 150)
        once = []

        def taking(operations):
            if any(op.path.endswith(taken) for op in operations) and not once:
                once.append(zk.create(taken, b"other", ephemeral=True))
        Sent(client, before_commit=taking)
        leader.assign({"m": list(range(350))})
        mine = set(range(350)) - {150}
        wait_for(lambda: {tp.partition for tp in member.owned()} == mine, message="m claimed all but the one taken")
        assert not leader.acked("m")
        zk.delete(taken)
        wait_for(lambda: leader.acked("m"), message="m claimed the last and acked")
        assert {tp.partition for tp in member.owned()} == mine | {150}
        assert zk.exists(taken).ephemeralOwner == client.client_id[0]
        member.close()
    finally:
        close_client(client)


def test_an_owner_node_whose_claim_answer_was_lost_is_adopted_and_commits(zk, data_dir, consumers):
    """A claim transaction applied but its answer never came back (a connection error): the
    member finds its own session's owner node, adopts it with the token that claim wrote, and
    its commits go through."""
    fill(data_dir, "t", [50] * 1, zk=zk)
    leader = ActingLeader(zk, "g")
    a = consumers()
    stream = f"{a.consumer_id}-0"
    t = a._client.transaction()  # what a's lost claim wrote, on a's own session
    a._client.ensure_path(protocol.owners_path("g", "t"))
    a._client.ensure_path(protocol.offsets_path("g", "t"))
    t.create(protocol.owners_path("g", "t", 0), stream.encode(), ephemeral=True)
    t.create(protocol.offsets_path("g", "t", 0), protocol.NO_OFFSET)
    t.commit()
    leader.assign({a.consumer_id: [0]})
    assert len(consume_until(a, 50)) == 50
    a.commit()
    assert committed(zk) == b"50"


def test_partitions_claimed_before_a_newer_command_are_handed_to_the_listener(zk, zk_connect):
    """m is given t-0 and t-1 while another session holds t-1: it claims t-0 and waits for t-1.
    A newer command then gives it t-0 alone. m keeps t-0, and its listener is told of it: a
    partition owned and never handed over would never be fetched (found by bin/chaos)."""
    holder, client = start_client(zk_connect, 4000), start_client(zk_connect, 4000)
    try:
        leader = ActingLeader(zk, "g")
        recorder = Recorder()
        member = GroupMember(client, "g", {"t": 1}, consumer_id="m", listener=recorder).start()
        holder.create(protocol.owners_path("g", "t", 1), b"other", ephemeral=True, makepath=True)
        leader.assign({"m": [0, 1]})

        def owner_of_t0():
            stat = zk.exists(protocol.owners_path("g", "t", 0))
            return stat and stat.ephemeralOwner
        wait_for(lambda: owner_of_t0() == client.client_id[0], message="m claimed t-0")
        leader.assign({"m": [0]})
        wait_for(lambda: leader.acked("m"), message="m applied the newer command")
        wait_for(lambda: recorder.owned == {TP}, message="the listener was told of t-0")
        assert set(member.owned()) == {TP}
        member.close()
    finally:
        close_client(client)
        close_client(holder)


def test_commits_and_releases_of_many_partitions_go_in_parts(zk, zk_connect):
    """m owns 250 partitions. A commit of all their offsets is written in transactions of at
    most COMMIT_PARTITIONS; revoking all of them (their offsets written, their owner nodes
    deleted) in transactions of at most CLAIM_PARTITIONS, the ack in the last. Every offset
    lands and every owner node goes."""
    client = start_client(zk_connect, session_timeout_ms=10000)  # 250 partitions on a loaded machine
    try:
        leader = ActingLeader(zk, "g")
        keeper = Keeper()
        member = GroupMember(client, "g", {"t": 1}, consumer_id="m", listener=keeper).start()
        leader.assign({"m": list(range(250))})
        wait_for(lambda: leader.acked("m"), message="m claimed its partitions")
        wait_for(lambda: len(keeper.committed) == 250, message="m handed its partitions to the listener")
        sent = Sent(client)
        member.commit({TopicPartition("t", p): p for p in range(250)})
        offsets, owners = protocol.offsets_path("g", "t"), protocol.owners_path("g", "t")
        assert sent.counts("SetData", offsets) == [COMMIT_PARTITIONS, 250 - COMMIT_PARTITIONS]
        assert all(zk.get(protocol.offsets_path("g", "t", p))[0] == str(p).encode() for p in range(250))

        sent.transactions.clear()
        leader.assign({"m": []})
        wait_for(lambda: leader.acked("m"), message="m released its partitions")
        assert sent.counts("Delete", owners) == [CLAIM_PARTITIONS, CLAIM_PARTITIONS, 250 - 2 * CLAIM_PARTITIONS]
        releases = sent.with_ops_under(owners)
        assert sent.with_ops_under(protocol.channel_path("g", "m")) == [releases[-1]]
        assert zk.get_children(owners) == []
        assert all(zk.get(protocol.offsets_path("g", "t", p))[0] == str(1000 + p).encode() for p in range(250))
        member.close()
    finally:
        close_client(client)


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



# ---------------------------------------------------------------- against a fake client, no server

class Silent:
    """A client that must not be used: any ZooKeeper call fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"a ZooKeeper call ({name}) where none is needed")


def claims_of(owned):
    holdings = Holdings(Silent(), "g", "m", 1.0, threading.Event())
    with holdings.lock:
        holdings.add_locked({tp: "m-0" for tp in owned}, {tp: 0 for tp in owned})
    return Claims(Silent(), "g", "m", holdings, Lease(Silent(), "/ids/m", holdings, 1.0), 1.0)


def test_a_partition_refused_by_the_listener_and_revoked_since_is_not_released_again(caplog):
    """t-0 cannot be served; before its release went through it was revoked (released with the
    others): nothing is sent for it, and it is no longer pending."""
    claims = claims_of(owned=[])
    with caplog.at_level(logging.INFO, logger="zkgroups.member"):
        claims.release_unserved({TP}, why="permission denied")
    assert claims.unserved == set()
    line = next(r.getMessage() for r in caplog.records if "which it cannot serve" in r.getMessage())
    assert "releasing t-0" in line and "(permission denied)" in line and "assigns it again at its next check" in line


def test_nothing_is_pending_release_with_no_partition_refused():
    claims = claims_of(owned=[TP])
    claims.release_unserved()  # a retry with nothing pending: no ZooKeeper call
    assert claims.unserved == set()


def test_a_listing_of_a_directory_gone_is_empty():
    class Gone:
        def get(self):
            raise NoNodeError()
    assert _children(Gone()) == []
