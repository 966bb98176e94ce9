"""``bin/chaos``: a randomized fault run of a whole zkgroups deployment, judged afterwards by
ZooKeeper's own transaction log.

    bin/chaos [--seed N] [--duration SECONDS] [--consumers 5] [--share-consumers 4] [--partitions 8] [--keep]
              [--data-plane embedded|kafka] [--network auto|namespaces|shared] [--faults KIND,...] [--zk-tls]
    bin/chaos --judge RUN_DIR      (judge a kept run again, e.g. after changing the referee)

The cluster: a 3-server ZooKeeper ensemble (``tickTime`` 200 ms), three ``coordinatord``
nodes, a producer writing uniquely numbered records (:mod:`tests.chaos.producer`) and
``--consumers`` processes of ``groupctl consume GROUP TOPIC --with-metadata``, each with a
consumer id of its own. Everything runs under the chroot ``/chaos``. The records are in the
embedded log on disk, or (``--data-plane kafka``) on librdkafka's mock Kafka cluster, in a
process of its own (3 brokers; the coordinators mirror the topic into ZooKeeper as for KRaft).

The share round (``--share-consumers N``, 4 by default on the embedded log; 0 turns it off, and
it is not made on Kafka yet, where the referee cannot read the dead letters' headers back): a
share group ``chaos-share`` on the same topic (``share.auto.offset.reset`` earliest, a 3 s
lock, a delivery limit of 3, the dead-letter topic ``records-dlq`` of 2 partitions), and N
processes of ``groupctl share-consume chaos-share records --process-ms 2 --reject-when
key=reject --release-when key=retry --release-delay-ms 500``. The producer keys 1 record in 50
``reject`` (archived as rejected, dead-lettered) and 1 in 50 ``retry`` (released with a 500 ms
delay each time, archived at the limit). The workers are victims of ``kill``, ``term``,
``pause`` and the consumer cuts as the consumers are (a pause, 3-5 s, outlasts the lock: the
lock expires, the late acknowledgement is refused, the record goes to another worker), and are
replaced the same way. It is on by default so that every run, the long ones too, has share
groups among the faults; the consumer group's figures and drain are unchanged by it (its
workers add 4 light processes).

The network (``--network``; ``auto``, the default, is ``namespaces`` where the machine allows
them, else ``shared`` with one line saying why): with ``namespaces`` every ZooKeeper server,
``coordinatord`` node, consumer process and the Kafka mock runs in a network namespace of its
own, joined to the others by a bridge (:mod:`tests.chaos.network`), so a link can be cut while
the processes on both ends keep running; the embedded log stays on the shared disk and the Kafka
brokers stay reachable, so a consumer cut from ZooKeeper keeps its data plane. With ``shared``
all processes share the host's network and the partition faults are stood in for by the
process faults (``cut-consumer``, ``cut-oneway``: ``pause``; ``cut-controller``, ``cut-node``:
``leader-kill``; ``zk-minority``: ``zk-restart``).

The nemesis, every 2-4 s, with an RNG seeded by ``--seed`` (faults that cannot be made at the
moment, e.g. a leader kill while no leader is registered, are retried at the next tick):

* ``kill``: SIGKILL a consumer, start a replacement;
* ``term``: SIGTERM a consumer (it leaves cleanly), start a replacement;
* ``pause``: SIGSTOP a consumer for its session timeout plus 1-3 s, then SIGCONT;
* ``leader-kill``: SIGKILL the leading ``coordinatord`` (its pid from the leader znode), restart it;
* ``zk-restart``: SIGKILL one ZooKeeper server, restart it 2-5 s later;
* ``quorum-loss``: once per run, SIGKILL two servers, restart them 3-5 s later;
* ``cut-consumer``: drop every packet between a consumer and the ZooKeeper servers, both ways,
  for 2-3x the session timeout, then heal;
* ``cut-oneway``: the same, but only ZooKeeper's answers are dropped (requests reach it);
* ``cut-controller``: cut the controller (the ``coordinatord`` in the leader znode) from
  ZooKeeper while it leads shards, for 2-3x the session timeout;
* ``cut-node``: the same for a node that leads shards and is not the controller;
* ``zk-minority``: cut one ZooKeeper server from the other two (all their traffic) for 2-3x
  the session timeout: its clients must move to the majority or wait;
* ``broker-down`` (Kafka only): take a broker down for 2-5 s, then up.

At each heal of a cut, at random (half the time), every TCP connection between the victim and
the peers it was cut from is reset at both ends, as a router that lost its state answers.

The first faults are every kind of the run once, in a seeded order (``--faults`` gives the
kinds and that first order instead; the nemesis goes on past ``--duration``, by 60 s at most,
until each happened), then kinds are drawn at random (no second quorum loss). Then everything
is healed (each fault still under way runs its course), the producer stopped, the consumers
drain until the group's committed offsets reach the end offsets (the log's, or Kafka's high
watermarks) and every share-partition's start reaches them too (everything accepted or archived,
its dead letters written; one bound, ``--drain-timeout``, for both), and are stopped with
SIGTERM, the coordinators too, and ZooKeeper. The referee (:mod:`tests.chaos.judge`, checks in
:mod:`tests.chaos.referee`, and the share round's in :mod:`tests.chaos.share_referee`: none
lost, no second holder while the first holds, no delivery past the limit, at most one ACCEPT,
the dead-letter topic holding exactly the archived records, no redelivery before its delay)
reads the servers' transaction logs, every printed line and every exit; the run prints one
verdict line (and one line per failed check) and the run directory.
Exit status: 0 on pass, 1 on fail, 2 when the run itself could not be made.

Run directory (``--run-dir``, else a new one under the system's temp dir): ``logs/`` (one
file per process: ``consumer-NNN.out`` holds its printed records, ``.log`` its stderr;
``share-NNN.out`` a share worker's;
``harness.log``), ``nemesis.log`` (every fault and process event, wall-clock seconds, to set
beside the records' ``at``), ``run.json``, ``referee/`` (``verdict.txt``, one file per check,
``ownership.txt``), ``zk/serverN/`` (each server's ``server.log`` and its bulky ``data/``) and
the bulky ``data/`` (the topic on the embedded log) or ``kafka-topic.json`` (the topic as read
back from Kafka at the end). All is kept, except the bulky parts after a pass without ``--keep``.

Not covered: partitions between a consumer or a node and the data plane (the log is a local
disk; Kafka's brokers are only ever taken down whole), between coordinators and consumers
directly (they talk only through ZooKeeper), packet loss, delay or reordering short of a cut,
clock jumps, disk faults, and a producer under faults (it needs ZooKeeper only at start, and
Kafka's producer only brokers).
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from kazoo.exceptions import NoNodeError

from consumer.dataplane import ENV_BOOTSTRAP_SERVERS
from consumer.log import Log
from consumer.share import configure_share_group
from coordinator import protocol
from coordinator.protocol.share import SharePartitionState, share_members_path, share_partitions_path
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from coordinator.testing.zkserver import STANDARD_PORTS, Ensemble, ZooKeeperNotFound, die_with_parent
from tests.chaos import judge, kafkatopic, network, producer, referee
from tests.chaos.judge import KAFKA_KINDS, KINDS, PARTITION_KINDS, PROCESS_KINDS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROOT = "/chaos"
GROUP = "chaos"
TOPIC = "records"
# Weights of the kinds drawn after the first round (quorum loss happens once).
REPEATED = {"kill": 3, "term": 2, "pause": 3, "leader-kill": 2, "zk-restart": 2, "cut-consumer": 3,
            "cut-oneway": 2, "cut-controller": 1, "cut-node": 1, "zk-minority": 1, "broker-down": 2}
# Without namespaces a partition is stood in for by the process fault closest to it.
STAND_INS = {"cut-consumer": "pause", "cut-oneway": "pause", "cut-controller": "leader-kill",
             "cut-node": "leader-kill", "zk-minority": "zk-restart"}
CUT_SESSIONS = (2.0, 3.0)  # a cut lasts this many session timeouts
RESET_AT_HEAL = 0.5        # the share of heals that reset the victim's connections
BROKERS = 3
WARMUP_S = 4.0
FAULT_GAP_S = (2.0, 4.0)
OVERTIME_S = 60.0        # the nemesis goes on past --duration until every kind happened (this long at most)
TERM_GRACE_S = 30.0      # a SIGTERMed process must exit within this
ZK_CALL_S = 3.0          # the harness's own ZooKeeper reads give up after this
TICK_S = 0.1
NODES = ("c1", "c2", "c3")
# The share round (--share-consumers): a share group on the same topic, its workers among the victims.
SHARE_GROUP = "chaos-share"
DEAD_LETTERS = "records-dlq"   # the share group's dead-letter topic
DEAD_LETTER_PARTITIONS = 2
SHARE_LOCK_MS = 3000           # shorter than a pause (session timeout + 1-3 s): locks expire under pauses
SHARE_DELIVERY_LIMIT = 3
SHARE_PROCESS_MS = 2           # each worker "works" this long per record
SHARE_RELEASE_DELAY_MS = 500   # a released ("retry") record is not delivered again before this
POISON_EVERY = 50              # the producer keys 1 in 50 records "reject" and 1 in 50 "retry"
CONSUMER_ROLES = ("consumer", "share-consumer")  # the victims of kill, term, pause and consumer cuts


@dataclass
class Options:
    seed: int
    duration: float = 120.0
    consumers: int = 5
    partitions: int = 8
    keep: bool = False
    rate: float = 200.0
    session_timeout_ms: int = 2000
    drain_timeout: float = 90.0
    run_dir: Optional[str] = None
    judge_only: Optional[str] = None  # a kept run directory to judge again
    data_plane: str = "embedded"      # embedded | kafka
    network: str = "auto"             # auto | namespaces | shared
    faults: Optional[List[str]] = None  # the kinds, in the order of the first round (None: all, shuffled)
    zk_tls: bool = False              # ZooKeeper serves TLS only; every process connects with a certificate
    share_consumers: int = 4          # groupctl share-consume workers of the share round (0: no share round)


@dataclass
class Proc:
    role: str
    name: str
    popen: subprocess.Popen
    log: str
    out: Optional[str] = None
    stopped_by: Optional[str] = None
    term_deadline: Optional[float] = None
    paused: bool = False
    note: str = ""
    end: Optional[referee.ProcessEnd] = None
    place: Optional[network.Place] = None  # its network namespace (None: the host's network)

    @property
    def alive(self) -> bool:
        return self.end is None and self.popen.poll() is None


@dataclass
class Pending:
    due: float
    what: str
    action: Callable[[], None]
    zookeeper: bool = False                 # heals a ZooKeeper fault (the next one waits for it)
    place: Optional[network.Place] = None   # heals a cut of this place


class ChaosRun:
    """One run: start, nemesis, heal, stop the producer, drain, stop (which leaves
    ``run.json`` for :func:`tests.chaos.judge.judge`). Single-threaded: the nemesis, the
    reaping of processes and the delayed actions (resumes, heals, restarts) all run in one loop.

    ``net`` is the run's network of namespaces, or None when everything shares the host's
    network; ``kinds`` the fault kinds of the run, ``plan`` the first round in its order."""

    def __init__(self, options: Options, run_dir: str, net: Optional[network.Network] = None):
        self.o, self.dir, self.net = options, run_dir, net
        self.rng = random.Random(options.seed)
        self.logs = os.path.join(run_dir, "logs")
        self.data_dir = os.path.join(run_dir, "data")
        os.makedirs(self.logs, exist_ok=True)
        os.makedirs(self.data_dir, exist_ok=True)
        self.ensemble: Optional[Ensemble] = None
        self.tls: Optional[Dict[str, str]] = None  # with --zk-tls: the zk_tls of every client of the run
        self.kafka = None  # the MockKafkaCluster on the Kafka data plane
        self.bootstrap_servers = ""
        self.brokers_down: set = set()
        self.admin = None
        self.procs: List[Proc] = []
        self.pending: List[Pending] = []
        self.faults: Counter = Counter()
        self.resets_at_heal = 0
        self.plan = fault_plan(options, net is not None, self.rng)
        self.kinds = sorted(set(self.plan), key=KINDS.index)
        self.zk_places: List[network.Place] = []
        self.node_places: Dict[str, network.Place] = {}
        self.consumer_count = 0
        self.share_count = 0
        self.live_share: Optional[Dict[int, Optional[list]]] = None  # partition -> [start, end] ZooKeeper answered
        self.coordinator_starts: Counter = Counter()
        self.producer: Optional[Proc] = None
        self.replacing = True  # start a new process for one that exits on its own (until the end)
        self.produced_count: Optional[int] = None
        self.live_committed: Optional[Dict] = None
        self.notes: List[str] = []  # what went wrong in the harness's own steps, for the referee's files
        self._nemesis_log = open(os.path.join(run_dir, "nemesis.log"), "a")

    # ------------------------------------------------------------ helpers

    @property
    def connect(self) -> str:
        return self.ensemble.connect + CHROOT

    @property
    def on_kafka(self) -> bool:
        return self.o.data_plane == "kafka"

    def note(self, message: str) -> None:
        self.notes.append(message)
        self.say(message)

    def say(self, message: str) -> None:
        self._nemesis_log.write(f"{time.time():.3f} {message}\n")
        self._nemesis_log.flush()

    def _spawn(self, role: str, name: str, argv: List[str], out: bool = False,
               place: Optional[network.Place] = None) -> Proc:
        log = os.path.join(self.logs, f"{name}.log")
        out_path = os.path.join(self.logs, f"{name}.out") if out else None
        env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
        env.pop(ENV_BOOTSTRAP_SERVERS, None)  # Kafka only when the run is on Kafka (argv says so)
        if self.tls:  # the tools' and the producer's TLS setting
            env.update({"ZK_TLS_CA": self.tls["ca"], "ZK_TLS_CERT": self.tls["cert"], "ZK_TLS_KEY": self.tls["key"]})
        with open(log, "ab") as err, open(out_path or os.devnull, "ab") as stdout:
            popen = subprocess.Popen(argv, stdout=stdout, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                     cwd=ROOT, preexec_fn=place.preexec if place else die_with_parent)
        proc = Proc(role, name, popen, log, out_path, place=place)
        self.procs.append(proc)
        self.say(f"started {role} {name} pid {popen.pid}" + (f" at {place.address}" if place else ""))
        return proc

    def live(self, role: str) -> List[Proc]:
        return [p for p in self.procs if p.role == role and p.alive and p.stopped_by is None]

    def _zk_get(self, path: str):
        return self.admin.get_async(path).get(timeout=ZK_CALL_S)

    def _data_plane_args(self) -> List[str]:
        return ["--bootstrap-servers", self.bootstrap_servers] if self.on_kafka else ["--data-dir", self.data_dir]

    # ------------------------------------------------------------ processes

    def start_consumer(self) -> Proc:
        self.consumer_count += 1
        name = f"consumer-{self.consumer_count:03d}"
        place = self.net.add(name) if self.net else None
        return self._spawn("consumer", name, [
            os.path.join(ROOT, "bin", "groupctl"), "--zk", self.connect, *self._data_plane_args(), "-v",
            "consume", GROUP, TOPIC, "--with-metadata", "--consumer-id", f"{GROUP}-{name}",
            "--session-timeout-ms", str(self.o.session_timeout_ms)], out=True, place=place)

    def start_share_consumer(self) -> Proc:
        """A worker of the share group: rejects the records keyed ``reject``, releases (with a delay)
        those keyed ``retry`` until the delivery limit archives them, accepts the rest."""
        self.share_count += 1
        name = f"share-{self.share_count:03d}"
        place = self.net.add(name) if self.net else None
        return self._spawn("share-consumer", name, [
            os.path.join(ROOT, "bin", "groupctl"), "--zk", self.connect, *self._data_plane_args(), "-v",
            "share-consume", SHARE_GROUP, TOPIC, "--process-ms", str(SHARE_PROCESS_MS),
            "--reject-when", f"key={producer.REJECT_KEY.decode()}", "--release-when",
            f"key={producer.RETRY_KEY.decode()}", "--release-delay-ms", str(SHARE_RELEASE_DELAY_MS),
            "--session-timeout-ms", str(self.o.session_timeout_ms)], out=True, place=place)

    def start_role(self, role: str) -> Proc:
        return self.start_share_consumer() if role == "share-consumer" else self.start_consumer()

    def configure_share_round(self) -> None:
        """The dead-letter topic and the share group's settings, before any worker starts."""
        TopicRegistry(self.admin).create(DEAD_LETTERS, DEAD_LETTER_PARTITIONS)
        configure_share_group(self.admin, SHARE_GROUP, share_settings())
        self.say(f"share group {SHARE_GROUP}: {share_settings()}")

    def start_coordinator(self, node: str) -> Proc:
        self.coordinator_starts[node] += 1
        mirror = ["--bootstrap-servers", self.bootstrap_servers] if self.on_kafka else []
        return self._spawn("coordinatord", f"coordinatord-{node}-{self.coordinator_starts[node]}", [
            os.path.join(ROOT, "bin", "coordinatord"), "--zk", self.connect, "--node-id", node,
            "--session-timeout-ms", str(self.o.session_timeout_ms), "--rebalance-timeout-ms", "5000",
            "--failed-retry-interval-ms", "3000", *mirror], place=self.node_places.get(node))

    def start(self) -> None:
        if self.net:
            self.zk_places = [self.net.add(f"zk{i}") for i in (1, 2, 3)]
            self.node_places = {node: self.net.add(node) for node in NODES}
        self.ensemble = Ensemble(3, tick_ms=200, fsync=False, workdir=os.path.join(self.dir, "zk"),
                                 hosts=[p.address for p in self.zk_places] if self.net else None,
                                 preexecs=[p.enter for p in self.zk_places] if self.net else None,
                                 tls=self.o.zk_tls).start(60)
        self.tls = self.ensemble.client_tls("chaos") if self.o.zk_tls else None
        self.admin = start_client(self.connect, 6000, tls=self.tls)
        if self.on_kafka:
            self.start_kafka()
        else:
            TopicRegistry(self.admin).create(TOPIC, self.o.partitions)
        if self.o.share_consumers:
            self.configure_share_round()
        for node in NODES:
            self.start_coordinator(node)
        if self.on_kafka:
            self.wait_for_mirror()
        self.producer = self._spawn("producer", "producer", [
            sys.executable, "-m", "tests.chaos.producer", self.connect, self.data_dir, TOPIC,
            "--rate", str(self.o.rate)] + (["--bootstrap-servers", self.bootstrap_servers] if self.on_kafka else [])
            + (["--poison-every", str(POISON_EVERY), "--partitions", str(self.o.partitions)]
               if self.o.share_consumers else []), out=True)
        for _ in range(self.o.consumers):
            self.start_consumer()
        for _ in range(self.o.share_consumers):
            self.start_share_consumer()

    def start_kafka(self) -> None:
        """The mock cluster in its own place; its brokers listen on that namespace's loopback,
        reached at the place's address through a DNAT rule there."""
        from coordinator.testing.kafkamock import MockKafkaCluster
        place = self.net.add("kafka") if self.net else None
        self.kafka = MockKafkaCluster(brokers=BROKERS, preexec_fn=place.enter if place else None).start()
        if place:
            self.net.expose_loopback(place, self.kafka.ports)
            self.kafka.advertise(place.address)
        self.bootstrap_servers = self.kafka.bootstrap_servers
        self.kafka.create_topic(TOPIC, self.o.partitions)
        self.say(f"Kafka: mock cluster of {BROKERS} brokers at {self.bootstrap_servers}, topic {TOPIC}")

    def wait_for_mirror(self, timeout: float = 60.0) -> None:
        """The controller mirrors Kafka's topic into ZooKeeper; consumers need it there."""
        deadline = time.monotonic() + timeout
        while self.admin.exists(protocol.topic_path(TOPIC)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the coordinators did not mirror topic {TOPIC} from Kafka within {timeout:.0f}s")
            self.wait(0.2)

    def signal(self, proc: Proc, sig: signal.Signals) -> None:
        try:
            proc.popen.send_signal(sig)
        except ProcessLookupError:
            pass
        self.say(f"{sig.name} {proc.name} pid {proc.popen.pid}")

    def kill(self, proc: Proc) -> None:
        proc.stopped_by = "SIGKILL"
        if proc.paused:
            proc.paused = False
        self.signal(proc, signal.SIGKILL)
        proc.popen.wait()
        self.reap()

    def terminate(self, proc: Proc) -> None:
        proc.stopped_by, proc.term_deadline = "SIGTERM", time.monotonic() + TERM_GRACE_S
        self.signal(proc, signal.SIGTERM)

    def reap(self) -> None:
        """Record every process that ended; replace those that ended on their own; SIGKILL
        those that did not exit within the grace of their SIGTERM. A consumer's namespace
        goes with it (a node's stays for its next start)."""
        for p in list(self.procs):
            if p.end is not None:
                continue
            rc = p.popen.poll()
            if rc is None and p.term_deadline is not None and time.monotonic() > p.term_deadline:
                p.note = f"still running {TERM_GRACE_S:.0f}s after SIGTERM; killed"
                self.signal(p, signal.SIGCONT)
                self.signal(p, signal.SIGKILL)
                rc = p.popen.wait()
            if rc is None:
                continue
            if p.stopped_by is None:
                p.note = last_error(p.log)
            p.end = referee.ProcessEnd(p.role, p.name, p.log, rc, p.stopped_by, p.note)
            self.say(f"{p.name} exited with status {rc}" + ("" if p.stopped_by else " ON ITS OWN"))
            if p.role in CONSUMER_ROLES and p.place is not None:
                self.net.remove(p.place)
            if p.stopped_by is None and self.replacing:
                if p.role in CONSUMER_ROLES:
                    self.start_role(p.role)
                elif p.role == "coordinatord":
                    self.start_coordinator(p.name.split("-")[1])

    # ------------------------------------------------------------ faults

    def inject(self, kind: str) -> bool:
        """Make one fault; False if it cannot be made now (it is retried later)."""
        consumers = [p for role in CONSUMER_ROLES for p in self.live(role) if not p.paused]
        if kind in ("kill", "term", "pause"):
            if not consumers:
                return False
            if kind == "term":  # a process not yet registered may not have its SIGTERM handler yet
                consumers = [p for p in consumers if self.registered(p)]
                if not consumers:
                    return False
            victim = self.rng.choice(consumers)
            if kind == "kill":
                self.kill(victim)
                self.start_role(victim.role)
            elif kind == "term":
                self.terminate(victim)
                self.start_role(victim.role)
            else:
                self.pause(victim)
        elif kind == "leader-kill":
            if not self.kill_leader():
                return False
        elif kind == "zk-restart":
            self.heal_zookeeper()
            index = self.rng.randrange(3)
            self.kill_server(index)
            self.later(self.rng.uniform(2.0, 5.0), f"restart ZooKeeper server {index + 1}",
                       lambda: self.restart_servers([index]), zookeeper=True)
        elif kind == "quorum-loss":
            self.heal_zookeeper()
            lost = self.rng.sample(range(3), 2)
            for index in lost:
                self.kill_server(index)
            self.wait(self.rng.uniform(3.0, 5.0))
            self.restart_servers(lost)
        elif kind in ("cut-consumer", "cut-oneway"):
            victims = [p for p in consumers if not self.net.is_cut(p.place)]
            if not victims:
                return False
            self.cut_from_zookeeper(self.rng.choice(victims), oneway=kind == "cut-oneway")
        elif kind in ("cut-controller", "cut-node"):
            victim = self.coordinator_victim(controller=kind == "cut-controller")
            if victim is None:
                return False
            self.cut_from_zookeeper(victim, oneway=False)
        elif kind == "zk-minority":
            self.heal_zookeeper()
            index = self.rng.randrange(3)
            self.cut(self.zk_places[index], [p for i, p in enumerate(self.zk_places) if i != index], None,
                     zookeeper=True)
        elif kind == "broker-down":
            up = [b for b in range(1, BROKERS + 1) if b not in self.brokers_down]
            if len(up) < 2:  # keep one broker up: a cluster wholly down is not this fault
                return False
            self.broker_down(self.rng.choice(up))
        self.faults[kind] += 1
        return True

    def registered(self, consumer: Proc) -> bool:
        """Whether ``consumer`` has registered in its group (it installs its SIGTERM handler
        before it connects, so a registered consumer leaves cleanly on SIGTERM). A share worker's
        member id holds its pid."""
        try:
            if consumer.role == "share-consumer":
                members = self.admin.get_children_async(share_members_path(SHARE_GROUP)).get(timeout=ZK_CALL_S)
                return any(f"-{consumer.popen.pid}-" in m for m in members)
            return self.admin.exists_async(protocol.ids_path(GROUP, f"{GROUP}-{consumer.name}")).get(
                timeout=ZK_CALL_S) is not None
        except Exception:  # ZooKeeper unreachable now: the fault is tried again at the next tick
            return False

    def pause(self, victim: Proc) -> None:
        victim.paused = True
        self.signal(victim, signal.SIGSTOP)
        seconds = self.o.session_timeout_ms / 1000 + self.rng.uniform(1.0, 3.0)

        def resume():
            if victim.paused:
                victim.paused = False
                self.signal(victim, signal.SIGCONT)
        self.later(seconds, f"SIGCONT {victim.name}", resume)

    def cut_from_zookeeper(self, victim: Proc, oneway: bool) -> None:
        self.say(f"cutting {victim.name} (pid {victim.popen.pid}) from ZooKeeper" + (", one way" if oneway else ""))
        self.cut(victim.place, self.zk_places, STANDARD_PORTS[0], oneway=oneway)

    def cut(self, place: network.Place, peers: List[network.Place], port: Optional[int], oneway: bool = False,
            zookeeper: bool = False) -> None:
        """Cut ``place`` from ``peers`` for 2-3 session timeouts; the heal (and whether it resets
        the connections) is drawn now, so the draws follow the faults, not the timing."""
        seconds = self.o.session_timeout_ms / 1000 * self.rng.uniform(*CUT_SESSIONS)
        reset = self.rng.random() < RESET_AT_HEAL
        self.net.cut(place, peers, port, oneway)

        def heal():
            if self.net.is_cut(place):
                self.net.heal(place, reset)
                self.resets_at_heal += reset
        self.later(seconds, f"heal {place.label}", heal, zookeeper=zookeeper, place=place)

    def coordinator_victim(self, controller: bool) -> Optional[Proc]:
        """A running, uncut ``coordinatord`` that leads shards: the controller, or one that is not."""
        try:
            leader = protocol.LeaderInfo.decode(self._zk_get(protocol.LEADER)[0])
            infos = [protocol.NodeInfo.decode(self._zk_get(protocol.node_path(node))[0], protocol.node_path(node))
                     for node in self.admin.get_children_async(protocol.NODES).get(timeout=ZK_CALL_S)]
        except Exception as e:  # no leader or node znodes now, or ZooKeeper busy: try again later
            self.say(f"coordinator cut: cannot read the nodes now ({type(e).__name__})")
            return None
        pids = {info.pid for info in infos if info.shards and (info.node_id == leader.node_id) == controller}
        victims = [p for p in self.live("coordinatord") if p.popen.pid in pids and not self.net.is_cut(p.place)]
        if not victims:
            self.say(f"coordinator cut: no {'controller' if controller else 'other node'} leading shards now")
            return None
        return self.rng.choice(victims)

    def broker_down(self, broker: int) -> None:
        self.kafka.broker_down(broker)
        self.brokers_down.add(broker)
        self.say(f"Kafka broker {broker} down")

        def up():
            self.kafka.broker_up(broker)
            self.brokers_down.discard(broker)
            self.say(f"Kafka broker {broker} up")
        self.later(self.rng.uniform(2.0, 5.0), f"Kafka broker {broker} up", up)

    def kill_leader(self) -> bool:
        try:
            info = protocol.LeaderInfo.decode(self._zk_get(protocol.LEADER)[0])
        except Exception as e:  # no leader, or ZooKeeper busy: try again later
            self.say(f"leader-kill: no leader to read now ({type(e).__name__})")
            return False
        leader = next((p for p in self.live("coordinatord") if p.popen.pid == info.pid), None)
        if leader is None:
            self.say(f"leader-kill: the registered leader (pid {info.pid}) is not running")
            return False
        self.kill(leader)
        place = self.node_places.get(info.node_id)
        if place is not None:  # its successor must not start cut off (it could not even connect)
            self.run_pending(lambda p: p.place is place)
        self.start_coordinator(info.node_id)
        return True

    def kill_server(self, index: int) -> None:
        self.ensemble.servers[index].kill()
        self.say(f"SIGKILL ZooKeeper server {index + 1}")

    def restart_servers(self, indexes: List[int]) -> None:
        for index in indexes:
            self.ensemble.servers[index].start()
        self.say(f"restarting ZooKeeper server(s) {', '.join(str(i + 1) for i in indexes)}")
        self.ensemble.wait_serving(60, [self.ensemble.servers[i] for i in indexes])
        self.say("ZooKeeper server(s) serving")

    def heal_zookeeper(self) -> None:
        """Restart any server still down and heal any server still cut off now (another
        ZooKeeper fault needs all three)."""
        self.run_pending(lambda p: p.zookeeper)

    def later(self, seconds: float, what: str, action: Callable[[], None], zookeeper: bool = False,
              place: Optional[network.Place] = None) -> None:
        self.pending.append(Pending(time.monotonic() + seconds, what, action, zookeeper, place))

    def run_pending(self, which: Callable[[Pending], bool] = lambda p: True, due_only: bool = False) -> None:
        now = time.monotonic()
        ready = [p for p in self.pending if which(p) and (not due_only or p.due <= now)]
        for p in ready:
            self.pending.remove(p)
            p.action()

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass, still reaping processes and running what is due."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.reap()
            self.run_pending(due_only=True)
            time.sleep(TICK_S)

    def nemesis(self) -> None:
        self.say(f"nemesis: seed {self.o.seed}, {self.o.duration:.0f}s, first round {', '.join(self.plan)}")
        drawn = [k for k in self.kinds if k != "quorum-loss"]
        end = time.monotonic() + self.o.duration
        next_fault = time.monotonic() + WARMUP_S
        while time.monotonic() < end or (self.plan and time.monotonic() < end + OVERTIME_S):
            self.reap()
            self.run_pending(due_only=True)
            if time.monotonic() >= next_fault and (self.plan or drawn):
                kind = self.plan[0] if self.plan else self.rng.choices(drawn, [REPEATED[k] for k in drawn])[0]
                if self.inject(kind):
                    self.say(f"fault {kind} done")
                    if self.plan:
                        self.plan.pop(0)
                next_fault = time.monotonic() + self.rng.uniform(*FAULT_GAP_S)
            time.sleep(TICK_S)

    # ------------------------------------------------------------ the end

    def heal(self) -> None:
        """Let every fault still under way run its course (pauses, cuts and downtimes are as
        long as drawn, a few seconds at most), then check all servers serve."""
        self.say("healing: waiting for paused consumers to resume, cuts to heal, servers and brokers to restart")
        while self.pending:
            self.wait(TICK_S)
        self.ensemble.wait_serving(60, self.ensemble.servers)

    def stop_producer(self) -> None:
        if self.producer.end is None:
            self.terminate(self.producer)
        while self.producer.end is None:
            self.wait(0.2)
        try:
            with open(self.producer.out) as f:
                self.produced_count = json.loads(f.read().strip().splitlines()[-1])["produced"]
        except (OSError, ValueError, KeyError, IndexError):
            self.note("the producer did not report how many records it sent")

    def end_offsets(self) -> Dict:
        if self.on_kafka:
            marks = kafkatopic.watermarks(self.bootstrap_servers, TOPIC, self.o.partitions)
            return {(TOPIC, p): high for p, (_, high) in marks.items()}
        log = Log(self.data_dir)
        try:
            return {(TOPIC, p): log.latest_offset(TOPIC, p) for p in range(self.o.partitions)}
        finally:
            log.close()

    def read_committed(self) -> Dict:
        out = {}
        for p in range(self.o.partitions):
            path = protocol.offsets_path(GROUP, TOPIC, p)
            try:
                out[(TOPIC, p)] = protocol.decode_offset(self._zk_get(path)[0], path)
            except NoNodeError:
                out[(TOPIC, p)] = None
        return out

    def read_share(self) -> Dict[int, Optional[list]]:
        """{partition: [start, end] of the share group's share-partition (None: no state yet)}."""
        out = {}
        for p in range(self.o.partitions):
            path = share_partitions_path(SHARE_GROUP, TOPIC, p)
            try:
                state = SharePartitionState.decode(self._zk_get(path)[0], path)
                out[p] = [state.start, state.end]
            except NoNodeError:
                out[p] = None
        return out

    def drain(self) -> bool:
        """Let the consumers catch up with the end offsets (bounded): the group's committed
        offsets, and (the share round) every share-partition's start (everything accepted or
        archived, and its dead letters written). True if both did."""
        ends = self.end_offsets()
        self.say(f"draining to end offsets {sum(ends.values())} records")
        deadline = time.monotonic() + self.o.drain_timeout
        group_done, share_done = False, not self.o.share_consumers
        while time.monotonic() < deadline:
            self.wait(0.5)
            try:
                if not group_done and self.read_committed() == ends:
                    group_done = True
                    self.say("drained: the consumer group")
                if not share_done and all(v is not None and v[0] == ends[(TOPIC, p)]
                                          for p, v in self.read_share().items()):
                    share_done = True
                    self.say("drained: the share group")
            except Exception as e:  # ZooKeeper still settling: look again
                self.say(f"drain: reading offsets failed ({type(e).__name__})")
            if group_done and share_done:
                self.say("drained")
                return True
        if not group_done:
            self.note(f"the consumers had not committed everything {self.o.drain_timeout:.0f}s after the faults")
        if not share_done:
            self.note(f"the share group had not accepted or archived everything {self.o.drain_timeout:.0f}s "
                      f"after the faults")
        return False

    def stop_role(self, role: str) -> None:
        for p in self.procs:
            if p.role == role and p.end is None and p.stopped_by is None:
                self.terminate(p)
        while any(p.role == role and p.end is None for p in self.procs):
            self.wait(0.2)

    def stop(self) -> None:
        self.replacing = False
        self.stop_role("consumer")
        self.stop_role("share-consumer")
        try:
            self.live_committed = self.read_committed()
        except Exception as e:
            self.note(f"could not read the committed offsets at the end ({type(e).__name__})")
        if self.o.share_consumers:
            try:
                self.live_share = self.read_share()
            except Exception as e:
                self.note(f"could not read the share-partitions at the end ({type(e).__name__})")
        if self.on_kafka:  # the mock's records die with it: keep them for the referee
            kafkatopic.save(self.dir, TOPIC, kafkatopic.read_values(self.bootstrap_servers, TOPIC, self.o.partitions))
        self.stop_role("coordinatord")
        close_client(self.admin)
        self.admin = None
        for server in self.ensemble.servers:
            server.stop()
        self.say("stopped")
        self.record().save(self.dir)

    def close(self) -> None:
        """Whatever happened: nothing of this run keeps running, no namespace stays."""
        for p in self.procs:
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGCONT)
                p.popen.kill()
                p.popen.wait()
        if self.admin is not None:
            close_client(self.admin)
        if self.kafka is not None:
            self.kafka.close()
        if self.ensemble is not None:
            self.ensemble.close()
        if self.net is not None:
            self.net.close()
        self._nemesis_log.close()

    def record(self) -> judge.RunRecord:
        """What the referee needs besides the logs: written to the run directory by :meth:`stop`."""
        return judge.RunRecord(
            seed=self.o.seed, duration=self.o.duration, group=GROUP, topic=TOPIC, partitions=self.o.partitions,
            chroot=CHROOT, faults=dict(self.faults), processes=[p.end for p in self.procs if p.end is not None],
            consumer_outputs=[os.path.relpath(p.out, self.dir) for p in self.procs if p.role == "consumer"],
            produced_count=self.produced_count,
            live_committed=None if self.live_committed is None else
            {tp[1]: offset for tp, offset in self.live_committed.items()},
            notes=self.notes, kinds=self.kinds, data_plane=self.o.data_plane,
            network="namespaces" if self.net else "shared", resets_at_heal=self.resets_at_heal,
            share=None if not self.o.share_consumers else judge.ShareRound(
                group=SHARE_GROUP, dead_letter_topic=DEAD_LETTERS, dead_letter_partitions=DEAD_LETTER_PARTITIONS,
                delivery_limit=SHARE_DELIVERY_LIMIT, lock_ms=SHARE_LOCK_MS, release_delay_ms=SHARE_RELEASE_DELAY_MS,
                reject_key=producer.REJECT_KEY.decode(), retry_key=producer.RETRY_KEY.decode(),
                outputs=[os.path.relpath(p.out, self.dir) for p in self.procs if p.role == "share-consumer"],
                live=self.live_share))


def share_settings() -> Dict[str, object]:
    """The share group's settings in the share round."""
    return {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": SHARE_LOCK_MS,
            "share.delivery.count.limit": SHARE_DELIVERY_LIMIT, "errors.deadletterqueue.topic.name": DEAD_LETTERS}


def fault_plan(options: Options, partitions: bool, rng: random.Random) -> List[str]:
    """The first round of faults: ``--faults`` in its order, else every kind of the run
    shuffled; without namespaces (``partitions`` False) each cut becomes its stand-in."""
    if options.faults:
        return [kind if partitions else STAND_INS.get(kind, kind) for kind in options.faults]
    plan = list(PROCESS_KINDS + (PARTITION_KINDS if partitions else ())
                + (KAFKA_KINDS if options.data_plane == "kafka" else ()))
    rng.shuffle(plan)
    return plan


def last_error(log_path: str) -> str:
    """The last ``error:`` line of a process's log (else its last line): why it exited."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - 8192))
            lines = [line.strip() for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1][:200]


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse_args(argv=None) -> Options:
    parser = _OneLineParser(prog="bin/chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, help="RNG seed (default: random, printed in the verdict)")
    parser.add_argument("--duration", type=float, default=120.0, metavar="SECONDS", help="nemesis time [120]")
    parser.add_argument("--consumers", type=int, default=5, help="consumer processes [5]")
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the topic [8]")
    parser.add_argument("--share-consumers", type=int, metavar="N",
                        help="groupctl share-consume workers of a share group on the same topic, among the victims "
                             "of the consumer faults (0: no share round; needs the embedded data plane) "
                             "[4 on the embedded log, 0 on Kafka]")
    parser.add_argument("--keep", action="store_true",
                        help="keep ZooKeeper's and the topic's data even on a pass (logs are always kept)")
    parser.add_argument("--rate", type=float, default=200.0, help="records produced per second [200]")
    parser.add_argument("--session-timeout-ms", type=int, default=2000,
                        help="session timeout of consumers and coordinators [2000]")
    parser.add_argument("--drain-timeout", type=float, default=90.0, metavar="SECONDS",
                        help="how long consumers get to commit everything after the faults [90]")
    parser.add_argument("--run-dir", help="where to keep the run (default: a new temporary directory)")
    parser.add_argument("--judge", metavar="RUN_DIR",
                        help="run nothing: judge again a run kept with its data (a failed run, or --keep)")
    parser.add_argument("--data-plane", choices=("embedded", "kafka"), default="embedded",
                        help="where the records are: the embedded log, or librdkafka's mock Kafka cluster [embedded]")
    parser.add_argument("--network", choices=("auto", "namespaces", "shared"), default="auto",
                        help="namespaces: every process in a network namespace of its own, links cut for real; "
                             "shared: the host's network, partitions stood in for by pauses and kills; "
                             "auto: namespaces where the machine allows them [auto]")
    parser.add_argument("--faults", metavar="KIND,...",
                        help="the fault kinds of the run, made once each in this order first (repeat one to make "
                             f"it more often), then drawn at random; kinds: {', '.join(KINDS)} [all, shuffled]")
    parser.add_argument("--zk-tls", action="store_true",
                        help="ZooKeeper serves TLS only (certificates from a throwaway CA); every process connects "
                             "over TLS")
    args = parser.parse_args(argv)
    for name in ("duration", "consumers", "partitions", "rate", "session_timeout_ms", "drain_timeout"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    faults = None
    if args.faults is not None:
        faults = [kind.strip() for kind in args.faults.split(",") if kind.strip()]
        unknown = [kind for kind in faults if kind not in KINDS]
        if unknown or not faults:
            parser.error(f"--faults: unknown kind {unknown[0]!r} (kinds: {', '.join(KINDS)})" if unknown
                         else "--faults: give at least one kind")
        if args.data_plane != "kafka" and any(kind in KAFKA_KINDS for kind in faults):
            parser.error("--faults: broker-down needs --data-plane kafka")
    share_consumers = args.share_consumers
    if share_consumers is None:
        share_consumers = 0 if args.data_plane == "kafka" else 4
    if share_consumers < 0:
        parser.error("--share-consumers must be 0 or more")
    if share_consumers and args.data_plane == "kafka":
        parser.error("--share-consumers: the share round runs on the embedded data plane only (its referee reads "
                     "the dead letters' headers from the log); give 0")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    return Options(seed, args.duration, args.consumers, args.partitions, args.keep, args.rate,
                   args.session_timeout_ms, args.drain_timeout, args.run_dir, args.judge,
                   args.data_plane, args.network, faults, args.zk_tls, share_consumers)


def prepare_run_dir(options: Options) -> str:
    options.run_dir = options.run_dir or tempfile.mkdtemp(prefix=f"zkgroups-chaos-{options.seed}-")
    os.makedirs(os.path.join(options.run_dir, "logs"), exist_ok=True)
    return options.run_dir


def open_network(options: Options) -> Optional[network.Network]:
    """The run's network of namespaces, or None (``--network shared``, or ``auto`` where the
    machine does not allow namespaces: then one line on stderr says why and what stands in).
    Raises :class:`network.NetworkError` for ``--network namespaces`` on such a machine."""
    if options.network == "shared":
        return None
    reason = network.unavailable()
    if reason is None:
        net = network.Network()
        try:
            return net.start()
        except network.NetworkError as e:
            reason = str(e)
    if options.network == "namespaces":
        raise network.NetworkError(f"network namespaces are not available here: {reason}")
    stand_ins = "; ".join(f"{kind} -> {STAND_INS[kind]}" for kind in PARTITION_KINDS)
    print(f"chaos: network namespaces are not available here ({reason}): no link is cut, partitions are "
          f"stood in for by process faults ({stand_ins})", file=sys.stderr, flush=True)
    return None


def run(options: Options) -> judge.Outcome:
    """One whole run; the caller gets the outcome (the run directory is ``options.run_dir``)."""
    run_dir = prepare_run_dir(options)
    net = open_network(options)
    try:
        chaos = ChaosRun(options, run_dir, net)
    except BaseException:
        if net is not None:
            net.close()
        raise
    if net is not None:
        net.say = chaos.say
    try:
        chaos.start()
        chaos.nemesis()
        chaos.heal()
        chaos.stop_producer()
        chaos.drain()
        chaos.stop()
    finally:
        chaos.close()
    outcome = judge.judge(run_dir)
    if outcome.passed and not options.keep:
        for bulky in [os.path.join(run_dir, "data")] + glob.glob(os.path.join(run_dir, "zk", "server*", "data")):
            shutil.rmtree(bulky, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(run_dir, kafkatopic.DUMP))
    return outcome


def main(argv=None) -> int:
    options = parse_args(argv)
    if options.judge_only:
        return judge_again(options.judge_only)
    print(f"chaos: seed={options.seed} duration={options.duration:.0f}s data plane {options.data_plane} "
          f"run directory {prepare_run_dir(options)}", file=sys.stderr, flush=True)
    # The harness's own ZooKeeper client complains while servers are down: into a file.
    logging.basicConfig(filename=os.path.join(prepare_run_dir(options), "logs", "harness.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        outcome = run(options)
    except KeyboardInterrupt:
        print(f"chaos: interrupted (run directory {options.run_dir})", file=sys.stderr)
        return 2
    except (ZooKeeperNotFound, network.NetworkError) as e:
        print(f"chaos: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a harness failure: one line here, the traceback in the run directory
        with open(os.path.join(options.run_dir, "harness-error.txt"), "w") as f:
            traceback.print_exc(file=f)
        print(f"chaos: error: {type(e).__name__}: {e} (traceback in {options.run_dir}/harness-error.txt)",
              file=sys.stderr)
        return 2
    print(outcome.verdict)
    print(f"run directory: {options.run_dir}")
    return 0 if outcome.passed else 1


def judge_again(run_dir: str) -> int:
    kept = os.path.isdir(os.path.join(run_dir, "data")) or os.path.exists(os.path.join(run_dir, kafkatopic.DUMP))
    if not os.path.exists(os.path.join(run_dir, judge.RECORD)) or not kept:
        print(f"chaos: error: {run_dir} is not a chaos run kept with its data (it needs {judge.RECORD}, "
              f"zk/server*/data and data/ or {kafkatopic.DUMP}: a failed run, or one made with --keep)",
              file=sys.stderr)
        return 2
    try:
        outcome = judge.judge(run_dir)
    except Exception as e:  # unreadable evidence: say which, in one line
        print(f"chaos: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(outcome.verdict)
    return 0 if outcome.passed else 1


if __name__ == "__main__":
    sys.exit(main())
