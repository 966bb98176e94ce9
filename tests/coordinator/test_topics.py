import pytest

from coordinator.errors import CorruptZnode, InvalidName, InvalidPartitions, TopicExists, UnknownTopic
from coordinator.topics import TopicRegistry


def test_topic_znode_is_kafka_format(zk):
    reg = TopicRegistry(zk)
    reg.create("orders", 3)
    raw, _ = zk.get("/brokers/topics/orders")
    assert raw == b'{"partitions":{"0":[0],"1":[0],"2":[0]},"version":1}'
    assert reg.partitions("orders") == 3
    assert reg.list() == ["orders"]


def test_add_partitions_grows_and_never_shrinks(zk):
    reg = TopicRegistry(zk)
    reg.create("t", 2)
    reg.add_partitions("t", 5)
    assert reg.partitions("t") == 5
    with pytest.raises(InvalidPartitions, match="cannot be removed"):
        reg.add_partitions("t", 3)
    with pytest.raises(UnknownTopic):
        reg.add_partitions("nope", 3)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "bad name", "x" * 250, "é"])
def test_invalid_topic_names_rejected(zk, name):
    with pytest.raises(InvalidName):
        TopicRegistry(zk).create(name, 1)


@pytest.mark.parametrize("count", [0, -1, 1.5, True])
def test_invalid_partition_counts_rejected(zk, count):
    with pytest.raises(InvalidPartitions):
        TopicRegistry(zk).create("t", count)


def test_duplicate_topic_rejected(zk):
    reg = TopicRegistry(zk)
    reg.create("t", 1)
    with pytest.raises(TopicExists):
        reg.create("t", 1)


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"version":1}', b'{"partitions":{"0":[0],"2":[0]}}',
                                 b'{"partitions":{"x":[0]}}', b"\xff\xfe"])
def test_corrupt_topic_znode_is_a_clear_error_and_others_still_work(zk, raw):
    reg = TopicRegistry(zk)
    reg.create("good", 2)
    zk.create("/brokers/topics/bad", raw)
    with pytest.raises(CorruptZnode, match="/brokers/topics/bad"):
        reg.partitions("bad")
    assert reg.all_partitions() == {"good": 2}
