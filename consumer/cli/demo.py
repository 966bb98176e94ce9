"""The live demo (``bin/demo``): real ZooKeeper, three coordinatord nodes, a producer and
consumers as separate processes; a consumer joins, a consumer is SIGKILLed, the node
coordinating the group is SIGKILLed — every rebalance is printed as it happens, and at the end every produced record
is checked to have been consumed (against the data plane's end offsets), then the Spark
pipeline reads the topic once more. Every node serves the read-only console (its URL is
printed first; at the end it shows the groups, one with its rebalance history); ``--hold``
keeps it running until Ctrl-C.

``--data-plane embedded`` (the default): the records are in the embedded log under the work
directory, and the demo registers the topic in ZooKeeper. ``--data-plane kafka``: the records
are on librdkafka's mock Kafka cluster (3 brokers in a child process of the demo: real Kafka
protocol, data in memory, at most ~5 MiB a partition — the demo writes a few hundred KiB);
the topic is created there and the coordinators mirror it into ZooKeeper as they do for a
KRaft cluster (``coordinatord --bootstrap-servers``); the producer writes Kafka, the
consumers are ``groupctl consume`` processes with ``KAFKA_BOOTSTRAP_SERVERS``, and the Spark
workers read Kafka too.

``--zk-tls``: ZooKeeper serves TLS only (a local install; certificates from a throwaway CA in
the work directory) and every process of the demo connects over TLS (the tools through
``ZK_TLS_*``), the Spark pipeline's driver and workers included.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter

import click
from kazoo.exceptions import NoNodeError
from kazoo.recipe.watchers import DataWatch

from coordinator import protocol, read
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from coordinator.cli.common import version_option
from coordinator.testing.zkserver import Ensemble, provide_zookeeper
from consumer.dataplane import ENV_BOOTSTRAP_SERVERS, open_data_plane
from consumer.member import new_consumer_id
from consumer.producer import Producer
from consumer.records import TopicPartition

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPIC, GROUP, PARTITIONS = "demo", "demo-group", 6
SESSION_MS = 2000
METRICS_LINE = re.compile(r"metrics served at (http://\S+)")
CONSOLE_LINE = re.compile(r"console at (http://\S+)")
AUDIT_GROUP = "demo-audit"  # a second group, reading the same topic until the end
#: The lines of a scrape the demo shows at the end.
SCRAPE_EXCERPT = re.compile(r"^(zkgroups_controller |zkgroups_rebalances_total\{group=\"%s\"|"
                            r"zkgroups_group_generation\{group=\"%s\"})" % (GROUP, GROUP))


def say(msg: str) -> None:
    click.echo(f"[{time.strftime('%H:%M:%S')}] {msg}")


class DataPlaneSetup:
    """Where the demo's records are: the embedded log under ``<workdir>/data``, or librdkafka's
    mock Kafka cluster (started by :meth:`start`, stopped by :meth:`close`)."""

    def __init__(self, kind: str, workdir: str):
        self.kind = kind
        self.data_dir = os.path.join(workdir, "data")
        self.cluster = None
        self.bootstrap_servers = ""  # "": the embedded log

    @property
    def on_kafka(self) -> bool:
        return self.kind == "kafka"

    def start(self) -> None:
        if not self.on_kafka:
            os.makedirs(self.data_dir)
            return
        from coordinator.testing.kafkamock import MockKafkaCluster, MockKafkaUnavailable
        try:
            self.cluster = MockKafkaCluster(brokers=3).start()
        except MockKafkaUnavailable as e:
            raise click.ClickException(str(e)) from None
        self.bootstrap_servers = self.cluster.bootstrap_servers
        say(f"Kafka: librdkafka's mock cluster, 3 brokers at {self.bootstrap_servers} "
            "(real Kafka protocol, records in memory)")

    def create_topic(self, client) -> None:
        if self.on_kafka:
            self.cluster.create_topic(TOPIC, PARTITIONS)
            say(f"topic {TOPIC} created on Kafka with {PARTITIONS} partitions")
        else:
            TopicRegistry(client).create(TOPIC, PARTITIONS)
            say(f"topic {TOPIC} created with {PARTITIONS} partitions (Kafka's /brokers/topics format)")

    def env(self) -> dict:
        """The children's environment: Kafka's brokers in ``KAFKA_BOOTSTRAP_SERVERS``, or none."""
        env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
        env.pop(ENV_BOOTSTRAP_SERVERS, None)
        if self.on_kafka:
            env[ENV_BOOTSTRAP_SERVERS] = self.bootstrap_servers
        return env

    def coordinator_args(self) -> list:
        """coordinatord mirrors Kafka's topics into ZooKeeper (it never reads the environment for that)
        and its console reads lag from Kafka; on the embedded log, from its directory."""
        return ["--bootstrap-servers", self.bootstrap_servers] if self.on_kafka else ["--data-dir", self.data_dir]

    def client_args(self) -> list:
        """groupctl's and pipeline's: Kafka comes from the environment; the log from --data-dir."""
        return [] if self.on_kafka else ["--data-dir", self.data_dir]

    def producer(self, client) -> Producer:
        return Producer(client, self.data_dir, bootstrap_servers=self.bootstrap_servers)

    def end_offsets(self, client) -> dict:
        """{partition: end offset}: the embedded log's, or Kafka's log-end offsets."""
        with open_data_plane(data_dir=self.data_dir, bootstrap_servers=self.bootstrap_servers, zk=client) as plane:
            ends = plane.latest_offsets([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        return {tp.partition: offset for tp, offset in ends.items()}

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()


class Processes:
    def __init__(self, connect: str, plane: DataPlaneSetup, workdir: str):
        self.connect, self.plane, self.workdir = connect, plane, workdir
        self.env = plane.env()
        self.procs = {}

    def coordinator(self, name: str) -> None:
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "coordinator.cli.coordinatord", "--zk", self.connect, "--node-id", name,
             "--session-timeout-ms", str(SESSION_MS), "--rebalance-timeout-ms", "5000", "--http-addr", "127.0.0.1:0",
             "--lag-interval", "2", *self.plane.coordinator_args()],
            env=self.env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.workdir, f"{name}.log"), "w"))

    def metrics_url(self, name: str) -> str:
        """Where coordinator ``name`` serves its metrics (the line its log starts with)."""
        return self._logged_url(name, METRICS_LINE, "metrics endpoint")

    def console_url(self, name: str) -> str:
        """Where coordinator ``name`` serves its console (logged once it is connected)."""
        return self._logged_url(name, CONSOLE_LINE, "console")

    def _logged_url(self, name: str, line: "re.Pattern", what: str) -> str:
        path = os.path.join(self.workdir, f"{name}.log")
        found = {}

        def served():
            with open(path) as f:
                found["url"] = next((m.group(1) for m in map(line.search, f) if m), None)
            return found["url"]
        wait_until(served, 20, f"{name}'s {what}")
        return found["url"]

    def consumer(self, name: str, client, names, group: str = GROUP, idle_exit: bool = True) -> None:
        """Start consumer ``name`` and wait until it registered."""
        consumer_id = new_consumer_id(group)
        names[consumer_id] = name
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "consumer.cli.groupctl", "--zk", self.connect, *self.plane.client_args(),
             "consume", group, TOPIC, *(["--idle-exit", "4"] if idle_exit else []), "--session-timeout-ms",
             str(SESSION_MS), "--consumer-id", consumer_id],
            env=self.env, stdout=open(os.path.join(self.workdir, f"{name}.jsonl"), "w"),
            stderr=open(os.path.join(self.workdir, f"{name}.log"), "w"))
        wait_until(lambda: consumer_id in read.children(client, protocol.ids_path(group)), 30, f"{name} to register")

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def consumed(self):
        seen = Counter()
        for name in [n for n in self.procs if n.startswith("consumer-")]:
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


def scrape_excerpt(url: str):
    """The controller gauge and the demo group's rebalance counters of one node's scrape."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return [line for line in text.splitlines() if SCRAPE_EXCERPT.match(line)]


def leader(client):
    info = read.leader(client)
    if info is None:
        raise NoNodeError(protocol.LEADER)  # callers wait for a leader
    return info


def wait_until(pred, timeout, what):
    """``pred()``'s first truthy value, polled until ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if time.monotonic() > deadline:
            raise click.ClickException(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def group_shard_leader(client):
    """(node, shard epoch, verified) of the node leading the demo group's shard."""
    shard = protocol.shard_of(GROUP, read.shard_count(client) or 1)
    return read.shard_leaders(client).get(shard, ("", 0, False))


def members(client):
    return read.children(client, protocol.ids_path(GROUP))


def run_pipeline(procs: Processes, workdir: str) -> None:
    """Last step: the same topic through a consumer group on Spark (bin/pipeline), written
    exactly once as Parquet."""
    out = os.path.join(workdir, "pipeline")
    say("Spark: bin/pipeline reads the topic through group demo-pipeline (2 foreachPartition workers"
        + (", reading Kafka)" if procs.plane.on_kafka else ")"))
    result = subprocess.run(
        [sys.executable, "-m", "consumer.cli.pipeline", "--zk", procs.connect, *procs.plane.client_args(),
         "--group", "demo-pipeline", "--topic", TOPIC, "--out", out, "--workers", "2"],
        env=procs.env, capture_output=True, text=True, timeout=600)
    for line in result.stdout.strip().splitlines():
        click.echo(f"    {line}")
    if result.returncode != 0:
        raise click.ClickException(f"the Spark pipeline failed: {result.stderr.strip().splitlines()[-1:]}")
    say(f"Spark pipeline done: Parquet records and per-key counts under {out}")


class BackgroundProducer:
    """Writes ~``rate`` records a second to the topic, on its own thread, until stopped."""

    def __init__(self, plane: DataPlaneSetup, client, rate: int):
        self.plane, self.client, self.rate = plane, client, rate
        self.stopping = threading.Event()
        self.produced = 0
        self._thread = threading.Thread(target=self._produce, daemon=True)

    def start(self) -> None:
        self._thread.start()
        say(f"producer writing ~{self.rate} records/s")

    def stop(self) -> int:
        """Stop writing; how many records were written."""
        self.stopping.set()
        self._thread.join()
        return self.produced

    def _produce(self) -> None:
        with self.plane.producer(self.client) as p:
            i = 0
            while not self.stopping.is_set():
                p.send(TOPIC, f"record-{i}".encode(), key=f"key-{i % 50}".encode())
                i += 1
                if i % 50 == 0:
                    p.flush()
                    time.sleep(50 / self.rate)
            self.produced = i


COORDINATORS = ("coord-1", "coord-2", "coord-3")


def start_coordinators(procs: Processes, client):
    """Start the three coordinatord nodes; (metrics URLs, console URLs) by node, once served."""
    for n in COORDINATORS:
        procs.coordinator(n)
    wait_until(lambda: client.exists(protocol.LEADER), 20, "a leader")
    say(f"coordinators up; the controller is {leader(client).node_id} (epoch {leader(client).epoch}); "
        f"groups are spread over {read.shard_count(client) or '?'} shards on 3 nodes")
    metrics = {n: procs.metrics_url(n) for n in COORDINATORS}
    say("Prometheus metrics: " + ", ".join(f"{n} {url}" for n, url in metrics.items()))
    consoles = {n: procs.console_url(n) for n in COORDINATORS}
    say(f"console: {consoles['coord-1']} (read-only: groups, members, owners, lag, rebalance timeline; "
        f"every node serves one: {', '.join(consoles[n] for n in ('coord-2', 'coord-3'))})")
    if procs.plane.on_kafka:
        wait_until(lambda: client.exists(protocol.topic_path(TOPIC)), 20, "the topic mirror")
        say(f"the controller mirrored topic {TOPIC} from Kafka into {protocol.topic_path(TOPIC)} "
            "(as for a KRaft cluster)")
    return metrics, consoles


def start_consumers(procs: Processes, client, names) -> None:
    """The auditor (its own group, until the end), two consumers, then a third joining."""
    procs.consumer("auditor", client, names, group=AUDIT_GROUP, idle_exit=False)
    say(f"auditor started: group {AUDIT_GROUP} reads the topic too, until the end")
    for n in ("consumer-1", "consumer-2"):
        procs.consumer(n, client, names)
        say(f"{n} started")
    time.sleep(3)
    procs.consumer("consumer-3", client, names)
    say("consumer-3 joined")
    time.sleep(3)


def kill_a_consumer(procs: Processes, client) -> None:
    """SIGKILL consumer-2 and wait until its session expired."""
    say("SIGKILL consumer-2 (its partitions move when its session expires)")
    procs.kill("consumer-2")
    wait_until(lambda: len(members(client)) == 2, 30, "consumer-2's expiry")
    time.sleep(3)


def kill_the_group_coordinator(procs: Processes, client, consoles) -> str:
    """SIGKILL the node coordinating the group (and, if it is, the controller); wait for its
    successors. The killed node's name."""
    node, epoch, _ = wait_until(lambda: group_shard_leader(client)[0] and group_shard_leader(client),
                                20, "the group's coordinator")
    controller = leader(client)
    also = ", also the controller" if controller.node_id == node else ""
    say(f"SIGKILL {node}, the node coordinating group {GROUP}{also}")
    procs.kill(node)
    now, now_epoch, _ = wait_until(
        lambda: (lambda led: led[0] not in ("", node) and led[2] and led)(group_shard_leader(client)),
        30, "the group's new coordinator")
    say(f"group {GROUP} is coordinated by {now} now (shard epoch {epoch} -> {now_epoch}); "
        "consumers kept fetching; its rebalance timeline, kept in ZooKeeper, is on "
        f"{consoles[now]}groups/{GROUP}")
    if also:
        wait_until(lambda: client.exists(protocol.LEADER) and leader(client).epoch > controller.epoch, 30,
                   "a new controller")
        say(f"new controller {leader(client).node_id} (epoch {leader(client).epoch})")
    return node


def stop_producing_and_drain(procs: Processes, producer: BackgroundProducer) -> None:
    """Stop the producer; wait until the group's consumers ran idle and exited."""
    produced = producer.stop()
    say(f"producer stopped after {produced} records; waiting for consumers to drain")
    for n in ("consumer-1", "consumer-3"):
        procs.procs[n].wait(timeout=120)


def check_every_record_consumed(procs: Processes, client, plane: DataPlaneSetup) -> None:
    """Every offset below the data plane's ends was consumed and committed (else exit 1)."""
    ends = plane.end_offsets(client)
    seen = procs.consumed()
    expected = {(p, o) for p, end in ends.items() for o in range(end)}
    missing = expected - set(seen)
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    committed = [int(client.get(protocol.offsets_path(GROUP, TOPIC, p))[0]) for p in range(PARTITIONS)]
    say(f"produced {sum(ends.values())}, consumed {len(set(seen))} distinct, "
        f"{duplicates} duplicates (at-least-once redelivery after the SIGKILL), missing {len(missing)}")
    ends_name = "Kafka's log-end offsets" if plane.on_kafka else "end offsets"
    say(f"committed offsets {committed} == {ends_name} {[ends[p] for p in range(PARTITIONS)]}: "
        f"{committed == [ends[p] for p in range(PARTITIONS)]}")
    if missing or committed != [ends[p] for p in range(PARTITIONS)]:
        raise click.ClickException("not every record was consumed")
    say("OK: every produced record was consumed")


def show_metrics(metrics, killed: str) -> None:
    """An excerpt of every surviving node's scrape."""
    for n, url in metrics.items():
        if n != killed:
            say(f"metrics of {n} (excerpt):")
            for line in scrape_excerpt(url):
                click.echo(f"    {line}")


def show_console(client, consoles, killed: str) -> None:
    """Where a surviving node's console shows the group's rebalance timeline."""
    survivor = next(n for n in consoles if n != killed)
    history = protocol.decode_timeline(client.get(protocol.timeline_path(GROUP))[0],
                                       protocol.timeline_path(GROUP))
    say(f"console: {consoles[survivor]} — group {GROUP}: {len(history)} rebalances in its timeline "
        f"({', '.join(sorted({r for e in history for r in e.reasons}))}); group {AUDIT_GROUP} still "
        "consuming")


def hold_until_interrupted() -> None:
    say("holding: the coordinators and the console keep running; Ctrl-C ends the demo")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


@click.command()
@click.option("--rate", default=500, show_default=True, help="Records produced per second.")
@click.option("--keep", is_flag=True, help="Keep the work directory (logs, consumed records, Parquet output).")
@click.option("--spark/--no-spark", default=True, show_default=True,
              help="End with the Spark pipeline over the same topic.")
@click.option("--data-plane", type=click.Choice(["embedded", "kafka"]), default="embedded", show_default=True,
              help="Where the records are: the embedded log, or librdkafka's mock Kafka cluster.")
@click.option("--hold", is_flag=True,
              help="At the end, keep the coordinators and the console running (until Ctrl-C) to look around.")
@click.option("--zk-tls", is_flag=True,
              help="ZooKeeper with a TLS port only (a throwaway CA); every process connects over TLS.")
@version_option
def main(rate, keep, spark, data_plane, hold, zk_tls):
    """Run the zkgroups live demo."""
    import logging
    logging.basicConfig(level=logging.ERROR)
    workdir = tempfile.mkdtemp(prefix="zkgroups-demo-")
    say(f"work directory {workdir}")
    plane = DataPlaneSetup(data_plane, workdir)
    with _zookeeper(zk_tls, workdir) as (connect, tls):
        say(f"ZooKeeper at {connect}" + (" (TLS only: client certificates from a throwaway CA)" if tls else ""))
        client = start_client(connect, tls=tls)
        procs = None
        names = {}
        producer = BackgroundProducer(plane, client, rate)
        try:
            plane.start()
            procs = Processes(connect, plane, workdir)
            if tls:  # the tools' TLS setting, from the environment
                procs.env.update({"ZK_TLS_CA": tls["ca"], "ZK_TLS_CERT": tls["cert"], "ZK_TLS_KEY": tls["key"]})
            plane.create_topic(client)
            metrics, consoles = start_coordinators(procs, client)
            watch_rebalances(client, names)
            producer.start()
            start_consumers(procs, client, names)
            kill_a_consumer(procs, client)
            killed = kill_the_group_coordinator(procs, client, consoles)
            time.sleep(3)
            stop_producing_and_drain(procs, producer)
            check_every_record_consumed(procs, client, plane)
            show_metrics(metrics, killed)
            if spark:  # over TLS too: bin/pipeline reads ZK_TLS_* and hands its workers the file names
                run_pipeline(procs, workdir)
            show_console(client, consoles, killed)
            if hold:
                hold_until_interrupted()
        finally:
            producer.stopping.set()
            if procs is not None:
                procs.close()
            close_client(client)
            plane.close()
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def _zookeeper(tls: bool, workdir: str):
    """(connect string, the demo's zk_tls or None): a TLS-only local server with --zk-tls."""
    if not tls:
        with provide_zookeeper(tick_ms=200) as zk:
            yield zk.connect, None
        return
    with Ensemble(1, tick_ms=200, workdir=os.path.join(workdir, "zookeeper"), tls=True) as ensemble:
        yield ensemble.connect, ensemble.client_tls("demo")


if __name__ == "__main__":
    main()
