"""The ShareConsumer (:mod:`consumer.share`) against a real ZooKeeper and the embedded log:
members share every partition, acknowledgements in ranges, refusals, the delivery limit. Dead
letters: ``test_share_exchange.py``."""
from __future__ import annotations

import pytest

from consumer import AcknowledgeType
from coordinator.errors import IllegalStateError, InvalidConfig
from tests.share.conftest import configure, drain, state
from tests.support.helpers import fill, wait_for

pytestmark = pytest.mark.zk


def test_two_members_share_one_partition_and_every_record_is_accepted_once(zk, make, data_dir):
    fill(data_dir, "t", [100], zk=zk)
    configure(zk, share_auto_offset_reset="earliest")
    a, b = make(max_poll_records=10), make(max_poll_records=10)
    seen = []
    wait_for(lambda: seen.extend(a.poll(50)) or seen.extend(b.poll(50)) or len(seen) >= 100, 20)
    assert sorted(r.offset for r in seen) == list(range(100))
    assert {r.delivery_count for r in seen} == {1}
    a.commit_sync(), b.commit_sync()
    s = state(zk)
    assert (s.start, s.end, s.ranges) == (100, 100, [])


def test_latest_is_the_default_start(zk, make, data_dir):
    fill(data_dir, "t", [5], zk=zk)
    c = make()
    assert c.poll(200) == []
    fill(data_dir, "t", [5], zk=zk)
    assert [r.offset for r in drain(c, 5)] == [5, 6, 7, 8, 9]


def test_explicit_release_redelivers_and_reject_archives(zk, make, data_dir):
    fill(data_dir, "t", [3], zk=zk)
    configure(zk, share_auto_offset_reset="earliest")
    c = make(share_acknowledgement_mode="explicit")
    first = drain(c, 3)
    c.acknowledge(first[0], AcknowledgeType.ACCEPT)
    c.acknowledge(first[1], AcknowledgeType.RELEASE)
    c.acknowledge(first[2], AcknowledgeType.REJECT)
    assert c.commit_sync() == {("t", 0): None}
    again = drain(c, 1)
    assert [(r.offset, r.delivery_count) for r in again] == [(1, 2)]
    c.acknowledge(again[0])
    c.commit_sync()
    assert state(zk).start == 3


def test_explicit_poll_refuses_while_a_record_has_no_acknowledgement(zk, make, data_dir):
    fill(data_dir, "t", [2], zk=zk)
    configure(zk, share_auto_offset_reset="earliest")
    c = make(share_acknowledgement_mode="explicit")
    drain(c, 2)
    with pytest.raises(IllegalStateError, match="acknowledge them first"):
        c.poll(0)


def test_acknowledge_in_implicit_mode_and_bad_arguments_are_one_line(zk, make, data_dir):
    fill(data_dir, "t", [1], zk=zk)
    configure(zk, share_auto_offset_reset="earliest")
    c = make()
    (r,) = drain(c, 1)
    with pytest.raises(IllegalStateError):
        c.acknowledge(r)
    with pytest.raises(InvalidConfig):
        make(share_acknowledgement_mode="sometimes")
    with pytest.raises(InvalidConfig):
        make(max_poll_records=0)


def test_the_read_view_shows_members_partitions_and_what_is_in_flight(zk, make, data_dir):
    from coordinator import read
    from coordinator.documents import share_group_document
    fill(data_dir, "t", [4], zk=zk)
    configure(zk, share_auto_offset_reset="earliest")
    c = make(share_acknowledgement_mode="explicit", max_poll_records=3)
    drain(c, 3)
    doc = share_group_document(read.share_group(zk, "q"), {("t", 0): 4})
    (member,) = doc["members"]
    assert member["member_id"] == c.member_id and member["records_held"] == 3
    (row,) = doc["partitions"]
    assert (row["start_offset"], row["end_offset"], row["lag"], row["acquired"]) == (0, 3, 4, 3)
    assert read.share_group(zk, "nope") is None
