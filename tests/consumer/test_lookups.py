"""A consumer's lookups outside the group (consumer/lookups.py): where partitions begin and end,
the offset for a time with its record's timestamp, the registered topics and partitions."""
import pytest

from consumer import Consumer, OffsetAndTimestamp, TopicPartition
from tests.support.helpers import fill

pytestmark = pytest.mark.zk


def test_lookups_answer_for_partitions_the_consumer_does_not_own(zk, zk_connect, data_dir):
    fill(data_dir, "t", [5, 3], zk=zk, ts=lambda o: 1000 + 10 * o)
    p0, p1 = TopicPartition("t", 0), TopicPartition("t", 1)
    with Consumer("g", ["t"], zk=zk_connect, data_dir=data_dir, session_timeout_ms=2000) as c:
        assert c.beginning_offsets([p0, p1]) == {p0: 0, p1: 0}
        assert c.end_offsets([p0, p1]) == {p0: 5, p1: 3}
        assert c.offsets_for_times({p0: 1015, p1: 9999}) == {p0: OffsetAndTimestamp(2, 1020), p1: None}
        assert "t" in c.topics() and c.partitions_for_topic("t") == {0, 1} and c.partitions_for_topic("nope") == set()
