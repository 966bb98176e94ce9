"""The share groups' znode schemas (:mod:`coordinator.protocol.share`): a share-partition state
no writer makes is refused in one line; a group's settings take Kafka's names and refuse bad
values in one line. Pure: no server."""
import pytest

from coordinator.errors import CorruptZnode, InvalidConfig
from coordinator.protocol.share import ShareGroupConfig, SharePartitionState, parse_setting


@pytest.mark.parametrize("raw", [
    b'{"version":1,"start":5,"end":4,"next_token":1,"dlq_scan":-1,"ranges":[],"held":{}}',
    b'{"version":1,"start":0,"end":2,"next_token":1,"dlq_scan":-1,"ranges":[[0,0,"av",1,0,0]],"held":{}}',
    b'{"version":1,"start":0,"end":1,"next_token":2,"dlq_scan":-1,"ranges":[[0,0,"aq",1,1,0]],"held":{}}',
    b'{"version":1,"start":0,"end":1,"next_token":2,"dlq_scan":-1,"ranges":[[0,0,"zz",1,0,0]],"held":{}}',
    b'{"version":1,"start":0,"end":0,"next_token":2,"dlq_scan":-1,"ranges":[],"held":{"9":["m",0]}}',
    b'{"version":1,"start":0,"end":99999,"next_token":1,"dlq_scan":-1,"ranges":[],"held":{}}',
    b'[1]', b'\xff',
])
def test_a_state_no_writer_makes_is_refused_in_one_line(raw):
    with pytest.raises(CorruptZnode):
        SharePartitionState.decode(raw, "/p")


def test_settings_take_kafkas_names_and_refuse_bad_values_in_one_line():
    config = ShareGroupConfig().with_settings({"share.delivery.count.limit": "7",
                                               "errors.deadletterqueue.topic.name": "orders.dlq"})
    assert config.delivery_count_limit == 7 and config.dead_letter_topic == "orders.dlq"
    assert ShareGroupConfig.decode(config.encode(), "/g") == config
    for key, value in [("share.delivery.count.limit", "11"), ("share.auto.offset.reset", "middle"),
                       ("share.record.lock.duration.ms", "soon"), ("nope", "1"),
                       ("errors.deadletterqueue.topic.name", "a b")]:
        with pytest.raises(InvalidConfig) as e:
            parse_setting(key, value)
        assert "\n" not in str(e.value)
