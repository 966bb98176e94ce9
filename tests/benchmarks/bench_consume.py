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
* **for record in consumer**: the same, iterating (a position moved per record handed out,
  so a loop left by ``break`` loses nothing).
* **poll with metrics**: the same consumer with ``metrics_port`` set (records, bytes and poll
  latency counted per poll).
* **poll + commit**: the same with ``commit()`` after every poll (a ZooKeeper transaction
  each time).
* **group of processes**: ``--processes`` (4) consumer processes in one group against one
  process alone; each polls and commits every ``--commit-interval-ms`` (and when idle, on
  revocation and on leaving) without printing. Time from spawning them until the group's
  committed offsets equal the end offsets; aggregate records/s = records / that time. Process
  start-up and the rebalances while members join are included: that is what a user waits for.

With ``--data-plane kafka`` the same question on librdkafka's mock Kafka cluster (a real Kafka
wire-protocol server in its own process): ``Consumer.poll()`` against bare confluent-kafka
consumers that ``assign()`` the partitions and ``consume(num_messages=1000)`` them, reading the
same records in the same run. The mock keeps only ~5 MiB per partition, so the records are
produced and read in rounds of ``--round-records`` (120,000): each round is produced, then
read by every reader in turn, cold (the Consumer seeks back and its partitions stay paused
while the others read, so nothing reads ahead), in the opposite order every other round; each
reader's best round is reported. Three bare readers: one that checks each message's
``error()`` and counts, one that reads each value, one that reads every field a
``ConsumerRecord`` carries; and the Consumer read the same three ways (counting the records it
returns, reading ``r.value``, reading every attribute). Rates are wall time from the first
record to the last; the CPU this process used per record is shown too (steadier than wall
time on a busy machine). Targets: the counting Consumer >= 0.8 of the bare reader checking
errors, each Consumer >= 0.95 of the bare reader reading the same fields.

    bin/bench consume [--records N] [--size B] [--partitions P] [--rounds R]
                      [--processes K] [--commit-interval-ms MS]
    bin/bench consume --data-plane kafka [--records N] [--size B] [--partitions P] [--round-records N]
"""
from __future__ import annotations

import os
import signal
import statistics
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

def poll_all(connect: str, data_dir: str, group: str, expected: int, commit_every_poll: bool,
             metrics: bool = False) -> float:
    """Records/s of a lone consumer reading everything (timed after its first record); with
    ``metrics`` its Prometheus metrics are on (served on a free port)."""
    c = Consumer(group, [TOPIC], zk=connect, data_dir=data_dir, auto_offset_reset="earliest",
                 enable_auto_commit=False, metrics_port=0 if metrics else None)
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


def iterate_all(connect: str, data_dir: str, group: str, expected: int) -> float:
    """Records/s of a lone consumer reading everything with ``for record in consumer`` (which
    moves each position one record at a time, as kafka-python's iterator does), timed after
    its first record."""
    c = Consumer(group, [TOPIC], zk=connect, data_dir=data_dir, auto_offset_reset="earliest",
                 enable_auto_commit=False, consumer_timeout_ms=60_000)
    try:
        records = iter(c)
        next(records)  # joins the group
        count = 1
        with Timer() as t:
            for _ in records:
                count += 1
                if count == expected:
                    break
        check(count, expected, "iterating the Consumer")
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
            raw = r.get()[0]
        except NoNodeError:
            raw = b""
        out.append(int(raw) if raw else None)  # empty: claimed, nothing committed yet
    return out


def coordinatord(connect: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "consumer.cli.coordinatord", "--zk", connect,
                             "--node-id", "bench", "--log-level", "WARNING"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---------------------------------------------------------------- on Kafka

#: What a reader does with each record: nothing but count it (a bare reader also checks
#: ``error()``, which poll() does for the application), read its value, or read every field.
READS = ("count", "value", "every field")


def read_messages(messages, read: str) -> None:
    """What a reader does with librdkafka's messages: checks ``error()`` (``count``), reads the
    value, or reads all seven fields a ConsumerRecord carries."""
    if read == "count":
        for m in messages:
            if m.error() is not None:
                sys.exit(f"bench_consume: a reader got an error: {m.error()}")
    elif read == "value":
        for m in messages:
            m.value()
    else:
        for m in messages:
            m.topic(), m.partition(), m.offset(), m.timestamp(), m.key(), m.value(), m.headers()


def read_records(records, read: str) -> None:
    """What a reader does with ConsumerRecords: nothing (``count``), reads ``value``, or reads
    every field."""
    if read == "value":
        for r in records:
            r.value
    elif read == "every field":
        for r in records:
            r.topic, r.partition, r.offset, r.timestamp, r.key, r.value, r.headers


def bare_read(ck, servers: str, starts, expected: int, read: str) -> tuple:
    """A bare confluent-kafka consumer: assign() at ``starts``, consume(1000) until ``expected``
    records, each message checked with ``error()`` (``count``) or read (``value``: its value;
    ``every field``: all seven fields a ConsumerRecord carries). (seconds, CPU seconds of this
    process) from its first record to its last."""
    reader = ck.Consumer({"bootstrap.servers": servers, "group.id": "bench-bare", "enable.auto.commit": False,
                          "fetch.queue.backoff.ms": 10})
    reader.assign([ck.TopicPartition(TOPIC, p, offset) for p, offset in starts.items()])
    got, started = 0, None
    try:
        while got < expected:
            messages = reader.consume(num_messages=1000, timeout=5.0)
            if not messages:
                sys.exit(f"bench_consume: the bare reader stopped at {got:,} of {expected:,} records")
            if started is None:
                started = time.perf_counter(), time.process_time()
            read_messages(messages, read)
            got += len(messages)
        return time.perf_counter() - started[0], time.process_time() - started[1]
    finally:
        reader.close()


def batch_read(c, starts, expected: int, read: str) -> tuple:
    """The Consumer's batch path (``poll_batch()``: librdkafka's Messages), read as the bare
    reader reads them; (seconds, CPU seconds) as :func:`zkgroups_read`."""
    return zkgroups_read(c, starts, expected, read, batch=True)


def zkgroups_read(c, starts, expected: int, read: str, batch: bool = False) -> tuple:
    """The Consumer, from ``starts`` (its partitions paused before and after, so nothing is read
    ahead): (seconds, CPU seconds of this process) from its first record to ``expected``
    records, each read as ``read`` says (with ``batch``, through ``poll_batch()``)."""
    from consumer.records import TopicPartition
    partitions = [TopicPartition(TOPIC, p) for p in starts]
    for tp in partitions:
        c.seek(tp, starts[tp.partition])
    c.resume(*partitions)
    got, started = 0, None
    deadline = time.monotonic() + 60
    while got < expected:
        if time.monotonic() > deadline:
            sys.exit(f"bench_consume: the Consumer stopped at {got:,} of {expected:,} records")
        for records in (c.poll_batch if batch else c.poll)(timeout_ms=1000).values():
            if started is None:
                started = time.perf_counter(), time.process_time()
            (read_messages if batch else read_records)(records, read)
            got += len(records)
    elapsed = time.perf_counter() - started[0], time.process_time() - started[1]
    c.pause(*partitions)
    return elapsed


def kafka_main(args) -> None:
    ck = __import__("confluent_kafka")
    from consumer.records import TopicPartition
    from coordinator.testing.kafkamock import MockKafkaCluster
    round_records = max(1, min(args.round_records, args.records))
    rounds = -(-args.records // round_records)
    payload = os.urandom(args.size)
    readers = [(kind, read) for read in READS for kind in ("bare", "zkgroups", "batch")]
    best = {reader: (float("inf"), float("inf")) for reader in readers}  # seconds, CPU seconds per record
    ratios = {(kind, read): [] for kind in ("zkgroups", "batch") for read in READS}  # per round: / the bare reader
    with zookeeper() as connect, zk_client(connect) as zk, MockKafkaCluster(brokers=3) as cluster:
        coordinator = coordinatord(connect)
        try:
            cluster.create_topic(TOPIC, args.partitions)
            TopicRegistry(zk).create(TOPIC, args.partitions)
            tps = [TopicPartition(TOPIC, p) for p in range(args.partitions)]
            c = Consumer("bench-kafka", [TOPIC], zk=connect, bootstrap_servers=cluster.bootstrap_servers,
                         auto_offset_reset="latest", enable_auto_commit=False)
            producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5})
            try:
                deadline = time.monotonic() + 30
                while len(c.assignment()) < args.partitions or c.assignment() - c.paused():
                    if time.monotonic() > deadline:
                        sys.exit("bench_consume: the Consumer did not get its partitions")
                    c.poll(timeout_ms=100)
                    c.pause(*tps)
                starts = {p: 0 for p in range(args.partitions)}
                done = 0
                for r in range(rounds):
                    n = min(round_records, args.records - done)
                    for i in range(n):
                        try:
                            producer.produce(TOPIC, payload, partition=i % args.partitions)
                        except BufferError:  # librdkafka's queue is full: let it drain
                            producer.flush(60)
                            producer.produce(TOPIC, payload, partition=i % args.partitions)
                    producer.flush(60)
                    # Every reader reads the round's records, in the opposite order every other round.
                    took = {}
                    for kind, read in (readers if r % 2 == 0 else readers[::-1]):
                        read_with = {"zkgroups": zkgroups_read, "batch": batch_read}.get(kind)
                        seconds, cpu = (bare_read(ck, cluster.bootstrap_servers, starts, n, read) if kind == "bare"
                                        else read_with(c, starts, n, read))
                        wall, used = best[(kind, read)]
                        best[(kind, read)] = min(wall, seconds / n), min(used, cpu / n)
                        took[(kind, read)] = seconds
                    for kind, read in ratios:
                        ratios[(kind, read)].append(took[("bare", read)] / took[(kind, read)])
                    for p in range(args.partitions):
                        starts[p] += n // args.partitions + (1 if p < n % args.partitions else 0)
                    done += n
            finally:
                producer.flush(10)
                c.close()
        finally:
            coordinator.send_signal(signal.SIGTERM)
            coordinator.wait(30)
    rate = {reader: 1 / wall for reader, (wall, _) in best.items()}
    cpu = {reader: used for reader, (_, used) in best.items()}
    base = rate[("bare", "count")]
    targets = {"count": 0.8, "value": 0.95, "every field": 0.95}
    rows = [Row("bare assign() + consume(1000), error() checked", base, "records/s", 1.0,
                f"{cpu[('bare', 'count')] * 1e9:,.0f} ns CPU a record")]
    for read in READS[1:]:
        rows.append(Row(f"bare, reading {'the value' if read == 'value' else 'every field'}", rate[("bare", read)],
                        "records/s", rate[("bare", read)] / base, f"{cpu[('bare', read)] * 1e9:,.0f} ns CPU a record"))
    for kind, call in (("zkgroups", "Consumer.poll()"), ("batch", "Consumer.poll_batch()")):
        for read in READS:
            same = rate[(kind, read)] / rate[("bare", read)]
            what = {"count": "counting", "value": "reading the value", "every field": "reading every field"}[read]
            target = targets[read] if kind == "zkgroups" else 0.95
            rows.append(Row(f"{call}, {what}", rate[(kind, read)], "records/s", rate[(kind, read)] / base,
                            f"{same:.2f} of the same bare reader (target >= {target}); median of the rounds "
                            f"{statistics.median(ratios[(kind, read)]):.2f}; CPU time "
                            f"{cpu[('bare', read)] / cpu[(kind, read)]:.2f}"))
    print_table(rows, title=f"bench_consume --data-plane kafka: {args.records:,} records of {args.size} bytes, "
                            f"{args.partitions} partitions, best of {rounds} rounds of {round_records:,} "
                            f"(librdkafka's mock cluster, 3 brokers)")


# ---------------------------------------------------------------- main

def main(argv=None) -> None:
    parser = workload_parser("consume", __doc__, rounds=5, data_dir=False)
    parser.add_argument("--processes", type=int, default=4, help="consumer processes in the group run")
    parser.add_argument("--commit-interval-ms", type=int, default=100,
                        help="how often the consumer processes commit")
    parser.add_argument("--data-plane", choices=("embedded", "kafka"), default="embedded")
    parser.add_argument("--round-records", type=int, default=120_000,
                        help="Kafka: records per round (the mock keeps ~5 MiB a partition)")
    args = parser.parse_args(argv)
    if args.data_plane == "kafka":
        return kafka_main(args)
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

            base = poll_rate = iterate_rate = metrics_rate = commit_rate = 0.0
            for r in range(rounds):
                base = max(base, raw_fetch(data_dir, args.partitions, records))
                poll_rate = max(poll_rate, poll_all(connect, data_dir, f"solo-{r}", records, False))
                iterate_rate = max(iterate_rate, iterate_all(connect, data_dir, f"iterate-{r}", records))
                metrics_rate = max(metrics_rate, poll_all(connect, data_dir, f"metrics-{r}", records, False, True))
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
        Row("for record in consumer", iterate_rate, "records/s", iterate_rate / base,
            f"{iterate_rate / poll_rate:.2f} of poll(); positions move per record"),
        Row("Consumer.poll(), metrics_port set", metrics_rate, "records/s", metrics_rate / base,
            f"{metrics_rate / poll_rate:.2f} of poll() without"),
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
