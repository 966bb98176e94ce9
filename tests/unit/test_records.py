"""The record type's two implementations: a KafkaRecord (librdkafka's Message, fields read when
asked for) behaves as the ConsumerRecord of the same values wherever a reader touches it.

librdkafka's Messages are made with confluent-kafka's own constructor: no cluster, no I/O.
"""
from __future__ import annotations

import copy
import pickle

import pytest

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
