"""A Spark standalone cluster with ZooKeeper and the Kafka plane, each role a host of its own
(the Spark tests' cluster round, ``bin/spark-cluster``).

With network namespaces (root, ``ip``/``nft``: :func:`tests.chaos.network.unavailable`) every
role runs in a namespace of its own on a bridge (``tests/chaos/network.py``): ZooKeeper,
librdkafka's mock Kafka cluster (its brokers, which bind the namespace's loopback, reached at
the place's address), the Spark master and each Spark worker (its executors and their Python
workers inside the same namespace). The driver (``spark-submit``, client mode) runs in this
host's namespace and is reached by the executors at the uplink's address. Without namespaces
everything runs on 127.0.0.1 with free ports. Each Spark host has a scratch directory of its
own (:mod:`consumer.spark.cluster`); with namespaces it also has a ``/tmp`` of its own (a
mount namespace: its scratch's ``tmp`` on ``/tmp``), where only the testbed's directory and the
``shared`` ones (the disks every host mounts: the output, the embedded log) are seen.

Faults: :meth:`SparkTestbed.kill_worker` (a worker host's processes SIGKILLed),
:meth:`SparkTestbed.cut_from_zookeeper` / :meth:`heal` (a worker host's packets to and from
ZooKeeper dropped).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import ctypes
from typing import Dict, List, Optional, Sequence

from consumer.spark.cluster import Host, StandaloneCluster, loopback_hosts, spark_home

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIPELINE_APP = os.path.join(ROOT, "consumer", "cli", "pipeline.py")
CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x00020000, 4096, 16384, 1 << 18


def private_tmp(own_tmp: str, shared: Sequence[str]) -> None:
    """``preexec`` (root): a mount namespace of its own whose ``/tmp`` is ``own_tmp``, with the
    ``shared`` directories under ``/tmp`` still at their paths, as a host with its own ``/tmp``
    that mounts a shared disk. Each is bound into ``own_tmp`` at its place first, then
    ``own_tmp`` with those mounts on ``/tmp``."""
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source: str, target: str, flags: int, what: str) -> None:
        if libc.mount(source.encode(), target.encode(), None, flags, None) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")
    os.makedirs(own_tmp, exist_ok=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    mount("none", "/", MS_REC | MS_PRIVATE, "making / private")
    for path in shared:
        rel = os.path.relpath(path, "/tmp")
        if rel.startswith(".."):
            continue  # not under /tmp: seen as it is
        target = os.path.join(own_tmp, rel)
        os.makedirs(target, exist_ok=True)
        mount(path, target, MS_BIND | MS_REC, f"binding {path}")
    mount(own_tmp, "/tmp", MS_BIND | MS_REC, f"binding {own_tmp} on /tmp")


class SparkTestbed:
    """ZooKeeper, the Kafka mock (``kafka_brokers``; 0: none) and a Spark master with
    ``workers`` workers under ``base_dir``; ``netns``: None picks namespaces where available.
    Threads: one thread calls everything."""

    def __init__(self, base_dir: str, workers: int = 2, cores: int = 2, memory: str = "1g",
                 kafka_brokers: int = 1, netns: Optional[bool] = None, shared: Sequence[str] = ()):
        from tests.chaos import network
        self.base_dir, self.workers, self.cores, self.memory = base_dir, workers, cores, memory
        # Disks every host mounts, and the software every host has at the same path (this
        # checkout and its Python: a checkout under /tmp is otherwise missing on the hosts).
        self.shared = [os.path.abspath(p) for p in (base_dir, *shared, ROOT, sys.prefix)]
        self.kafka_brokers = kafka_brokers
        self.netns = network.unavailable() is None if netns is None else netns
        self.net = None
        self.places: Dict[str, object] = {}
        self.ensemble = self.kafka = self.spark = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "SparkTestbed":
        try:
            if self.netns:
                from tests.chaos import network
                self.net = network.Network().start()
                self.places = {name: self.net.add(name)
                               for name in ["zk", "kafka", "master", *self.worker_names]}
            self._start_zookeeper()
            if self.kafka_brokers:
                self._start_kafka()
            self.spark = StandaloneCluster(*self._spark_hosts(), cores=self.cores, memory=self.memory).start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for part in (self.spark, self.kafka, self.ensemble, self.net):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.close()

    def __enter__(self) -> "SparkTestbed":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def worker_names(self) -> List[str]:
        return [f"worker{i}" for i in range(1, self.workers + 1)]

    def _start_zookeeper(self) -> None:
        from coordinator.testing.zkserver import Ensemble
        place = self.places.get("zk")
        self.ensemble = Ensemble(1, tick_ms=200, fsync=False, workdir=os.path.join(self.base_dir, "zk"),
                                 hosts=[place.address] if place else None,
                                 preexecs=[place.enter] if place else None).start(60)

    def _start_kafka(self) -> None:
        from coordinator.testing.kafkamock import MockKafkaCluster
        place = self.places.get("kafka")
        self.kafka = MockKafkaCluster(brokers=self.kafka_brokers, preexec_fn=place.enter if place else None).start()
        if place:
            self.net.expose_loopback(place, self.kafka.ports)
            self.kafka.advertise(place.address)

    def _spark_hosts(self):
        if not self.netns:
            hosts = loopback_hosts(os.path.join(self.base_dir, "spark"), self.workers)
            return hosts[0], hosts[1:]
        hosts = [self._own_host(name) for name in ["master", *self.worker_names]]
        return hosts[0], hosts[1:]

    def _own_host(self, name: str) -> Host:
        """A Spark host in its namespace, with a ``/tmp`` of its own (its scratch's ``tmp``),
        where only ``shared`` is seen at its own path."""
        place, scratch = self.places[name], os.path.join(self.base_dir, "spark", name)
        own_tmp = os.path.join(scratch, "tmp")

        def preexec():
            place.preexec()
            private_tmp(own_tmp, self.shared)
        return Host(name, place.address, scratch, preexec, tmp="/tmp")

    # ---------------------------------------------------------------- what clients use

    @property
    def zk_connect(self) -> str:
        return self.ensemble.connect

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka.bootstrap_servers

    @property
    def driver_host(self) -> str:
        """The address the executors reach the driver at."""
        return self.net.host_address if self.net else "127.0.0.1"

    def submit_argv(self, app: str, *args: str, master: Optional[str] = None,
                    conf: Optional[Dict[str, str]] = None) -> List[str]:
        """``spark-submit`` of ``app`` in client mode on this cluster (``master``: another one)."""
        settings = {"spark.driver.host": self.driver_host, "spark.driver.bindAddress": self.driver_host,
                    "spark.ui.enabled": "false", "spark.executor.memory": "512m", **(conf or {})}
        confs = [a for k, v in settings.items() for a in ("--conf", f"{k}={v}")]
        return [os.path.join(spark_home(), "bin", "spark-submit"), "--master", master or self.spark.url, *confs,
                app, *args]

    def submit_env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """The driver's environment: this Python on the driver and (as installed there) on the
        executors; nothing of an outer Spark setup."""
        env = {k: v for k, v in (base or os.environ).items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != ROOT]
        env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join([ROOT, *paths]))
        env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
        return env

    # ---------------------------------------------------------------- faults

    def kill_worker(self, index: int) -> None:
        self.spark.kill_worker(index)

    def cut_from_zookeeper(self, index: int) -> None:
        """Drop every packet between worker ``index``'s host and ZooKeeper (namespaces only)."""
        self._require_netns("cut a host from ZooKeeper")
        self.net.cut(self.places[self.worker_names[index]], [self.places["zk"]])

    def heal(self, index: int) -> None:
        self._require_netns("heal a cut")
        self.net.heal(self.places[self.worker_names[index]], reset=True)

    def _require_netns(self, what: str) -> None:
        if self.net is None:
            raise RuntimeError(f"without network namespaces there is no link to {what}")


def remove(base_dir: str) -> None:
    shutil.rmtree(base_dir, ignore_errors=True)


# ---------------------------------------------------------------- bin/spark-cluster

def try_command(bed: SparkTestbed, zk: str, topic: str, out: str, workers: int) -> str:
    """The spark-submit line that runs the pipeline on ``bed`` (as the user would type it)."""
    import shlex
    env = {k: bed.submit_env()[k] for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    argv = bed.submit_argv(os.path.relpath(PIPELINE_APP, ROOT), "--zk", zk, "--bootstrap-servers",
                           bed.bootstrap_servers, "--topic", topic, "--out", out, "--workers", str(workers),
                           "--json")
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *map(shlex.quote, argv)])


def fill_topic(bed: SparkTestbed, topic: str, partitions: int, per_partition: int) -> None:
    """``per_partition`` records in each of the topic's partitions (value ``<topic>-<p>-<o>``)."""
    import confluent_kafka as ck
    bed.kafka.create_topic(topic, partitions)
    producer = ck.Producer({"bootstrap.servers": bed.bootstrap_servers, "linger.ms": 5,
                            "partitioner": "murmur2_random"})
    for p in range(partitions):
        for o in range(per_partition):
            producer.produce(topic, f"{topic}-{p}-{o}".encode(), f"k{o % 7}".encode(), partition=p)
            if o % 10000 == 0:
                producer.poll(0)
    if producer.flush(60):
        raise RuntimeError(f"records for {topic} not all acknowledged by the Kafka mock")


def _serve(bed: SparkTestbed, run_dir: str, partitions: int, records: int) -> None:
    """Fill the topic, start a coordinator, print what to try; until SIGINT/SIGTERM."""
    import signal
    import threading
    from coordinator.coordinator import Coordinator, CoordinatorConfig

    fill_topic(bed, "orders", partitions, records)
    node = Coordinator(bed.zk_connect, "n1", CoordinatorConfig(bootstrap_servers=bed.bootstrap_servers)).start()
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    try:
        workers = ", ".join(f"{h.name} {h.address} (scratch {h.scratch})" for h in bed.spark.worker_hosts)
        print(f"spark master {bed.spark.url} (web UI {bed.spark.webui}); workers: {workers}")
        print(f"ZooKeeper {bed.zk_connect}; Kafka (librdkafka's mock) {bed.bootstrap_servers}, topic orders: "
              f"{partitions} partitions x {records:,} records; a coordinator mirrors it into ZooKeeper")
        print("network: " + (f"a namespace per host ({bed.net.prefix}-*), the driver at {bed.driver_host}; "
                             f"each Spark host has a /tmp of its own and sees {run_dir} (the shared disk)"
                             if bed.net else "this host's (127.0.0.1)"))
        print("try (in another shell, from the project root):\n  "
              + try_command(bed, bed.zk_connect, "orders", os.path.join(run_dir, "out"), partitions))
        print("Ctrl-C stops the cluster.", flush=True)
        done.wait()
    finally:
        node.close()


def main(argv=None) -> None:
    import tempfile
    import click
    from coordinator.cli.common import CliCommand, CliError, Limited

    @click.command(cls=CliCommand)
    @click.option("--workers", default=2, show_default=True, type=Limited(1, 8, "the hosts one machine carries"),
                  help="Spark worker hosts.")
    @click.option("--cores", default=2, show_default=True, type=click.IntRange(1), help="Task slots per worker.")
    @click.option("--memory", default="1g", show_default=True, help="Memory per worker (Spark's --memory).")
    @click.option("--partitions", default=4, show_default=True, type=click.IntRange(1, 64),
                  help="Partitions of the topic 'orders'.")
    @click.option("--records", default=50000, show_default=True, type=click.IntRange(0, 40000000),
                  help="Records per partition written before the cluster is offered.")
    @click.option("--network", default="auto", show_default=True,
                  type=click.Choice(["auto", "namespaces", "shared"]),
                  help="namespaces: a network namespace per host (root); shared: everything on 127.0.0.1.")
    @click.option("--dir", "run_dir", type=click.Path(file_okay=False),
                  help="Where the hosts' scratch directories go (default: a new temporary directory, removed).")
    def command(workers, cores, memory, partitions, records, network, run_dir):
        """A Spark standalone cluster on this machine (a master and WORKERS workers from the pyspark
        wheel's spark-class), with ZooKeeper, a coordinator and librdkafka's mock Kafka cluster
        holding a topic, for spark-submit to try; until Ctrl-C."""
        from tests.chaos import network as netns
        reason = netns.unavailable()
        if network == "namespaces" and reason:
            raise CliError(f"network namespaces are not available here: {reason}")
        own = run_dir is None
        run_dir = run_dir or tempfile.mkdtemp(prefix="zkgroups-spark-cluster-")
        try:
            with SparkTestbed(run_dir, workers=workers, cores=cores, memory=memory,
                              netns=network != "shared" and reason is None) as bed:
                _serve(bed, run_dir, partitions, records)
        except (OSError, RuntimeError) as e:
            raise CliError(str(e)) from None
        finally:
            if own:
                remove(run_dir)

    command(args=argv, prog_name="spark-cluster")


if __name__ == "__main__":
    main()
