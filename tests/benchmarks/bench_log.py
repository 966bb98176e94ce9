"""Log throughput: produce through Producer, read back through Log.fetch, against a baseline.

Baseline: reading the same number of lines of the same size from a plain newline-delimited
file opened in binary mode with a bare ``for line in f`` loop, in the same run. Reading and
the baseline alternate for ``--rounds`` rounds and the best of each is reported, which damps
the noise of other processes on a shared machine.
Targets: produce >= 300k records/s, read >= 1M records/s and >= 0.25 x baseline.

    bin/bench log [--records N] [--size B] [--partitions P] [--rounds R] [--data-dir DIR]
"""
from __future__ import annotations

import os
import sys

from consumer.log import Log
from coordinator.topics import TopicRegistry
from tests.benchmarks.common import Row, Timer, print_table, produce, scratch_dir, zk_client, workload_parser, zookeeper

TOPIC = "bench-log"


def read(data_dir: str, partitions: int, expected: int) -> float:
    count = 0
    with Log(data_dir) as log, Timer() as t:  # a fresh Log: nothing cached by the producer
        for partition in range(partitions):
            offset = log.earliest_offset(TOPIC, partition)
            while True:
                batch = log.fetch(TOPIC, partition, offset)
                if not batch:
                    break
                count += len(batch)
                offset = batch[-1].offset + 1
    if count != expected:
        sys.exit(f"bench_log: read {count} records, expected {expected}")
    return t.rate(count)


def write_baseline_file(path: str, records: int, size: int) -> None:
    line = b"x" * (size - 1) + b"\n"
    with open(path, "wb") as f:
        for _ in range(0, records, 10_000):
            f.write(line * 10_000)


def baseline(path: str) -> float:
    count = 0
    with open(path, "rb") as f, Timer() as t:
        for _ in f:
            count += 1
    return t.rate(count)


def main(argv=None) -> None:
    args = workload_parser("log", __doc__, rounds=3).parse_args(argv)
    records = args.records - args.records % 10_000 or 10_000
    payload = os.urandom(args.size)

    with zookeeper() as connect, zk_client(connect) as zk, scratch_dir(keep=args.data_dir) as data_dir:
        TopicRegistry(zk).create(TOPIC, args.partitions)
        produce_rate = produce(zk, data_dir, TOPIC, records, payload)
        baseline_file = os.path.join(data_dir, "baseline.txt")
        write_baseline_file(baseline_file, records, args.size)
        read_rate = base_rate = 0.0
        for _ in range(max(args.rounds, 1)):
            read_rate = max(read_rate, read(data_dir, args.partitions, records))
            base_rate = max(base_rate, baseline(baseline_file))
        os.unlink(baseline_file)

    print_table([
        Row("produce (Producer.send + flush)", produce_rate, "records/s", produce_rate / base_rate,
            "target >= 300,000"),
        Row("read (Log.fetch)", read_rate, "records/s", read_rate / base_rate,
            "target >= 1,000,000 and ratio >= 0.25"),
        Row("baseline (for line in f)", base_rate, "records/s", 1.0),
    ], title=f"bench_log: {records:,} records of {args.size} bytes, {args.partitions} partitions "
             f"(read and baseline: best of {max(args.rounds, 1)})")


if __name__ == "__main__":
    main()
