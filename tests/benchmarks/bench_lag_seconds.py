"""Lag in seconds: what reading the ages of P lagging partitions costs a lag reading, against
reading their log ends (which every reading does anyway), on the embedded log and on Kafka
(librdkafka's mock cluster, 1 broker).

Per plane, best of ``--rounds``: the log ends of the P partitions (the baseline); their ages
with every committed offset new (one record read per partition; on Kafka one assignment of all
of them); the same with nothing new (the cache: no read at all). Each round moves every
committed offset, so the read is never served by the cache.

    bin/bench lag_seconds [--partitions P] [--rounds R] [--data-dir DIR]
"""
from __future__ import annotations

import argparse
import time

from consumer.dataplane import open_data_plane
from consumer.dataplane.record_times import RecordTimesReader
from consumer.records import TopicPartition
from coordinator.lagtime import RecordTimes
from tests.benchmarks.common import Row, Timer, print_table, scratch_dir

TOPIC = "bench-lag"
RECORDS = 50  # per partition


def fill(plane, partitions: int) -> None:
    now_ms = int(time.time() * 1000)
    for p in range(partitions):
        plane.append(TopicPartition(TOPIC, p), [(None, b"x" * 100, now_ms - 1000 * (RECORDS - o), ())
                                                for o in range(RECORDS)])


def measure(plane, partitions: int, rounds: int):
    """Best seconds of (log ends, ages read, ages cached) over ``rounds``."""
    tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
    reader = RecordTimesReader(plane)
    times = RecordTimes(reader)
    best = [float("inf")] * 3
    try:
        for r in range(rounds):
            spots = [(TOPIC, p, r % RECORDS) for p in range(partitions)]
            with Timer() as ends:
                plane.latest_offsets(tps)
            with Timer() as read:
                found = times.timestamps(spots)
            with Timer() as cached:
                times.timestamps(spots)
            if len(found) != partitions:
                raise SystemExit(f"bench_lag_seconds: {len(found)} of {partitions} ages read on {plane.name}")
            best = [min(b, t.seconds) for b, t in zip(best, (ends, read, cached))]
    finally:
        reader.close()
    return best


def rows(name: str, best) -> list:
    ends, read, cached = best
    return [Row(f"{name}: log ends (baseline)", ends * 1000, "ms", 1.0),
            Row(f"{name}: ages, commits moved", read * 1000, "ms", read / ends),
            Row(f"{name}: ages, nothing moved", cached * 1000, "ms", cached / ends, "cache: no read")]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="bin/bench lag_seconds", description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each measurement (best is reported)")
    parser.add_argument("--data-dir", help="keep the log here instead of a temporary directory")
    args = parser.parse_args(argv)
    from coordinator.testing.kafkamock import MockKafkaCluster
    out = []
    with scratch_dir(keep=args.data_dir) as data_dir:
        with open_data_plane(data_dir=data_dir) as plane:
            fill(plane, args.partitions)
            out += rows("embedded", measure(plane, args.partitions, args.rounds))
    with MockKafkaCluster(brokers=1) as cluster:
        cluster.create_topic(TOPIC, args.partitions)
        with open_data_plane(bootstrap_servers=cluster.bootstrap_servers) as plane:
            fill(plane, args.partitions)
            out += rows("kafka", measure(plane, args.partitions, args.rounds))
    print_table(out, f"lag in seconds, {args.partitions} lagging partitions, best of {args.rounds}")


if __name__ == "__main__":
    main()
