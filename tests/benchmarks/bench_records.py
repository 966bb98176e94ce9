"""The per-record steps of ``poll()`` on Kafka: making KafkaRecords of librdkafka's Messages
and reading their fields, compiled (``consumer._speedups``) against pure Python.

No cluster: the Messages are made once with confluent-kafka's own constructor (``--size``
bytes of value, a key, no headers), then each way of reading goes over them in batches of
``--batch`` (``max_poll_records``' default) as ``poll()`` hands them out: counting (the record
made, nothing read), reading ``value``, reading every field. The baseline, in the same run, is
a bare loop over the same Messages that calls the same methods (``m.value()``, ...). The pure
Python runs in a child process with ``ZKGROUPS_NO_EXTENSIONS=1`` (an implementation is chosen
at import). Figures are CPU time per record (best of ``--rounds``), so the rest of the machine
weighs less; ``bin/bench consume --data-plane kafka`` measures the whole ``poll()``.

    bin/bench records [--records N] [--size B] [--batch N] [--rounds R]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from consumer.records import COMPILED, kafka_records
from tests.benchmarks.bench_consume import READS, read_messages, read_records
from tests.benchmarks.common import Row, print_table


def messages(records: int, size: int) -> list:
    import confluent_kafka as ck
    value = b"x" * size
    return [ck.Message(topic="bench-records", partition=i % 4, offset=i, key=b"k%d" % (i % 100), value=value,
                       timestamp=(ck.TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + i), headers=None)
            for i in range(records)]


def make_and_read(messages: list, read: str) -> None:
    """What ``poll()`` does with a read's messages (KafkaRecords of them), then the reader."""
    read_records(kafka_records(messages), read)


def ns_a_record(step, batches: list, read: str, rounds: int) -> float:
    """Best CPU nanoseconds a record of ``step`` over ``batches``, of ``rounds`` rounds."""
    records = sum(len(b) for b in batches)
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for batch in batches:
            step(batch, read)
        best = min(best, (time.process_time() - started) / records * 1e9)
    return best


def measure(args) -> dict:
    """{read: {"bare": ns, "records": ns}} in this process (its own implementation)."""
    all_messages = messages(args.records, args.size)
    batches = [all_messages[i:i + args.batch] for i in range(0, len(all_messages), args.batch)]
    out = {"compiled": COMPILED}
    for read in READS:
        out[read] = {"bare": ns_a_record(read_messages, batches, read, args.rounds),
                     "records": ns_a_record(make_and_read, batches, read, args.rounds)}
    return out


def pure_python(args) -> dict:
    env = dict(os.environ, ZKGROUPS_NO_EXTENSIONS="1")
    argv = [sys.executable, "-m", "tests.benchmarks.bench_records", "--json", "--records", str(args.records),
            "--size", str(args.size), "--batch", str(args.batch), "--rounds", str(args.rounds)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"bench_records: the pure-Python run failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="bin/bench records", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--batch", type=int, default=500, help="records a poll() hands out")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of each measurement (best is reported)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the child's answer
    args = parser.parse_args(argv)
    if not (1 <= args.records <= 10_000_000 and 1 <= args.batch <= args.records and 1 <= args.rounds <= 1000
            and 0 <= args.size <= 1 << 20):
        parser.error("--records 1..10,000,000, --batch 1..--records, --rounds 1..1000, --size 0..1 MiB")
    if args.json:
        print(json.dumps(measure(args)))
        return
    if not COMPILED:
        sys.exit("bench_records: consumer._speedups is not in use (not built: run bin/setup; or ZKGROUPS_NO_EXTENSIONS is set)")
    pure, here = pure_python(args), measure(args)
    rows = []
    for read in READS:
        bare = here[read]["bare"]
        for name, ns in (("bare Message loop", bare), ("pure Python", pure[read]["records"]),
                         ("compiled", here[read]["records"])):
            note = "" if name == "bare Message loop" else f"{ns / bare:.2f}x the bare loop's CPU"
            if name == "compiled":
                note += f"; {pure[read]['records'] / ns:.2f}x as fast as pure Python"
            rows.append(Row(f"{read}: {name}", 1e9 / ns, "records/CPU s", bare / ns, note))
    print_table(rows, f"bench_records: {args.records:,} Messages of {args.size} bytes, batches of {args.batch}, "
                      f"best of {args.rounds} rounds (CPU time)")


if __name__ == "__main__":
    main()
