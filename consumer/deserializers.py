"""A consumer's ``key_deserializer`` and ``value_deserializer`` (kafka-python's), applied to the
records the application is handed.

Guarantees: a record is handed out deserialized or not at all. When a deserializer raises on a
record, the records of its partition before it are handed out, the partition's position stays
at it (it and what follows are given back to the fetcher) and, once it is the next record of
its partition, :class:`~coordinator.errors.RecordDeserializationError` names its partition and
offset; ``seek(tp, offset + 1)`` skips it. Other partitions' records are not held up.

Not provided: deserializers for headers, and a way to hand out the raw bytes of a record
whose deserializer fails (seek past it, or consume without the deserializer).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from coordinator.errors import RecordDeserializationError
from consumer.records import ConsumerRecord, TopicPartition

Deserializer = Callable[[bytes], Any]


def usable(deserializer: object) -> bool:
    """Whether ``deserializer`` is one: a function of the bytes, or an object with kafka-python
    3's ``deserialize(topic, headers, data)``."""
    return callable(getattr(deserializer, "deserialize", None)) or callable(deserializer)


def _applied(deserializer: Optional[object]) -> Optional[Callable[[ConsumerRecord, Any], Any]]:
    if deserializer is None:
        return None
    deserialize = getattr(deserializer, "deserialize", None)
    if callable(deserialize):
        return lambda record, data: deserialize(record.topic, list(record.headers), data)
    return lambda record, data: deserializer(data)  # type: ignore[operator]


class Deserializers:
    """The key and value deserializers of one consumer (either may be None), each a function
    of the bytes or a kafka-python 3 ``Deserializer``. Stateless: any thread."""

    __slots__ = ("key", "value")

    def __init__(self, key: Optional[Deserializer], value: Optional[Deserializer]) -> None:
        self.key, self.value = _applied(key), _applied(value)

    def one(self, record: ConsumerRecord) -> ConsumerRecord:
        """``record`` with its key and value deserialized; RecordDeserializationError if one fails."""
        key, value = record.key, record.value
        try:
            if self.value is not None:
                value = self.value(record, value)
        except Exception as e:
            raise RecordDeserializationError(record.topic, record.partition, record.offset, "value_deserializer",
                                             e) from e
        try:
            if self.key is not None and key is not None:
                key = self.key(record, key)
        except Exception as e:
            raise RecordDeserializationError(record.topic, record.partition, record.offset, "key_deserializer",
                                             e) from e
        return ConsumerRecord(record.topic, record.partition, record.offset, record.timestamp, key, value,
                              record.headers)

    def batch(self, batch: Dict[TopicPartition, List[ConsumerRecord]]
              ) -> Tuple[Dict[TopicPartition, list], Dict[TopicPartition, list], Optional[RecordDeserializationError]]:
        """(what to hand out, what to give back to the fetcher, the first failure) of a
        ``poll()``'s batch: each partition's records up to the first that fails; that record
        and the rest of its partition go back."""
        out: Dict[TopicPartition, list] = {}
        back: Dict[TopicPartition, list] = {}
        failure: Optional[RecordDeserializationError] = None
        one = self.one
        for tp, records in batch.items():
            done = []
            for i, record in enumerate(records):
                try:
                    done.append(one(record))
                except RecordDeserializationError as e:
                    back[tp] = records[i:]
                    failure = failure or e
                    break
            if done:
                out[tp] = done
        return out, back, failure
