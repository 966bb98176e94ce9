"""Committed offsets (:mod:`consumer.offsets`): a member's fenced commits (each partition's token,
the refused ones named, the others written) and the reader of offsets znodes. Real ZooKeeper,
the leader played by hand; then the pure parts (refusals, the fence's decisions) against a
fake client."""
from __future__ import annotations

import threading

import pytest

from consumer import TopicPartition
from consumer.member import GroupMember
from consumer.offsets import (CLAIMED_SINCE, HOLD_LOST, NOT_OWNED, REFUSALS_NAMED, SESSION_ENDED, Holdings,
                              refusal)
from coordinator import protocol
from coordinator.errors import CommitFailedError, ZooKeeperUnavailable
from coordinator.zkclient import close_client, start_client
from tests.support.helpers import wait_for
from tests.support.members import ActingLeader, Keeper, claim_as_another_member, committed


def test_a_commit_writes_the_partitions_still_owned_and_names_the_refused_ones(zk, zk_connect):
    """m owns t-0 and t-1; t-1 moves to another member (m's owner node deleted under it, the
    other claims it). A commit of t-0, t-1 and t-2 (never m's) writes t-0 and then raises
    CommitFailedError naming t-1 and t-2; t-1 keeps the new owner's offset. Before, the one
    refused partition kept the whole commit from being written (bin/chaos: a partition's
    progress was never committed because another one of the same commit was refused)."""
    client, other = start_client(zk_connect, 4000), start_client(zk_connect, 4000)
    t0, t1, t2 = (TopicPartition("t", p) for p in range(3))
    try:
        leader = ActingLeader(zk, "g")
        member = GroupMember(client, "g", {"t": 1}, consumer_id="m", listener=Keeper()).start()
        leader.assign({"m": [0, 1]})
        # The ack goes with the claim's transaction; the member records what it holds just after.
        wait_for(lambda: leader.acked("m") and {t0, t1} <= set(member.owned()), message="m claimed its partitions")
        member.commit({t0: 5, t1: 5})
        zk.delete(protocol.owners_path("g", "t", 1))
        claim_as_another_member(other, "g", t1)

        with pytest.raises(CommitFailedError) as refused:
            member.commit({t0: 10, t1: 20, t2: 30})
        assert committed(zk, tp=t0) == b"10" and committed(zk, tp=t1) == b"5"
        assert refused.value.partitions == {t1, t2}
        assert "t-1 was claimed by another member" in str(refused.value)
        assert "t-2 is not owned by this member" in str(refused.value)
        member.close()
    finally:
        close_client(client)
        close_client(other)


# ---------------------------------------------------------------- the pure parts, no server

class Client:
    """A kazoo client as the fence sees it: its session id while connected (None: not)."""

    def __init__(self, session=None):
        self.client_id = (session, b"") if session is not None else None


def holdings(session=7, connected=True):
    flag = threading.Event()
    if connected:
        flag.set()
    return Holdings(Client(session), "g", "m", 1.0, flag)


def test_a_refusal_names_each_partition_with_its_reason_and_counts_the_others_written():
    t = [TopicPartition("t", p) for p in range(REFUSALS_NAMED + 3)]
    one = refusal({t[0]: CLAIMED_SINCE, t[1]: NOT_OWNED}, written=1)
    assert str(one) == ("commit refused: t-1 is not owned by this member; t-0 was claimed by another member after "
                        "this one (1 other partition committed)")
    assert one.partitions == {t[0], t[1]}
    many = refusal({tp: SESSION_ENDED for tp in t})
    assert str(many).endswith("t-9 and 3 more were owned by a ZooKeeper session that ended")
    assert str(many).count("t-") == REFUSALS_NAMED


def test_the_fence_writes_each_held_partition_at_its_token_and_refuses_the_others_by_name():
    h = holdings()
    t0, t1, t2 = (TopicPartition("t", p) for p in range(3))
    with h.lock:
        h.session = 7
        h.add_locked({t0: "m-0", t1: "m-0"}, {t0: 4, t1: 9})
    h.tokens.pop(t1)  # its token was found taken over
    writes, refused = h.fenced_offsets({t0: 10, t1: 11, t2: 12})
    assert writes == [(t0, protocol.encode_offset(10), 4)]
    assert refused == {t1: HOLD_LOST, t2: NOT_OWNED}
    h.written(writes)
    assert h.tokens_of({t0, t1}) == {t0: 5}  # the next write goes at the version this one left


def test_nothing_is_written_off_line_or_from_a_session_that_is_not_the_owners():
    tp = TopicPartition("t", 0)
    for h in (holdings(session=None), holdings(connected=False)):
        with pytest.raises(ZooKeeperUnavailable, match="not connected"):
            h.fenced_offsets({tp: 1})
    h = holdings(session=8)  # a new session: the partitions were owned by session 7
    with h.lock:
        h.session = 7
        h.add_locked({tp: "m-0"}, {tp: 2})
    assert h.fenced_offsets({tp: 1}) == ([], {tp: SESSION_ENDED})
    assert h.fenced_offsets({}) == ([], {})
