"""bin/bench rebalance — how fast a group settles after a member joins or leaves.

One ZooKeeper (fsync on), one run. For N members on P partitions: the time from a new
member's registration (and from a member's clean close) until every member fetches under the
new assignment (the coordinator has every ack and writes Stable), 20 repetitions, p50/p99.
Beside it, measured the same way in the same run: kazoo's SetPartitioner recipe with the same
N and P and the smallest time_boundary it works with. Each assignment strategy is measured
(range, the default, moves most partitions on a change; sticky moves the fewest). Last: SIGKILL of the leader with 100
groups → time until a new leader has verified every group, beyond the session timeout.

Before anything is measured, both sides run unmeasured joins and leaves (``--warmup``) against
the new server: a ZooKeeper freshly started spends its first ~15 s compiling its request path
(the JVM's C2 compiler took ~5 s of CPU on the 2 cores here), which a server in production has
long since done, and joins measured meanwhile paid for it (p50 55 ms in the first 50
repetitions, 32–37 ms after 100).
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

from kazoo.client import KazooClient
from kazoo.handlers import utils as kazoo_utils
from kazoo.recipe.watchers import DataWatch

from coordinator import protocol, read
from coordinator.assignors import DEFAULT_STRATEGY
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.testing.zkserver import die_with_parent
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
    return subprocess.Popen([sys.executable, "-m", "consumer.cli.coordinatord", "--zk", connect, "--node-id", name,
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


class RoundTrips:
    """Counts, per thread, the ZooKeeper requests sent and the sequential round trips: a thread
    that sent requests and then waits for an answer makes one round trip, however many
    requests it had pipelined (kazoo's sync calls are an async call and a wait)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict = {}
        self.trips: dict = {}
        self._sent = threading.local()
        call, get = KazooClient._call, kazoo_utils.AsyncResult.get
        counter = self

        def counted_call(client, request, async_object):
            counter._sent.pending = True
            with counter.lock:
                name = threading.current_thread().name
                counter.requests[name] = counter.requests.get(name, 0) + 1
            return call(client, request, async_object)

        def counted_get(result, *args, **kwargs):
            if getattr(counter._sent, "pending", False):
                counter._sent.pending = False
                with counter.lock:
                    name = threading.current_thread().name
                    counter.trips[name] = counter.trips.get(name, 0) + 1
            return get(result, *args, **kwargs)

        KazooClient._call, kazoo_utils.AsyncResult.get = counted_call, counted_get
        self._restore = lambda: (setattr(KazooClient, "_call", call), setattr(kazoo_utils.AsyncResult, "get", get))

    def reset(self):
        with self.lock:
            self.requests.clear()
            self.trips.clear()

    def close(self):
        self._restore()

    def sides(self):
        """{side: (round trips of its busiest thread, all round trips, requests)}: the
        coordinator's event and handler threads, and the members' threads (the joiner's
        registration runs on the benchmark's main thread)."""
        with self.lock:
            trips, requests = dict(self.trips), dict(self.requests)
        out = {}
        for side, prefixes in (("coordinator", ("groups-", "rebalance-")), ("members", ("member-", "MainThread"))):
            names = [n for n in set(trips) | set(requests) if n.startswith(prefixes)]
            busiest = max((trips.get(n, 0) for n in names), default=0)
            out[side] = (busiest, sum(trips.get(n, 0) for n in names), sum(requests.get(n, 0) for n in names))
        return out


def count_round_trips(connect: str, n: int, p: int, strategy: str):
    """One join and one leave with the coordinator and the members in this process, counted:
    {"join"/"leave": RoundTrips.sides()}."""
    counter = RoundTrips()
    node = None
    try:
        node = Coordinator(connect, "rt", CoordinatorConfig()).start()
        admin = start_client(connect)
        TopicRegistry(admin).create("t", p)
        clients = [start_client(connect) for _ in range(min(n + 1, 10))]
        watch = StateWatch(admin, "g")
        members = [GroupMember(clients[i % len(clients)], "g", {"t": 1}, strategies=(strategy,),
                               listener=MemberListener()).start() for i in range(n)]
        watch.wait(stable_with(n, 0))
        time.sleep(0.5)  # let the first generation's last acks and watches settle
        out = {}
        counter.reset()
        gen = watch.state.generation
        extra = GroupMember(clients[n % len(clients)], "g", {"t": 1}, strategies=(strategy,),
                            listener=MemberListener()).start()
        watch.wait(stable_with(n + 1, gen))
        time.sleep(0.3)
        out["join"] = counter.sides()
        counter.reset()
        gen = watch.state.generation
        extra.close()
        watch.wait(stable_with(n, gen))
        time.sleep(0.3)
        out["leave"] = counter.sides()
        for m in members:
            m.close()
        for c in clients + [admin]:
            close_client(c)
        return out
    finally:
        if node:
            node.close()
        counter.close()


def warm_up(connect: str, reps: int, boundary: float) -> None:
    """Unmeasured joins and leaves of both sides in a chroot of their own (see the module's
    docstring): ``reps`` of ours (members as processes), a tenth as many of SetPartitioner's."""
    if reps <= 0:
        return
    bench_set_partitioner(f"{connect}/warmup-sp", 10, 100, max(1, reps // 10), boundary)
    node = coordinatord(f"{connect}/warmup", "w1", 6000)
    try:
        bench_zkgroups_processes(f"{connect}/warmup", 10, 100, reps, DEFAULT_STRATEGY)
    finally:
        node.terminate()
        node.wait()


def member_process(connect: str, group: str, strategy: str) -> None:
    """``--member``: a member in a process of its own, driven by lines on stdin: ``join``
    (registers; answers ``joined``), ``leave`` (closes; answers ``left``), ``exit``."""
    client = start_client(connect)
    member = None
    for line in sys.stdin:
        command = line.strip()
        if command == "join":
            member = GroupMember(client, group, {"t": 1}, strategies=(strategy,), listener=MemberListener()).start()
            print("joined", flush=True)
        elif command == "leave" and member:
            member.close()
            member = None
            print("left", flush=True)
        elif command == "exit":
            break
    if member:
        member.close()
    close_client(client)


class MemberProcess:
    def __init__(self, connect: str, strategy: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.benchmarks.bench_rebalance", "--member", connect, "g",
                                      strategy], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=die_with_parent)

    def send(self, command: str, answer: str = "") -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        if answer and self.proc.stdout.readline().strip() != answer:
            raise RuntimeError(f"member process: no {answer!r} after {command!r}")

    def close(self) -> None:
        try:
            self.send("exit")
            self.proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def bench_zkgroups_processes(connect: str, n: int, p: int, reps: int, strategy: str):
    """As :func:`bench_zkgroups`, every member a process of its own (the timer starts when the
    joiner is told to register, and when the leaver is told to close)."""
    admin = start_client(connect)
    TopicRegistry(admin).create("t", p)
    watch = StateWatch(admin, "g")
    members = [MemberProcess(connect, strategy) for _ in range(n + 1)]
    try:
        for m in members[:n]:
            m.send("join", "joined")
        watch.wait(stable_with(n, 0))
        extra = members[n]
        joins, leaves = [], []
        for _ in range(reps):
            gen = watch.state.generation
            t0 = time.perf_counter()
            extra.send("join")
            watch.wait(stable_with(n + 1, gen))
            joins.append((time.perf_counter() - t0) * 1000)
            extra.proc.stdout.readline()
            gen = watch.state.generation
            t0 = time.perf_counter()
            extra.send("leave")
            watch.wait(stable_with(n, gen))
            leaves.append((time.perf_counter() - t0) * 1000)
            extra.proc.stdout.readline()
        return joins, leaves, []
    finally:
        for m in members:
            m.close()
        close_client(admin)


def moved(before: protocol.GroupState, after: protocol.GroupState) -> int:
    """Partitions whose owning member changed from one generation to the next."""
    old = {(t, q): protocol.consumer_of_stream(s) for t, parts in before.assignment.items() for q, s in parts.items()}
    return sum(1 for t, parts in after.assignment.items() for q, s in parts.items()
               if old.get((t, q)) != protocol.consumer_of_stream(s))


def bench_zkgroups(connect: str, n: int, p: int, reps: int, strategy: str):
    """(join ms, leave ms, partitions moved per change) over ``reps`` joins and leaves."""
    admin = start_client(connect)
    TopicRegistry(admin).create("t", p)
    clients = [start_client(connect) for _ in range(min(n + 1, 10))]
    watch = StateWatch(admin, "g")
    def member(i):
        return GroupMember(clients[i % len(clients)], "g", {"t": 1}, strategies=(strategy,),
                           listener=MemberListener()).start()

    members = [member(i) for i in range(n)]
    watch.wait(stable_with(n, 0))
    joins, leaves, moves = [], [], []
    for i in range(reps):
        before = watch.state
        t0 = time.perf_counter()
        extra = member(i)
        watch.wait(stable_with(n + 1, before.generation))
        joins.append((time.perf_counter() - t0) * 1000)
        moves.append(moved(before, watch.state))
        before = watch.state
        t0 = time.perf_counter()
        extra.close()
        watch.wait(stable_with(n, before.generation))
        leaves.append((time.perf_counter() - t0) * 1000)
        moves.append(moved(before, watch.state))
    for m in members:
        m.close()
    for c in clients + [admin]:
        close_client(c)
    return joins, leaves, moves


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

    wait(lambda: leader() is not None and all_stable() and read.all_verified(admin), 120)
    first = leader()
    t0 = time.perf_counter()
    nodes[first.node_id].send_signal(signal.SIGKILL)

    def taken_over():
        leaders = read.shard_leaders(admin)
        return (bool(leaders) and all(node and node != first.node_id and verified
                                      for node, _, verified in leaders.values()))

    wait(taken_over, 60)
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
    if len(sys.argv) > 1 and sys.argv[1] == "--member":
        return member_process(*sys.argv[2:5])
    ap = argparse.ArgumentParser(prog="bin/bench rebalance", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sizes", default="10x100,50x500", help="NxP pairs")
    ap.add_argument("--boundary", type=float, default=0.02,
                    help="SetPartitioner time_boundary (s); 0.01 and 0.05 measured no faster")
    ap.add_argument("--strategies", default="sticky,range", help="assignment strategies to measure")
    ap.add_argument("--processes", action="store_true", help="every member a process of its own")
    ap.add_argument("--warmup", type=int, default=100,
                    help="unmeasured joins and leaves first, while ZooKeeper's JVM compiles (0: none)")
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--session-ms", type=int, default=2000)
    args = ap.parse_args()
    rows, trips = [], []
    with zookeeper(fsync=True) as connect:
        warm_up(connect, args.warmup, args.boundary)
        for size in args.sizes.split(","):
            n, p = map(int, size.split("x"))
            sj, sl = bench_set_partitioner(f"{connect}/sp-{n}x{p}", n, p, args.reps, args.boundary)
            for strategy in args.strategies.split(","):
                chroot = f"{connect}/bench-{n}x{p}-{strategy}"
                node = coordinatord(chroot, "b1", 6000)
                try:
                    run = bench_zkgroups_processes if args.processes else bench_zkgroups
                    joins, leaves, moves = run(chroot, n, p, args.reps, strategy)
                finally:
                    node.terminate()
                    node.wait()
                for what, ours, theirs in (("join", joins, sj), ("leave", leaves, sl)):
                    for q in (50, 99):
                        mine, base = percentile(ours, q), percentile(theirs, q)
                        rows.append(Row(f"N={n} P={p} {strategy} {what} p{q}", mine, "ms", base / mine,
                                        f"SetPartitioner {base:.0f} ms (time_boundary {args.boundary}s)"))
                if moves:
                    rows.append(Row(f"N={n} P={p} {strategy} partitions moved per change (mean)",
                                    sum(moves) / len(moves), "", note=f"at least {p / (n + 1):.1f}"))
                counted = count_round_trips(f"{connect}/trips-{n}x{p}-{strategy}", n, p, strategy)
                for what, sides in counted.items():
                    for side, (busiest, total, requests) in sides.items():
                        trips.append(Row(f"N={n} P={p} {strategy} {what}: {side}", busiest, "round trips",
                                         note=f"{total} in all threads, {requests} requests"))
        took = bench_failover(f"{connect}/failover", args.groups, args.session_ms)
        rows.append(Row(f"leader SIGKILL, {args.groups} groups verified", took - args.session_ms, "ms",
                        note=f"beyond the {args.session_ms} ms session timeout"))
    mode = "members as processes" if args.processes else "members in this process"
    print_table(rows, f"rebalance latency, {mode} (ratio = SetPartitioner / zkgroups: how many times faster)")
    print_table(trips, "sequential ZooKeeper round trips of one join and one leave (coordinator: its busiest "
                       "thread; members: the busiest member thread)")


if __name__ == "__main__":
    main()
