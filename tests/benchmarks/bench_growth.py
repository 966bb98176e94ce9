"""bin/bench growth — a topic grown under a live group, as users run it.

One ZooKeeper (fsync on, the JVM's defaults), one ``coordinatord`` and ``--consumers``
``groupctl consume`` processes, every one with its defaults, on a topic of ``--partitions``
partitions. Once the group is Stable the topic is grown with ``groupctl topics add-partitions``
to each total of ``--to`` in turn (default: to 1,000, then to 10,000). For each growth, from the
command's start until the group's state is Stable with every partition assigned (the
coordinator writes Stable only once every member acked, and a member acks only once it created
the owner nodes of all it was given):

* the wall time;
* ZooKeeper's own view (``mntr``, its statistics reset just before): requests received, bytes
  received, ``max_latency``, the most ``outstanding_requests`` seen (sampled every 20 ms);
* the bytes each side sent and received on its ZooKeeper connections (``ss``: the
  coordinator, the consumers together);
* the consumers and coordinator log lines that say a connection or a session was lost
  (``ConnectionLoss``, ``Connection dropped``, ``SessionExpired``), which must stay 0.

``--baseline DIR`` runs the processes of another checkout (``git worktree add`` or ``git
archive`` of an older commit) on the same scenario in the same run, first; ratios are
baseline / current (above 1: the current code is faster or cheaper). Heavy: run under
``flock /tmp/zkgroups-heavy.lock``.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from kazoo.recipe.watchers import DataWatch

from coordinator import protocol
from coordinator.testing.zkserver import SERVER_JVM, die_with_parent, four_letter, provide_zookeeper
from coordinator.zkclient import close_client, start_client
from tests.benchmarks.bench_scale import cpu_seconds
from tests.benchmarks.common import Row, print_table, scratch_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPIC, GROUP = "t", "g"
#: Log lines that mean a ZooKeeper connection or session was lost.
TROUBLE = re.compile(r"ConnectionLoss|Connection dropped|SessionExpired|session lost")


# ---------------------------------------------------------------- ZooKeeper's side

def mntr(connect: str) -> Dict[str, float]:
    host, port = connect.split("/")[0].split(",")[0].rsplit(":", 1)
    out = {}
    for line in four_letter(host, int(port), "mntr").splitlines():
        key, _, value = line.partition("\t")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def reset_stats(connect: str) -> None:
    host, port = connect.split("/")[0].split(",")[0].rsplit(":", 1)
    four_letter(host, int(port), "srst")


class OutstandingSampler:
    """The largest ``outstanding_requests`` mntr shows, sampled every 20 ms while running."""

    def __init__(self, connect: str):
        self.connect, self.most = connect, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.most = max(self.most, mntr(self.connect).get("zk_outstanding_requests", 0.0))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.most


_SS_SOCKET = re.compile(r"pid=(\d+)")
_SS_BYTES = re.compile(r"\bbytes_(sent|received):(\d+)")


def socket_bytes(port: int) -> Dict[str, Dict[str, int]]:
    """{client socket (local address): {"pid", "sent", "received"}} of every connection to ZooKeeper's port."""
    try:
        text = subprocess.run(["ss", "-tinpH", "dst", f"127.0.0.1:{port}"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out, current = {}, None
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            fields = line.split()
            pid = _SS_SOCKET.search(line)
            current = fields[3] if len(fields) > 3 else None
            if current:
                out[current] = {"pid": int(pid.group(1)) if pid else 0, "sent": 0, "received": 0}
        elif current:
            for kind, n in _SS_BYTES.findall(line):
                out[current][kind] = int(n)
    return out


def bytes_by_pid(before, after) -> Dict[int, List[int]]:
    """{pid: [sent, received]} between two :func:`socket_bytes` readings (new sockets from 0)."""
    out: Dict[int, List[int]] = {}
    for sock, now in after.items():
        was = before.get(sock, {"sent": 0, "received": 0})
        total = out.setdefault(now["pid"], [0, 0])
        total[0] += now["sent"] - was["sent"]
        total[1] += now["received"] - was["received"]
    return out


# ---------------------------------------------------------------- the processes

class Stack:
    """ZooKeeper's group, a coordinatord and the consumers of one checkout (``root``)."""

    def __init__(self, connect: str, root: str, data_dir: str, logs: str, consumers: int):
        self.connect, self.root, self.data_dir, self.logs = connect, root, data_dir, logs
        self.env = dict(os.environ, PYTHONPATH=root)
        self.env.pop("ZK_CONNECT", None)
        self.consumers: List[subprocess.Popen] = []
        self.coordinator: Optional[subprocess.Popen] = None
        self.count = consumers
        # Where groupctl is in this checkout (older ones kept it in coordinator/cli).
        self.groupctl_module = "consumer.cli.groupctl" if os.path.exists(
            os.path.join(root, "consumer", "cli", "groupctl.py")) else "coordinator.cli.groupctl"

    def groupctl(self, *args: str) -> None:
        done = subprocess.run([sys.executable, "-m", self.groupctl_module, "--zk", self.connect, "--data-dir",
                               self.data_dir, *args], cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=300)
        if done.returncode:
            raise RuntimeError(f"groupctl {' '.join(args)} failed: {done.stderr.strip()[-500:]}")

    def _spawn(self, name: str, args: List[str]) -> subprocess.Popen:
        log = open(os.path.join(self.logs, f"{name}.log"), "w")
        try:
            return subprocess.Popen([sys.executable, "-m", *args], cwd=self.root, env=self.env,
                                    stdout=subprocess.DEVNULL, stderr=log, preexec_fn=die_with_parent)
        finally:
            log.close()

    def start(self) -> None:
        self.coordinator = self._spawn("coordinatord", ["coordinator.cli.coordinatord", "--zk", self.connect,
                                                        "--node-id", "n1"])
        for i in range(self.count):
            self.consumers.append(self._spawn(f"consumer-{i}", [
                self.groupctl_module, "--zk", self.connect, "--data-dir", self.data_dir] + (["-v"] if os.environ.get("BENCH_V") else []) + ["consume", GROUP, TOPIC]))

    def stop(self) -> None:
        for p in self.consumers + [self.coordinator]:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in self.consumers + [self.coordinator]:
            if p is None:
                continue
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def trouble(self) -> Dict[str, int]:
        """{"coordinator"/"consumers": log lines saying a connection or session was lost, since the last call}."""
        out = {"coordinator": 0, "consumers": 0}
        for path in sorted(glob.glob(os.path.join(self.logs, "*.log"))):
            side = "coordinator" if os.path.basename(path).startswith("coordinatord") else "consumers"
            with open(path, errors="replace") as f:
                out[side] += sum(1 for line in f if TROUBLE.search(line))
        seen, self._seen = getattr(self, "_seen", {}), out
        return {k: v - seen.get(k, 0) for k, v in out.items()}


class Watches:
    """The group's state and the topic's partition count, each with when it was last seen to
    change (``perf_counter``, in kazoo's callback thread); waiters are woken at every change."""

    def __init__(self, client):
        self.cond = threading.Condition()
        self.state, self.state_at = protocol.GroupState(), 0.0
        self.partitions, self.partitions_at = 0, 0.0
        DataWatch(client, protocol.state_path(GROUP), self._state)
        DataWatch(client, protocol.topic_path(TOPIC), self._topic)

    def _state(self, data, _stat):
        with self.cond:
            if data:
                self.state, self.state_at = protocol.GroupState.decode(data, "state"), time.perf_counter()
            self.cond.notify_all()

    def _topic(self, data, _stat):
        with self.cond:
            if data:
                self.partitions = protocol.decode_topic(data, "topic")
                self.partitions_at = time.perf_counter()
            self.cond.notify_all()

    def wait_stable(self, members: int, partitions: int, timeout: float) -> float:
        """When the group was seen Stable with ``members`` members and ``partitions`` partitions assigned."""
        def done(s):
            return (s.state == protocol.STABLE and len(s.members) == members
                    and sum(len(parts) for parts in s.assignment.values()) == partitions)
        with self.cond:
            if not self.cond.wait_for(lambda: done(self.state), timeout):
                raise TimeoutError(f"group not Stable with {partitions} partitions within {timeout:.0f} s: "
                                   f"{self.state.state}, generation {self.state.generation}")
            return self.state_at


# ---------------------------------------------------------------- one scenario

@dataclass
class Growth:
    to: int
    wall_s: float = 0.0              # from the command's start
    from_topic_s: float = 0.0        # from the topic znode's change (seen by a watch)
    requests: float = 0.0
    request_bytes: float = 0.0
    max_latency_ms: float = 0.0
    outstanding: float = 0.0
    coordinator_bytes: int = 0       # sent + received on its ZooKeeper connections
    consumer_bytes: int = 0          # all consumers together
    zk_cpu_s: float = 0.0            # CPU seconds from the command's start until Stable
    coordinator_cpu_s: float = 0.0
    consumers_cpu_s: float = 0.0
    trouble: Dict[str, int] = field(default_factory=dict)


def scenario(connect: str, zk_port: int, zk_pid: int, root: str, tag: str, args) -> List[Growth]:
    chroot = f"{connect}/{tag}"
    admin = start_client(connect)
    admin.ensure_path(f"/{tag}")
    close_client(admin)
    out = []
    with scratch_dir() as data_dir, scratch_dir(prefix="zkgroups-bench-logs-", keep=None) as logs:
        stack = Stack(chroot, root, data_dir, logs, args.consumers)
        stack.groupctl("topics", "create", TOPIC, "--partitions", str(args.partitions))
        client = start_client(chroot)
        try:
            watch = Watches(client)
            stack.start()
            watch.wait_stable(args.consumers, args.partitions, args.timeout)
            time.sleep(args.settle_s)  # the first commits and acks are done
            stack.trouble()
            for total in args.to:
                g = Growth(total)
                pids = {stack.coordinator.pid: "coordinator", **{p.pid: "consumers" for p in stack.consumers}}
                sockets = socket_bytes(zk_port)
                cpu = [cpu_seconds(zk_pid), cpu_seconds(stack.coordinator.pid),
                       sum(cpu_seconds(p.pid) for p in stack.consumers)]
                reset_stats(connect)
                before = mntr(connect)
                sampler = OutstandingSampler(connect)
                t0 = time.perf_counter()
                spy = None
                if os.environ.get("BENCH_PYSPY") and total >= 10000:
                    spy = [subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "-p", str(pp.pid), "-d", "12", "-r", "100", "--gil", "--nonblocking", "--format", "raw", "-o", os.environ["BENCH_PYSPY"] + f"-{k}.txt"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for k, pp in [("coord", stack.coordinator), ("c0", stack.consumers[0])]]
                stack.groupctl("topics", "add-partitions", TOPIC, "--to", str(total))
                stable_at = watch.wait_stable(args.consumers, total, args.timeout)
                g.wall_s = stable_at - t0
                g.from_topic_s = stable_at - watch.partitions_at
                g.zk_cpu_s = cpu_seconds(zk_pid) - cpu[0]
                g.coordinator_cpu_s = cpu_seconds(stack.coordinator.pid) - cpu[1]
                g.consumers_cpu_s = sum(cpu_seconds(p.pid) for p in stack.consumers) - cpu[2]
                g.outstanding = sampler.stop()
                after = mntr(connect)
                g.requests = after.get("zk_packets_received", 0) - before.get("zk_packets_received", 0)
                g.request_bytes = after.get("zk_bytes_received_count", 0) - before.get("zk_bytes_received_count", 0)
                g.max_latency_ms = after.get("zk_max_latency", 0)
                for pid, (sent, received) in bytes_by_pid(sockets, socket_bytes(zk_port)).items():
                    side = pids.get(pid)
                    if side == "coordinator":
                        g.coordinator_bytes += sent + received
                    elif side == "consumers":
                        g.consumer_bytes += sent + received
                for sp in spy or ():
                    sp.wait()
                c0 = sum(cpu_seconds(p.pid) for p in stack.consumers); z0 = cpu_seconds(zk_pid)
                time.sleep(args.settle_s)  # trouble shows up late too (a ping missed, a commit after)
                print("IDLE consumers %.2f zk %.2f cores" % ((sum(cpu_seconds(p.pid) for p in stack.consumers) - c0) / args.settle_s, (cpu_seconds(zk_pid) - z0) / args.settle_s), flush=True)
                g.trouble = stack.trouble()
                out.append(g)
                print(f"  [{tag}] +{total}: {g}", flush=True)
        finally:
            stack.stop()
            close_client(client)
            if args.keep_logs:
                kept = os.path.join(args.keep_logs, tag)
                os.makedirs(kept, exist_ok=True)
                for path in glob.glob(os.path.join(logs, "*.log")):
                    os.replace(path, os.path.join(kept, os.path.basename(path)))
    return out


COMPARED = [
    ("command -> owned and Stable", "wall_s", "s", "{:.2f} s"),
    ("topic grown -> owned and Stable", "from_topic_s", "s", "{:.2f} s"),
    ("ZooKeeper requests", "requests", "", "{:,.0f}"),
    ("ZooKeeper bytes received", "request_bytes", "B", "{:,.0f} B"),
    ("ZooKeeper max latency", "max_latency_ms", "ms", "{:.0f} ms"),
    ("ZooKeeper outstanding requests (most)", "outstanding", "", "{:.0f}"),
    ("coordinator's ZooKeeper traffic", "coordinator_bytes", "B", "{:,.0f} B"),
    ("consumers' ZooKeeper traffic", "consumer_bytes", "B", "{:,.0f} B"),
    ("ZooKeeper's CPU", "zk_cpu_s", "s", "{:.2f} s"),
    ("coordinator's CPU", "coordinator_cpu_s", "s", "{:.2f} s"),
    ("consumers' CPU", "consumers_cpu_s", "s", "{:.2f} s"),
]


def rows_for(start: int, cur: Growth, base: Optional[Growth]) -> List[Row]:
    label = f"{start} -> {cur.to:,} partitions"
    rows = []
    for what, name, unit, fmt in COMPARED:
        mine = getattr(cur, name)
        ratio, note = None, ""
        if base is not None:
            theirs = getattr(base, name)
            ratio, note = (theirs / mine if mine else None), "baseline " + fmt.format(theirs)
        rows.append(Row(f"{label} {what}", mine, unit, ratio, note))
    lost = sum(cur.trouble.values())
    note = f"baseline {sum(base.trouble.values())}" if base is not None else ""
    rows.append(Row(f"{label} connection/session lost (log lines)", lost, "", None, note))
    return rows


def main():
    ap = argparse.ArgumentParser(prog="bin/bench growth", description=__doc__.splitlines()[0])
    ap.add_argument("--consumers", type=int, default=10, help="groupctl consume processes")
    ap.add_argument("--partitions", type=int, default=100, help="the topic's partitions before it grows")
    ap.add_argument("--to", default="1000,10000", help="totals the topic is grown to, in turn")
    ap.add_argument("--settle-s", type=float, default=3.0, help="pause after each Stable")
    ap.add_argument("--timeout", type=float, default=180.0, help="give up a wait after this many seconds")
    ap.add_argument("--baseline", metavar="DIR", help="also run the processes of this checkout, first, for ratios")
    ap.add_argument("--keep-logs", metavar="DIR", help="keep every process's log here")
    args = ap.parse_args()
    args.to = [int(x) for x in args.to.split(",") if x]
    with provide_zookeeper(tick_ms=200, fsync=True, jvm=SERVER_JVM) as zk:
        port = int(zk.connect.split(",")[0].rsplit(":", 1)[1])
        pid = zk.ensemble.servers[0].proc.pid
        base = scenario(zk.connect, port, pid, os.path.abspath(args.baseline), "base", args) if args.baseline else None
        cur = scenario(zk.connect, port, pid, ROOT, "cur", args)
    rows: List[Row] = []
    starts = [args.partitions] + args.to[:-1]
    for i, g in enumerate(cur):
        rows += rows_for(starts[i], g, base[i] if base else None)
    print_table(rows, f"growth under {args.consumers} consumer processes and one coordinatord "
                      "(ratio = baseline / current: above 1, the current code is faster or cheaper)")


if __name__ == "__main__":
    main()
