"""Value types shared by the log, the producer and the consumer."""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class ConsumerRecord(NamedTuple):
    """One record as read from the log (field names as in kafka-python)."""
    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch
    key: Optional[bytes]
    value: bytes
    headers: Tuple[Tuple[str, bytes], ...] = ()


class RecordMetadata(NamedTuple):
    """Where a produced record landed."""
    topic: str
    partition: int
    offset: int
    timestamp: int


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int
