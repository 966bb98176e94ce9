"""bin/bench tls — what TLS to ZooKeeper costs: a consumer's join and its commits, over TLS
against plaintext, in one run.

Two local ZooKeeper servers with the same settings (fsync on, the JVM's defaults), one serving
plaintext only and one TLS only (client certificates required, a throwaway CA), each with a
coordinator node of its own in this process. Measured in alternating rounds, so the machine's
noise falls on both alike:

* **join**: from ``Consumer(...)`` (a new connection: TCP, then the TLS handshake) until its
  first assignment, a group of one on 4 partitions; p50 and p90 over the rounds.
* **commit**: ``commit({tp: offset})`` of one partition, each a fenced ZooKeeper transaction
  waited for; commits/s.
* **connect**: a TCP connection to the server, and over TLS its handshake (what a join pays
  once more than plaintext), p50.

Targets (issue 35): join ≤ 1.3× plaintext, commits ≥ 0.7× plaintext.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import socket
import tempfile
import time
from typing import Dict, List, Optional

from consumer import Consumer, Producer, TopicPartition
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.testing.zkserver import SERVER_JVM, Ensemble
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from coordinator.zktls import parse_tls
from tests.benchmarks.common import Row, Timer, print_table

GROUP_CONFIG = dict(session_timeout_ms=6000, rebalance_timeout_ms=5000, rebalance_backoff_ms=50)


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class Side:
    """One server, its coordinator and the ``zk_tls`` of its clients (None: plaintext)."""

    def __init__(self, stack: contextlib.ExitStack, tls: bool, workdir: str):
        self.name = "TLS" if tls else "plaintext"
        ensemble = Ensemble(1, tick_ms=200, fsync=True, workdir=f"{workdir}/{self.name}", jvm=SERVER_JVM, tls=tls)
        stack.enter_context(ensemble)
        self.address = (ensemble.servers[0].host, ensemble.servers[0].client_port)
        self.connect = ensemble.connect + "/bench-tls"
        self.tls: Optional[Dict[str, str]] = ensemble.client_tls("bench") if tls else None
        self.data_dir = tempfile.mkdtemp(prefix=f"zkgroups-bench-tls-{self.name}-", dir=workdir)
        client = start_client(self.connect, tls=self.tls)
        TopicRegistry(client).ensure("events", 4)
        close_client(client)
        with Producer(self.connect, data_dir=self.data_dir, zk_tls=self.tls) as producer:
            for p in range(4):  # the log exists (else each consumer warns it may be elsewhere)
                producer.send("events", b"x", partition=p)
        node = Coordinator(self.connect, f"node-{self.name}", CoordinatorConfig(**GROUP_CONFIG, zk_tls=self.tls))
        stack.callback(node.close)
        node.start()
        self.joins: List[float] = []
        self.commit_rates: List[float] = []
        self.connects: List[float] = []

    def connect_once(self) -> None:
        start = time.perf_counter()
        if self.tls is None:
            sock = socket.create_connection(self.address, 10)
        else:
            sock = parse_tls(self.tls).connect(self.address, self.address[0], 10)
        self.connects.append(time.perf_counter() - start)
        sock.close()

    def consumer(self, group: str) -> Consumer:
        return Consumer(group, ["events"], zk=self.connect, data_dir=self.data_dir, zk_tls=self.tls,
                        enable_auto_commit=False, session_timeout_ms=GROUP_CONFIG["session_timeout_ms"])

    def join(self, group: str) -> Consumer:
        """A new consumer joined (timed until its first assignment)."""
        start = time.perf_counter()
        consumer = self.consumer(group)
        while not consumer.assignment():
            consumer.poll(timeout_ms=5)
        self.joins.append(time.perf_counter() - start)
        return consumer

    def commits(self, consumer: Consumer, count: int) -> None:
        tp = TopicPartition("events", 0)
        with Timer() as t:
            for offset in range(1, count + 1):
                consumer.commit({tp: offset})
        self.commit_rates.append(t.rate(count))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="bin/bench tls", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="joins per side (alternating)")
    parser.add_argument("--commits", type=int, default=300, help="commits per round")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="zkgroups-bench-tls-") as workdir:
        sides = [Side(stack, False, workdir), Side(stack, True, workdir)]
        for side in sides:  # a first join warms the JVMs and the code paths
            side.join("warm-up").close()
            side.joins.clear()
        for i in range(args.rounds):
            for side in (sides if i % 2 == 0 else reversed(sides)):
                consumer = side.join(f"g{i}")
                side.commits(consumer, args.commits)
                consumer.close()
                side.connect_once()
        report(*sides)


def report(plain: Side, tls: Side) -> None:
    join_plain, join_tls = percentile(plain.joins, 50), percentile(tls.joins, 50)
    commit_plain, commit_tls = percentile(plain.commit_rates, 50), percentile(tls.commit_rates, 50)
    print_table([
        Row("join p50, plaintext", join_plain * 1000, "ms"),
        Row("join p50, TLS", join_tls * 1000, "ms", join_tls / join_plain, "target ≤ 1.3"),
        Row("join p90, plaintext", percentile(plain.joins, 90) * 1000, "ms"),
        Row("join p90, TLS", percentile(tls.joins, 90) * 1000, "ms",
            percentile(tls.joins, 90) / percentile(plain.joins, 90)),
        Row("commits, plaintext", commit_plain, "/s"),
        Row("commits, TLS", commit_tls, "/s", commit_tls / commit_plain, "target ≥ 0.7"),
        Row("connect p50, plaintext (TCP)", percentile(plain.connects, 50) * 1000, "ms"),
        Row("connect p50, TLS (TCP + handshake)", percentile(tls.connects, 50) * 1000, "ms"),
    ], title=f"TLS to ZooKeeper against plaintext, load average {os.getloadavg()[0]:.1f} ({len(plain.joins)} joins and "
             f"{len(plain.commit_rates)} commit rounds a side, alternating; medians)")


if __name__ == "__main__":
    main()
