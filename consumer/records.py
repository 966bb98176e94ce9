"""Value types shared by the data planes, the producer and the consumer, and how records are built."""
from __future__ import annotations

import gc
from contextlib import contextmanager

from typing import List, NamedTuple, Optional, Sequence, Tuple


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


class RecordColumns(NamedTuple):
    """Contiguous records of one partition column by column, without an object per record (what
    a columnar reader such as the Spark data source takes): record k has the offset
    ``first_offset + k`` and the value ``buf[value_starts[k]:value_starts[k + 1]]``."""
    topic: str
    partition: int
    first_offset: int
    count: int
    timestamps: Sequence[int]                       # ms since the epoch
    keys: Optional[List[Optional[bytes]]]           # None: no record has a key
    buf: bytes
    value_starts: Sequence[int]                     # count + 1 positions in buf
    headers: Optional[List[Tuple[Tuple[str, bytes], ...]]]  # None: no record has headers


class RecordMetadata(NamedTuple):
    """Where a produced record landed."""
    topic: str
    partition: int
    offset: int
    timestamp: int


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


@contextmanager
def records_built():
    """Defer the cyclic GC while a batch of records is built (the log's and Kafka's readers).

    Building allocates one tuple per record; with the GC on, a collection every 700 of them
    makes it about a third slower. None of these objects can form a cycle, so deferring the
    collection loses nothing (it runs at the next allocation after).
    """
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
