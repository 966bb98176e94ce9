"""Share groups against consumer groups, measured in the same run (the default configuration,
members as separate processes, the embedded log).

* **Scaling past the partitions**: a 4-partition topic, 20 ms of work per record (a sleep).
  A consumer group of 4 members (the most that can work at once: ~4 x 50 = 200 records/s) is
  the baseline; share groups of 8, 16 and 32 members against linear (n x 50 records/s; the
  target is >= 0.9 of it, 1,440 records/s at 32).
* **No work per record**: one ShareConsumer's ``poll()`` loop against one Consumer's, in this
  process (target >= 0.5), and the share-partition writes per 1,000 records (target <= 20 at
  ``max_poll_records`` = 500).
* **A SIGKILLed member**: how long until another member is given the records it held (the
  target: within the lock duration + 1 s; with the default settings the member's session ends
  first, and its coordinator releases them then).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from coordinator.coordinator import Coordinator, CoordinatorConfig
from tests.benchmarks.common import Row, Timer, print_table, scratch_dir, zk_client, zookeeper
from tests.support.helpers import fill

WORK_S = 0.02
PARTITIONS = 4

MEMBER = r"""
import sys, time
from consumer import Consumer, ShareConsumer
zk, data_dir, group, kind, out = sys.argv[1:6]
f = open(out, "a", buffering=1)
if kind == "group":
    with Consumer(group, ["t"], zk=zk, data_dir=data_dir, auto_offset_reset="earliest") as c:
        print("ready", flush=True)
        for record in c:
            time.sleep(%(work)r)
            f.write(f"{record.partition} {record.offset}\n")
else:
    with ShareConsumer(group, ["t"], zk=zk, data_dir=data_dir) as c:
        print("ready", flush=True)
        while True:
            for record in c.poll(1000):
                time.sleep(%(work)r)
                f.write(f"{record.partition} {record.offset}\n")
""" % {"work": WORK_S}

HOLDER = r"""
import sys
from consumer import ShareConsumer
c = ShareConsumer(sys.argv[3], ["t"], zk=sys.argv[1], data_dir=sys.argv[2], max_poll_records=100)
got = []
while not got:
    got = c.poll(1000)
print("held", len(got), flush=True)
sys.stdin.readline()
"""


def spawn(script, args, env):
    p = subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    return p


def lines(path) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return f.read().count("\n")


def window_rate(connect, data_dir, kind, members, seconds, tmp, env) -> float:
    """records/s of ``members`` processes of one group over ``seconds``, once all have started."""
    group = f"{kind}-{members}"
    outs = [os.path.join(tmp, f"{group}-{i}.out") for i in range(members)]
    procs = [spawn(MEMBER, [connect, data_dir, group, kind, out], env) for out in outs]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while sum(1 for out in outs if lines(out)) < min(members, 4 if kind == "group" else members) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)  # past the start: every member at work
        before = sum(lines(out) for out in outs)
        with Timer() as t:
            time.sleep(seconds)
            after = sum(lines(out) for out in outs)
        return t.rate(after - before)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def poll_rates(connect, data_dir, total):
    """(Consumer.poll() records/s, ShareConsumer.poll() records/s, share-partition writes per 1,000 records)."""
    from consumer import Consumer, ShareConsumer
    from coordinator.protocol.share import ShareGroupConfig, share_group_path
    with zk_client(connect) as zk:
        zk.ensure_path(share_group_path("nowork"))
        zk.set(share_group_path("nowork"), ShareGroupConfig(auto_offset_reset="earliest").encode())
    with Consumer("nowork-group", ["t"], zk=connect, data_dir=data_dir, auto_offset_reset="earliest") as c:
        n, t = 0, None
        while n < total:
            got = sum(len(r) for r in c.poll(200).values())
            t = t or (time.perf_counter() if got else None)
            n += got
        group_rate = n / (time.perf_counter() - t)
    with ShareConsumer("nowork", ["t"], zk=connect, data_dir=data_dir) as s:
        n, t = 0, None
        while n < total:
            got = len(s.poll(200))
            t = t or (time.perf_counter() if got else None)
            n += got
        share_rate = n / (time.perf_counter() - t)
        writes = s.stats()["writes"]
    return group_rate, share_rate, writes * 1000 / n


def kill_round(connect, data_dir, env) -> float:
    """Seconds from a SIGKILL of a member holding records to another member being given them."""
    from consumer import ShareConsumer
    holder = spawn(HOLDER, [connect, data_dir, "killed"], env)
    line = holder.stdout.readline().split()
    assert line and line[0] == "held", line
    with ShareConsumer("killed", ["t"], zk=connect, data_dir=data_dir) as other:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        with Timer() as t:
            while not any(r.delivery_count > 1 for r in other.poll(100)):
                pass
    return t.seconds


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bin/bench share", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="how long each rate is measured")
    parser.add_argument("--members", type=int, nargs="+", default=[8, 16, 32], help="share group sizes")
    parser.add_argument("--records", type=int, default=200_000, help="records of the no-work round")
    args = parser.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    with zookeeper() as connect, zk_client(connect) as zk, scratch_dir() as data_dir, scratch_dir() as tmp:
        node = Coordinator(connect, "bench", CoordinatorConfig()).start()
        try:
            fill(data_dir, "t", [max(args.records, 100_000) // PARTITIONS] * PARTITIONS, zk=zk)
            from coordinator.protocol.share import ShareGroupConfig, share_group_path
            for n in args.members + ["killed"]:
                zk.ensure_path(share_group_path(f"share-{n}" if n != "killed" else "killed"))
                zk.set(share_group_path(f"share-{n}" if n != "killed" else "killed"),
                       ShareGroupConfig(auto_offset_reset="earliest").encode())
            base = window_rate(connect, data_dir, "group", PARTITIONS, args.seconds, tmp, env)
            shares = [(n, window_rate(connect, data_dir, "share", n, args.seconds, tmp, env)) for n in args.members]
            group_poll, share_poll, writes = poll_rates(connect, data_dir, args.records)
            redelivered = kill_round(connect, data_dir, env)
        finally:
            node.close()
    rows = [Row(f"consumer group, {PARTITIONS} members, 20 ms a record", base, "records/s", 1.0, "the baseline")]
    for n, rate in shares:
        linear = n / WORK_S
        rows.append(Row(f"share group, {n} members", rate, "records/s", rate / base,
                        f"{rate / linear:.2f} of linear {linear:,.0f} (target >= 0.9)"))
    rows += [Row("Consumer.poll(), no work", group_poll, "records/s", 1.0, "baseline of the next"),
             Row("ShareConsumer.poll(), no work", share_poll, "records/s", share_poll / group_poll, "target >= 0.5"),
             Row("share-partition writes per 1,000 records", writes, "writes", None, "target <= 20"),
             Row("a SIGKILLed member's records given to another", redelivered, "s", None,
                 "target <= lock 30 s + 1 s")]
    print_table(rows, title=f"bin/bench share ({time.strftime('%Y-%m-%d')}): {PARTITIONS} partitions, "
                            f"the default settings, members as processes")


if __name__ == "__main__":
    main()
