"""Consumer throughput: Consumer.poll() against the log's raw read API, and a group of processes.

One ZooKeeper (fsync on), a ``coordinatord`` process, one topic of ``--partitions`` (4)
partitions holding ``--records`` (2,000,000) records of ``--size`` (100) bytes, written by the
Producer. Measured in one run:

* **poll**: one Consumer alone in a fresh group (auto_offset_reset="earliest",
  enable_auto_commit=False) polls everything; records/s over the records after the first
  (the first ``poll()`` also joins the group). Baseline: a ``Log.fetch`` loop over the same
  data with the fetcher's chunk size (500 records), in a fresh ``Log`` like the consumer's.
  The two alternate for ``--rounds`` (5) rounds and the best of each is reported (the machine is
  shared and noisy). Target: ratio >= 0.8.
* **poll + commit**: the same with ``commit()`` after every poll (a ZooKeeper transaction
  each time).
* **group of processes**: ``--processes`` (4) consumer processes in one group against one
  process alone; each polls and commits every ``--commit-interval-ms`` (and when idle, on
  revocation and on leaving) without printing. Time from spawning them until the group's
  committed offsets equal the end offsets; aggregate records/s = records / that time. Process
  start-up and the rebalances while members join are included: that is what a user waits for.

    bin/bench consume [--records N] [--size B] [--partitions P] [--rounds R]
                      [--processes K] [--commit-interval-ms MS]
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from kazoo.exceptions import NoNodeError

from consumer.consumer import Consumer, ConsumerRebalanceListener
from consumer.log import Log
from coordinator import protocol
from coordinator.errors import ZkGroupsError
from coordinator.topics import TopicRegistry
from tests.benchmarks.common import Row, Timer, print_table, produce, scratch_dir, zk_client, workload_parser, zookeeper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPIC = "bench-consume"
FETCH_CHUNK = 500  # what the fetcher asks of Log.fetch with the default max_poll_records


# ---------------------------------------------------------------- data and baseline

def end_offsets(data_dir: str, partitions: int):
    with Log(data_dir) as log:
        return {p: log.latest_offset(TOPIC, p) for p in range(partitions)}


def raw_fetch(data_dir: str, partitions: int, expected: int) -> float:
    count = 0
    with Log(data_dir) as log, Timer() as t:  # a fresh Log, as each Consumer opens its own
        for partition in range(partitions):
            offset = log.earliest_offset(TOPIC, partition)
            while True:
                batch = log.fetch(TOPIC, partition, offset, max_records=FETCH_CHUNK)
                if not batch:
                    break
                count += len(batch)
                offset = batch[-1].offset + 1
    check(count, expected, "Log.fetch")
    return t.rate(count)


def check(count: int, expected: int, what: str) -> None:
    if count != expected:
        sys.exit(f"bench_consume: {what} read {count:,} records, expected {expected:,}")


# ---------------------------------------------------------------- one consumer in this process

def poll_all(connect: str, data_dir: str, group: str, expected: int, commit_every_poll: bool) -> float:
    """Records/s of a lone consumer reading everything (timed after its first record)."""
    c = Consumer(group, [TOPIC], zk=connect, data_dir=data_dir, auto_offset_reset="earliest",
                 enable_auto_commit=False)
    try:
        deadline = time.monotonic() + 60
        count = 0
        while not count:  # join the group: the first poll() that returns a record
            if time.monotonic() > deadline:
                sys.exit(f"bench_consume: group {group} never assigned partitions")
            count = sum(len(r) for r in c.poll(timeout_ms=1000, max_records=1).values())
        poll = c.poll
        with Timer() as t:
            if commit_every_poll:
                commit = c.commit
                while count < expected:
                    for records in poll(timeout_ms=1000).values():
                        count += len(records)
                    commit()
            else:
                while count < expected:
                    for records in poll(timeout_ms=1000).values():
                        count += len(records)
        check(count, expected, "Consumer.poll")
        if commit_every_poll:
            ends = end_offsets(data_dir, len(c.assignment()))
            if any(c.committed(tp) != ends[tp.partition] for tp in c.assignment()):
                sys.exit("bench_consume: committed offsets do not match the end offsets")
        return (count - 1) / t.seconds
    finally:
        c.close()


# ---------------------------------------------------------------- consumer processes

class _CommitOnRevoke(ConsumerRebalanceListener):
    """Commit the positions of partitions that move away (enable_auto_commit is off)."""

    consumer = None

    def on_partitions_revoked(self, revoked):
        try:
            self.consumer.commit({tp: self.consumer.position(tp) for tp in revoked})
        except ZkGroupsError:
            pass  # already moved on: the new owner starts from the last commit

    def on_partitions_lost(self, lost):
        pass


def worker(connect: str, data_dir: str, group: str, commit_interval_ms: str) -> None:
    """A consumer process: poll and commit (every interval, when idle, on revocation and on
    SIGTERM) without printing records; print how many it polled when it exits."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    interval = int(commit_interval_ms) / 1000.0
    listener = _CommitOnRevoke()
    count = 0
    c = Consumer(group, [TOPIC], zk=connect, data_dir=data_dir, listener=listener,
                 auto_offset_reset="earliest", enable_auto_commit=False)
    listener.consumer = c
    try:
        next_commit = time.monotonic() + interval
        while not stop.is_set():
            n = sum(len(r) for r in c.poll(timeout_ms=100).values())
            count += n
            now = time.monotonic()
            if not n or now >= next_commit:
                next_commit = now + interval
                try:
                    c.commit()
                except ZkGroupsError:
                    pass  # a partition moved between owned() and the commit: not ours to commit
        try:
            c.commit()
        except ZkGroupsError:
            pass
    finally:
        c.close()
    print(count, flush=True)


def run_group(zk, connect: str, data_dir: str, group: str, processes: int, interval_ms: int,
              ends, timeout: float = 300.0):
    """Seconds from spawning ``processes`` workers until the group has committed ``ends``,
    the records the workers polled in all (duplicates after rebalances included), and seconds
    until all of them had registered in the group (None if some finished before)."""
    code = "import sys; from tests.benchmarks.bench_consume import worker; worker(*sys.argv[1:])"
    env = dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                              if os.environ.get("PYTHONPATH") else ""))
    paths = [protocol.offsets_path(group, TOPIC, p) for p in sorted(ends)]
    want = [ends[p] for p in sorted(ends)]
    ids = protocol.ids_path(group)
    registered = None
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code, connect, data_dir, group, str(interval_ms)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(processes)]
    try:
        while True:
            seconds = time.perf_counter() - started
            if registered is None and zk.exists(ids) and len(zk.get_children(ids)) == processes:
                registered = seconds
            if committed_offsets(zk, paths) == want:
                break
            if seconds > timeout or any(p.poll() is not None for p in procs):
                errors = "".join(p.stderr.read()[-2000:] for p in procs if p.poll() is not None)
                sys.exit(f"bench_consume: group {group} did not commit everything in {seconds:.0f}s\n{errors}")
            time.sleep(0.01)
        polled = 0
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            out, err = p.communicate(timeout=60)
            if p.returncode != 0:
                sys.exit(f"bench_consume: a worker exited with {p.returncode}:\n{err[-2000:]}")
            polled += int(out.split()[-1])
        return seconds, polled, registered
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def committed_offsets(zk, paths):
    """The committed offsets at ``paths`` (None where nothing is committed yet), read in parallel."""
    results = [zk.get_async(path) for path in paths]
    out = []
    for r in results:
        try:
            out.append(int(r.get()[0]))
        except NoNodeError:
            out.append(None)
    return out


def coordinatord(connect: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "coordinator.cli.coordinatord", "--zk", connect,
                             "--node-id", "bench", "--log-level", "WARNING"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---------------------------------------------------------------- main

def main(argv=None) -> None:
    parser = workload_parser("consume", __doc__, rounds=5, data_dir=False)
    parser.add_argument("--processes", type=int, default=4, help="consumer processes in the group run")
    parser.add_argument("--commit-interval-ms", type=int, default=100,
                        help="how often the consumer processes commit")
    args = parser.parse_args(argv)
    records, rounds = max(args.records, 1), max(args.rounds, 1)
    payload = os.urandom(args.size)

    with zookeeper() as connect, zk_client(connect) as zk, scratch_dir() as data_dir:
        coordinator = coordinatord(connect)
        try:
            TopicRegistry(zk).create(TOPIC, args.partitions)
            produce_rate = produce(zk, data_dir, TOPIC, records, payload)
            ends = end_offsets(data_dir, args.partitions)
            check(sum(ends.values()), records, "the producer")
            deadline = time.monotonic() + 30
            while not zk.exists(protocol.LEADER):
                if time.monotonic() > deadline or coordinator.poll() is not None:
                    sys.exit("bench_consume: coordinatord did not become leader")
                time.sleep(0.05)

            base = poll_rate = commit_rate = 0.0
            for r in range(rounds):
                base = max(base, raw_fetch(data_dir, args.partitions, records))
                poll_rate = max(poll_rate, poll_all(connect, data_dir, f"solo-{r}", records, False))
                commit_rate = max(commit_rate, poll_all(connect, data_dir, f"commit-{r}", records, True))

            one = many = None  # (seconds, polled, registered) of the best round
            for r in range(rounds):
                result = run_group(zk, connect, data_dir, f"one-{r}", 1, args.commit_interval_ms, ends)
                one = result if one is None or result[0] < one[0] else one
                result = run_group(zk, connect, data_dir, f"group-{r}", args.processes,
                                   args.commit_interval_ms, ends)
                many = result if many is None or result[0] < many[0] else many
        finally:
            coordinator.send_signal(signal.SIGTERM)
            try:
                coordinator.wait(30)
            except subprocess.TimeoutExpired:
                coordinator.kill()
                coordinator.wait()

    one_rate, many_rate = records / one[0], records / many[0]
    k = args.processes
    joined = "" if many[2] is None else f"all {k} registered after {many[2]:.2f} s, "
    print_table([
        Row("baseline (Log.fetch loop)", base, "records/s", 1.0, f"chunks of {FETCH_CHUNK}"),
        Row("Consumer.poll()", poll_rate, "records/s", poll_rate / base, "target ratio >= 0.8"),
        Row("Consumer.poll() + commit() per poll", commit_rate, "records/s", commit_rate / base),
        Row("1 consumer process (spawn -> all committed)", one_rate, "records/s", 1.0,
            f"{one[0]:.2f} s, {one[1] - records:,} duplicates"),
        Row(f"{k} consumer processes, one group (aggregate)", many_rate, "records/s", many_rate / one_rate,
            f"{many[0]:.2f} s ({joined}{many[1] - records:,} duplicates); ratio vs 1 process"),
        Row("produce (Producer.send + flush)", produce_rate, "records/s", None, "setup"),
    ], title=f"bench_consume: {records:,} records of {args.size} bytes, {args.partitions} partitions, "
             f"{os.cpu_count()} CPUs (best of {rounds} rounds each)")


if __name__ == "__main__":
    main()
