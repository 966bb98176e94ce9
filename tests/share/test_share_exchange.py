"""A share member's one write per partition (:mod:`consumer.share_exchange`): here its dead
letters, appended to the group's dead-letter topic with the original's topic, partition, offset,
delivery count and reason in headers. A ShareConsumer on a real ZooKeeper and the embedded log
(the state's rules alone: ``tests/unit/test_share_partition.py``)."""
from __future__ import annotations

import pytest

from consumer import AcknowledgeType, TopicPartition
from coordinator.protocol.share import share_members_path
from tests.share.conftest import configure, drain, state
from tests.support.helpers import fill, wait_for

pytestmark = pytest.mark.zk


def test_past_the_delivery_limit_a_record_goes_to_the_dead_letter_topic(zk, make, data_dir):
    from consumer.log import Log
    fill(data_dir, "t", [1], zk=zk)
    fill(data_dir, "t.dlq", [0], zk=zk)
    configure(zk, share_auto_offset_reset="earliest", share_delivery_count_limit=2,
              errors_deadletterqueue_topic_name="t.dlq")
    c = make(share_acknowledgement_mode="explicit")
    for n in (1, 2):
        (r,) = drain(c, 1)
        assert r.delivery_count == n
        c.acknowledge(r, AcknowledgeType.RELEASE)
        c.commit_sync()
    wait_for(lambda: c.poll(50) == [] and state(zk).start == 1, 10, message="the letter written")
    with Log(data_dir) as log:
        (letter,) = log.fetch("t.dlq", 0, 0, 10)
    headers = dict(letter.headers)
    assert letter.value == b"t-0-0"
    assert headers["zkgroups.dlq.reason"] == b"delivery-limit" and headers["zkgroups.dlq.delivery.count"] == b"2"


def test_a_member_whose_registration_is_gone_writes_nothing_until_it_registered_again(zk, make, data_dir):
    """Its write checks its registration in the same transaction: with the registration gone (a
    session ended and replaced, or removed by hand) the write changes nothing, the member
    registers again and then writes; nothing is acquired while it is not registered."""
    fill(data_dir, "t", [4], zk=zk)
    configure(zk, share_auto_offset_reset="earliest")
    c = make(share_acknowledgement_mode="explicit", max_poll_records=1)
    (first,) = drain(c, 1)
    registration = share_members_path("q", c.member_id)
    before = state(zk)
    zk.delete(registration)
    assert c._exchange.exchange(TopicPartition("t", 0), {}, 1).written is False
    assert c._exchange.unregistered and state(zk).ranges == before.ranges and not zk.exists(registration)
    c.acknowledge(first)
    (second,) = drain(c, 1)   # registered again, then acknowledged and acquired
    assert zk.exists(registration) and not c._exchange.unregistered
    assert second.offset != first.offset
    assert c.commit_sync() == {TopicPartition("t", 0): None}


def test_a_write_zookeeper_refuses_raises_its_answer_and_a_lost_race_does_not():
    """Past the registration check, a write refused (NoAuth, say) is ZooKeeper's answer raised,
    not a lost race retried; a version that moved on is a lost race."""
    from kazoo.exceptions import BadVersionError, NoAuthError, RolledBackError
    from coordinator.protocol.share import SharePartitionState
    from consumer.share_exchange import ShareExchange

    class Transaction:
        def __init__(self, answers):
            self.answers = answers

        def check(self, path, version):
            pass

        def set_data(self, path, value, version):
            pass

        def commit(self):
            return self.answers

    class Client:
        answers = None

        def transaction(self):
            return Transaction(self.answers)

    client = Client()
    exchange = ShareExchange(client, None, "q", "m", lambda: None)
    tp, state = TopicPartition("t", 0), SharePartitionState(start=0)
    client.answers = [RolledBackError(), BadVersionError()]
    assert exchange._set(tp, "/p", state, 3) is False and not exchange.unregistered
    client.answers = [True, NoAuthError()]
    with pytest.raises(NoAuthError):
        exchange._set(tp, "/p", state, 3)
