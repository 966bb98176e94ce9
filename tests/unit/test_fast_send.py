"""consumer._speedups.FastSend, the Kafka producer's compiled send fast path, over stand-ins
for librdkafka's produce and the checked send: which calls it takes, which it hands on, and
that it holds the producer's own set and budget. (The producer's tests run it on Kafka.)"""
from __future__ import annotations

import gc
import weakref

import pytest

from consumer.compiled import SPEEDUPS

pytestmark = pytest.mark.skipif(SPEEDUPS is None, reason="consumer._speedups is not in use")


class Stand:
    """A producer's state: the ready topics, the budget, what produce and the checked send got."""

    def __init__(self, futures=True, budget=3, produce_raises=None):
        self.ready, self.budget, self.produced, self.checked = {"t"}, [None] * budget, [], []
        self.produce_raises = produce_raises
        self.send = SPEEDUPS.FastSend(self.ready, self.budget, self.produce,
                                      (lambda: object()) if futures else None, self.checked_send)

    def produce(self, *args):
        if self.produce_raises is not None:
            raise self.produce_raises
        self.produced.append(args)

    def checked_send(self, *args, **kwargs):
        self.checked.append((args, kwargs))
        return "checked"


def test_the_common_record_is_produced_with_librdkafkas_partitioner_and_a_future():
    s = Stand()
    future = s.send("t", b"v")
    assert s.produced == [("t", b"v", None, -1, future)] and future is not None and not s.checked
    assert s.send("t", b"v", b"k") is s.produced[-1][4] and s.produced[-1][:4] == ("t", b"v", b"k", -1)
    assert len(s.budget) == 1  # one item a record


@pytest.mark.parametrize("args, kwargs", [
    (("t",), {"value": b"v", "key": b"k"}), ((), {"topic": "t", "value": b"v", "key": b"k"}),
    (("t", b"v"), {"key": b"k"}), ((), {"key": b"k", "value": b"v", "topic": "t"}),
])
def test_topic_value_and_key_may_be_named_as_kafka_python_programs_do(args, kwargs):
    s = Stand()
    future = s.send(*args, **kwargs)
    assert s.produced == [("t", b"v", b"k", -1, future)] and not s.checked


def test_without_futures_it_returns_none():
    s = Stand(futures=False)
    assert s.send("t", b"v") is None and s.produced == [("t", b"v", None, -1, None)]


@pytest.mark.parametrize("args, kwargs", [
    (("u", b"v"), {}),                      # a topic not ready
    (("t", "text"), {}),                    # a value to convert or refuse
    (("t", b"v", "k"), {}),                 # a key to convert
    (("t", b"v"), {"partition": 1}),        # any other keyword
    (("t", b"v"), {"value": b"w"}),         # one given twice: the checked send raises
    (("t", b"v", b"k"), {"key": b"k"}),
    (("t",), {}), ((), {"value": b"v"}),    # a topic or a value missing
    (("t",), {"key": b"k"}),
    (("t", b"v", None, 1), {}),             # a fourth argument
    (([], b"v"), {}),                       # an unhashable topic: the checked send says what is wrong
])
def test_everything_else_goes_to_the_checked_send_unchanged(args, kwargs):
    s = Stand()
    assert s.send(*args, **kwargs) == "checked" and s.checked == [(args, kwargs)] and not s.produced
    assert len(s.budget) == 3


def test_an_empty_budget_and_what_the_producer_changes_in_place_are_seen():
    s = Stand(budget=1)
    s.send("t", b"v")
    assert s.send("t", b"v") == "checked"  # the checked send serves reports and refills the budget
    s.budget[:] = [None] * 2
    assert s.send("t", b"v") != "checked"
    s.ready.clear()                         # close() or a failed delivery
    assert s.send("t", b"v") == "checked"


def test_a_produce_that_raises_goes_to_the_checked_send_but_an_interrupt_propagates():
    s = Stand(produce_raises=BufferError("queue full"))
    assert s.send("t", b"v") == "checked" and s.checked == [(("t", b"v"), {})]
    s = Stand(produce_raises=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        s.send("t", b"v")


def test_it_refuses_what_is_not_a_producers_state_and_is_collected_with_its_producer():
    with pytest.raises(TypeError):
        SPEEDUPS.FastSend([], [], print, None, print)
    with pytest.raises(TypeError):
        SPEEDUPS.FastSend(set(), (), print, None, print)
    s = Stand()
    gone = weakref.ref(s)
    del s  # the stand and its send refer to each other
    gc.collect()
    assert gone() is None
