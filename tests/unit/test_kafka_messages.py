"""consumer.dataplane.kafka_messages: librdkafka's consume() results split into runs of one
partition (no Python step per message), against itertools.groupby."""
from __future__ import annotations

import pytest

from consumer.dataplane.kafka_messages import runs
from tests.unit.test_records import message

ck = pytest.importorskip("confluent_kafka")


def test_run_ends_are_where_groupby_ends_its_groups():
    import itertools
    import random

    from consumer.dataplane.kafka_messages import run_ends
    rng = random.Random(7)
    cases = [[], [1], [1] * 1000, [0, 1] * 50, [0] * 5 + [1] + [0] * 10, [("a", 0)] * 3 + [("b", 0)] * 2]
    for _ in range(3000):
        values = []
        while len(values) < rng.randrange(80):
            values += [rng.randrange(3)] * rng.choice([1, 1, 2, 7, 30])
        cases.append(values)
    for values in cases:
        ends = list(itertools.accumulate(len(list(g)) for _, g in itertools.groupby(values)))
        assert list(run_ends(values)) == ends, values


def test_a_consume_result_splits_into_runs_of_one_partition_and_error_events():
    messages = [message(offset=o, partition=p) for p, o in [(0, 1), (0, 2), (1, 7), (0, 3), (0, 4)]]
    error = ck.Message(topic="orders", partition=1, offset=8, error=ck.KafkaError(ck.KafkaError._UNKNOWN_PARTITION))
    found = list(runs(messages[:3] + [error] + messages[3:], "orders"))
    assert [(None if run is None else [(m.partition(), m.offset()) for m in run], e) for run, e in found] == [
        ([(0, 1), (0, 2)], None), ([(1, 7)], None), (None, error), ([(0, 3), (0, 4)], None)]
    other = message(topic="refunds", partition=0, offset=9)
    assert [len(run) for run, _ in runs(messages[:2] + [other], None)] == [2, 1]  # several topics
