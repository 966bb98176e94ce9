"""librdkafka's messages and errors, read the way the Kafka data plane and its fetcher need them:
runs of one partition found with no Python step per message, each record's size, and the names
and texts of librdkafka's errors (never with the user's properties in them)."""
from __future__ import annotations

from operator import add
from typing import Iterator, Optional, Sequence

from consumer.records import ConsumerRecord, TopicPartition, column
from coordinator.errors import FetchFailed, ZkGroupsError
from coordinator.kafka import confluent_kafka

#: Partition errors after which a partition is parked and reported (others are retried inside librdkafka).
PARKING = ("UNKNOWN_TOPIC_OR_PART", "TOPIC_AUTHORIZATION_FAILED", "_UNKNOWN_PARTITION", "_UNKNOWN_TOPIC")


def kafka_error(e: BaseException):
    """The KafkaError a KafkaException carries, or None."""
    err = e.args[0] if getattr(e, "args", None) else None
    return err if isinstance(err, confluent_kafka().KafkaError) else None


def error_name(e: BaseException) -> str:
    """librdkafka's name of the error a KafkaException carries ("" for anything else)."""
    err = kafka_error(e)
    return err.name() if err is not None else ""


def error_text(e: BaseException) -> str:
    """The text of a librdkafka error without the ``KafkaError{code=...}`` wrapping."""
    err = kafka_error(e)
    return err.str() if err is not None else str(e)


# ---------------------------------------------------------------- records from librdkafka messages

def runs(messages, topic: Optional[str] = None):
    """Split one ``consume()`` result into runs of one partition, in order: (messages, None) for
    a run of records, (None, message) for an error event. Per message only its error and
    partition (and topic, unless ``topic`` names the one topic every message belongs to) are
    read, by C-level ``map``: no Python frame per message."""
    if not messages:
        return
    Message = confluent_kafka().Message
    if any(map(Message.error, messages)):
        start = 0
        for i, message in enumerate(messages):
            if message.error() is not None:
                yield from runs(messages[start:i], topic)
                yield None, message
                start = i + 1
        yield from runs(messages[start:], topic)
        return
    keys = list(map(Message.partition, messages) if topic else zip(map(Message.topic, messages),
                                                                    map(Message.partition, messages)))
    start = 0
    for end in run_ends(keys):
        yield (messages[start:end] if end - start < len(messages) else messages), None
        start = end


def run_ends(values: list) -> Iterator[int]:
    """Where each run of equal neighbours in ``values`` ends (exclusive), in order. A run is
    found by probing 1, 2, 4, ... places ahead and halving back, then checked whole with one
    C-level ``count``: a few Python steps per run, none per value (librdkafka hands out a
    partition's messages in runs of up to a fetch response)."""
    i, n = 0, len(values)
    while i < n:
        v = values[i]
        step = 1
        while i + step < n and values[i + step] == v:
            step *= 2
        lo, hi = i + step // 2, min(i + step, n)  # values[lo] == v; the run ends in (lo, hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if values[mid] == v:
                lo = mid
            else:
                hi = mid
        if values[i:hi].count(v) != hi - i:  # a probe skipped another value: go one by one
            hi = next(k for k in range(i + 1, hi) if values[k] != v)
        yield hi
        i = hi


def record_sizes(records: Sequence[ConsumerRecord]):
    """Each record's key and value bytes."""
    sizes = map(len, column(records, "value"))
    keys = column(records, "key")
    if keys.count(None) == len(keys):
        return sizes
    return map(add, sizes, [len(k) if k else 0 for k in keys])


def partition_error(tp: TopicPartition, offset: int, message) -> ZkGroupsError:
    err = message.error()
    return FetchFailed(tp.topic, tp.partition, RuntimeError(f"{err.name()}: {err.str()}"))
