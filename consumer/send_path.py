"""How ``Producer.send`` gets a record to its data plane: the checks every send makes (bad input
is one line), the topic cache, and the Kafka producer's send path.

* The checks (:func:`check_partition`, :func:`checked_headers`, :func:`as_bytes`,
  :func:`checked_batch`) and the topic cache (:class:`TopicInfo`, :func:`cache_topic`) serve
  both data planes.
* :class:`KafkaSendPath` is the Kafka producer's ``send``, ``send_many`` and delivery-report
  serving, a mixin of :mod:`consumer.producer`'s Kafka producer, which owns librdkafka's
  producer, the lifecycle and the topics' metadata.

The Kafka send path, per record
-------------------------------
``send`` has a fast path for the common record: a topic in ``_ready``, a ``bytes`` value, a
``bytes`` key or none, librdkafka's partitioner and clock (no ``partition``, ``timestamp`` or
``headers``). It costs one membership test, a few ``is None`` tests, one ``list.pop`` (a
budget of :data:`SERVE_EVERY` records between two servings of delivery reports) and
librdkafka's ``produce`` with positional arguments. ``_ready`` holds the topics send accepted
while the producer was open with no failure to raise: ``close`` and the first failed delivery
empty it, so the one membership test stands for three checks. Anything else (the first record
of a topic, an explicit partition, a timestamp, headers, a type to convert or refuse, a full
queue, an error of librdkafka, an empty budget) takes the checked path, ``_send``, which makes
every check and raises one line for bad input. Where :mod:`consumer._speedups` is built, the
fast path is compiled (``FastSend``, the same steps on the same ``_ready`` and budget, with
no Python frame): the producer's ``send`` attribute is then that, falling back to this
``send`` for everything else; a producer with serializers keeps this ``send``.

``send_many(topic, values, keys=None, partition=None)`` checks the batch once (every value and
key before any record is sent) and hands the records to librdkafka in one loop with no Python
call of ours per record: the batch path for loaders (:doc:`/guides/producer`). Its futures,
which the caller keeps, keep three ints a record once delivered, not librdkafka's message.
"""
from __future__ import annotations

import itertools
import random
import time
from typing import Dict, List, Optional, Sequence, Tuple

from consumer.compiled import SPEEDUPS
from consumer.futures import DeliveryFailed, FutureRecordMetadata, _KafkaBatchFuture
from coordinator.errors import IllegalStateError, InvalidPartitions, UnknownTopic, ZkGroupsError

#: Kafka: ``send`` serves librdkafka's delivery reports once per this many records.
SERVE_EVERY = 1000
#: Kafka: a background thread serves delivery reports when none were served for this long.
IDLE_SERVE_S = 0.05

_NO_KEYS = itertools.repeat(None)
_FULL_BUDGET = [None] * SERVE_EVERY


# ---------------------------------------------------------------- checks of both data planes

class TopicInfo:
    """A topic's partition count as the producer last read it, until ``expires`` (monotonic),
    and where its next record without key or partition goes (the embedded log)."""

    __slots__ = ("partitions", "expires", "next")

    def __init__(self, partitions: int, expires: float):
        self.partitions, self.expires = partitions, expires
        self.next = random.randrange(partitions)  # spread producers that start together


def cache_topic(topics: Dict[str, TopicInfo], topic: str, partitions: int, max_age: float) -> TopicInfo:
    info = topics.get(topic)
    if info is None or info.partitions != partitions:
        info = topics[topic] = TopicInfo(partitions, 0.0)
    info.expires = time.monotonic() + max_age
    return info


def check_partition(topic: str, partition, info: TopicInfo) -> None:
    if not (type(partition) is int and 0 <= partition < info.partitions):
        raise InvalidPartitions(f"partition {partition!r} of topic {topic!r} does not exist "
                                f"(it has partitions 0..{info.partitions - 1})")


def checked_headers(headers) -> tuple:
    headers = tuple(headers)
    for header in headers:
        if not (isinstance(header, tuple) and len(header) == 2 and isinstance(header[0], str)
                and (header[1] is None or isinstance(header[1], (bytes, bytearray)))):
            raise TypeError(f"headers must be (str, bytes) pairs, got {header!r}")
    return headers


def as_bytes(data, what: str) -> bytes:
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes, got {type(data).__name__}")


def checked_batch(values, keys) -> Tuple[Sequence[bytes], Optional[Sequence[Optional[bytes]]]]:
    """``send_many``'s records, every one checked before any is sent: ``values`` as a sequence of
    bytes (bytearray and memoryview copied, as ``send`` does), ``keys`` None or as many keys,
    bytes or None; a TypeError naming the first that is not."""
    if not isinstance(values, (list, tuple)):
        values = list(values)
    if not set(map(type, values)) <= {bytes}:
        values = [v if type(v) is bytes else as_bytes(v, f"values[{i}]") for i, v in enumerate(values)]
    if keys is not None:
        if not isinstance(keys, (list, tuple)):
            keys = list(keys)
        if len(keys) != len(values):
            raise TypeError(f"send_many: {len(keys)} keys for {len(values)} values")
        if not set(map(type, keys)) <= {bytes, type(None)}:
            keys = [k if k is None or type(k) is bytes else as_bytes(k, f"keys[{i}]") for i, k in enumerate(keys)]
    return values, keys


# ---------------------------------------------------------------- the Kafka producer's send path

class KafkaSendPath:
    """``send``, ``send_many`` and the serving of delivery reports of the Kafka producer.

    The class it is mixed into provides: ``_kp`` (librdkafka's producer), ``_produce`` (its
    bound ``produce``), ``_KafkaException``, ``_plane``, ``_state`` and ``_CLOSED`` (the
    closed state), ``_futures``, ``_new_future``, ``_batch_futures`` (a dict), ``_topics`` and
    ``_refresh(topic)``, ``max_block``, ``_stop``; and it starts ``_ready`` empty, ``_budget``
    and ``_failure`` as ``_serve`` and ``_delivery_failed`` leave them. Threads: any number of
    senders and servers; each structure is changed by one atomic step (``set.add``,
    ``set.clear``, ``list.pop``, an attribute store), so no lock is taken per record."""

    def send(self, topic, value, key=None, partition=None, timestamp=None, headers=None,
             timestamp_ms=None) -> Optional[FutureRecordMetadata]:
        if (topic in self._ready and type(value) is bytes and partition is None and timestamp is None
                and headers is None and timestamp_ms is None and (key is None or type(key) is bytes)):
            future = self._new_future() if self._futures else None
            try:
                self._budget.pop()  # IndexError: time to serve delivery reports (in _send)
                self._produce(topic, value, key, -1, future)
            except Exception:  # that, a full queue or an error of librdkafka: _send deals with it
                return self._send(topic, value, key, partition, timestamp, headers, timestamp_ms)
            return future
        return self._send(topic, value, key, partition, timestamp, headers, timestamp_ms)

    def _compile_send(self) -> None:
        """Make ``send`` the compiled fast path over this producer's ``_ready`` and budget,
        where it is built and ``send`` is this class's own (no serializers in front of it)."""
        if SPEEDUPS is not None and "send" not in self.__dict__:
            self.send = SPEEDUPS.FastSend(self._ready, self._budget, self._produce,
                                          self._new_future if self._futures else None,
                                          KafkaSendPath.send.__get__(self))

    def _send(self, topic, value, key, partition, timestamp, headers, timestamp_ms) -> Optional[FutureRecordMetadata]:
        """``send`` with every check; a topic it accepts goes to ``_ready``, unless the producer
        was closed or a delivery failed meanwhile (their writers empty ``_ready`` after)."""
        partition = self._checked_target(topic, partition)
        if type(value) is not bytes:
            value = as_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = as_bytes(key, "key")
        if timestamp is None:
            timestamp = timestamp_ms
        if timestamp is None:
            timestamp = 0  # librdkafka stamps it
        elif type(timestamp) is not int:
            raise TypeError(f"timestamp must be an int (milliseconds), got {type(timestamp).__name__}")
        if headers:
            headers = list(checked_headers(headers))
        future = self._new_future() if self._futures else None
        try:
            self._produce(topic, value, key, partition, future, None, timestamp, headers or None)
        except BufferError:
            self._produce_when_room(topic, value, key, partition, future, timestamp, headers or None)
        except self._KafkaException as e:
            raise self._refused(topic, partition, e) from None
        except RuntimeError:  # librdkafka's producer was closed by a close() in another thread
            raise IllegalStateError("the producer is closed") from None
        self._ready.add(topic)
        if self._failure is not None or self._state is self._CLOSED:
            self._ready.clear()
        try:
            self._budget.pop()
        except IndexError:
            self._serve(0)
        return future

    def _checked_target(self, topic: str, partition) -> int:
        """The checks of a send that do not depend on the record: the producer open, no failure
        to raise, the topic known, the partition (-1: librdkafka's partitioner) existing."""
        if self._state is self._CLOSED:
            raise IllegalStateError("the producer is closed")
        if self._failure is not None:
            self._raise_failure()
        info = self._topics.get(topic)
        if info is None:
            info = self._refresh(topic)
        if partition is None:
            return -1  # librdkafka's partitioner: murmur2 for keys (as Java), else random
        if not (type(partition) is int and 0 <= partition < info.partitions):
            check_partition(topic, partition, self._refresh(topic))  # maybe partitions were just added
        return partition

    def send_many(self, topic: str, values, keys=None, partition=None) -> Optional[List[FutureRecordMetadata]]:
        values, keys = checked_batch(*self._serialized_batch(topic, values, keys))
        try:
            partition = self._checked_target(topic, partition)
        except ZkGroupsError as e:
            e.sent = 0
            raise
        produce = self._produce
        futures, new_future = ([], self._batch_future(topic)) if self._futures else (None, None)
        start, chunk, pairs = 0, (), iter(())
        try:
            for start in range(0, len(values), SERVE_EVERY):
                chunk = values[start:start + SERVE_EVERY]
                pairs = zip(chunk, _NO_KEYS if keys is None else keys[start:start + SERVE_EVERY])
                if futures is None:
                    for value, key in pairs:
                        try:
                            produce(topic, value, key, partition)
                        except BufferError:
                            self._produce_when_room(topic, value, key, partition, None, 0, None)
                else:
                    for value, key in pairs:
                        future = new_future()
                        try:
                            produce(topic, value, key, partition, future)
                        except BufferError:
                            self._produce_when_room(topic, value, key, partition, future, 0, None)
                        futures.append(future)
                self._serve(0)
        except (self._KafkaException, RuntimeError, ZkGroupsError) as e:
            if isinstance(e, self._KafkaException):
                e = self._refused(topic, partition, e)
            elif isinstance(e, RuntimeError):  # librdkafka's producer was closed by a close() in another thread
                e = IllegalStateError("the producer is closed")
            e.sent = start + len(chunk) - sum(1 for _ in pairs) - 1  # the records before the one refused
            raise e from None
        return futures

    def _batch_future(self, topic: str) -> type:
        """The class of ``send_many``'s futures for ``topic`` (made once per topic)."""
        made = self._batch_futures.get(topic)
        if made is None:
            made = self._batch_futures[topic] = type("KafkaBatchFuture", (_KafkaBatchFuture,),
                                                     {"_owner": self, "_topic": topic})
        return made

    def _produce_when_room(self, topic, value, key, partition, future, timestamp, headers) -> None:
        """librdkafka's queue is full: serve delivery reports until there is room (bounded)."""
        deadline = time.monotonic() + self.max_block
        while True:
            self._serve(0.05)
            try:
                return self._produce(topic, value, key, partition, future, None, timestamp, headers)
            except BufferError:
                if time.monotonic() >= deadline:
                    from coordinator.kafka import KafkaUnavailable
                    raise KafkaUnavailable(f"{self._plane.describe()} took no records for {self.max_block:g}s "
                                           "(the producer's queue stayed full)") from None
            except self._KafkaException as e:
                raise self._refused(topic, partition, e) from None

    def _refused(self, topic: str, partition: int, e: Exception) -> ZkGroupsError:
        """What a produce() librdkafka refused at once means."""
        from consumer.dataplane.kafka import error_name, error_text, kafka_error
        name, reason, err = error_name(e), error_text(e), kafka_error(e)
        if name in ("_UNKNOWN_PARTITION", "UNKNOWN_TOPIC_OR_PART") and partition >= 0:
            return InvalidPartitions(f"partition {partition} of topic {topic!r} does not exist ({reason})")
        if name in ("_UNKNOWN_TOPIC", "UNKNOWN_TOPIC_OR_PART"):
            return UnknownTopic(topic)
        return DeliveryFailed(topic, partition, reason, retriable=err is not None and err.retriable())

    def _delivery_failed(self, err, message) -> DeliveryFailed:
        """Called from a delivery report (of a failure, without futures): the failure for its
        future, remembered to be raised once."""
        if err.name() in ("_PURGE_QUEUE", "_PURGE_INFLIGHT"):
            reason = "the producer was closed before it was delivered"
        else:
            reason = err.str()
        failure = DeliveryFailed(message.topic(), message.partition(), reason, retriable=err.retriable())
        if self._failure is None:
            self._failure = failure
            self._ready.clear()  # after _failure is set: the next send takes the checked path and raises it
        return failure

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _serve(self, timeout: float) -> bool:
        """Serve librdkafka's delivery reports (and log lines), waiting at most ``timeout``;
        False once librdkafka's producer is closed (close() served every report before)."""
        self._budget[:] = _FULL_BUDGET  # in place: the compiled send holds this list
        self._last_served = time.monotonic()
        try:
            self._kp.poll(timeout)
        except RuntimeError:
            return False
        return True

    def _serve_when_idle(self) -> None:
        while not self._stop.wait(IDLE_SERVE_S):
            if time.monotonic() - self._last_served >= IDLE_SERVE_S:
                self._serve(0)
