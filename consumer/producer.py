"""The producer: records to topics on either data plane; ``send`` returns a future per record,
or nothing with ``futures=False``; ``send_many`` queues a batch with one call (the batch path).

``Producer(zk, data_dir=...)`` writes the embedded log (topics registered in ZooKeeper);
``Producer(bootstrap_servers=..., kafka={...})`` writes Kafka through a librdkafka producer
(confluent-kafka) configured by :meth:`KafkaDataPlane.producer_config`. Which one follows
:func:`consumer.dataplane.open_data_plane`'s rule: Kafka when bootstrap servers are given (the
argument, else ``KAFKA_BOOTSTRAP_SERVERS``; ``bootstrap_servers=""`` means the embedded log),
else the embedded log. An explicit ``log`` always means the embedded log.

Guarantees (both data planes)
-----------------------------
* ``send`` returns a :class:`FutureRecordMetadata` (kafka-python's API). It resolves to
  ``RecordMetadata(topic, partition, offset, timestamp)`` when the record is written, or fails
  with the reason: the log's error for its batch, :class:`DeliveryFailed` from Kafka, or
  :class:`DeliveryFailed` for a record still pending when the producer was closed with a timeout.
  Callbacks run once, in the thread that resolves the future (or at once in the caller if it
  is already resolved); an exception a callback raises is logged, never propagated.
* Futures cost a small object each; they are resolved in bulk (a batch of the log at a time,
  librdkafka's delivery reports as they are served) with no lock or event per record: only a
  future that is waited on or given a callback pays for that.
* Records of one partition are written in the order ``send`` was called (``send_many``: in
  the batch's order). ``send_many`` checks every value and key of a batch before it sends any
  (a TypeError naming the first bad one); an error after that carries ``sent``, the number of
  the batch's records sent before it.
* Keys: Kafka's default partitioner (``murmur2(key) & 0x7fffffff % n``), so a key lands on the
  same partition in every process, in the embedded log and where Java clients put it in Kafka
  (librdkafka runs with ``partitioner=murmur2_random``). An explicit ``partition`` is checked
  against the topic's partition count; records without key or partition are spread.
* ``send`` of a topic that does not exist raises :class:`UnknownTopic` at once (unless
  ``auto_create_topics``), a partition that does not exist :class:`InvalidPartitions`.
* After :meth:`Producer.flush` returns, every record sent before it is written and its future
  resolved. A failed write is raised once by the next ``send``, ``flush`` or ``close``
  (besides failing its futures).
* ``futures=False``: ``send`` returns None and the producer keeps no result per record, for
  applications that only need to know that everything sent was written: ``flush`` and
  ``close`` still return only once it is, and a failed write is still raised once by the next
  ``send``, ``flush`` or ``close``. On Kafka librdkafka then reports failed deliveries only
  (``delivery.report.only.error``), so a record that is delivered costs no Python code at all.

The embedded log
----------------
* ``send`` validates and appends to an in-memory buffer. A partition's buffer is written as one
  batch (one :meth:`Log.append`) when it holds ``batch_size`` records, when a record has
  waited ``linger_ms`` (a background thread), on :meth:`Producer.flush` and on :meth:`Producer.close`. A
  future's offset is its batch's first offset plus its index in the batch.
* Partition counts come from the topic registry in ZooKeeper, cached for
  ``metadata_max_age_ms`` and re-read at once when a partition index is out of range, so
  partitions added to a topic start receiving records within that time.
* Durable as the log's fsync policy says (``log_options``: fsync, segment_bytes, ...).

Kafka
-----
* librdkafka batches, retries and keeps order (``linger_ms`` → ``linger.ms``, ``batch_size`` →
  ``batch.num.messages`` when given; the ``kafka`` table holds every other property: acks,
  ``enable.idempotence``, compression, security). Durability is the brokers' (``acks``,
  ``min.insync.replicas``). A record that cannot be delivered within librdkafka's
  ``message.timeout.ms`` fails its future with :class:`DeliveryFailed`.
* The topic's existence and partition count come from Kafka's metadata; ``auto_create_topics``
  lets the brokers create a missing topic as they are configured to (``auto.create.topics.enable``,
  ``num.partitions``; ``auto_create_partitions`` is for the embedded log).
* Delivery reports are served by ``send`` (every :data:`SERVE_EVERY` records), ``flush``,
  ``close``, a waiting ``get`` and, while the application sends nothing, a background thread
  (every :data:`IDLE_SERVE_S`); callbacks run on one of those threads.
* ``send`` blocks while librdkafka's queue is full, at most ``max_block_ms``, then raises
  :class:`KafkaUnavailable`.
* ``send`` of a record with no partition, timestamp or headers to a topic it has sent to takes a
  fast path (:mod:`consumer.send_path`) with the same checks and errors; ``send_many`` checks a
  batch once and calls no Python code of ours per record. What each costs against a bare
  confluent-kafka producer: ``bin/bench kafka_produce``.
* ``zk`` is not needed (Kafka knows its topics) and is not used.

The futures and :class:`DeliveryFailed` are in :mod:`consumer.futures` (also importable from
here and from ``consumer``).

Not provided: transactions; on the embedded log, retries and compression. On Kafka a future
keeps librdkafka's delivered message (with copies of its key and value) until its metadata is
first read: keep futures only as long as they are needed.
"""
from __future__ import annotations

import enum
import itertools
import logging
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

from kazoo.client import KazooClient

from consumer.dataplane import bootstrap_servers_from
from consumer.futures import DeliveryFailed, FutureRecordMetadata, _Batch, _KafkaFuture, _LogFuture
from consumer.hashing import partition_for_key
from consumer.log import Log
from consumer.kafka_python import KAFKA_PYTHON_PRODUCER, serializer_function
from consumer.send_path import (IDLE_SERVE_S, SERVE_EVERY, KafkaSendPath, TopicInfo,  # noqa: F401 (re-exported)
                                as_bytes, cache_topic, check_partition, checked_batch, checked_headers)
from coordinator.config import refuse_unknown
from coordinator.errors import IllegalStateError, InvalidConfig, InvalidPartitions, UnknownTopic, ZkGroupsError
from coordinator.lifecycle import Lifecycle
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client

log = logging.getLogger("zkgroups.producer")

#: The embedded log's settings a producer passes to the Log it opens (``log_options``).
LOG_OPTIONS = ("fsync", "fsync_interval_ms", "segment_bytes", "retention_bytes", "retention_ms")
#: The producer's own keywords, for "did you mean" (the constructors' signatures hold them).
PRODUCER_KEYWORDS = ("linger_ms", "batch_size", "auto_create_topics", "auto_create_partitions",
                     "metadata_max_age_ms", "max_block_ms", "request_timeout_ms", "futures", "kafka",
                     "key_serializer", "value_serializer", "zk_auth", "zk_tls", "zk_sasl", "bootstrap_servers", "log",
                     "data_dir")

# ---------------------------------------------------------------- the producer

class ProducerState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


_CLOSED = ProducerState.CLOSED  # read on every send(): one global, no enum class attribute


class Producer(Lifecycle[ProducerState]):
    """Send records to topics of the embedded log or of Kafka (see the module docstring).

    ``Producer(zk, data_dir=..., linger_ms=5, batch_size=16384, auto_create_topics=False,
    auto_create_partitions=1, metadata_max_age_ms=5000, log=None, **log_options)``: the embedded
    log. ``zk`` is a connect string (the producer opens and closes its own client) or a started
    kazoo client (shared, not closed); ``log`` shares an open :class:`Log` (not closed by the
    producer), else one is opened on ``data_dir`` with ``log_options``; ``zk_auth``, ``zk_tls``
    (TLS to ZooKeeper, :mod:`coordinator.zktls`) and ``zk_sasl`` are for the client it opens.

    ``Producer(bootstrap_servers="h:9092,...", kafka={librdkafka properties}, linger_ms=None,
    batch_size=None, auto_create_topics=False, max_block_ms=60000, request_timeout_ms=10000)``:
    Kafka; ``request_timeout_ms`` bounds each metadata request (an unreachable cluster raises
    :class:`KafkaUnavailable` after it). A topic's metadata is read on its first ``send`` and
    again when an explicit partition is not known yet; librdkafka keeps its own up to date
    (``auto_create_partitions`` and ``metadata_max_age_ms`` are accepted and unused).

    ``send(topic, value, key=None, partition=None, timestamp=None, headers=None)`` returns a
    :class:`FutureRecordMetadata`, or None with ``futures=False`` (either data plane: no result
    per record; failures are raised once by the next ``send``, ``flush`` or ``close``);
    ``send_many(topic, values, keys=None, partition=None)`` queues a batch (a list of futures,
    or None); ``flush(timeout=None)``, ``close(timeout=None)``; a context manager. Thread-safe:
    any thread may send, flush or close.

    States (:class:`ProducerState`), changed through ``_set_state``: OPEN ──close()──▶ CLOSED
    (by compare-and-set: a second or concurrent ``close`` does nothing). Once ``close`` has
    returned, every future of the producer is resolved and ``send`` raises IllegalStateError.
    """

    TRANSITIONS = {ProducerState.OPEN: {ProducerState.CLOSED}, ProducerState.CLOSED: set()}
    _serializers: Optional[Tuple[Optional[Callable], Optional[Callable]]] = None  # (key, value), when given

    def __new__(cls, zk: Union[None, str, KazooClient] = None, data_dir: Optional[str] = None, *,
                bootstrap_servers: Optional[str] = None, log: Optional[Log] = None, **options: Any) -> "Producer":
        if cls is Producer:
            servers = "" if log is not None else bootstrap_servers_from(bootstrap_servers)
            cls = _KafkaProducer if servers else _LogProducer
        return super().__new__(cls)

    def send(self, topic: str, value: bytes, key: Optional[bytes] = None, partition: Optional[int] = None,
             timestamp: Optional[int] = None, headers: Optional[Sequence[Tuple[str, bytes]]] = None,
             timestamp_ms: Optional[int] = None) -> Optional[FutureRecordMetadata]:
        """Queue one record; its future (None with ``futures=False``) resolves once it is
        written. ``timestamp_ms`` is kafka-python's name for ``timestamp``. Raises UnknownTopic,
        InvalidPartitions, TypeError at once, and a failure of an earlier write once."""
        raise NotImplementedError

    def send_many(self, topic: str, values: Iterable[bytes], keys: Optional[Iterable[Optional[bytes]]] = None,
                  partition: Optional[int] = None) -> Optional[List[FutureRecordMetadata]]:
        """Queue ``values`` for ``topic`` in their order: the batch path. ``keys`` is None or one
        key per value; ``partition`` is one for all, else each record is placed as by ``send``.
        Returns a future per record, in order (None with ``futures=False``). Every value and key
        is checked before any record is sent (a TypeError naming the first bad one: nothing was
        sent); any other error (the producer closed, a failure of an earlier write, a record
        librdkafka refuses, a queue full for ``max_block_ms``) carries ``sent``, how many records
        of the batch were sent before it. On Kafka no Python code of ours runs per record."""
        values, keys = checked_batch(*self._serialized_batch(topic, values, keys))
        send, futures = type(self).send, []
        for sent, (value, key) in enumerate(zip(values, itertools.repeat(None) if keys is None else keys)):
            try:
                futures.append(send(self, topic, value, key, partition))
            except ZkGroupsError as e:
                e.sent = sent
                raise
        return futures if self._futures else None

    def _serialized_batch(self, topic: str, values, keys):
        """``values`` and ``keys`` through kafka-python's serializers, when the producer has them."""
        if self._serializers is None:
            return values, keys
        serialize_key, serialize_value = self._serializers
        if serialize_value is not None:
            values = [None if v is None else serialize_value(topic, None, v) for v in values]
        if serialize_key is not None and keys is not None:
            keys = [None if k is None else serialize_key(topic, None, k) for k in keys]
        return values, keys

    def partitions_for(self, topic: str) -> Set[int]:
        """The partition ids of ``topic`` (kafka-python's call); UnknownTopic if there is none."""
        return set(range(self._refresh(topic).partitions))

    def metrics(self, raw: bool = False) -> Dict[str, float]:
        """What the producer holds now (kafka-python's call): ``records_buffered`` (sent, not yet
        written: the log's buffers, or librdkafka's queue) and, on the embedded log,
        ``records_written_total``. ``raw`` is accepted for kafka-python's signature."""
        raise NotImplementedError

    def _refresh(self, topic: str) -> "TopicInfo":
        raise NotImplementedError

    def _serializing(self, key_serializer: Optional[Callable], value_serializer: Optional[Callable]) -> None:
        """With kafka-python's ``key_serializer``/``value_serializer``: ``send`` applies them
        first (an instance attribute, so a producer without them pays nothing per record)."""
        if key_serializer is None and value_serializer is None:
            return
        serialize_key = serializer_function("key_serializer", key_serializer)
        serialize_value = serializer_function("value_serializer", value_serializer)
        self._serializers = (serialize_key, serialize_value)
        send = type(self).send

        def serializing_send(topic, value, key=None, partition=None, timestamp=None, headers=None, timestamp_ms=None):
            if serialize_value is not None and value is not None:
                value = serialize_value(topic, headers, value)
            if serialize_key is not None and key is not None:
                key = serialize_key(topic, headers, key)
            return send(self, topic, value, key, partition, timestamp, headers, timestamp_ms)
        self.send = serializing_send  # type: ignore[method-assign]

    def flush(self, timeout: Optional[float] = None) -> None:
        """Return when every record sent before is written and its future resolved."""
        raise NotImplementedError

    def close(self, timeout: Optional[float] = None) -> None:
        """Flush, then release everything the producer opened. Idempotent."""
        raise NotImplementedError

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _log_options(options: Mapping[str, Any]) -> Dict[str, Any]:
    """``options`` if each is a setting of the embedded log; else one line for the first that
    is not (with what to use instead, for kafka-python's keywords)."""
    for key in options:
        if key not in LOG_OPTIONS:
            refuse_unknown("producer config", key, LOG_OPTIONS + PRODUCER_KEYWORDS, KAFKA_PYTHON_PRODUCER)
    return dict(options)


def _whole_numbers(**values) -> None:
    for name, (value, low) in values.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
            raise InvalidConfig(f"{name} must be a whole number >= {low}, got {value!r}")


class _LogProducer(Producer):
    """The embedded log. Threads: any number of senders, the linger thread; ``_lock`` guards
    ``_buffers`` and ``_has_pending``, and the linger thread waits on it for records or ``close``
    (which takes it after the move to CLOSED); ``_write_lock`` is held while batches are cut
    and written, so a partition's batches are written in the order they were cut."""

    def __init__(self, zk=None, data_dir: Optional[str] = None, *, bootstrap_servers: Optional[str] = None,
                 kafka=None, linger_ms: Optional[int] = None, batch_size: Optional[int] = None,
                 auto_create_topics: bool = False, auto_create_partitions: int = 1,
                 metadata_max_age_ms: int = 5000, log: Optional[Log] = None, zk_auth=None, futures: bool = True,
                 key_serializer=None, value_serializer=None, zk_tls=None, zk_sasl=None, **log_options):
        super().__init__(ProducerState.OPEN)
        log_options = _log_options(log_options)
        self._serializing(key_serializer, value_serializer)
        linger_ms = 5 if linger_ms is None else linger_ms
        batch_size = 16384 if batch_size is None else batch_size
        _whole_numbers(linger_ms=(linger_ms, 0), batch_size=(batch_size, 1),
                       auto_create_partitions=(auto_create_partitions, 1),
                       metadata_max_age_ms=(metadata_max_age_ms, 0))
        if log is None and data_dir is None:
            raise InvalidConfig("Producer needs a data_dir or a log (or bootstrap_servers for Kafka)")
        self._own_client = isinstance(zk, str)
        if not self._own_client and not isinstance(zk, KazooClient):
            raise InvalidConfig(f"zk must be a connect string or a started kazoo client, not {type(zk).__name__}")
        self._log = log if log is not None else Log(data_dir, **log_options)
        self._owns_log = log is None
        try:
            self._client = start_client(zk, auth=zk_auth, tls=zk_tls, sasl=zk_sasl) if self._own_client else zk
        except BaseException:
            if self._owns_log:
                self._log.close()
            raise
        self._registry = TopicRegistry(self._client)
        self.linger = linger_ms / 1000.0
        self.batch_size = batch_size
        self.auto_create_topics = auto_create_topics
        self.auto_create_partitions = auto_create_partitions
        self.metadata_max_age = metadata_max_age_ms / 1000.0
        self._futures = bool(futures)
        self._topics: Dict[str, TopicInfo] = {}
        self._buffers: Dict[Tuple[str, int], _Batch] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.RLock()
        self._wake = threading.Condition(self._lock)  # the linger thread waits for records (or close)
        self._has_pending = False              # records buffered since the last _write_all
        self._written = 0                      # records written, for metrics()
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._thread = None
        if linger_ms > 0:
            self._thread = threading.Thread(target=self._linger_loop, name="producer-linger", daemon=True)
            self._thread.start()

    def send(self, topic, value, key=None, partition=None, timestamp=None, headers=None,
             timestamp_ms=None) -> FutureRecordMetadata:
        if self._state is _CLOSED:
            raise IllegalStateError("the producer is closed")
        if self._error is not None:
            self._raise_background_error()
        if type(value) is not bytes:
            value = as_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = as_bytes(key, "key")
        info = self._topics.get(topic)
        if info is None or info.expires < time.monotonic():
            info = self._refresh(topic)
        if partition is None:
            if key is None:
                partition = info.next % info.partitions
                info.next = partition + 1
            else:
                partition = partition_for_key(key, info.partitions)
        elif not (type(partition) is int and 0 <= partition < info.partitions):
            info = self._refresh(topic)  # maybe partitions were just added
            check_partition(topic, partition, info)
        if timestamp is None:
            timestamp = timestamp_ms
        if timestamp is None:
            timestamp = time.time_ns() // 1_000_000
        elif type(timestamp) is not int:
            raise TypeError(f"timestamp must be an int (milliseconds), got {type(timestamp).__name__}")
        record = (key, value, timestamp, checked_headers(headers) if headers else ())
        tp = (topic, partition)
        with self._lock:
            batch = self._buffers.get(tp)
            if batch is None:
                batch = self._buffers[tp] = _Batch(topic, partition)
            records = batch.records
            records.append(record)
            index = len(records) - 1
            if not self._has_pending:  # notify only when the producer goes from idle to busy
                self._has_pending = True
                self._wake.notify()
        future = _LogFuture(batch, index, timestamp) if self._futures else None
        if index + 1 >= self.batch_size or self._thread is None:
            self._write(tp)
        return future

    def metrics(self, raw: bool = False) -> Dict[str, float]:
        with self._lock:
            buffered = sum(len(batch.records) for batch in self._buffers.values())
        return {"records_buffered": buffered, "records_written_total": self._written}

    def flush(self, timeout: Optional[float] = None) -> None:
        """Write every buffered record now (in this thread: ``timeout`` is not needed)."""
        self._write_all()
        if self._error is not None:
            self._raise_background_error()

    def close(self, timeout: Optional[float] = None) -> None:
        """Flush, stop the linger thread and close the log and client this producer opened."""
        if not self._set_state(ProducerState.CLOSED, expect={ProducerState.OPEN}):
            return  # closed before: close-once
        with self._lock:
            self._wake.notify_all()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.flush()
        finally:
            if self._owns_log:
                self._log.close()
            if self._own_client:
                close_client(self._client)

    # ---- internals

    def _refresh(self, topic: str) -> TopicInfo:
        try:
            partitions = self._registry.partitions(topic)
        except UnknownTopic:
            if not self.auto_create_topics:
                raise
            partitions = self._registry.ensure(topic, self.auto_create_partitions)
            log.info("producer: created topic %s with %d partitions", topic, partitions)
        return cache_topic(self._topics, topic, partitions, self.metadata_max_age)

    def _append(self, batch: _Batch) -> None:
        count = len(batch.records)  # resolving releases them
        try:
            base = self._log.append(batch.topic, batch.partition, batch.records)
        except BaseException as e:
            batch.resolve(-1, e)
            raise
        batch.resolve(base, None)
        self._written += count  # under _write_lock

    def _write(self, tp: Tuple[str, int]) -> None:
        """Cut one partition's buffer and append it."""
        with self._write_lock:
            with self._lock:
                batch = self._buffers.pop(tp, None)
            if batch is not None:
                self._append(batch)

    def _write_all(self) -> None:
        with self._write_lock:
            with self._lock:
                buffers, self._buffers = self._buffers, {}
                self._has_pending = False
            failure = None
            for batch in buffers.values():
                try:
                    self._append(batch)
                except Exception as e:  # keep writing the other partitions; report the first failure
                    failure = failure or e
            if failure is not None:
                raise failure

    def _linger_loop(self) -> None:
        while True:
            with self._lock:
                while not self._has_pending and self._state is not _CLOSED:
                    self._wake.wait()
                if self._state is _CLOSED:
                    return  # close() writes what is left
            if self._stop.wait(self.linger):  # let records gather for linger_ms, then write them all
                return
            try:
                self._write_all()
            except BaseException as e:  # reported to the caller by the next send/flush/close
                log.error("producer: background write failed: %s", e)
                self._error = e

    def _raise_background_error(self) -> None:
        error, self._error = self._error, None
        raise error


class _KafkaProducer(KafkaSendPath, Producer):
    """Kafka through one librdkafka producer. Threads: any number of senders; delivery reports
    are served by whichever thread polls (senders, ``flush``, waiting futures, the idle thread);
    librdkafka is thread-safe. ``_failure`` (the first delivery failure not yet raised) is
    written by those threads without a lock: which failure is raised first is not promised.
    ``send``, ``send_many`` and the serving of delivery reports: :class:`KafkaSendPath`."""

    _CLOSED = _CLOSED

    def __init__(self, zk=None, data_dir: Optional[str] = None, *, bootstrap_servers: Optional[str] = None,
                 kafka=None, linger_ms: Optional[int] = None, batch_size: Optional[int] = None,
                 auto_create_topics: bool = False, auto_create_partitions: int = 1,
                 metadata_max_age_ms: int = 5000, max_block_ms: int = 60_000, request_timeout_ms: int = 10_000,
                 log: Optional[Log] = None, zk_auth=None, futures: bool = True,
                 key_serializer=None, value_serializer=None, zk_tls=None, zk_sasl=None,
                 **log_options):  # zk_auth, zk_tls, zk_sasl: unused, Kafka needs no ZooKeeper
        super().__init__(ProducerState.OPEN)
        from consumer.dataplane.kafka import KafkaDataPlane
        from coordinator.kafka import confluent_kafka
        if _log_options(log_options):
            raise InvalidConfig(f"{', '.join(sorted(log_options))}: settings of the embedded log, not of Kafka")
        _whole_numbers(linger_ms=(linger_ms, 0), batch_size=(batch_size, 1), max_block_ms=(max_block_ms, 0),
                       metadata_max_age_ms=(metadata_max_age_ms, 0), request_timeout_ms=(request_timeout_ms, 1))
        self._serializing(key_serializer, value_serializer)
        self._plane = KafkaDataPlane(bootstrap_servers_from(bootstrap_servers), kafka,
                                     timeout_s=request_timeout_ms / 1000.0)
        overrides = {}
        if linger_ms is not None:
            overrides["linger.ms"] = linger_ms
        if batch_size is not None:
            overrides["batch.num.messages"] = batch_size
        self._futures = bool(futures)
        # With futures every record's report resolves its future; without, librdkafka reports
        # failures only, to one callback that keeps the first to be raised.
        overrides["delivery.report.only.error"] = not self._futures
        if not self._futures:
            overrides["on_delivery"] = self._delivery_failed
        self._kp = self._plane.new_producer(overrides)
        self._produce = self._kp.produce
        self._KafkaException = confluent_kafka().KafkaException
        self.auto_create_topics = auto_create_topics
        self.metadata_max_age = metadata_max_age_ms / 1000.0
        self.max_block = max_block_ms / 1000.0
        self._topics: Dict[str, TopicInfo] = {}
        self._ready: Set[str] = set()  # topics send() takes on its fast path; emptied by close() and failures
        self._new_future = type("KafkaFuture", (_KafkaFuture,), {"_owner": self})
        self._batch_futures: Dict[str, type] = {}  # send_many's future class of each topic
        self._failure: Optional[BaseException] = None
        self._budget = [None] * SERVE_EVERY  # one popped per record sent: empty, send serves reports
        self._last_served = time.monotonic()
        self._stop = threading.Event()
        self._idle_thread = threading.Thread(target=self._serve_when_idle, name="producer-deliveries", daemon=True)
        self._idle_thread.start()
        self._compile_send()

    def flush(self, timeout: Optional[float] = None) -> None:
        """Wait until librdkafka has a delivery report for every record and serve them; raises
        TimeoutError if some have none after ``timeout`` seconds (None: librdkafka's
        ``message.timeout.ms`` bounds it)."""
        if self._state is _CLOSED:
            return
        left = self._kp.flush() if timeout is None else self._kp.flush(timeout)
        self._last_served = time.monotonic()
        if left:
            raise TimeoutError(f"{left} records were not delivered within {timeout:g}s")
        if self._failure is not None:
            self._raise_failure()

    def close(self, timeout: Optional[float] = None) -> None:
        """Flush (at most ``timeout`` seconds); records still pending then fail their futures
        with DeliveryFailed. Raises the first delivery failure not raised yet."""
        if not self._set_state(ProducerState.CLOSED, expect={ProducerState.OPEN}):
            return  # closed before: close-once
        self._ready.clear()
        self._stop.set()
        self._idle_thread.join()
        try:
            left = self._kp.flush() if timeout is None else self._kp.flush(timeout)
            if left:  # fail what is left rather than wait on: its futures learn why
                self._kp.purge()
                self._kp.flush(1.0)  # serves the purged records' reports (librdkafka purges in the background)
            self._kp.close()
        finally:
            self._plane.close()
        if self._failure is not None:
            self._raise_failure()

    # ---- internals

    def _refresh(self, topic: str) -> TopicInfo:
        partitions = self._plane.partition_counts([topic]).get(topic)
        if partitions is None and self.auto_create_topics:
            try:  # a metadata request for the topic: brokers that allow it create it
                self._kp.list_topics(topic, timeout=self._plane.timeout_s)
            except self._KafkaException as e:
                log.info("producer: asking Kafka to create topic %s: %s", topic, e)
            partitions = self._plane.partition_counts([topic]).get(topic)
        if partitions is None:
            raise UnknownTopic(topic)
        return cache_topic(self._topics, topic, partitions, self.metadata_max_age)
