"""bin/bench scale — how the coordinator copes with many groups: cold start, failover, idle cost.

One ZooKeeper (fsync on, the JVM's default options). For each size (G groups x M members, one topic of P partitions
every group consumes) and each node count (1 or 3 ``coordinatord`` processes):

* members are light members (:mod:`tests.benchmarks.lightmembers`: each registers, watches
  its channel, applies its commands with the member's own decision logic, claims owner nodes
  and rewrites offsets compare-and-set, acks; no data plane), thousands per process handled
  in batches over a few shared kazoo clients, in ``--member-procs`` processes, all
  registered before any coordinator starts (``--real-members``: a
  :class:`~consumer.member.GroupMember` each, a thread per member);
* **cold**: from spawning the coordinator processes until every group's state is Stable with
  all its members;
* **idle**: CPU of the coordinators and of ZooKeeper over ``--idle-s`` seconds with nothing
  changing (% of one core), their RSS, and ZooKeeper's znode count;
* **failover**: SIGKILL of the controller node (with one node, a new node is started at
  once): the time until every shard is led by a live node (the dead session must expire
  first: about the session timeout) and from then until every shard reports all its groups
  verified; and from the controller's placement of the last shard (its znode's mtime) until
  every shard was seen verified (the takeover itself).

``--baseline DIR`` runs the coordinators of another checkout (e.g. ``git archive`` of an older
commit) on the same scenarios in the same run; ratios are baseline / current (above 1:
the current code is faster or cheaper). ``--large`` adds one group of 500 members on 5,000
partitions. Heavy: run under ``flock /tmp/zkgroups-heavy.lock``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from kazoo.exceptions import NoNodeError

from coordinator import protocol, read
from coordinator.errors import CorruptZnode
from coordinator.testing.zkserver import SERVER_JVM, die_with_parent, four_letter, provide_zookeeper
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from tests.benchmarks.common import Row, print_table
from tests.benchmarks.lightmembers import MemberPool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
TOPIC = "t"
MEMBER_SESSION_MS = 30000


def group_name(i: int) -> str:
    return f"g{i:05d}"


# ---------------------------------------------------------------- processes

def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (from /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[21]) * PAGE / 1e6


def coordinatord(connect: str, name: str, session_ms: int, root: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=root)
    return subprocess.Popen([sys.executable, "-m", "consumer.cli.coordinatord", "--zk", connect, "--node-id", name,
                             "--session-timeout-ms", str(session_ms), "--log-level", "WARNING"],
                            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=die_with_parent)


def start_members(connect: str, groups: List[str], members: int, procs: int, clients: int,
                  real: bool) -> List[subprocess.Popen]:
    """Member processes, each holding its share of the groups' members; returns once all registered."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = []
    for k in range(procs):
        mine = groups[k::procs]
        if not mine:
            continue
        out.append(subprocess.Popen([sys.executable, "-m", "tests.benchmarks.bench_scale", "--worker", connect,
                                     str(members), str(clients), "real" if real else "light", ",".join(mine)],
                                    cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    preexec_fn=die_with_parent))
    for p in out:
        line = p.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"a member process failed to start ({line!r})")
    return out


def stop_members(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        p.stdin.close()
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def worker(connect: str, members: int, clients: int, groups: List[str], real: bool) -> None:
    """A member process: ``members`` members per group over ``clients`` kazoo clients; prints
    ``ready`` once all are registered and runs until stdin closes. Light members
    (:mod:`tests.benchmarks.lightmembers`) by default; ``real``: a GroupMember each."""
    logging.disable(logging.WARNING)  # no "no coordinator is running" lines: none runs yet, on purpose
    # A long session: a busy member process may starve its connection threads for seconds on a
    # loaded machine; the members' sessions are not what is measured.
    zks = [start_client(connect, MEMBER_SESSION_MS) for _ in range(clients)]
    if real:
        from consumer.member import GroupMember, MemberListener
        jobs = [(g, i) for g in groups for i in range(members)]

        def start(job):
            return GroupMember(zks[hash(job) % len(zks)], job[0], {TOPIC: 1}, listener=MemberListener()).start()

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            running = list(pool.map(start, jobs))
    else:
        running = MemberPool(zks, groups, members, TOPIC).start()
    print("ready", flush=True)
    sys.stdin.read()
    del running
    for zk in zks:
        close_client(zk)
    os._exit(0)


# ---------------------------------------------------------------- observations

def unstable(zk, groups: List[str], members: int) -> int:
    """How many groups are not Stable with all their members (states read pipelined)."""
    gets = [zk.get_async(protocol.state_path(g)) for g in groups]
    bad = 0
    for a in gets:
        try:
            s = protocol.GroupState.decode(a.get()[0], "state")
            bad += not (s.state == protocol.STABLE and len(s.members) == members)
        except Exception:
            bad += 1
    return bad


class StableWatch:
    """Which groups are not Stable with all their members, kept current by a watch on each
    state znode: a cold start of 1,000 groups costs this observer a few thousand messages,
    where reading every state at every poll (1,000 reads every 50 ms) competed for the cores
    with what it measured."""

    def __init__(self, zk, groups: List[str], members: int):
        self.zk, self.members = zk, members
        self.pending = set(groups)
        self.changed = threading.Condition()
        for g in groups:
            self._read(g)

    def _read(self, group: str) -> None:  # any thread: asks only
        path = protocol.state_path(group)
        self.zk.get_async(path, watch=lambda _e: self._read(group)).rawlink(lambda a: self._got(group, a))

    def _got(self, group: str, answer) -> None:  # kazoo's callback thread
        try:
            state = protocol.GroupState.decode(answer.get()[0], "state")
            stable = state.state == protocol.STABLE and len(state.members) == self.members
        except NoNodeError:  # not written yet: read it once it is (or now, if it just was)
            made = self.zk.exists_async(protocol.state_path(group), watch=lambda _e: self._read(group))
            made.rawlink(lambda a: a.successful() and a.value is not None and self._read(group))
            stable = False
        except CorruptZnode:
            stable = False
        with self.changed:
            (self.pending.discard if stable else self.pending.add)(group)
            self.changed.notify_all()

    def wait(self, timeout: float) -> float:
        t0 = time.perf_counter()
        with self.changed:
            if not self.changed.wait_for(lambda: not self.pending, timeout):
                raise TimeoutError(f"timed out waiting for every group Stable ({len(self.pending)} are not)")
        return time.perf_counter() - t0


def wait_until(pred, timeout: float, what: str, poll: float = 0.1) -> float:
    t0 = time.perf_counter()
    while not pred():
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(poll)
    return time.perf_counter() - t0


def znode_count(connect: str) -> int:
    host, port = connect.split("/")[0].split(",")[0].rsplit(":", 1)
    for line in four_letter(host, int(port), "mntr").splitlines():
        if line.startswith("zk_znode_count"):
            return int(line.split()[1])
    return -1


@dataclass
class Result:
    cold_s: float = 0.0
    cold_coord_cpu_s: float = 0.0    # CPU the coordinators spent from start until all Stable
    cold_zk_cpu_s: float = 0.0
    cold_members_cpu_s: float = 0.0  # and the member processes (they share the machine's cores)
    idle_coord_pct: float = 0.0      # % of one core, all coordinators together
    idle_zk_pct: float = 0.0
    coord_rss_mb: float = 0.0        # the largest coordinator
    zk_rss_mb: float = 0.0
    znodes: int = 0
    elect_s: float = 0.0             # SIGKILL -> every shard led by a live node
    verify_s: float = 0.0            # then -> every shard verified
    takeover_s: float = 0.0          # the last shard placed -> every shard verified
    extra: Dict[str, float] = field(default_factory=dict)


def scenario(connect: str, zk_pid: Optional[int], groups: int, members: int, partitions: int, nodes: int,
             args, root: str, tag: str) -> Result:
    chroot = f"{connect}/{tag}"
    znodes_before = znode_count(connect)
    names = [group_name(i) for i in range(groups)]
    admin = start_client(chroot)
    TopicRegistry(admin).create(TOPIC, partitions)
    workers = start_members(chroot, names, members, args.member_procs, args.clients, args.real_members)
    coords: Dict[str, subprocess.Popen] = {}
    r = Result()
    try:
        zk_cold = cpu_seconds(zk_pid) if zk_pid else 0.0
        members_cold = sum(cpu_seconds(w.pid) for w in workers)
        watch = StableWatch(admin, names, members)
        t0 = time.perf_counter()
        for k in range(nodes):
            coords[f"n{k}"] = coordinatord(chroot, f"n{k}", args.session_ms, root)
        watch.wait(args.timeout)
        r.cold_s = time.perf_counter() - t0
        r.cold_coord_cpu_s = sum(cpu_seconds(p.pid) for p in coords.values())
        r.cold_zk_cpu_s = cpu_seconds(zk_pid) - zk_cold if zk_pid else float("nan")
        r.cold_members_cpu_s = sum(cpu_seconds(w.pid) for w in workers) - members_cold
        wait_until(lambda: read.all_verified(admin), args.timeout, "every shard verified", 0.05)
        time.sleep(1.0)  # let the last acks and state writes finish
        pids = [p.pid for p in coords.values()]
        before = [cpu_seconds(p) for p in pids]
        zk_before = cpu_seconds(zk_pid) if zk_pid else 0.0
        time.sleep(args.idle_s)
        r.idle_coord_pct = 100 * sum(cpu_seconds(p) - b for p, b in zip(pids, before)) / args.idle_s
        r.idle_zk_pct = 100 * (cpu_seconds(zk_pid) - zk_before) / args.idle_s if zk_pid else float("nan")
        r.coord_rss_mb = max(rss_mb(p) for p in pids)
        r.zk_rss_mb = rss_mb(zk_pid) if zk_pid else float("nan")
        r.znodes = znode_count(connect) - znodes_before  # this scenario's
        # Failover: SIGKILL the controller (it leads shards too).
        leader = read.leader(admin)
        victim = leader.node_id if leader and leader.node_id in coords else "n0"
        coords[victim].send_signal(signal.SIGKILL)
        coords[victim].wait()
        t0 = time.perf_counter()
        if nodes == 1:
            coords["n-new"] = coordinatord(chroot, "n-new", args.session_ms, root)

        def led():
            leaders = read.shard_leaders(admin)
            return bool(leaders) and all(n and n != victim for n, _, _ in leaders.values())

        r.elect_s = wait_until(led, args.timeout, "every shard led by a live node", 0.02)
        r.verify_s = wait_until(lambda: read.all_verified(admin), args.timeout, "every shard verified", 0.02)
        # From the controller's placement of the last shard (its znode's mtime, the server's
        # clock: the same machine's) until every shard was seen verified.
        verified_at = time.time()
        placed = max(admin.exists(protocol.shard_path(s)).mtime for s in range(read.shard_count(admin))) / 1000.0
        r.takeover_s = verified_at - placed
        wait_until(lambda: unstable(admin, names, members) == 0, args.timeout, "every group Stable after failover")
    finally:
        for p in coords.values():
            if p.poll() is None:
                p.terminate()
        for p in coords.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        stop_members(workers)
        close_client(admin)
    return r


#: (what, Result field, unit, how the baseline's value is shown) of every compared row.
COMPARED = [
    ("cold start -> all Stable", "cold_s", "s", "{:.2f} s"),
    ("cold start: coordinators' CPU", "cold_coord_cpu_s", "s", "{:.2f} s"),
    ("cold start: ZooKeeper's CPU", "cold_zk_cpu_s", "s", "{:.2f} s"),
    ("cold start: member processes' CPU", "cold_members_cpu_s", "s", "{:.2f} s"),
    ("SIGKILL -> shards led again", "elect_s", "s", "{:.2f} s"),
    ("then -> all verified", "verify_s", "s", "{:.2f} s"),
    ("last shard placed -> all verified", "takeover_s", "s", "{:.2f} s"),
    ("idle coordinators CPU", "idle_coord_pct", "% core", "{:.2f} %"),
    ("idle ZooKeeper CPU", "idle_zk_pct", "% core", "{:.2f} %"),
    ("coordinator RSS (largest)", "coord_rss_mb", "MB", "{:.0f} MB"),
]


def rows_for(label: str, cur: Result, base: Optional[Result], args) -> List[Row]:
    rows = []
    for what, name, unit, fmt in COMPARED:
        mine = getattr(cur, name)
        ratio = note = None
        if base is not None:
            theirs = getattr(base, name)
            ratio, note = (theirs / mine if mine else None), "baseline " + fmt.format(theirs)
        if name == "elect_s":
            note = (note or "") + f" (session {args.session_ms} ms)"
        rows.append(Row(f"{label} {what}", mine, unit, ratio, note or ""))
    return rows + [Row(f"{label} ZooKeeper RSS", cur.zk_rss_mb, "MB", None),
                   Row(f"{label} znodes", cur.znodes, "", None)]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        connect, members, clients, kind, groups = sys.argv[2:7]
        return worker(connect, int(members), int(clients), groups.split(","), kind == "real")
    ap = argparse.ArgumentParser(prog="bin/bench scale", description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="10,100,1000", help="group counts to ramp through")
    ap.add_argument("--members", type=int, default=10, help="members per group")
    ap.add_argument("--partitions", type=int, default=20, help="partitions of the topic every group consumes")
    ap.add_argument("--nodes", default="1,3", help="coordinator node counts")
    ap.add_argument("--large", action="store_true", help="also one group of 500 members on 5,000 partitions")
    ap.add_argument("--member-procs", type=int, default=4, help="member processes")
    ap.add_argument("--clients", type=int, default=2, help="kazoo clients per member process")
    ap.add_argument("--real-members", action="store_true",
                    help="GroupMember objects (a thread each) instead of the light members")
    ap.add_argument("--idle-s", type=float, default=70.0,
                    help="idle measurement window (longer than the 60 s check interval, so it holds a check)")
    ap.add_argument("--session-ms", type=int, default=6000, help="the coordinators' session timeout")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up a wait after this many seconds")
    ap.add_argument("--baseline", metavar="DIR", help="also run the coordinators of this checkout, for ratios")
    args = ap.parse_args()
    sizes = [(int(g), args.members, args.partitions) for g in args.groups.split(",") if g]
    if args.large:
        sizes.append((1, 500, 5000))
    rows: List[Row] = []
    with provide_zookeeper(tick_ms=200, fsync=True, jvm=SERVER_JVM) as zk:
        zk_pid = zk.ensemble.servers[0].proc.pid if zk.ensemble else None
        for g, m, p in sizes:
            for n in [int(x) for x in args.nodes.split(",")]:
                label = f"{g}x{m} P={p} nodes={n}"
                base = None
                if args.baseline:
                    base = scenario(zk.connect, zk_pid, g, m, p, n, args, os.path.abspath(args.baseline),
                                    f"base-{g}x{m}-{n}")
                cur = scenario(zk.connect, zk_pid, g, m, p, n, args, ROOT, f"cur-{g}x{m}-{n}")
                part = rows_for(label, cur, base, args)
                print_table(part, f"-- {label}")
                sys.stdout.flush()
                rows += part
    print_table(rows, "scale (ratio = baseline / current: above 1, the current code is faster or cheaper)")


if __name__ == "__main__":
    main()
