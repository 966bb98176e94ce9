"""consumer.deserializers: kafka-python's deserializers on a poll's batch (pure)."""
import json

import pytest

from consumer.deserializers import Deserializers
from consumer.records import ConsumerRecord, TopicPartition
from coordinator.errors import RecordDeserializationError

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def record(tp, offset, value, key=b"k"):
    return ConsumerRecord(tp.topic, tp.partition, offset, 7, key, value)


def test_keys_and_values_are_deserialized_and_a_missing_key_stays_none():
    d = Deserializers(bytes.decode, json.loads)
    assert d.one(record(A, 0, b'{"a": 1}')) == ConsumerRecord("t", 0, 0, 7, "k", {"a": 1})
    assert d.one(record(A, 0, b"1", key=None)).key is None


def test_a_batch_stops_at_the_failing_record_of_its_partition_only():
    d = Deserializers(None, json.loads)
    batch = {A: [record(A, 0, b"1"), record(A, 1, b"oops"), record(A, 2, b"3")], B: [record(B, 5, b"5")]}
    out, back, failure = d.batch(batch)
    assert {tp: [r.value for r in rs] for tp, rs in out.items()} == {A: [1], B: [5]}
    assert back == {A: batch[A][1:]}  # raw records, for the fetcher's give_back
    assert (failure.topic, failure.partition, failure.offset) == ("t", 0, 1)
    assert "value_deserializer failed on t-0 at offset 1: JSONDecodeError" in str(failure)


def test_a_failing_first_record_hands_out_nothing_of_its_partition():
    out, back, failure = Deserializers(bytes.decode, None).batch({A: [record(A, 3, b"v", key=b"\xff")]})
    assert out == {} and back == {A: [record(A, 3, b"v", key=b"\xff")]}
    with pytest.raises(RecordDeserializationError, match="key_deserializer failed on t-0 at offset 3"):
        raise failure


def test_kafka_python_3_deserializer_objects_get_the_topic_and_headers():
    class Tagged:  # kafka.serializer.Deserializer's shape
        def deserialize(self, topic, headers, data):
            return (topic, headers, data.decode())
    r = ConsumerRecord("t", 0, 0, 7, None, b"v", (("h", b"1"),))
    assert Deserializers(None, Tagged()).one(r).value == ("t", [("h", b"1")], "v")
