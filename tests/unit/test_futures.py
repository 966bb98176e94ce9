"""What became of a sent record (:mod:`consumer.futures`): the embedded log's futures resolved
once per batch, kafka-python's future API over them (``get``, ``exception``, the callbacks,
each run once, at once when already resolved, a failing one only logged), ``DeliveryFailed``'s
one line. Pure: batches resolved by hand, no log, no server."""
from __future__ import annotations

import logging
import threading

import pytest

from consumer.futures import DeliveryFailed, _Batch, _LogFuture
from consumer.records import RecordMetadata


def futures(n=2):
    batch = _Batch("t", 1)
    return batch, [_LogFuture(batch, i, 1000 + i) for i in range(n)]


def test_a_batch_resolves_every_future_of_it_at_its_own_offset():
    batch, (first, second) = futures()
    assert not first.is_done and repr(first) == "<FutureRecordMetadata pending>"
    with pytest.raises(TimeoutError, match="not written within 0.01s"):
        first.get(timeout=0.01)
    batch.resolve(40, None)
    assert first.get() == RecordMetadata("t", 1, 40, 1000) and second.get(0) == RecordMetadata("t", 1, 41, 1001)
    assert first.succeeded() and not first.failed() and first.exception() is None


def test_a_failed_batch_fails_every_future_and_get_raises_its_error():
    batch, (first, _) = futures()
    error = DeliveryFailed("t", 1, "the producer was closed")
    batch.resolve(-1, error)
    assert first.failed() and first.exception() is error
    with pytest.raises(DeliveryFailed, match="a record for t-1 was not delivered: the producer was closed"):
        first.get()
    assert str(DeliveryFailed("t", None, "x")) == "a record for t was not delivered: x"


def test_callbacks_run_once_in_the_resolving_thread_or_at_once_and_a_failing_one_is_logged(caplog):
    batch, (first, second) = futures()
    heard = []

    def note(*args):
        heard.append(args)
    first.add_callback(note, "ok").add_errback(note, "error").add_both(note, "both")
    first.add_done_callback(lambda f: heard.append(("done", f is first)))
    second.add_callback(lambda metadata: 1 / 0)  # logged, never raised to the resolver
    resolver = threading.Thread(target=batch.resolve, args=(7, None))
    with caplog.at_level(logging.ERROR):
        resolver.start()
        resolver.join()
    metadata = RecordMetadata("t", 1, 7, 1000)
    assert heard == [("ok", metadata), ("both", metadata), ("done", True)]
    first.add_callback(note)  # already resolved: at once, in this thread
    assert heard[-1] == (metadata,) and len(heard) == 4
    assert any("a callback of a sent record failed" in r.getMessage() for r in caplog.records)


def test_a_waiting_get_wakes_when_its_batch_is_resolved_by_another_thread():
    batch, (first, _) = futures()
    threading.Timer(0.02, batch.resolve, args=(3, None)).start()
    assert first.get(timeout=5).offset == 3
