"""Value types shared by the data planes, the producer and the consumer, and how records are built.

One record type, two implementations: :class:`ConsumerRecord` (a named tuple of its seven
values: the embedded log, tools, anything built by hand) and :class:`KafkaRecord` (a
``ConsumerRecord`` read from Kafka that holds librdkafka's ``Message`` and reads each field
from it when the field is asked for).

Making a KafkaRecord and reading its fields are the per-record steps of ``poll()`` on Kafka:
:mod:`consumer._speedups` (C, built by ``setup.py`` where a compiler is present) does them
when it was built, the pure-Python code here otherwise or with ``ZKGROUPS_NO_EXTENSIONS=1``
(:mod:`consumer.compiled`; ``COMPILED`` says which). Both behave the same; only their speed differs.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import NamedTuple, Optional, Sequence, Tuple

from consumer.compiled import COMPILED, SPEEDUPS as _SPEEDUPS  # noqa: F401 (COMPILED: documented here too)


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class ConsumerRecord(NamedTuple):
    """One record as read from a data plane (field names as in kafka-python). Records read
    from Kafka are KafkaRecords: ConsumerRecords whose fields are read when asked for."""
    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch
    key: Optional[bytes]
    value: bytes
    headers: Tuple[Tuple[str, bytes], ...] = ()


#: ConsumerRecord's own descriptor of its item 0: it reads the tuple's storage, not
#: ``__getitem__``. A KafkaRecord keeps librdkafka's Message there (see KafkaRecord).
_ITEM_0 = ConsumerRecord.__dict__["topic"]


class KafkaRecord(ConsumerRecord):
    """A :class:`ConsumerRecord` read from Kafka: ``isinstance(r, ConsumerRecord)`` holds and
    it behaves as one wherever a reader touches it — the seven attributes, unpacking and
    iteration, indexing and slicing, ``len``, equality and ordering with any ConsumerRecord or
    tuple of the same values, ``hash``, ``repr`` (``ConsumerRecord(...)``), ``_asdict``,
    ``_replace``. Pickling or copying one gives a plain ConsumerRecord (so do ``_replace``
    and :meth:`materialize`): records shipped to Spark tasks or other processes carry their
    values, not librdkafka's objects.

    Why: it holds librdkafka's ``Message`` and reads a field from it when the field is asked
    for, so a record costs what its reader reads: building one is a single C-level step per
    record, where building the seven values would be five calls into librdkafka's objects (and
    a tuple for the timestamp) for every record, read or not. A field read costs a little
    more than a ConsumerRecord's (a Python call); one that reads every field of every record
    does better with unpacking (``for topic, partition, offset, *_ in records``), which reads
    them all at once.

    How: the tuple's one item is the Message; everything that reads the items as values goes
    through :meth:`materialize`. Code in C that reads a tuple's storage directly, not through
    iteration or indexing (pandas' ``DataFrame(records)``, ``"%s" % record``), sees the
    Message there: give it ``tuple(record)`` or ``record.materialize()``.
    """

    __slots__ = ()

    _message = _ITEM_0

    @property
    def topic(self) -> str:  # type: ignore[override]
        return self._message.topic()

    @property
    def partition(self) -> int:  # type: ignore[override]
        return self._message.partition()

    @property
    def offset(self) -> int:  # type: ignore[override]
        return self._message.offset()

    @property
    def timestamp(self) -> int:  # type: ignore[override]
        return self._message.timestamp()[1]

    @property
    def key(self) -> Optional[bytes]:  # type: ignore[override]
        return self._message.key()

    @property
    def value(self) -> bytes:  # type: ignore[override]
        return self._message.value()

    @property
    def headers(self) -> Tuple[Tuple[str, bytes], ...]:  # type: ignore[override]
        headers = self._message.headers()
        return tuple(headers) if headers else ()

    def materialize(self) -> ConsumerRecord:
        """This record as a plain ConsumerRecord (its values read from the Message now)."""
        if _SPEEDUPS is not None:
            return _SPEEDUPS.materialize(ConsumerRecord, self)
        m = self._message
        headers = m.headers()
        return tuple.__new__(ConsumerRecord, (m.topic(), m.partition(), m.offset(), m.timestamp()[1], m.key(),
                                              m.value(), tuple(headers) if headers else ()))

    # Everything a tuple does with its items, done on the values.

    def __iter__(self):
        return iter(self.materialize())

    def __getitem__(self, index):
        return self.materialize()[index]

    def __len__(self) -> int:
        return 7

    def __contains__(self, item) -> bool:
        return item in self.materialize()

    def count(self, value) -> int:
        return self.materialize().count(value)

    def index(self, value, *bounds) -> int:
        return self.materialize().index(value, *bounds)

    def __eq__(self, other) -> bool:
        return self.materialize() == other

    def __ne__(self, other) -> bool:
        return self.materialize() != other

    def __lt__(self, other) -> bool:
        return self.materialize() < other

    def __le__(self, other) -> bool:
        return self.materialize() <= other

    def __gt__(self, other) -> bool:
        return self.materialize() > other

    def __ge__(self, other) -> bool:
        return self.materialize() >= other

    def __hash__(self) -> int:
        return hash(self.materialize())

    def __add__(self, other):
        return self.materialize() + other

    def __radd__(self, other):
        return other + self.materialize()

    def __mul__(self, n):
        return self.materialize() * n

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return repr(self.materialize())

    def __reduce__(self):
        return ConsumerRecord, tuple(self.materialize())

    def __getnewargs__(self):
        return tuple(self.materialize())

    def _replace(self, **changes) -> ConsumerRecord:
        return self.materialize()._replace(**changes)

    @classmethod
    def _make(cls, iterable) -> ConsumerRecord:  # type: ignore[override]
        return ConsumerRecord._make(iterable)


if _SPEEDUPS is not None:  # the same fields, each read by a C function: no Python frame per read
    for _field in ConsumerRecord._fields:
        setattr(KafkaRecord, _field, property(getattr(_SPEEDUPS, _field)))
    del _field


def kafka_records(messages: Sequence) -> list:
    """KafkaRecords of librdkafka ``messages`` (none of them an error event): one C-level step
    per record, no Python frame (compiled: records the cyclic GC does not track, see
    ``consumer/_speedups.c``)."""
    if _SPEEDUPS is not None:
        return _SPEEDUPS.records(KafkaRecord, messages)
    return list(map(tuple.__new__, repeat(KafkaRecord), zip(messages)))


def kafka_messages(records: Sequence[KafkaRecord]) -> list:
    """The librdkafka Messages ``records`` hold (what :func:`kafka_records` made them of)."""
    return list(map(_ITEM_0.__get__, records))


_FIELD_INDEX = {name: i for i, name in enumerate(ConsumerRecord._fields)}


def column(records: Sequence[ConsumerRecord], field: str) -> list:
    """``[getattr(r, field) for r in records]`` with no Python frame per record where the
    records are all of one implementation (as ``poll()`` hands them out, per partition): a
    ConsumerRecord's item, or the field read from each KafkaRecord's Message. ``headers`` are
    the exception: from KafkaRecords a falsy value stands for no headers and a list of pairs
    for some (librdkafka's form)."""
    if not records:
        return []
    first = records[0]
    if type(first) is KafkaRecord:
        read = getattr(type(first._message), field)
        try:
            values = map(read, map(_ITEM_0.__get__, records))
            return list(map(_SECOND, values) if field == "timestamp" else values)
        except TypeError:  # not only KafkaRecords: item 0 of another record is not a Message
            pass
    return list(map(itemgetter(_FIELD_INDEX[field]) if type(first) is ConsumerRecord else attrgetter(field), records))


_SECOND = itemgetter(1)


class RecordMetadata(NamedTuple):
    """Where a produced record landed."""
    topic: str
    partition: int
    offset: int
    timestamp: int


class OffsetAndTimestamp(NamedTuple):
    """What ``offsets_for_times`` found: the first record at or after the asked-for time, and
    that record's own timestamp (milliseconds)."""
    offset: int
    timestamp: int


class ShareRecord(NamedTuple):
    """A record a share consumer was given: a :class:`ConsumerRecord`'s seven values and how
    many times it has been delivered (1 the first time)."""
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Optional[bytes]
    value: bytes
    headers: Tuple[Tuple[str, bytes], ...] = ()
    delivery_count: int = 1


class OffsetAndMetadata(NamedTuple):
    """A commit as kafka-python writes one. ``commit()`` takes it in place of an offset;
    ``committed(tp, metadata=True)`` returns one. The offset znode holds the offset alone (the
    format Kafka's ZooKeeper tools read), so ``metadata`` is not stored: it reads back ``""``."""
    offset: int
    metadata: str = ""
    leader_epoch: int = -1


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
