"""kafka-python's keywords zkgroups does not take, and its serializers
(:mod:`consumer.kafka_python`): every refusal says what to write instead; a serializer is taken
either way kafka-python takes one. (That every kafka-python keyword is taken or refused:
``tests/project/test_migrating.py``.) Pure: no server."""
import pytest

from consumer.kafka_python import KAFKA_PYTHON_CONSUMER, KAFKA_PYTHON_PRODUCER, serializer_function
from coordinator.errors import InvalidConfig


def test_every_refusal_says_what_to_write_instead_on_one_line():
    for hints in (KAFKA_PYTHON_CONSUMER, KAFKA_PYTHON_PRODUCER):
        assert hints and all(isinstance(h, str) and h.strip() and "\n" not in h for h in hints.values())


def test_a_serializer_is_a_function_of_the_value_or_an_object_with_serialize():
    assert serializer_function("value_serializer", None) is None
    plain = serializer_function("value_serializer", lambda v: v.upper())
    assert plain("t", None, b"x") == b"X"

    class Kafka3:  # kafka-python 3's Serializer: serialize(topic, headers, data)
        def serialize(self, topic, headers, data):
            return f"{topic}:{headers}:{data}".encode()
    assert serializer_function("key_serializer", Kafka3())("t", (("h", b"1"),), "k") == b"t:[('h', b'1')]:k"
    with pytest.raises(InvalidConfig, match="key_serializer must be callable .* got int"):
        serializer_function("key_serializer", 3)
