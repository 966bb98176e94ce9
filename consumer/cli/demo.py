"""The live demo (``bin/demo``): real ZooKeeper, three coordinatord nodes, a producer and
consumers as separate processes; a consumer joins, a consumer is SIGKILLed, the leader is
SIGKILLed — every rebalance is printed as it happens, and at the end every produced record
is checked to have been consumed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import click
from kazoo.exceptions import NoNodeError
from kazoo.recipe.watchers import DataWatch

from coordinator import protocol, read
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from coordinator.testing.zkserver import provide_zookeeper
from consumer.log import Log
from consumer.member import new_consumer_id
from consumer.producer import Producer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPIC, GROUP, PARTITIONS = "demo", "demo-group", 6
SESSION_MS = 2000


def say(msg: str) -> None:
    click.echo(f"[{time.strftime('%H:%M:%S')}] {msg}")


class Processes:
    def __init__(self, connect: str, data_dir: str, workdir: str):
        self.connect, self.data_dir, self.workdir = connect, data_dir, workdir
        self.env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
        self.procs = {}

    def coordinator(self, name: str) -> None:
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "coordinator.cli.coordinatord", "--zk", self.connect, "--node-id", name,
             "--session-timeout-ms", str(SESSION_MS), "--rebalance-timeout-ms", "5000"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.workdir, f"{name}.log"), "w"))

    def consumer(self, name: str, client, names) -> None:
        """Start consumer ``name`` and wait until it registered."""
        consumer_id = new_consumer_id(GROUP)
        names[consumer_id] = name
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "consumer.cli.groupctl", "--zk", self.connect, "--data-dir", self.data_dir,
             "consume", GROUP, TOPIC, "--idle-exit", "4", "--session-timeout-ms", str(SESSION_MS),
             "--consumer-id", consumer_id],
            env=self.env, stdout=open(os.path.join(self.workdir, f"{name}.jsonl"), "w"),
            stderr=open(os.path.join(self.workdir, f"{name}.log"), "w"))
        wait_until(lambda: consumer_id in members(client), 30, f"{name} to register")

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def consumed(self):
        seen = Counter()
        for name in self.procs:
            path = os.path.join(self.workdir, f"{name}.jsonl")
            if os.path.exists(path):
                with open(path) as f:
                    for line in f:
                        try:
                            r = json.loads(line)
                        except ValueError:
                            continue  # a line cut by SIGKILL
                        seen[(r["partition"], r["offset"])] += 1
        return seen

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()


def watch_rebalances(client, names):
    """Print every change of the group's state as it happens."""
    last = {}

    def changed(data, stat):
        if not data:
            return
        s = protocol.GroupState.decode(data, protocol.state_path(GROUP))
        key = (s.generation, s.state)
        if key == last.get("key"):
            return
        last["key"] = key
        shares = Counter(protocol.consumer_of_stream(st) for parts in s.assignment.values() for st in parts.values())
        who = ", ".join(f"{names.get(c, c[-8:])}:{n}" for c, n in sorted(shares.items(), key=lambda x: names.get(x[0], x[0])))
        say(f"  group {GROUP} generation {s.generation} {s.state}: {len(s.members)} members"
            + (f" — partitions {who}" if who and s.state == protocol.STABLE else ""))
    DataWatch(client, protocol.state_path(GROUP), changed)


def leader(client):
    info = read.leader(client)
    if info is None:
        raise NoNodeError(protocol.LEADER)  # callers wait for a leader
    return info


def wait_until(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise click.ClickException(f"timed out waiting for {what}")
        time.sleep(0.05)


def members(client):
    return read.children(client, protocol.ids_path(GROUP))


def run_pipeline(procs: Processes, workdir: str) -> None:
    """Last step: the same topic through a consumer group on Spark (bin/pipeline), written
    exactly once as Parquet."""
    out = os.path.join(workdir, "pipeline")
    say("Spark: bin/pipeline reads the topic through group demo-pipeline (2 foreachPartition workers)")
    result = subprocess.run(
        [sys.executable, "-m", "consumer.cli.pipeline", "--zk", procs.connect, "--data-dir", procs.data_dir,
         "--group", "demo-pipeline", "--topic", TOPIC, "--out", out, "--workers", "2"],
        env=procs.env, capture_output=True, text=True, timeout=600)
    for line in result.stdout.strip().splitlines():
        click.echo(f"    {line}")
    if result.returncode != 0:
        raise click.ClickException(f"the Spark pipeline failed: {result.stderr.strip().splitlines()[-1:]}")
    say(f"Spark pipeline done: Parquet records and per-key counts under {out}")


@click.command()
@click.option("--rate", default=500, show_default=True, help="Records produced per second.")
@click.option("--keep", is_flag=True, help="Keep the work directory (logs, consumed records, Parquet output).")
@click.option("--spark/--no-spark", default=True, show_default=True,
              help="End with the Spark pipeline over the same topic.")
def main(rate, keep, spark):
    """Run the zkgroups live demo."""
    import logging
    logging.basicConfig(level=logging.ERROR)
    workdir = tempfile.mkdtemp(prefix="zkgroups-demo-")
    data_dir = os.path.join(workdir, "data")
    os.makedirs(data_dir)
    say(f"work directory {workdir}")
    with provide_zookeeper(tick_ms=200) as zk:
        say(f"ZooKeeper at {zk.connect}")
        client = start_client(zk.connect)
        procs = Processes(zk.connect, data_dir, workdir)
        names = {}
        stop_producing = threading.Event()
        produced = Counter()
        try:
            TopicRegistry(client).create(TOPIC, PARTITIONS)
            say(f"topic {TOPIC} created with {PARTITIONS} partitions (Kafka's /brokers/topics format)")
            for n in ("coord-1", "coord-2", "coord-3"):
                procs.coordinator(n)
            wait_until(lambda: client.exists(protocol.LEADER), 20, "a leader")
            say(f"coordinators up; leader is {leader(client).node_id} (epoch {leader(client).epoch})")
            watch_rebalances(client, names)

            def produce():
                with Producer(client, data_dir) as p:
                    i = 0
                    while not stop_producing.is_set():
                        p.send(TOPIC, f"record-{i}".encode(), key=f"key-{i % 50}".encode())
                        i += 1
                        if i % 50 == 0:
                            p.flush()
                            time.sleep(50 / rate)
                    produced["records"] = i
            producer = threading.Thread(target=produce, daemon=True)
            producer.start()
            say(f"producer writing ~{rate} records/s")

            for n in ("consumer-1", "consumer-2"):
                procs.consumer(n, client, names)
                say(f"{n} started")
            time.sleep(3)
            procs.consumer("consumer-3", client, names)
            say("consumer-3 joined")
            time.sleep(3)
            say("SIGKILL consumer-2 (its partitions move when its session expires)")
            procs.kill("consumer-2")
            wait_until(lambda: len(members(client)) == 2, 30, "consumer-2's expiry")
            time.sleep(3)
            old = leader(client)
            say(f"SIGKILL the leader {old.node_id}")
            procs.kill(old.node_id)
            wait_until(lambda: client.exists(protocol.LEADER) and leader(client).epoch > old.epoch, 30, "a new leader")
            say(f"new leader {leader(client).node_id} (epoch {leader(client).epoch}); consumers kept fetching")
            time.sleep(3)
            stop_producing.set()
            producer.join()
            say(f"producer stopped after {produced['records']} records; waiting for consumers to drain")
            for n in ("consumer-1", "consumer-3"):
                procs.procs[n].wait(timeout=120)
            log = Log(data_dir)
            ends = {p: log.latest_offset(TOPIC, p) for p in range(PARTITIONS)}
            log.close()
            seen = procs.consumed()
            expected = {(p, o) for p, end in ends.items() for o in range(end)}
            missing = expected - set(seen)
            duplicates = sum(n - 1 for n in seen.values() if n > 1)
            committed = [int(client.get(protocol.offsets_path(GROUP, TOPIC, p))[0]) for p in range(PARTITIONS)]
            say(f"produced {sum(ends.values())}, consumed {len(set(seen))} distinct, "
                f"{duplicates} duplicates (at-least-once redelivery after the SIGKILL), missing {len(missing)}")
            say(f"committed offsets {committed} == end offsets {[ends[p] for p in range(PARTITIONS)]}: "
                f"{committed == [ends[p] for p in range(PARTITIONS)]}")
            if missing or committed != [ends[p] for p in range(PARTITIONS)]:
                raise click.ClickException("not every record was consumed")
            say("OK: every produced record was consumed")
            if spark:
                run_pipeline(procs, workdir)
        finally:
            stop_producing.set()
            procs.close()
            close_client(client)
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
