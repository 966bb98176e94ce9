"""The producer: buffers records per partition and appends them to the log in batches.

Guarantees
----------
* ``send`` only validates and appends to an in-memory buffer. A partition's buffer is written
  as one batch (one :meth:`Log.append`) when it holds ``batch_size`` records, when a record
  has waited ``linger_ms`` (a background thread), on :meth:`flush` and on :meth:`close`.
* Records of one partition are written in the order ``send`` was called (batches of a
  partition are written under one lock, in the order they were cut).
* Partition choice: an explicit ``partition`` (checked against the topic registry), else
  Kafka's default partitioner for keyed records (``murmur2(key) & 0x7fffffff % n``, so a key
  maps to the same partition here, in every process and in Kafka), else round robin.
* Partition counts come from the topic registry in ZooKeeper, cached for
  ``metadata_max_age_ms`` and re-read at once when a partition index is out of range, so
  partitions added to a topic start receiving records within that time.
* After :meth:`flush` returns, every record sent before it is in the log (durable as the
  log's fsync policy says). A failure of a background write is raised by the next ``send``,
  ``flush`` or ``close``; the records of that batch are lost.

Not provided: per-record futures or callbacks, retries, compression, transactions.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from typing import Dict, Optional, Sequence, Tuple

from kazoo.client import KazooClient

from consumer.hashing import partition_for_key
from consumer.log import Log
from coordinator.errors import IllegalStateError, InvalidConfig, InvalidPartitions, UnknownTopic
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client

log = logging.getLogger(__name__)


class _TopicInfo:
    __slots__ = ("partitions", "expires", "next")

    def __init__(self, partitions: int, expires: float):
        self.partitions, self.expires = partitions, expires
        self.next = random.randrange(partitions)  # spread producers that start together


class Producer:
    """Send records to topics registered in ZooKeeper. ``zk`` is a connect string (the producer
    opens and closes its own client) or a started kazoo client (shared, not closed).

    ``log``: share an existing :class:`Log` (not closed by the producer); otherwise one is
    opened on ``data_dir`` with ``log_options`` (fsync, segment_bytes, retention_*, ...).
    """

    def __init__(self, zk, data_dir: Optional[str] = None, linger_ms: int = 5, batch_size: int = 16384,
                 auto_create_topics: bool = False, auto_create_partitions: int = 1,
                 metadata_max_age_ms: int = 5000, log: Optional[Log] = None, **log_options):
        for name, value, low in (("linger_ms", linger_ms, 0), ("batch_size", batch_size, 1),
                                 ("auto_create_partitions", auto_create_partitions, 1),
                                 ("metadata_max_age_ms", metadata_max_age_ms, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InvalidConfig(f"{name} must be a whole number >= {low}, got {value!r}")
        if log is None and data_dir is None:
            raise InvalidConfig("Producer needs a data_dir or a log")
        self._own_client = isinstance(zk, str)
        if not self._own_client and not isinstance(zk, KazooClient):
            raise InvalidConfig(f"zk must be a connect string or a started kazoo client, not {type(zk).__name__}")
        self._log = log if log is not None else Log(data_dir, **log_options)
        self._owns_log = log is None
        try:
            self._client = start_client(zk) if self._own_client else zk
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
        self._topics: Dict[str, _TopicInfo] = {}
        self._buffers: Dict[Tuple[str, int], list] = {}
        self._lock = threading.Lock()          # guards _buffers, _has_pending and _closed
        self._write_lock = threading.RLock()   # cut + write of batches, so a partition's batches stay in order
        self._wake = threading.Condition(self._lock)  # the linger thread waits for records (or close)
        self._has_pending = False              # records buffered since the last _write_all
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._closed = False
        self._thread = None
        if linger_ms > 0:
            self._thread = threading.Thread(target=self._linger_loop, name="producer-linger", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------ public API

    def send(self, topic: str, value: bytes, key: Optional[bytes] = None, partition: Optional[int] = None,
             timestamp: Optional[int] = None, headers: Optional[Sequence[Tuple[str, bytes]]] = None) -> None:
        """Buffer one record. Raises UnknownTopic, InvalidPartitions, TypeError at once."""
        if self._closed:
            raise IllegalStateError("the producer is closed")
        if self._error is not None:
            self._raise_background_error()
        if type(value) is not bytes:
            value = _as_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = _as_bytes(key, "key")
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
            if not (type(partition) is int and 0 <= partition < info.partitions):
                raise InvalidPartitions(f"partition {partition!r} of topic {topic!r} does not exist "
                                        f"(it has partitions 0..{info.partitions - 1})")
        if timestamp is None:
            timestamp = time.time_ns() // 1_000_000
        elif type(timestamp) is not int:
            raise TypeError(f"timestamp must be an int (milliseconds), got {type(timestamp).__name__}")
        record = (key, value, timestamp, _checked_headers(headers) if headers else ())
        tp = (topic, partition)
        with self._lock:
            buf = self._buffers.get(tp)
            if buf is None:
                buf = self._buffers[tp] = []
            buf.append(record)
            full = len(buf) >= self.batch_size
            if not self._has_pending:  # notify only when the producer goes from idle to busy
                self._has_pending = True
                self._wake.notify()
        if full or self._thread is None:
            self._write(tp)

    def flush(self) -> None:
        """Write every buffered record; return when all records sent before are in the log."""
        self._write_all()
        if self._error is not None:
            self._raise_background_error()

    def close(self) -> None:
        """Flush, stop the linger thread and close the log if this producer opened it."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
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

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _refresh(self, topic: str) -> _TopicInfo:
        try:
            partitions = self._registry.partitions(topic)
        except UnknownTopic:
            if not self.auto_create_topics:
                raise
            partitions = self._registry.ensure(topic, self.auto_create_partitions)
            log.info("producer: created topic %s with %d partitions", topic, partitions)
        info = self._topics.get(topic)
        if info is None or info.partitions != partitions:
            info = self._topics[topic] = _TopicInfo(partitions, 0.0)
        info.expires = time.monotonic() + self.metadata_max_age
        return info

    def _write(self, tp: Tuple[str, int]) -> None:
        """Cut one partition's buffer and append it."""
        with self._write_lock:
            with self._lock:
                batch = self._buffers.pop(tp, None)
            if batch:
                self._log.append(tp[0], tp[1], batch)

    def _write_all(self) -> None:
        with self._write_lock:
            with self._lock:
                buffers, self._buffers = self._buffers, {}
                self._has_pending = False
            failure = None
            for (topic, partition), batch in buffers.items():
                try:
                    self._log.append(topic, partition, batch)
                except Exception as e:  # keep writing the other partitions; report the first failure
                    failure = failure or e
            if failure is not None:
                raise failure

    def _linger_loop(self) -> None:
        while True:
            with self._lock:
                while not self._has_pending and not self._closed:
                    self._wake.wait()
                if self._closed:
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


def _checked_headers(headers) -> tuple:
    headers = tuple(headers)
    for header in headers:
        if not (isinstance(header, tuple) and len(header) == 2 and isinstance(header[0], str)
                and (header[1] is None or isinstance(header[1], (bytes, bytearray)))):
            raise TypeError(f"headers must be (str, bytes) pairs, got {header!r}")
    return headers


def _as_bytes(data, what: str) -> bytes:
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes, got {type(data).__name__}")
