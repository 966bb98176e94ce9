"""Producer throughput on Kafka: ``Producer.send`` and ``Producer.send_many`` + ``flush`` (a
future per record, and without futures) against bare confluent-kafka producers with the same
settings, sending the same records in the same run.

librdkafka's mock cluster (3 brokers, its own process), a topic of ``--partitions`` (4)
partitions; ``--records`` (200,000) records of ``--size`` (100) bytes, keyless, as fast as
each producer takes them. Every producer is configured by ``KafkaDataPlane.producer_config()``
(``partitioner=murmur2_random``, ``linger.ms=5``) and starts warm (connected, metadata known).
``--rounds`` (7) rounds, each running every row once on a fresh topic, in alternating order.
Rows:

* **bare produce()**: ``produce(topic, value)`` in a loop (``poll`` only when the queue is
  full), then ``flush()``. It learns nothing of where records went or whether they failed.
* **bare produce(on_delivery=C no-op)**: the same with a delivery report per record handed to
  a C-level no-op (``slice``): the cost of the reports alone, the least any per-record result
  costs through confluent-kafka.
* **bare produce(on_delivery=Python)**: a per-record Python callback that keeps the offset,
  what an application that wants per-record results writes by hand.
* **Producer.send + flush**: zkgroups' producer, one ``send`` per record; every record gets a future.
* **Producer(futures=False).send + flush**: no result per record; failures are raised once.
* **Producer.send_many + flush** (with futures, and without): the batch path, one call for all.

Reported per row: the median records/s over the rounds; the median and range of the per-round
ratio to its baseline (bare produce(), or for rows with futures also the Python-callback
producer); and the ratios of CPU time per record (medians): of the process (the sending
thread and librdkafka's, not the mock's) and of the sending thread alone (``send`` and
``produce``, and the delivery callbacks it serves). CPU ratios move far less than wall-clock
ones when other work shares the machine. The load average is printed before and after.

Targets (median of rounds): without futures >= 0.85 of bare produce(); with futures >= 0.7 of
the bare producer with a Python delivery callback.

    bin/bench kafka_produce [--records N] [--size B] [--partitions P] [--rounds R]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from statistics import median
from typing import Dict, List, NamedTuple

from consumer.dataplane.kafka import KafkaDataPlane
from consumer.producer import Producer
from coordinator.testing.kafkamock import MockKafkaCluster
from tests.benchmarks.common import Row, print_table


class Sample(NamedTuple):
    rate: float        # records/s, wall clock
    cpu_us: float      # process CPU time per record, microseconds
    thread_us: float   # the sending thread's CPU time per record, microseconds


class Clock:
    """``with Clock() as c: ...`` then ``c.sample(records)``: wall clock, process and thread CPU time."""

    def __enter__(self) -> "Clock":
        self._start = (time.perf_counter(), time.process_time(), time.thread_time())
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu, self.thread = (now - then for now, then in zip(
            (time.perf_counter(), time.process_time(), time.thread_time()), self._start))

    def sample(self, records: int) -> Sample:
        return Sample(records / self.wall, self.cpu / records * 1e6, self.thread / records * 1e6)


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


def bare(plane: KafkaDataPlane, topic: str, value: bytes, records: int, callback=None) -> Sample:
    producer = _producer(plane, topic)
    with Clock() as t:
        _send_all(producer, topic, value, records, callback)
        left = producer.flush(60)
    if left:
        sys.exit(f"bench_kafka_produce: {left} records not delivered")
    return t.sample(records)


def bare_python_callback(plane: KafkaDataPlane, topic: str, value: bytes, records: int) -> Sample:
    offsets = []

    def delivered(err, message):
        offsets.append(message.offset() if err is None else err)
    sample = bare(plane, topic, value, records, delivered)
    if len(offsets) != records:
        sys.exit(f"bench_kafka_produce: {len(offsets)} delivery reports, expected {records}")
    return sample


def ours(servers: str, topic: str, value: bytes, records: int, futures: bool = True) -> Sample:
    with Producer(bootstrap_servers=servers, futures=futures) as producer:
        producer.send(topic, b"warm-up")
        producer.flush(30)
        send = producer.send
        with Clock() as t:
            for _ in range(records):
                last = send(topic, value)
            producer.flush(60)
        if futures:
            last.get(0)  # resolved by flush
    return t.sample(records)


def ours_many(servers: str, topic: str, value: bytes, records: int, futures: bool = True) -> Sample:
    values = [value] * records
    with Producer(bootstrap_servers=servers, futures=futures) as producer:
        producer.send(topic, b"warm-up")
        producer.flush(30)
        with Clock() as t:
            sent = producer.send_many(topic, values)
            producer.flush(60)
        if futures:
            sent[-1].get(0)  # resolved by flush
    return t.sample(records)


ROWS = (  # (key, name, baseline keys for its ratios, target: (baseline, ratio) or None)
    ("bare", "bare produce()", (), None),
    ("c_callback", "bare produce(on_delivery=C no-op)", ("bare",), None),
    ("py_callback", "bare produce(on_delivery=Python)", ("bare",), None),
    ("producer", "Producer.send + flush (futures)", ("bare", "py_callback"), ("py_callback", 0.7)),
    ("no_futures", "Producer(futures=False).send + flush", ("bare",), ("bare", 0.85)),
    ("many", "Producer.send_many + flush (futures)", ("bare", "py_callback"), ("py_callback", 0.7)),
    ("many_no_futures", "Producer(futures=False).send_many + flush", ("bare",), ("bare", 0.85)),
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="bin/bench kafka_produce", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7, help="rounds of each measurement (medians are reported)")
    args = parser.parse_args(argv)
    value, rounds = os.urandom(args.size), max(args.rounds, 1)
    samples: Dict[str, List[Sample]] = {key: [] for key, *_ in ROWS}
    load_before = os.getloadavg()[0]
    with MockKafkaCluster(brokers=3) as cluster:
        plane, servers = KafkaDataPlane(cluster.bootstrap_servers), cluster.bootstrap_servers
        runs = {
            "bare": lambda topic: bare(plane, topic, value, args.records),
            "c_callback": lambda topic: bare(plane, topic, value, args.records, slice),
            "py_callback": lambda topic: bare_python_callback(plane, topic, value, args.records),
            "producer": lambda topic: ours(servers, topic, value, args.records),
            "no_futures": lambda topic: ours(servers, topic, value, args.records, False),
            "many": lambda topic: ours_many(servers, topic, value, args.records),
            "many_no_futures": lambda topic: ours_many(servers, topic, value, args.records, False),
        }
        try:
            for round_ in range(rounds):
                for name, run in (runs.items() if round_ % 2 == 0 else reversed(runs.items())):
                    topic = f"bench-{name}-{round_}"  # a fresh topic each time: the mock keeps ~5 MiB a partition
                    cluster.create_topic(topic, args.partitions)
                    samples[name].append(run(topic))
        finally:
            plane.close()
    print_table(_rows(samples), title=f"bench_kafka_produce: {args.records:,} records of {args.size} bytes, "
                f"{args.partitions} partitions, mock cluster of 3 brokers (medians of {rounds} rounds; "
                f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)")


def _rows(samples: Dict[str, List[Sample]]) -> List[Row]:
    """A row per producer: median rate, ratios to the bare rows (median and range over the
    rounds, and of CPU time per record), and the target when it has one."""
    rows = []
    for key, name, baselines, target in ROWS:
        mine = samples[key]
        notes = [f"CPU/record {median(s.cpu_us for s in mine):.2f} us, sender {median(s.thread_us for s in mine):.2f} us"]
        for base in baselines:
            ratios = [s.rate / b.rate for s, b in zip(mine, samples[base])]
            cpu = median(b.cpu_us for b in samples[base]) / median(s.cpu_us for s in mine)
            thread = median(b.thread_us for b in samples[base]) / median(s.thread_us for s in mine)
            label = "bare" if base == "bare" else "Python-callback"
            notes.append(f"{median(ratios):.2f} of {label} ({min(ratios):.2f}-{max(ratios):.2f}; "
                         f"by CPU {cpu:.2f}, sender {thread:.2f})")
            if target is not None and target[0] == base:
                notes.append(f"target >= {target[1]}: {'met' if median(ratios) >= target[1] else 'NOT met'}")
        ratio = median(s.rate / b.rate for s, b in zip(mine, samples["bare"]))
        rows.append(Row(name, median(s.rate for s in mine), "records/s", ratio, "; ".join(notes)))
    return rows


if __name__ == "__main__":
    main()
