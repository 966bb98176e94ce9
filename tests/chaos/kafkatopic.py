"""The chaos run's own view of a topic on Kafka (``bin/chaos --data-plane kafka``).

Read with a bare librdkafka consumer (confluent-kafka: ``assign()`` from the low watermark, a
group id that is never joined, nothing committed), so the evidence never comes through the code
under test: :func:`watermarks` gives each partition's (low, high) watermarks (the end offsets
the drain waits for), :func:`read_values` every record's value from the low watermark to the
high one. :func:`save` and :func:`load` keep that in the run directory (``kafka-topic.json``)
for the referee, since the mock cluster's records die with its process.
"""
from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Tuple

DUMP = "kafka-topic.json"
REQUEST_TIMEOUT_S = 10.0


def _consumer(bootstrap_servers: str):
    from confluent_kafka import Consumer
    return Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "zkgroups-chaos-referee",
                     "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "error",
                     "log_level": 3})


def watermarks(bootstrap_servers: str, topic: str, partitions: int) -> Dict[int, Tuple[int, int]]:
    """{partition: (low, high)} as the leaders answer now."""
    from confluent_kafka import TopicPartition
    consumer = _consumer(bootstrap_servers)
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=REQUEST_TIMEOUT_S)
                for p in range(partitions)}
    finally:
        consumer.close()


def read_values(bootstrap_servers: str, topic: str, partitions: int, timeout_s: float = 120.0) -> Dict[int, dict]:
    """{partition: {"start": low watermark, "values": [value of each offset from start]}};
    raises TimeoutError if the records up to the high watermarks did not all arrive in time."""
    from confluent_kafka import KafkaError, TopicPartition
    marks = watermarks(bootstrap_servers, topic, partitions)
    out: Dict[int, dict] = {p: {"start": low, "values": []} for p, (low, _) in marks.items()}
    waiting = {p for p, (low, high) in marks.items() if high > low}
    consumer = _consumer(bootstrap_servers)
    try:
        consumer.assign([TopicPartition(topic, p, marks[p][0]) for p in waiting])
        deadline = time.monotonic() + timeout_s
        while waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} from Kafka: partitions {sorted(waiting)} not read to their "
                                   f"high watermarks in {timeout_s:.0f}s")
            for message in consumer.consume(1000, timeout=1.0):
                p = message.partition()
                if message.error():
                    if message.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"reading {topic}/{p}: {message.error()}")
                    continue
                values: List[str] = out[p]["values"]
                expected = out[p]["start"] + len(values)
                if message.offset() != expected:
                    raise RuntimeError(f"reading {topic}/{p}: offset {message.offset()} where {expected} was next")
                values.append(message.value().decode("utf-8", "replace"))
                if message.offset() + 1 >= marks[p][1]:
                    waiting.discard(p)
    finally:
        consumer.close()
    return out


def save(run_dir: str, topic: str, partitions: Dict[int, dict]) -> None:
    with open(os.path.join(run_dir, DUMP), "w") as f:
        json.dump({"topic": topic, "partitions": {str(p): v for p, v in partitions.items()}}, f)


def load(run_dir: str) -> Tuple[str, Dict[int, dict]]:
    with open(os.path.join(run_dir, DUMP)) as f:
        obj = json.load(f)
    return obj["topic"], {int(p): v for p, v in obj["partitions"].items()}
