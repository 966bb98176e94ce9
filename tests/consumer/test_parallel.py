"""ParallelConsumer against a real ZooKeeper, a running coordinator and the embedded log:
per-key order, the committed point and the completed set, restarts that skip finished
records, retries and the dead-letter topic, back-pressure, rebalances between processes."""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from coordinator import protocol
from coordinator.errors import InvalidConfig
from consumer import Consumer, ParallelConsumer, ProcessingFailed, TopicPartition
from tests.support.helpers import committed, fill, ok, wait_for

KEYS = 20


def key_of(offset: int) -> bytes:
    return f"k{offset % KEYS}".encode()


class Recorder:
    """What ``fn`` saw: per key, the (partition, offset) started and whether two of one key overlapped."""

    def __init__(self, delay: float = 0.0):
        self.lock = threading.Lock()
        self.running, self.seen, self.overlaps = set(), [], 0
        self.delay = delay

    def __call__(self, record):
        lane = (record.partition, record.key)
        with self.lock:
            if lane in self.running:
                self.overlaps += 1
            self.running.add(lane)
            self.seen.append((record.partition, record.offset, record.key))
        time.sleep(self.delay)
        with self.lock:
            self.running.discard(lane)

    def count(self):
        with self.lock:
            return len(self.seen)

    def in_key_order(self) -> bool:
        last = {}
        for p, o, k in self.seen:
            if last.get((p, k), -1) >= o:
                return False
            last[(p, k)] = o
        return True


def start(pc, fn):
    errors = []

    def run():
        try:
            pc.run(fn)
        except BaseException as e:  # handed to the test
            errors.append(e)
    t = threading.Thread(target=run)
    t.start()
    return t, errors


@pytest.fixture
def parallel(zk_connect, data_dir):
    made = []

    def make(group="g", topics=("t",), **config):
        config.setdefault("auto_offset_reset", "earliest")
        config.setdefault("session_timeout_ms", 2000)
        pc = ParallelConsumer(group, list(topics), zk=zk_connect, data_dir=data_dir, **config)
        made.append(pc)
        return pc
    yield make
    for pc in made:
        pc.close()


def test_key_order_many_in_flight_and_the_committed_point(cluster, zk, data_dir, parallel):
    cluster.node("n")
    fill(data_dir, "t", [300] * 2, zk=zk, key=key_of)
    rec = Recorder(delay=0.005)
    pc = parallel(max_concurrency=16)
    t, errors = start(pc, rec)
    wait_for(lambda: rec.count() >= 600, 30, message="every record processed")
    wait_for(lambda: committed(zk, "g", "t", 2) == {0: 300, 1: 300}, 10, message="the end committed")
    pc.close()
    t.join(30)
    assert not errors
    assert rec.overlaps == 0 and rec.in_key_order()
    assert len({(p, o) for p, o, _ in rec.seen}) == 600
    assert pc.metrics()["processed"] == 600
    # Kafka's format for outside readers: the offset alone, a decimal
    assert zk.get(protocol.offsets_path("g", "t", 0))[0] == b"300"


def test_committed_point_never_passes_an_unfinished_record(cluster, zk, data_dir, parallel, groupctl):
    """One slow record holds the point; the records finished above it are committed as the
    completed set, and a new consumer of the group skips them."""
    cluster.node("n")
    fill(data_dir, "t", [100], zk=zk, key=key_of)
    release = threading.Event()
    rec = Recorder()

    def fn(record):
        if record.offset == 10:
            release.wait(30)
        rec(record)

    pc = parallel(max_concurrency=8, ordering="unordered", commit_interval_ms=100)
    t, errors = start(pc, fn)
    path = protocol.completed_path("g", "t", 0)

    def completed_set():
        raw = zk.get(path)[0] if zk.exists(path) else b""
        return protocol.decode_completed(raw, path)
    wait_for(lambda: (completed_set() or (0, ()))[1] == frozenset(range(11, 100)), 20,
             message="the 89 records above the slow one committed as completed")
    assert committed(zk, "g", "t", 1) == {0: 10}
    assert completed_set()[0] == 10
    header, row = ok(groupctl("groups", "describe", "g")).splitlines()[:2]
    assert header.split()[-1] == "COMPLETED-ABOVE" and row.split()[3] == "10" and row.split()[-1] == "89"
    listed = json.loads(ok(groupctl("groups", "describe", "g", "--output", "json")))["offsets"]
    assert listed[0]["completed_above"] == 89
    # A crash now (no clean leave) would redo offset 10 only: what the next owner reads back.
    from consumer.offsets import read_completed
    assert read_completed(zk, "g", {TopicPartition("t", 0): 10})[TopicPartition("t", 0)] == set(range(11, 100))
    release.set()
    wait_for(lambda: committed(zk, "g", "t", 1) == {0: 100}, 10, message="the point past the slow record")
    pc.close()
    t.join(30)
    assert not errors


def test_restart_processes_only_what_was_not_finished(cluster, zk, data_dir, parallel):
    cluster.node("n")
    fill(data_dir, "t", [60], zk=zk, key=key_of)
    release = threading.Event()
    first = Recorder()

    def fn(record):
        if record.offset in (5, 6):
            release.wait(30)
            raise RuntimeError("interrupted")  # never finishes in this owner
        first(record)

    pc = parallel(max_concurrency=8, ordering="unordered", commit_interval_ms=100, revoke_timeout_ms=200,
                  max_attempts=1, on_failure="stop")
    t, errors = start(pc, fn)
    wait_for(lambda: first.count() == 58, 20, message="all but the two stuck records processed")
    wait_for(lambda: committed(zk, "g", "t", 1) == {0: 5}, 10, message="the point at the first stuck one")
    path = protocol.completed_path("g", "t", 0)
    wait_for(lambda: protocol.decode_completed(zk.get(path)[0], path) == (5, frozenset(range(7, 60))), 10,
             message="the records above the stuck ones committed as completed")
    release.set()
    t.join(30)
    assert errors and isinstance(errors[0], ProcessingFailed)
    second = Recorder()
    pc2 = parallel(max_concurrency=8, ordering="unordered")
    t2, errors2 = start(pc2, second)
    wait_for(lambda: committed(zk, "g", "t", 1) == {0: 60}, 20, message="the rest committed")
    pc2.close()
    t2.join(30)
    assert not errors2
    assert sorted(o for _, o, _ in second.seen) == [5, 6]
    assert pc2.metrics()["skipped"] == 53


def test_a_poison_record_goes_to_the_dead_letter_topic_and_other_keys_flow(cluster, zk, data_dir, parallel):
    cluster.node("n")
    fill(data_dir, "t", [200], zk=zk, key=key_of)
    fill(data_dir, "dlq", [0], zk=zk)
    tries = collections.Counter()
    rec = Recorder()

    def fn(record):
        if record.offset == 3:
            tries[3] += 1
            raise ValueError("poison")
        rec(record)

    pc = parallel(max_concurrency=8, max_attempts=3, retry_backoff_ms=50, dead_letter_topic="dlq")
    t, errors = start(pc, fn)
    wait_for(lambda: committed(zk, "g", "t", 1) == {0: 200}, 30, message="everything past the poison record")
    pc.close()
    t.join(30)
    assert not errors
    assert tries[3] == 3 and pc.metrics()["dead_lettered"] == 1 and pc.metrics()["retries"] == 2
    assert rec.in_key_order() and len(rec.seen) == 199
    # the record's own key waited for it (order through retries): its next record came after
    assert [o for _, o, k in rec.seen if k == key_of(3)][0] == 3 + KEYS
    with Consumer("reader", ["dlq"], zk=zk, data_dir=data_dir, auto_offset_reset="earliest") as reader:
        got = wait_for(lambda: [r for rs in reader.poll(200).values() for r in rs], 20, message="the dead letter")
    assert got[0].value == b"t-0-3" and got[0].key == key_of(3)
    headers = dict(got[0].headers)
    assert headers["zkgroups.offset"] == b"3" and headers["zkgroups.attempts"] == b"3"
    assert headers["zkgroups.error"] == b"ValueError: poison"


def test_back_pressure_bounds_what_one_slow_key_holds(cluster, zk, data_dir, parallel):
    cluster.node("n")
    fill(data_dir, "t", [3000], zk=zk, key=lambda o: b"slow" if o % 2 == 0 else f"k{o}".encode())
    release = threading.Event()
    most = []

    def fn(record):
        if record.key == b"slow":
            release.wait(30)

    pc = parallel(max_concurrency=4, max_pending_per_partition=100)
    t, errors = start(pc, fn)

    def pending():
        most.append(pc.metrics()["queued"] + pc.metrics()["in_flight"])
        return pc.metrics()["processed"] >= 49
    wait_for(pending, 20, message="the other keys processed up to the bound")
    for _ in range(20):  # the bound holds while the slow key is stuck
        most.append(pc.metrics()["queued"] + pc.metrics()["in_flight"])
        time.sleep(0.02)
    release.set()
    wait_for(lambda: committed(zk, "g", "t", 1) == {0: 3000}, 60, message="everything committed")
    pc.close()
    t.join(30)
    assert not errors
    assert max(most) <= 100 + 500  # the bound, and at most one poll's batch over it


def test_coroutine_functions_run_on_an_event_loop(cluster, zk, data_dir, parallel):
    import asyncio
    cluster.node("n")
    fill(data_dir, "t", [200] * 2, zk=zk, key=key_of)
    seen, most = [], [0]
    running = [0]

    async def fn(record):
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.01)
        running[0] -= 1
        seen.append((record.partition, record.offset, record.key))

    pc = parallel(max_concurrency=32)
    t, errors = start(pc, fn)
    wait_for(lambda: committed(zk, "g", "t", 2) == {0: 200, 1: 200}, 30, message="everything committed")
    pc.close()
    t.join(30)
    assert not errors and len(seen) == 400
    assert 1 < most[0] <= 32


def test_invalid_configuration_is_refused(zk_connect, data_dir):
    with pytest.raises(InvalidConfig, match="ordering"):
        ParallelConsumer("g", ["t"], zk=zk_connect, data_dir=data_dir, ordering="random")
    with pytest.raises(InvalidConfig, match="enable_auto_commit"):
        ParallelConsumer("g", ["t"], zk=zk_connect, data_dir=data_dir, enable_auto_commit=True)


def test_a_signal_while_the_main_thread_holds_a_lock_close_takes_does_not_deadlock():
    """SIGTERM's handler runs on the main thread between two bytecodes, maybe just as a poll
    woke up holding the fetcher's lock, which close() takes (a member SIGTERMed hung forever
    in one run of four). The handler leaves close() to another thread and returns at once."""
    lock, closed = threading.Lock(), threading.Event()

    class Closing:
        def close(self):
            if lock.acquire(timeout=2):  # on the thread that holds it: would deadlock
                lock.release()
                closed.set()

    restore = ParallelConsumer._install_signals(Closing())
    try:
        with lock:
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        assert closed.wait(5)
    finally:
        restore()


MEMBER = r"""
import json, sys, threading, time
from consumer import ParallelConsumer
zk, data_dir, out, delay = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
f = open(out, "a", buffering=1)
lock = threading.Lock()
def fn(record):
    with lock:
        f.write(json.dumps({"p": record.partition, "o": record.offset, "k": record.key.decode(), "e": "start",
                            "t": time.monotonic()}) + "\n")
    time.sleep(delay)
    with lock:
        f.write(json.dumps({"p": record.partition, "o": record.offset, "k": record.key.decode(), "e": "end",
                            "t": time.monotonic()}) + "\n")
pc = ParallelConsumer("g", ["t"], zk=zk, data_dir=data_dir, auto_offset_reset="earliest", session_timeout_ms=1500,
                      max_concurrency=16, commit_interval_ms=200, revoke_timeout_ms=2000)
print("ready", flush=True)
pc.run(fn)
print("closed", flush=True)
"""


def read_events(paths):
    """[(member index, event)] in each member's own order."""
    out = []
    for i, path in enumerate(paths):
        if os.path.exists(path):
            for line in open(path).read().splitlines():
                try:
                    out.append((i, json.loads(line)))
                except ValueError:
                    continue  # a SIGKILLed member's last half line
    return out


def test_members_as_processes_keep_key_order_through_a_join_a_leave_a_failover_and_a_sigkill(
        cluster, zk, zk_connect, data_dir, tmp_path, subprocess_env):
    cluster.node("n1")
    cluster.node("n2")
    # Enough records that the first member, alone for a while, cannot finish the partitions
    # the third is given before it joins (it did in one run of eight at 400 and 0.03 s each).
    parts, per = 4, 800
    fill(data_dir, "t", [per] * parts, zk=zk, key=key_of)
    outs = [str(tmp_path / f"m{i}.jsonl") for i in range(3)]

    def spawn(i, delay=0.03):
        p = subprocess.Popen([sys.executable, "-c", MEMBER, zk_connect, data_dir, outs[i], str(delay)],
                             env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        cluster.procs.append(p)  # killed at the end, also when the test fails
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        return p

    def processed():
        return len({(e["p"], e["o"]) for _, e in read_events(outs) if e["e"] == "end"})

    def by(i):
        return sum(1 for m, e in read_events(outs) if m == i and e["e"] == "end")

    a = spawn(0, delay=0.06)
    wait_for(lambda: by(0) >= 100, 30, message="the first member under way")
    b = spawn(1)  # a join
    wait_for(lambda: by(1) >= 50, 30, message="the second member under way")
    b.send_signal(15)  # a clean leave: SIGTERM
    assert b.wait(30) == 0
    cluster.leader().close()  # a coordinator failover: the other node rebalances the third member in
    c = spawn(2)
    wait_for(lambda: by(2) >= 50, 30, message="a third member under way")
    c.kill()  # SIGKILL: its in-flight records are redone by the next owner
    c.wait()
    wait_for(lambda: committed(zk, "g", "t", parts) == {p: per for p in range(parts)}, 60,
             message="everything committed")
    a.send_signal(15)
    assert a.wait(30) == 0
    events = read_events(outs)
    assert processed() == parts * per
    assert {i for i, _ in events} == {0, 1, 2}  # each member had partitions
    # Per-key order: within a key, a record starts only after the one before it ended (on any member).
    by_key = collections.defaultdict(list)
    for i, e in events:
        by_key[(e["p"], e["k"])].append((e["t"], e["e"], e["o"], i))
    for lane, evs in by_key.items():
        running = set()
        for _, kind, o, i in sorted(evs):
            if kind == "start":
                stuck = {r for r in running if r[1] == 2}  # the SIGKILLed member's, never ended
                assert running == stuck, (lane, o, running)
                running = {(o, i)}
            else:
                running.discard((o, i))
    # Redelivered: only what the SIGKILLed member had started and not committed (its in-flight records
    # and those finished in its last commit interval).
    starts = collections.Counter((e["p"], e["o"]) for _, e in events if e["e"] == "start")
    again = [k for k, n in starts.items() if n > 1]
    by_c = {(e["p"], e["o"]) for i, e in events if i == 2 and e["e"] == "start"}
    assert set(again) <= by_c
    assert len(again) <= 16 + 16 * 0.2 / 0.03 + 16, len(again)  # in flight, and a commit interval's worth
