"""What became of a sent record: the futures ``Producer.send`` returns, and ``DeliveryFailed``.

* :class:`FutureRecordMetadata` — kafka-python's future API (``get``, ``add_callback``, ...),
  written once over two hooks each data plane's future provides: the object whose ``done``
  and ``watchers`` it shares, and its outcome.
* The embedded log's futures share their batch (``_Batch``, one per partition's append):
  a batch is resolved once, for all its records.
* Kafka's future is its own librdkafka delivery-report callback (``_KafkaFuture``); a
  waiting ``get`` serves the producer's delivery reports itself. ``send_many``'s futures
  (``_KafkaBatchFuture``) keep where their record landed as three ints instead.

Futures are resolved in bulk with no lock or event per record: only a future that is waited
on or given a callback registers a watcher (under one module lock) and pays for it.
Callbacks run once, in the thread that resolves the future, or at once in the caller if it
is already resolved; an exception a callback raises is logged, never propagated.

The producer (:mod:`consumer.producer`) decides when records are written and resolves their
futures.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

from consumer.records import RecordMetadata
from coordinator.errors import IllegalStateError, ZkGroupsError

if TYPE_CHECKING:
    from consumer.producer import _KafkaProducer

log = logging.getLogger("zkgroups.producer")  # the producer's log lines, wherever their code lives

#: Kafka: how long a waiting ``get`` lets librdkafka wait for a delivery report at a time.
_WAIT_STEP_S = 0.01


class DeliveryFailed(ZkGroupsError):
    """A record could not be written: Kafka refused it, did not take it in time, or the
    producer was closed first. ``retriable`` is Kafka's own verdict (sending it again may work)."""

    def __init__(self, topic: str, partition: Optional[int], reason: str, retriable: bool = False) -> None:
        where = topic if partition is None or partition < 0 else f"{topic}-{partition}"
        super().__init__(f"a record for {where} was not delivered: {reason}")
        self.topic, self.partition, self.retriable = topic, partition, retriable


# ---------------------------------------------------------------- futures

# Watchers of unresolved futures (waiters, callbacks) are registered and taken under this one
# lock. Resolving takes it only when a watcher exists, so futures nobody watches cost no lock.
_watch_lock = threading.Lock()


def _watch(target, watcher: Callable[[], None]) -> None:
    """Run ``watcher`` when ``target`` (an object with ``done`` and ``watchers``) is resolved,
    now if it already is."""
    with _watch_lock:
        if not target.done:
            if target.watchers is None:
                target.watchers = []
            target.watchers.append(watcher)
            watcher = None
    if watcher is not None:
        watcher()
    elif target.done:  # resolved meanwhile and its resolver may have missed the new list
        _fire(target)


def _fire(target) -> None:
    """Run (once) the watchers of a resolved ``target``; its resolver calls this after setting
    ``done`` when it finds ``watchers`` set (either it or ``_watch`` takes every watcher)."""
    with _watch_lock:
        watchers, target.watchers = target.watchers, None
    for watcher in watchers or ():
        watcher()


class FutureRecordMetadata:
    """Where a sent record landed, once it is written (kafka-python's ``FutureRecordMetadata``).

    ``get(timeout)`` returns the :class:`RecordMetadata` or raises the failure (``TimeoutError``
    if not resolved in time); ``is_done``, ``succeeded()``, ``failed()``; ``exception(timeout)``
    waits like ``concurrent.futures`` and returns the failure or None. ``add_callback(fn,
    *args)`` calls ``fn(*args, metadata)`` on success, ``add_errback(fn, *args)`` ``fn(*args,
    error)`` on failure, ``add_both`` either, ``add_done_callback(fn)`` ``fn(future)``; each
    returns the future. Callbacks run in the thread that resolves it (see the module docstring).
    """

    __slots__ = ()

    # ---- what each data plane's future provides

    def _target(self):
        """The object whose ``done`` and ``watchers`` this future shares (its batch, or itself)."""
        raise NotImplementedError

    def _outcome(self) -> Tuple[Optional[RecordMetadata], Optional[BaseException]]:
        raise NotImplementedError

    def _wait(self, timeout: Optional[float]) -> bool:
        """Wait until resolved, at most ``timeout`` seconds (None: no limit); whether it is."""
        event = threading.Event()
        _watch(self._target(), event.set)
        return event.wait(timeout)

    # ---- the API

    @property
    def is_done(self) -> bool:
        return self._target().done

    def succeeded(self) -> bool:
        return self.is_done and self._outcome()[1] is None

    def failed(self) -> bool:
        return self.is_done and self._outcome()[1] is not None

    def get(self, timeout: Optional[float] = None) -> RecordMetadata:
        metadata, error = self._resolved(timeout)
        if error is not None:
            raise error.with_traceback(None)  # one error serves many futures: keep its traceback short
        return metadata

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        return self._resolved(timeout)[1]

    def add_callback(self, fn: Callable, *args: Any) -> "FutureRecordMetadata":
        return self._on_done(lambda metadata, error: error is None and fn(*args, metadata))

    def add_errback(self, fn: Callable, *args: Any) -> "FutureRecordMetadata":
        return self._on_done(lambda metadata, error: error is not None and fn(*args, error))

    def add_both(self, fn: Callable, *args: Any) -> "FutureRecordMetadata":
        return self._on_done(lambda metadata, error: fn(*args, metadata if error is None else error))

    def add_done_callback(self, fn: Callable[["FutureRecordMetadata"], object]) -> "FutureRecordMetadata":
        return self._on_done(lambda metadata, error: fn(self))

    def _resolved(self, timeout: Optional[float]):
        if not self.is_done and not self._wait(timeout):
            raise TimeoutError(f"the record was not written within {timeout:g}s")
        return self._outcome()

    def _on_done(self, call: Callable) -> "FutureRecordMetadata":
        def watcher():
            try:
                call(*self._outcome())
            except Exception:
                log.exception("producer: a callback of a sent record failed")
        _watch(self._target(), watcher)
        return self

    def __repr__(self) -> str:
        if not self.is_done:
            return "<FutureRecordMetadata pending>"
        metadata, error = self._outcome()
        return f"<FutureRecordMetadata {'failed: ' + str(error) if error else metadata}>"


class _Batch:
    """One partition's records of the embedded log: buffered, then written in one append; its
    futures read ``base_offset`` or ``error`` once ``done``."""

    __slots__ = ("topic", "partition", "records", "base_offset", "error", "done", "watchers")

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition, self.records = topic, partition, []
        self.base_offset, self.error, self.done, self.watchers = -1, None, False, None

    def resolve(self, base_offset: int, error: Optional[BaseException]) -> None:
        self.base_offset, self.error, self.records = base_offset, error, None  # the values are written
        self.done = True
        if self.watchers is not None:
            _fire(self)


class _LogFuture(FutureRecordMetadata):
    __slots__ = ("_batch", "_index", "_timestamp")

    def __init__(self, batch: _Batch, index: int, timestamp: int):
        self._batch, self._index, self._timestamp = batch, index, timestamp

    def _target(self):
        return self._batch

    def _outcome(self):
        b = self._batch
        if b.error is not None:
            return None, b.error
        return RecordMetadata(b.topic, b.partition, b.base_offset + self._index, self._timestamp), None


class _KafkaFuture(FutureRecordMetadata):
    """Its own delivery-report callback: librdkafka's report of this record (served inside a
    ``poll``/``flush`` of the producer) calls it with ``(error, message)``.

    Made with no arguments and no ``__init__`` (the class attributes are the defaults, and each
    producer has a subclass whose ``_owner`` is that producer): ~90 ns less per record than
    with an ``__init__``, about 6% of what a record costs the Kafka producer."""

    _owner: "_KafkaProducer"
    _result = None
    watchers = None

    def __call__(self, err, message) -> None:
        self._result = message if err is None else self._owner._delivery_failed(err, message)
        if self.watchers is not None:
            _fire(self)

    @property
    def done(self) -> bool:
        return self._result is not None

    def _target(self):
        return self

    def _outcome(self):
        result = self._result
        if type(result) is DeliveryFailed:
            return None, result
        if type(result) is not RecordMetadata:  # the delivered message: read it once
            result = self._result = RecordMetadata(result.topic(), result.partition(), result.offset(),
                                                   result.timestamp()[1])
        return result, None

    def _wait(self, timeout: Optional[float]) -> bool:
        """Serve delivery reports in this thread until this one is in (no other thread may be serving them)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._result is None:
            left = _WAIT_STEP_S if deadline is None else min(deadline - time.monotonic(), _WAIT_STEP_S)
            if left <= 0:
                return False
            if not self._owner._serve(left) and self._result is None:
                raise IllegalStateError("the producer was closed before the record was delivered")
        return True


class _KafkaBatchFuture(_KafkaFuture):
    """A future of ``send_many`` on Kafka: its caller keeps every one, so its delivery report
    keeps where the record landed, three ints, instead of librdkafka's ``Message`` (which holds a
    copy of the key and the value and is one more object the garbage collector walks: with a
    batch of 200,000 futures kept, full collections took half the batch's time). Each
    producer has a subclass per topic, whose ``_topic`` it is."""

    _topic: str

    def __call__(self, err, message) -> None:
        if err is None:
            self._result = (message.partition(), message.offset(), message.timestamp()[1])
        else:
            self._result = self._owner._delivery_failed(err, message)
        if self.watchers is not None:
            _fire(self)

    def _outcome(self):
        result = self._result
        if type(result) is DeliveryFailed:
            return None, result
        return RecordMetadata(self._topic, *result), None
