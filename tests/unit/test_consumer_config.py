"""The consumer's configuration (:mod:`consumer.config`): what it refuses, each in one line (a
kafka-python key with what to write instead), what it normalises (strategies given as a
list, an infinite ``consumer_timeout_ms``), and a Consumer's subscription. Pure: no server."""
import pytest

from consumer.config import build_consumer_config, subscription_of
from coordinator import protocol
from coordinator.errors import InvalidConfig


@pytest.mark.parametrize("values, message", [
    ({"auto_offset_reset": "smallest"}, "auto_offset_reset must be earliest, latest or none"),
    ({"start_position": "middle"}, "start_position must be one of committed, earliest, latest, timestamp"),
    ({"max_poll_records": 0}, "max_poll_records must be > 0"),
    ({"static_grace_ms": -1}, "static_grace_ms must not be negative"),
    ({"consumer_timeout_ms": -5}, "consumer_timeout_ms must be a number >= 0"),
    ({"value_deserializer": 3}, "value_deserializer must be callable"),
    ({"assignment_strategy": ("range", "bogus")}, "assignment_strategy: unknown strategy 'bogus'"),
    ({"assignment_strategy": ()}, "assignment_strategy must name at least one strategy"),
    ({"max_poll_record": 5}, "consumer config: unknown key 'max_poll_record' (did you mean 'max_poll_records'?)"),
    ({"group_id": "g"}, "consumer config: 'group_id' is not taken here"),
])
def test_a_bad_setting_is_refused_in_one_line(values, message):
    with pytest.raises(InvalidConfig) as e:
        build_consumer_config(values)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_strategies_given_as_a_list_are_a_tuple_and_an_infinite_timeout_is_none():
    config = build_consumer_config({"assignment_strategy": ["range"], "consumer_timeout_ms": float("inf")})
    assert config.assignment_strategy == ("range",) and config.consumer_timeout_ms is None


def test_a_subscription_is_topics_or_a_pattern_and_one_name_is_one_topic():
    assert subscription_of("orders", None, False) == ({"orders": 1}, protocol.PATTERN_STATIC)
    assert subscription_of({"orders": 2}, None, False) == ({"orders": 2}, protocol.PATTERN_STATIC)
    assert subscription_of(None, "o.*", True) == ({"o.*": 1}, protocol.PATTERN_BLACK_LIST)
    assert subscription_of(None, "o.*", False)[1] == protocol.PATTERN_WHITE_LIST
    for both_or_neither in ((["t"], "o.*"), (None, None)):
        with pytest.raises(InvalidConfig, match="give either topics or pattern"):
            subscription_of(*both_or_neither, False)
