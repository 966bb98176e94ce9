"""Producer throughput on Kafka: ``Producer.send`` + ``flush`` (a future per record, and
without futures) against bare confluent-kafka producers with the same settings, sending the same
records in the same run.

librdkafka's mock cluster (3 brokers, its own process), a topic of ``--partitions`` (4)
partitions; ``--records`` (200,000) records of ``--size`` (100) bytes, keyless, as fast as
each producer takes them. Every producer is configured by ``KafkaDataPlane.producer_config()``
(``partitioner=murmur2_random``, ``linger.ms=5``) and starts warm (connected, metadata known).
Rows, each the best of ``--rounds`` (5) alternating rounds, ratios against the first:

* **bare produce()**: ``produce(topic, value)`` in a loop (``poll`` only when the queue is
  full), then ``flush()``. It learns nothing of where records went or whether they failed.
* **bare produce(on_delivery=C no-op)**: the same with a delivery report per record handed to
  a C-level no-op (``slice``): the cost of the reports alone, the least any per-record result
  costs through confluent-kafka.
* **bare produce(on_delivery=Python)**: a per-record Python callback that keeps the offset,
  what an application that wants per-record results writes by hand.
* **Producer.send + flush**: zkgroups' producer; every record gets a future.
* **Producer(futures=False).send + flush**: no result per record; failures are raised once.

Targets: without futures >= 0.85 of bare produce(); with futures >= 0.7 of the bare producer
with a Python delivery callback.

    bin/bench kafka_produce [--records N] [--size B] [--partitions P] [--rounds R]
"""
from __future__ import annotations

import argparse
import os
import sys

from consumer.dataplane.kafka import KafkaDataPlane
from consumer.producer import Producer
from coordinator.testing.kafkamock import MockKafkaCluster
from tests.benchmarks.common import Row, Timer, print_table


def _producer(plane: KafkaDataPlane, topic: str):
    producer = plane.new_producer()
    producer.produce(topic, b"warm-up")
    producer.flush(30)
    return producer


def _send_all(producer, topic: str, value: bytes, records: int, callback=None) -> None:
    produce, poll = producer.produce, producer.poll
    for _ in range(records):
        try:
            produce(topic, value, None, -1, callback)
        except BufferError:  # the queue is full: serve delivery reports until there is room
            poll(0.05)
            produce(topic, value, None, -1, callback)


def bare(plane: KafkaDataPlane, topic: str, value: bytes, records: int, callback=None) -> float:
    producer = _producer(plane, topic)
    with Timer() as t:
        _send_all(producer, topic, value, records, callback)
        left = producer.flush(60)
    if left:
        sys.exit(f"bench_kafka_produce: {left} records not delivered")
    return t.rate(records)


def bare_python_callback(plane: KafkaDataPlane, topic: str, value: bytes, records: int) -> float:
    offsets = []

    def delivered(err, message):
        offsets.append(message.offset() if err is None else err)
    rate = bare(plane, topic, value, records, delivered)
    if len(offsets) != records:
        sys.exit(f"bench_kafka_produce: {len(offsets)} delivery reports, expected {records}")
    return rate


def ours(servers: str, topic: str, value: bytes, records: int, futures: bool = True) -> float:
    with Producer(bootstrap_servers=servers, futures=futures) as producer:
        producer.send(topic, b"warm-up")
        producer.flush(30)
        send = producer.send
        with Timer() as t:
            for _ in range(records):
                last = send(topic, value)
            producer.flush(60)
        if futures:
            last.get(0)  # resolved by flush
    return t.rate(records)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="bin/bench kafka_produce", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each measurement (best is reported)")
    args = parser.parse_args(argv)
    value = os.urandom(args.size)
    best = {"bare": 0.0, "c_callback": 0.0, "py_callback": 0.0, "producer": 0.0, "no_futures": 0.0}
    with MockKafkaCluster(brokers=3) as cluster:
        plane = KafkaDataPlane(cluster.bootstrap_servers)
        try:
            for round_ in range(max(args.rounds, 1)):
                runs = {
                    "bare": lambda topic: bare(plane, topic, value, args.records),
                    "c_callback": lambda topic: bare(plane, topic, value, args.records, slice),
                    "py_callback": lambda topic: bare_python_callback(plane, topic, value, args.records),
                    "producer": lambda topic: ours(cluster.bootstrap_servers, topic, value, args.records),
                    "no_futures": lambda topic: ours(cluster.bootstrap_servers, topic, value, args.records, False),
                }
                for name, run in (runs.items() if round_ % 2 == 0 else reversed(runs.items())):
                    topic = f"bench-{name}-{round_}"  # a fresh topic each time: the mock keeps ~5 MiB a partition
                    cluster.create_topic(topic, args.partitions)
                    best[name] = max(best[name], run(topic))
        finally:
            plane.close()
    base = best["bare"]
    print_table([
        Row("bare produce()", base, "records/s", 1.0),
        Row("bare produce(on_delivery=C no-op)", best["c_callback"], "records/s", best["c_callback"] / base),
        Row("bare produce(on_delivery=Python)", best["py_callback"], "records/s", best["py_callback"] / base),
        Row("Producer.send + flush (futures)", best["producer"], "records/s", best["producer"] / base,
            f"{best['producer'] / best['py_callback']:.2f} of the Python-callback producer (target >= 0.7)"),
        Row("Producer(futures=False).send + flush", best["no_futures"], "records/s", best["no_futures"] / base,
            "target ratio >= 0.85"),
    ], title=f"bench_kafka_produce: {args.records:,} records of {args.size} bytes, {args.partitions} partitions, "
             f"mock cluster of 3 brokers (best of {max(args.rounds, 1)})")


if __name__ == "__main__":
    main()
