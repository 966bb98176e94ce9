"""bin/bench growth — a topic grown under a live group, as users run it.

One ZooKeeper (fsync on, the JVM's defaults), one ``coordinatord`` and ``--consumers``
``groupctl consume`` processes, every one with its defaults, on a topic of ``--partitions``
partitions with no records. Once the group is Stable the topic is grown with ``groupctl topics
add-partitions`` to each total of ``--to`` in turn (default: to 1,000, then to 10,000). For each
growth, until the group's state is Stable with every partition assigned (the coordinator writes
Stable only once every member acked, and a member acks only once it created the owner nodes of
all it was given):

* the time from the topic's growth to the Stable state (both znodes' mtimes) and from the
  command's start (which includes starting ``groupctl``);
* ZooKeeper's own view (``mntr``, its statistics reset just before): requests and bytes it
  received, ``max_latency``, the most ``outstanding_requests`` seen (sampled every 100 ms);
* the bytes each side sent and received on its ZooKeeper connections (``ss``: the coordinator,
  the consumers together), and the CPU ZooKeeper, the coordinator and the consumers spent;
* then, over ``--settle-s`` seconds: the consumers' CPU with nothing to consume (their idle
  cost at the new size), and the lines in every process's log that say a connection or a
  session was lost (``ConnectionLoss``, ``Connection dropped``, ``SessionExpired``), which
  must stay 0.

``--baseline DIR`` runs the same with the processes of another checkout (``git archive`` of an
older commit), first; ratios are baseline / current (above 1: the current code is faster or
cheaper). ``--rounds N`` runs both N times, alternating, and reports each figure's median.
Heavy: run under ``flock /tmp/zkgroups-heavy.lock``.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, fields
from typing import Dict, List, Optional

from kazoo.recipe.watchers import DataWatch

from coordinator import protocol
from coordinator.testing.zkserver import SERVER_JVM, die_with_parent, four_letter, provide_zookeeper
from coordinator.zkclient import close_client, start_client
from tests.benchmarks.bench_scale import cpu_seconds
from tests.benchmarks.common import Row, print_table, scratch_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPIC, GROUP = "t", "g"
#: Log lines that say a ZooKeeper connection or session was lost.
TROUBLE = re.compile(r"ConnectionLoss|Connection dropped|SessionExpired|session lost")


# ---------------------------------------------------------------- ZooKeeper's side

def _four_letter(connect: str, word: str) -> str:
    host, port = connect.split("/")[0].split(",")[0].rsplit(":", 1)
    return four_letter(host, int(port), word)


def mntr(connect: str) -> Dict[str, float]:
    """ZooKeeper's ``mntr`` figures (the numeric ones)."""
    out = {}
    for line in _four_letter(connect, "mntr").splitlines():
        key, _, value = line.partition("\t")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


class OutstandingSampler:
    """The largest ``outstanding_requests`` mntr shows, sampled every 100 ms until stopped."""

    def __init__(self, connect: str):
        self.connect, self.most = connect, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.most = max(self.most, mntr(self.connect).get("zk_outstanding_requests", 0.0))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.most


_SS_PID = re.compile(r"pid=(\d+)")
_SS_BYTES = re.compile(r"\bbytes_(sent|received):(\d+)")


def socket_bytes(port: int) -> Dict[str, Dict[str, int]]:
    """{client socket (its local address): {"pid", "sent", "received"}} of every connection to
    ZooKeeper's ``port`` on this machine (``ss``; {} if it cannot tell)."""
    try:
        text = subprocess.run(["ss", "-tinpH", "dst", f"127.0.0.1:{port}"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: Dict[str, Dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        if not line[:1].isspace():  # a socket's line; its counters follow on an indented one
            fields_ = line.split()
            pid = _SS_PID.search(line)
            current = fields_[3] if len(fields_) > 3 else None
            if current:
                out[current] = {"pid": int(pid.group(1)) if pid else 0, "sent": 0, "received": 0}
        elif current:
            for kind, n in _SS_BYTES.findall(line):
                out[current][kind] = int(n)
    return out


def bytes_by_pid(before, after) -> Dict[int, int]:
    """{pid: bytes sent + received} between two :func:`socket_bytes` readings (a new socket from 0)."""
    out: Dict[int, int] = {}
    for sock, now in after.items():
        was = before.get(sock, {"sent": 0, "received": 0})
        out[now["pid"]] = out.get(now["pid"], 0) + now["sent"] - was["sent"] + now["received"] - was["received"]
    return out


# ---------------------------------------------------------------- the processes

class Stack:
    """A coordinatord and the consumers of one checkout (``root``), logging to ``logs``."""

    def __init__(self, connect: str, root: str, data_dir: str, logs: str, consumers: int):
        self.connect, self.root, self.data_dir, self.logs, self.count = connect, root, data_dir, logs, consumers
        self.env = dict(os.environ, PYTHONPATH=root)
        self.env.pop("ZK_CONNECT", None)
        # Where groupctl is in this checkout (older ones kept it in coordinator/cli).
        self.groupctl_module = "consumer.cli.groupctl" if os.path.exists(
            os.path.join(root, "consumer", "cli", "groupctl.py")) else "coordinator.cli.groupctl"
        self.consumers: List[subprocess.Popen] = []
        self.coordinator: Optional[subprocess.Popen] = None
        self._seen: Dict[str, int] = {}

    def groupctl(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", self.groupctl_module, "--zk", self.connect, "--data-dir",
                                 self.data_dir, *args], cwd=self.root, env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)

    @staticmethod
    def finished(proc: subprocess.Popen, what: str) -> None:
        _, err = proc.communicate(timeout=300)
        if proc.returncode:
            raise RuntimeError(f"groupctl {what} failed: {err.strip()[-500:]}")

    def _spawn(self, name: str, args: List[str]) -> subprocess.Popen:
        with open(os.path.join(self.logs, f"{name}.log"), "w") as log:
            return subprocess.Popen([sys.executable, "-m", *args], cwd=self.root, env=self.env,
                                    stdout=subprocess.DEVNULL, stderr=log, preexec_fn=die_with_parent)

    def start(self) -> None:
        self.coordinator = self._spawn("coordinatord", ["consumer.cli.coordinatord", "--zk", self.connect,
                                                        "--node-id", "n1"])
        for i in range(self.count):
            self.consumers.append(self._spawn(f"consumer-{i}", [
                self.groupctl_module, "--zk", self.connect, "--data-dir", self.data_dir, "consume", GROUP, TOPIC]))

    def cpu(self) -> List[float]:
        """CPU seconds so far: the coordinator's, the consumers' (together)."""
        return [cpu_seconds(self.coordinator.pid), sum(cpu_seconds(p.pid) for p in self.consumers)]

    def stop(self) -> None:
        running = [p for p in self.consumers + [self.coordinator] if p is not None]
        for p in running:
            if p.poll() is None:
                p.terminate()
        for p in running:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def trouble(self) -> int:
        """Log lines saying a connection or a session was lost, written since the last call."""
        counts = {}
        for path in glob.glob(os.path.join(self.logs, "*.log")):
            with open(path, errors="replace") as f:
                counts[path] = sum(1 for line in f if TROUBLE.search(line))
        new = sum(n - self._seen.get(path, 0) for path, n in counts.items())
        self._seen = counts
        return new


class Watches:
    """The group's state and the topic's partition count, with when each was written (the
    znode's mtime: ZooKeeper's clock, this machine's, in seconds); waiters are woken at every
    change. Server times, so that the observer's own delay (a watch, a read of a large state)
    is not measured."""

    def __init__(self, client):
        self.cond = threading.Condition()
        self.states: List = []   # (when written, GroupState) of every state seen
        self.partitions, self.partitions_at = 0, 0.0
        DataWatch(client, protocol.state_path(GROUP), self._state)
        DataWatch(client, protocol.topic_path(TOPIC), self._topic)

    def _state(self, data, stat):
        with self.cond:
            if data:
                self.states.append((stat.mtime / 1000.0, protocol.GroupState.decode(data, "state")))
            self.cond.notify_all()

    def _topic(self, data, stat):
        with self.cond:
            if data:
                self.partitions = protocol.decode_topic(data, "topic")
                self.partitions_at = stat.mtime / 1000.0
            self.cond.notify_all()

    def wait_stable(self, members: int, partitions: int, timeout: float) -> float:
        """When the group's state was written Stable with ``members`` members and ``partitions``
        partitions assigned."""
        def first():
            return next((at for at, s in self.states if s.state == protocol.STABLE and len(s.members) == members
                         and sum(len(parts) for parts in s.assignment.values()) == partitions), None)
        with self.cond:
            if not self.cond.wait_for(lambda: first() is not None, timeout):
                last = self.states[-1][1] if self.states else protocol.GroupState()
                raise TimeoutError(f"group not Stable with {partitions} partitions within {timeout:.0f} s: "
                                   f"{last.state}, generation {last.generation}")
            return first()


# ---------------------------------------------------------------- one scenario

@dataclass
class Growth:
    from_topic_s: float = 0.0        # the topic znode written -> the Stable state written
    wall_s: float = 0.0              # the command started -> Stable
    requests: float = 0.0            # ZooKeeper's figures, from the command's start to Stable
    request_bytes: float = 0.0
    max_latency_ms: float = 0.0
    outstanding: float = 0.0
    coordinator_bytes: float = 0.0   # sent + received on its ZooKeeper connections
    consumer_bytes: float = 0.0      # all consumers together
    zk_cpu_s: float = 0.0
    coordinator_cpu_s: float = 0.0
    consumers_cpu_s: float = 0.0
    idle_consumers_pct: float = 0.0  # % of one core, all consumers, over --settle-s after Stable
    lost: float = 0.0                # log lines: a connection or session lost


def _cpu(pid: Optional[int]) -> float:
    return cpu_seconds(pid) if pid else float("nan")  # no local server: its CPU is not known


def grow(stack: Stack, watch: Watches, connect: str, zk_port: int, zk_pid: Optional[int], total: int,
         args) -> Growth:
    """Grow the topic to ``total`` partitions and measure it (see the module docstring)."""
    g = Growth()
    sides = {stack.coordinator.pid: "coordinator", **{p.pid: "consumers" for p in stack.consumers}}
    sockets = socket_bytes(zk_port)
    zk_cpu, (coordinator_cpu, consumers_cpu) = _cpu(zk_pid), stack.cpu()
    _four_letter(connect, "srst")
    before = mntr(connect)
    sampler = OutstandingSampler(connect)
    t0 = time.time()
    command = stack.groupctl("topics", "add-partitions", TOPIC, "--to", str(total))
    stable_at = watch.wait_stable(args.consumers, total, args.timeout)
    g.wall_s, g.from_topic_s = stable_at - t0, stable_at - watch.partitions_at
    g.zk_cpu_s = _cpu(zk_pid) - zk_cpu
    now = stack.cpu()
    g.coordinator_cpu_s, g.consumers_cpu_s = now[0] - coordinator_cpu, now[1] - consumers_cpu
    after = mntr(connect)
    g.outstanding = sampler.stop()
    g.requests = after.get("zk_packets_received", 0) - before.get("zk_packets_received", 0)
    g.request_bytes = after.get("zk_bytes_received_count", 0) - before.get("zk_bytes_received_count", 0)
    g.max_latency_ms = after.get("zk_max_latency", 0)
    for pid, n in bytes_by_pid(sockets, socket_bytes(zk_port)).items():
        if sides.get(pid) == "coordinator":
            g.coordinator_bytes += n
        elif sides.get(pid) == "consumers":
            g.consumer_bytes += n
    stack.finished(command, "topics add-partitions")  # it makes the partitions' directories after the growth
    consumers_cpu = stack.cpu()[1]
    time.sleep(args.settle_s)  # a lost connection shows late too (a heartbeat missed, a commit after)
    g.idle_consumers_pct = 100 * (stack.cpu()[1] - consumers_cpu) / args.settle_s
    g.lost = stack.trouble()
    return g


def scenario(connect: str, zk_port: int, zk_pid: Optional[int], root: str, tag: str, args) -> List[Growth]:
    """Start a group on its own chroot, grow its topic to each of ``args.to``: a Growth each."""
    chroot = f"{connect}/{tag}"
    admin = start_client(connect)
    admin.ensure_path(f"/{tag}")
    close_client(admin)
    out = []
    with scratch_dir() as data_dir, scratch_dir(prefix="zkgroups-bench-logs-") as logs:
        stack = Stack(chroot, root, data_dir, logs, args.consumers)
        Stack.finished(stack.groupctl("topics", "create", TOPIC, "--partitions", str(args.partitions)),
                       "topics create")
        client = start_client(chroot)
        try:
            watch = Watches(client)
            stack.start()
            watch.wait_stable(args.consumers, args.partitions, args.timeout)
            time.sleep(args.settle_s)  # the first commits are done
            stack.trouble()
            for total in args.to:
                out.append(grow(stack, watch, connect, zk_port, zk_pid, total, args))
                print(f"  {tag} -> {total:,}: {out[-1]}", file=sys.stderr, flush=True)
        finally:
            stack.stop()
            close_client(client)
            if args.keep_logs:
                kept = os.path.join(args.keep_logs, tag)
                os.makedirs(kept, exist_ok=True)
                for path in glob.glob(os.path.join(logs, "*.log")):
                    shutil.copy(path, kept)
    return out


def median(growths: List[Growth]) -> Growth:
    return Growth(**{f.name: statistics.median(getattr(g, f.name) for g in growths) for f in fields(Growth)})


#: (what, Growth field, unit, how the baseline's value is shown) of every compared row.
COMPARED = [
    ("topic grown -> owned and Stable", "from_topic_s", "s", "{:.2f} s"),
    ("command -> owned and Stable", "wall_s", "s", "{:.2f} s"),
    ("ZooKeeper requests received", "requests", "", "{:,.0f}"),
    ("ZooKeeper bytes received", "request_bytes", "B", "{:,.0f} B"),
    ("ZooKeeper max latency", "max_latency_ms", "ms", "{:,.0f} ms"),
    ("ZooKeeper outstanding requests (most)", "outstanding", "", "{:,.0f}"),
    ("coordinator's ZooKeeper traffic", "coordinator_bytes", "B", "{:,.0f} B"),
    ("consumers' ZooKeeper traffic", "consumer_bytes", "B", "{:,.0f} B"),
    ("ZooKeeper's CPU", "zk_cpu_s", "s", "{:.2f} s"),
    ("coordinator's CPU", "coordinator_cpu_s", "s", "{:.2f} s"),
    ("consumers' CPU", "consumers_cpu_s", "s", "{:.2f} s"),
    ("then idle: consumers' CPU", "idle_consumers_pct", "% core", "{:.0f} %"),
    ("connection or session lost (log lines)", "lost", "", "{:.0f}"),
]


def rows_for(start: int, total: int, cur: Growth, base: Optional[Growth]) -> List[Row]:
    rows = []
    for what, name, unit, fmt in COMPARED:
        mine = getattr(cur, name)
        ratio, note = None, ""
        if base is not None:
            theirs = getattr(base, name)
            ratio = theirs / mine if mine else None
            note = "baseline " + fmt.format(theirs)
        rows.append(Row(f"{start:,} -> {total:,} partitions: {what}", mine, unit, ratio, note))
    return rows


def main():
    ap = argparse.ArgumentParser(prog="bin/bench growth", description=__doc__.splitlines()[0])
    ap.add_argument("--consumers", type=int, default=10, help="groupctl consume processes")
    ap.add_argument("--partitions", type=int, default=100, help="the topic's partitions before it grows")
    ap.add_argument("--to", default="1000,10000", help="totals the topic is grown to, in turn")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each side, alternating (medians are reported)")
    ap.add_argument("--settle-s", type=float, default=5.0, help="the idle window after each Stable")
    ap.add_argument("--timeout", type=float, default=300.0, help="give up a wait after this many seconds")
    ap.add_argument("--baseline", metavar="DIR", help="also run the processes of this checkout, for ratios")
    ap.add_argument("--keep-logs", metavar="DIR", help="keep every process's log (and ZooKeeper's) here")
    args = ap.parse_args()
    try:
        args.to = [int(x) for x in args.to.split(",") if x]
    except ValueError:
        ap.error(f"--to: comma-separated partition counts, not {args.to!r}")
    if not args.to or [args.partitions] + args.to != sorted(set([args.partitions] + args.to)):
        ap.error("--to: totals above --partitions, each larger than the one before")
    if args.consumers < 1 or args.rounds < 1 or args.partitions < 1 or args.settle_s <= 0:
        ap.error("--consumers, --rounds and --partitions must be at least 1, --settle-s above 0")
    if args.baseline and not os.path.isfile(os.path.join(args.baseline, "coordinator", "cli", "coordinatord.py")):
        ap.error(f"--baseline {args.baseline}: not a zkgroups checkout (no coordinator/cli/coordinatord.py)")
    base_runs: List[List[Growth]] = []
    cur_runs: List[List[Growth]] = []
    with provide_zookeeper(tick_ms=200, fsync=True, jvm=SERVER_JVM) as zk:
        port = int(zk.connect.split(",")[0].rsplit(":", 1)[1])
        pid = zk.ensemble.servers[0].proc.pid if zk.ensemble else None
        try:
            for r in range(args.rounds):
                if args.baseline:
                    base_runs.append(scenario(zk.connect, port, pid, os.path.abspath(args.baseline), f"base{r}", args))
                cur_runs.append(scenario(zk.connect, port, pid, ROOT, f"cur{r}", args))
        finally:
            if args.keep_logs and zk.ensemble:
                os.makedirs(args.keep_logs, exist_ok=True)
                for server in zk.ensemble.servers:
                    shutil.copy(os.path.join(server.dir, "server.log"), os.path.join(args.keep_logs, "zookeeper.log"))
    rows: List[Row] = []
    starts = [args.partitions] + args.to[:-1]
    for i, total in enumerate(args.to):
        cur = median([run[i] for run in cur_runs])
        base = median([run[i] for run in base_runs]) if base_runs else None
        rows += rows_for(starts[i], total, cur, base)
    rounds = f", median of {args.rounds} rounds" if args.rounds > 1 else ""
    print_table(rows, f"growth under {args.consumers} groupctl consume processes and one coordinatord{rounds} "
                      "(ratio = baseline / current: above 1, the current code is faster or cheaper)")


if __name__ == "__main__":
    main()
