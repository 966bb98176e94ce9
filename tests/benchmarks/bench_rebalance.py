"""bin/bench rebalance — how fast a group settles after a member joins or leaves.

One ZooKeeper (fsync on), one run. For N members on P partitions: the time from a new
member's registration (and from a member's clean close) until every member fetches under the
new assignment (the coordinator has every ack and writes Stable), 20 repetitions, p50/p99.
Beside it, measured the same way in the same run: kazoo's SetPartitioner recipe with the same
N and P and the smallest time_boundary it works with. Each assignment strategy is measured
(range, the default, moves most partitions on a change; sticky moves the fewest). Last: SIGKILL of the leader with 100
groups → time until a new leader has verified every group, beyond the session timeout.
"""
from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import threading
import time

from kazoo.recipe.watchers import DataWatch

from coordinator import protocol
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from consumer.member import GroupMember, MemberListener
from tests.benchmarks.common import Row, print_table, zookeeper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def coordinatord(connect: str, name: str, session_ms: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "coordinator.cli.coordinatord", "--zk", connect, "--node-id", name,
                             "--session-timeout-ms", str(session_ms), "--log-level", "WARNING"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class StateWatch:
    """Wakes waiters whenever the group's state znode changes."""

    def __init__(self, client, group):
        self.cond = threading.Condition()
        self.state = protocol.GroupState()
        DataWatch(client, protocol.state_path(group), self._changed)

    def _changed(self, data, stat):
        with self.cond:
            if data:
                self.state = protocol.GroupState.decode(data, "state")
            self.cond.notify_all()

    def wait(self, pred, timeout=60.0):
        with self.cond:
            if not self.cond.wait_for(lambda: pred(self.state), timeout):
                raise TimeoutError(f"group did not settle: {self.state}")


def stable_with(n, after):
    return lambda s: s.state == protocol.STABLE and len(s.members) == n and s.generation > after


def bench_zkgroups(connect: str, n: int, p: int, reps: int, strategy: str):
    admin = start_client(connect)
    TopicRegistry(admin).create("t", p)
    clients = [start_client(connect) for _ in range(min(n + 1, 10))]
    watch = StateWatch(admin, "g")
    def member(i):
        return GroupMember(clients[i % len(clients)], "g", {"t": 1}, strategies=(strategy,),
                           listener=MemberListener()).start()

    members = [member(i) for i in range(n)]
    watch.wait(stable_with(n, 0))
    joins, leaves = [], []
    for i in range(reps):
        gen = watch.state.generation
        t0 = time.perf_counter()
        extra = member(i)
        watch.wait(stable_with(n + 1, gen))
        joins.append((time.perf_counter() - t0) * 1000)
        gen = watch.state.generation
        t0 = time.perf_counter()
        extra.close()
        watch.wait(stable_with(n, gen))
        leaves.append((time.perf_counter() - t0) * 1000)
    for m in members:
        m.close()
    for c in clients + [admin]:
        close_client(c)
    return joins, leaves


def bench_set_partitioner(connect: str, n: int, p: int, reps: int, boundary: float):
    clients = [start_client(connect) for _ in range(min(n + 1, 10))]
    items = list(range(p))
    stop = threading.Event()
    ids = itertools.count()

    def drive(part):
        while not stop.is_set() and not part.failed:
            if part.release:
                part.release_set()
            elif part.allocating:
                part.wait_for_acquire(timeout=0.05)
            else:
                time.sleep(0.001)

    def start(i):
        part = clients[i % len(clients)].SetPartitioner("/partitioner", set=items, identifier=f"party-{next(ids)}",
                                                        time_boundary=boundary, max_reaction_time=boundary)
        threading.Thread(target=drive, args=(part,), daemon=True).start()
        return part

    def settled(parts):
        if not all(x.acquired for x in parts):
            return False
        owned = [set(x) for x in parts]
        return sum(map(len, owned)) == p and set().union(*owned) == set(items)

    def wait(parts, timeout=120):
        deadline = time.perf_counter() + timeout
        while not settled(parts):
            if time.perf_counter() > deadline:
                raise TimeoutError("SetPartitioner did not settle")
            time.sleep(0.001)

    parts = [start(i) for i in range(n)]
    wait(parts)
    joins, leaves = [], []
    for i in range(reps):
        t0 = time.perf_counter()
        extra = start(i)
        time.sleep(0.002)  # let the new party register before checking
        wait(parts + [extra])
        joins.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        extra.finish()
        time.sleep(0.002)
        wait(parts)
        leaves.append((time.perf_counter() - t0) * 1000)
    stop.set()
    for x in parts:
        x.finish()
    for c in clients:
        close_client(c)
    return joins, leaves


def bench_failover(connect: str, groups: int, session_ms: int):
    admin = start_client(connect)
    TopicRegistry(admin).create("f", 4)
    nodes = {name: coordinatord(connect, name, session_ms) for name in ("f1", "f2")}
    clients = [start_client(connect) for _ in range(10)]
    members = [GroupMember(clients[i % 10], f"fg{i}", {"f": 1}, listener=MemberListener()).start()
               for i in range(groups)]

    def leader():
        try:
            return protocol.LeaderInfo.decode(admin.get(protocol.LEADER)[0])
        except Exception:
            return None

    def wait(pred, timeout=60):
        deadline = time.perf_counter() + timeout
        while not pred():
            if time.perf_counter() > deadline:
                raise TimeoutError("no leader")
            time.sleep(0.002)

    def all_stable():
        for i in range(groups):
            try:
                raw, _ = admin.get(protocol.state_path(f"fg{i}"))
                if protocol.GroupState.decode(raw, "s").state != protocol.STABLE:
                    return False
            except Exception:
                return False
        return True

    wait(lambda: leader() is not None and leader().loaded and all_stable(), 120)
    first = leader()
    t0 = time.perf_counter()
    nodes[first.node_id].send_signal(signal.SIGKILL)
    wait(lambda: (lambda i: i is not None and i.epoch > first.epoch and i.loaded)(leader()), 60)
    took = (time.perf_counter() - t0) * 1000
    for m in members:
        m.close()
    for proc in nodes.values():
        proc.kill()
        proc.wait()
    for c in clients + [admin]:
        close_client(c)
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sizes", default="10x100,50x500", help="NxP pairs")
    ap.add_argument("--boundary", type=float, default=0.02,
                    help="SetPartitioner time_boundary (s); 0.01 and 0.05 measured no faster")
    ap.add_argument("--strategies", default="range,sticky", help="assignment strategies to measure")
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--session-ms", type=int, default=2000)
    args = ap.parse_args()
    rows = []
    with zookeeper(fsync=True) as connect:
        for size in args.sizes.split(","):
            n, p = map(int, size.split("x"))
            sj, sl = bench_set_partitioner(f"{connect}/sp-{n}x{p}", n, p, args.reps, args.boundary)
            for strategy in args.strategies.split(","):
                chroot = f"{connect}/bench-{n}x{p}-{strategy}"
                node = coordinatord(chroot, "b1", 6000)
                try:
                    joins, leaves = bench_zkgroups(chroot, n, p, args.reps, strategy)
                finally:
                    node.terminate()
                    node.wait()
                for what, ours, theirs in (("join", joins, sj), ("leave", leaves, sl)):
                    for q in (50, 99):
                        mine, base = percentile(ours, q), percentile(theirs, q)
                        rows.append(Row(f"N={n} P={p} {strategy} {what} p{q}", mine, "ms", base / mine,
                                        f"SetPartitioner {base:.0f} ms (time_boundary {args.boundary}s)"))
        took = bench_failover(f"{connect}/failover", args.groups, args.session_ms)
        rows.append(Row(f"leader SIGKILL, {args.groups} groups verified", took - args.session_ms, "ms",
                        note=f"beyond the {args.session_ms} ms session timeout"))
    print_table(rows, "rebalance latency (ratio = SetPartitioner / zkgroups: how many times faster)")

if __name__ == "__main__":
    main()
