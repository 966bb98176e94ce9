"""The record type's two implementations: a KafkaRecord (librdkafka's Message, fields read when
asked for) behaves as the ConsumerRecord of the same values wherever a reader touches it.

librdkafka's Messages are made with confluent-kafka's own constructor: no cluster, no I/O.
The module runs against the compiled per-record steps (consumer._speedups) and, in a
subprocess, against their pure-Python equivalents.
"""
from __future__ import annotations

import copy
import gc
import os
import pickle
import subprocess
import sys

import pytest

from consumer import records as records_module
from consumer.compiled import extensions_disabled
from consumer.records import ConsumerRecord, KafkaRecord, column, kafka_messages, kafka_records

ck = pytest.importorskip("confluent_kafka")


def message(offset=7, key=b"k", value=b"v", headers=None, topic="orders", partition=2, timestamp=1_700_000_000_123):
    return ck.Message(topic=topic, partition=partition, offset=offset, key=key, value=value,
                      timestamp=(ck.TIMESTAMP_CREATE_TIME, timestamp), headers=headers)


def pair(**fields):
    """(KafkaRecord, the ConsumerRecord of the same values)."""
    m = message(**fields)
    headers = tuple(m.headers() or ())
    return (kafka_records([m])[0],
            ConsumerRecord(m.topic(), m.partition(), m.offset(), m.timestamp()[1], m.key(), m.value(), headers))


@pytest.mark.parametrize("fields", [{}, {"key": None}, {"value": None, "key": None},
                                    {"headers": [("trace", b"1"), ("empty", None)]}])
def test_a_kafka_record_is_the_consumer_record_of_its_values(fields):
    k, c = pair(**fields)
    assert isinstance(k, ConsumerRecord) and isinstance(k, tuple)
    assert [getattr(k, f) for f in ConsumerRecord._fields] == [getattr(c, f) for f in ConsumerRecord._fields]
    assert isinstance(k.headers, tuple) and all(isinstance(h, tuple) for h in k.headers)
    topic, partition, offset, timestamp, key, value, headers = k
    assert (topic, partition, offset, timestamp, key, value, headers) == tuple(c)
    assert list(k) == list(c) and tuple(k) == tuple(c) and len(k) == 7
    assert [k[i] for i in range(-7, 7)] == [c[i] for i in range(-7, 7)] and k[1:5] == c[1:5] and k[::-1] == c[::-1]
    with pytest.raises(IndexError):
        k[7]
    assert (c.value in k) and (object() not in k) and k.count(c.offset) == c.count(c.offset)
    assert k.index(c.value) == c.index(c.value) and list(reversed(k)) == list(reversed(c))
    assert k._asdict() == c._asdict()
    assert repr(k) == repr(c) == str(k) and f"{k}" == f"{c}"


def test_equality_hash_and_order_are_the_values():
    k, c = pair()
    assert k == c and c == k and k == tuple(c) and tuple(c) == k and not (k != c) and not (c != k)
    assert hash(k) == hash(c) and {k: 1}[c] == 1 and len({k, c}) == 1
    later, _ = pair(offset=8)
    assert k != later and c != later and later != c
    assert k < later and later > c and c < later and k <= c and k >= c and sorted([later, k, c])[-1] is later
    assert (k + (1,)) == (c + (1,)) and ((1,) + k) == ((1,) + c) and k * 2 == c * 2 and 2 * k == 2 * c


@pytest.mark.parametrize("dup", [lambda r: pickle.loads(pickle.dumps(r)),
                                 lambda r: pickle.loads(pickle.dumps(r, protocol=0)), copy.copy, copy.deepcopy,
                                 lambda r: r._replace(), lambda r: r.materialize()])
def test_pickled_copied_or_replaced_it_is_a_plain_consumer_record(dup):
    k, c = pair(headers=[("h", b"x")])
    out = dup(k)
    assert type(out) is ConsumerRecord and out == c and tuple(out) == tuple(c)  # the values, not the Message
    assert k._replace(value=b"new") == c._replace(value=b"new")
    assert type(KafkaRecord._make(tuple(c))) is ConsumerRecord


def test_records_keep_their_messages_and_columns_read_them_in_bulk():
    messages = [message(offset=o, key=None if o % 2 else b"k%d" % o, headers=[("o", b"%d" % o)] if o == 3 else None)
                for o in range(5)]
    records = kafka_records(messages)
    assert [type(r) for r in records] == [KafkaRecord] * 5 and kafka_messages(records) == messages
    plain = [r.materialize() for r in records]
    for name in ConsumerRecord._fields:
        want = [getattr(r, name) for r in plain]
        assert column(plain, name) == want
        got = column(records, name)
        if name == "headers":  # librdkafka's form: falsy for none, else the (key, value) pairs
            assert [tuple(h or ()) for h in got] == want
        else:
            assert got == want
        assert column(records[:2] + plain[2:], name) == want  # a mixed list: read one by one
    assert column([], "value") == []


# ---------------------------------------------------------------- the two implementations

needs_compiled = pytest.mark.skipif(not records_module.COMPILED, reason="the pure-Python records")


@pytest.mark.skipif(extensions_disabled(), reason="ZKGROUPS_NO_EXTENSIONS is set")
def test_the_compiled_steps_are_built_in_this_install():
    """bin/setup builds consumer/_speedups.c in place: a build that broke fails here, not in a benchmark."""
    assert records_module.COMPILED


@pytest.mark.skipif(extensions_disabled(), reason="this is that run")
def test_the_pure_python_records_pass_the_same_tests():
    env = dict(os.environ, ZKGROUPS_NO_EXTENSIONS="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


def test_records_say_which_implementation_made_them():
    record = kafka_records([message()])[0]
    # Compiled records are not tracked by the cyclic GC (they can be in no cycle: see _speedups.c).
    assert gc.is_tracked(record) is not records_module.COMPILED
    assert record.value == b"v" and gc.collect() >= 0 and record.materialize().value == b"v"


@needs_compiled
def test_the_compiled_steps_refuse_what_is_not_theirs():
    from consumer import _speedups

    class WithADict(tuple):
        pass

    for bad in ((42, []), (dict, []), (WithADict, []), (KafkaRecord, 42)):
        with pytest.raises(TypeError):
            _speedups.records(*bad)
    with pytest.raises(TypeError, match="expected a KafkaRecord"):
        _speedups.value(42)
    with pytest.raises(TypeError, match="expected a KafkaRecord"):
        _speedups.value(())
    with pytest.raises(AttributeError):  # item 0 of a plain ConsumerRecord is its topic, not a Message
        _speedups.value(ConsumerRecord("t", 0, 0, 0, None, b"v"))
    assert _speedups.records(KafkaRecord, iter([message()]))[0].offset == 7  # any iterable
    for bad in ((dict, kafka_records([message()])[0]), (WithADict, kafka_records([message()])[0]),
                (ConsumerRecord, 42), (ConsumerRecord, ())):
        with pytest.raises(TypeError):
            _speedups.materialize(*bad)


@pytest.mark.parametrize("value, disabled", [(None, False), ("", False), ("0", False), ("1", True), ("yes", True)])
def test_zkgroups_no_extensions_asks_for_pure_python_unless_0(monkeypatch, value, disabled):
    if value is None:
        monkeypatch.delenv("ZKGROUPS_NO_EXTENSIONS", raising=False)
    else:
        monkeypatch.setenv("ZKGROUPS_NO_EXTENSIONS", value)
    assert extensions_disabled() is disabled
