"""bin/bench tls — what TLS to ZooKeeper costs: a consumer's join and its commits, over TLS
against plaintext, in one run.

Two local ZooKeeper servers with the same settings (fsync on, the JVM's defaults), one serving
plaintext only and one TLS only (client certificates required, a throwaway CA), each with a
coordinator node of its own in this process. Measured in alternating rounds, so the machine's
noise falls on both alike:

* **join**: from ``Consumer(..., zk=client)`` on a ZooKeeper session already connected until
  its first assignment, a group of one on 4 partitions; p50 and p90 over the rounds. This is
  the join ``bin/bench rebalance`` measures too (from a member's registration on a connected
  client): the group's work, with TLS only on the wire.
* **new consumer**: from ``Consumer(..., zk="host:port")`` (a new connection: TCP, the TLS
  handshake, a new ZooKeeper session) until its first assignment: what a consumer process
  starting up waits for. The difference to the join is the **session** row:
  ``start_client()`` (TCP, handshake, session) timed alone.
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
from coordinator.testing.zkserver import NETTY_JARS, SERVER_JVM, Ensemble
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

    def __init__(self, stack: contextlib.ExitStack, tls: bool, workdir: str, netty: bool = False):
        self.name = "TLS" if tls else "plaintext-netty" if netty else "plaintext"
        ensemble = Ensemble(1, tick_ms=200, fsync=True, workdir=f"{workdir}/{self.name}",
                            jvm=SERVER_JVM, tls=tls)
        if netty and not tls:  # the TLS server's connection factory, without TLS: what is Netty's, what TLS's
            server = ensemble.servers[0]
            with open(server.cfg, "a") as f:
                f.write("serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n")
            server.classpath = os.pathsep.join([server.classpath] + [j for j in NETTY_JARS if os.path.exists(j)])
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
        self.new_consumers: List[float] = []
        self.sessions: List[float] = []
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

    def consumer(self, group: str, zk) -> Consumer:
        # On a client given (connected over TLS already), zk_tls would only be checked again
        # (its files read, ~5 ms) and not used: not given, so the join is the group's work alone.
        return Consumer(group, ["events"], zk=zk, data_dir=self.data_dir,
                        zk_tls=self.tls if isinstance(zk, str) else None,
                        enable_auto_commit=False, session_timeout_ms=GROUP_CONFIG["session_timeout_ms"])

    def session(self):
        """A connected ZooKeeper client (timed: TCP, the TLS handshake, the session)."""
        start = time.perf_counter()
        client = start_client(self.connect, tls=self.tls)
        self.sessions.append(time.perf_counter() - start)
        return client

    def join(self, group: str, client) -> Consumer:
        """A consumer joined on ``client``'s session (timed until its first assignment)."""
        return self._joined(group, client, self.joins)

    def new_consumer(self, group: str) -> Consumer:
        """A consumer with a connection of its own joined (timed from before it connects)."""
        return self._joined(group, self.connect, self.new_consumers)

    def _joined(self, group: str, zk, into: List[float]) -> Consumer:
        start = time.perf_counter()
        consumer = self.consumer(group, zk)
        while not consumer.assignment():
            consumer.poll(timeout_ms=5)
        into.append(time.perf_counter() - start)
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
    parser.add_argument("--netty", action="store_true",
                        help="a third server: plaintext on Netty, the TLS server's connection factory")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="zkgroups-bench-tls-") as workdir:
        sides = [Side(stack, False, workdir), Side(stack, True, workdir)]
        if args.netty:
            sides.append(Side(stack, False, workdir, netty=True))
        for side in sides:  # a first join of each kind warms the JVMs and the code paths
            side.new_consumer("warm-up").close()
            client = side.session()
            side.join("warm-up-2", client).close()
            close_client(client)
            for measured in (side.joins, side.new_consumers, side.sessions):
                measured.clear()
        for i in range(args.rounds):
            for side in (sides if i % 2 == 0 else list(reversed(sides))):
                client = side.session()
                consumer = side.join(f"g{i}", client)
                side.commits(consumer, args.commits)
                consumer.close()
                close_client(client)
                side.new_consumer(f"n{i}").close()
                side.connect_once()
        report(*sides)


def report(plain: Side, tls: Side, netty: Optional[Side] = None) -> None:
    join_plain, join_tls = percentile(plain.joins, 50), percentile(tls.joins, 50)
    new_plain, new_tls = percentile(plain.new_consumers, 50), percentile(tls.new_consumers, 50)
    session_plain, session_tls = percentile(plain.sessions, 50), percentile(tls.sessions, 50)
    commit_plain, commit_tls = percentile(plain.commit_rates, 50), percentile(tls.commit_rates, 50)
    print_table([
        Row("join p50 (connected session), plaintext", join_plain * 1000, "ms"),
        Row("join p50 (connected session), TLS", join_tls * 1000, "ms", join_tls / join_plain, "target ≤ 1.3"),
        Row("join p90 (connected session), plaintext", percentile(plain.joins, 90) * 1000, "ms"),
        Row("join p90 (connected session), TLS", percentile(tls.joins, 90) * 1000, "ms",
            percentile(tls.joins, 90) / percentile(plain.joins, 90)),
        Row("new consumer p50 (session + join), plaintext", new_plain * 1000, "ms"),
        Row("new consumer p50 (session + join), TLS", new_tls * 1000, "ms", new_tls / new_plain),
        Row("session p50 (start_client), plaintext", session_plain * 1000, "ms"),
        Row("session p50 (start_client), TLS", session_tls * 1000, "ms", session_tls / session_plain),
        Row("commits, plaintext", commit_plain, "/s"),
        Row("commits, TLS", commit_tls, "/s", commit_tls / commit_plain, "target ≥ 0.7"),
        Row("connect p50, plaintext (TCP)", percentile(plain.connects, 50) * 1000, "ms"),
        Row("connect p50, TLS (TCP + handshake)", percentile(tls.connects, 50) * 1000, "ms"),
    ] + ([] if netty is None else [
        Row("join p50 (connected session), plaintext on Netty", percentile(netty.joins, 50) * 1000, "ms",
            percentile(netty.joins, 50) / join_plain),
        Row("new consumer p50, plaintext on Netty", percentile(netty.new_consumers, 50) * 1000, "ms",
            percentile(netty.new_consumers, 50) / new_plain),
        Row("commits, plaintext on Netty", percentile(netty.commit_rates, 50), "/s",
            percentile(netty.commit_rates, 50) / commit_plain),
    ]), title=f"TLS to ZooKeeper against plaintext, load average {os.getloadavg()[0]:.1f} ({len(plain.joins)} joins of each kind and "
             f"{len(plain.commit_rates)} commit rounds a side, alternating; medians)")


if __name__ == "__main__":
    main()
