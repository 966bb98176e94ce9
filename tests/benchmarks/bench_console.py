"""bin/bench console — how fast the console answers with many groups.

For each size (``--groups 1000,10000``): that many groups are written straight into ZooKeeper
(a Stable state with one member on one partition of topic ``t``, the member's registration, a
committed offset behind the embedded log's end, a timeline of three entries) with a shard
placement, so the pages have everything to show; no coordinator runs (the figures are the
console's, not the rebalancing's). Then a node's console is started on it (its snapshot loaded
by watches, one lag round read) and each page and API call is requested ``--rounds`` times over
HTTP; the median and the slowest are reported. ``cold``: the groups page's row cache emptied
before each request (what the first request after a change costs); ``warm``: cached.

Baseline, measured in the same run: ``groupctl groups list --output json`` for the same
groups (it reads ZooKeeper: a state and a listing per group); ratios are baseline / console.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import urllib.error
import urllib.request

from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from consumer.cli.groupctl import main as groupctl
from consumer.log import Log
from coordinator import protocol
from consumer.dataplane.log_ends import DataPlaneEnds
from coordinator.console.app import Console
from coordinator.console.lag import LagSampler
from coordinator.console.snapshot import ClusterSnapshot
from coordinator.http import HttpSettings, NodeHttpServer
from coordinator.protocol import GroupState, RebalanceRecord, Registration
from coordinator.topics import TopicRegistry
from tests.benchmarks.common import Row, print_table, zk_client, zookeeper

TOPIC, PARTITIONS, SHARDS = "t", 16, 16
BATCH = 500


def group_name(i: int) -> str:
    return f"g{i:05d}"


def write_groups(client, first: int, count: int) -> None:
    """``count`` groups from ``first``, each in one transaction (pipelined)."""
    client.ensure_path(protocol.GROUPS)
    pending = []
    for i in range(first, first + count):
        g, cid = group_name(i), f"{group_name(i)}_host-1-abcdef01"
        p = i % PARTITIONS
        state = GroupState(3, protocol.STABLE, [cid], {TOPIC: {p: f"{cid}-0"}}, "range", "", 1)
        timeline = [RebalanceRecord(gen, protocol.now_ms() - (4 - gen) * 60_000, protocol.STABLE, "n1", 1, ["join"],
                                    members_before=0, members_after=1, joined=[cid], topics={TOPIC: PARTITIONS},
                                    moved=1, duration_ms=12.5, members=[cid]) for gen in (1, 2, 3)]
        t = client.transaction()
        for path in (protocol.group_path(g), protocol.ids_path(g), protocol.channel_path(g),
                     protocol.channel_path(g, cid), protocol.offsets_path(g), protocol.offsets_path(g, TOPIC)):
            t.create(path)
        t.create(protocol.ids_path(g, cid), Registration({TOPIC: 1}, protocol.PATTERN_STATIC, ["range"], "host").encode())
        t.create(protocol.offsets_path(g, TOPIC, p), protocol.encode_offset(100 + i % 50))
        t.create(protocol.state_path(g), state.encode())
        t.create(protocol.timeline_path(g), protocol.encode_timeline(timeline))
        pending.append(t.commit_async())
        if len(pending) >= BATCH:
            _check(pending)
            pending = []
    _check(pending)


def _check(pending) -> None:
    for a in pending:
        failed = [r for r in a.get() if isinstance(r, Exception)]
        if failed:
            raise SystemExit(f"bin/bench console: writing a group failed: {failed[0]!r}")


def place_shards(client) -> None:
    client.ensure_path(protocol.NODES)
    client.create(protocol.SHARDS, protocol.ShardsInfo(SHARDS).encode())
    for s in range(SHARDS):
        client.create(protocol.shard_path(s), protocol.ShardAssignment("n1", 1).encode())
    client.create(protocol.node_path("n1"), protocol.NodeInfo("n1", "host", 1, protocol.now_ms(),
                                                              {s: {"epoch": 1, "verified": True}
                                                               for s in range(SHARDS)}).encode())


def timed_get(url: str) -> float:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            r.read()
    except urllib.error.HTTPError as e:
        raise SystemExit(f"bin/bench console: {url} answered {e.code}: {e.read()[:200]!r}") from None
    return time.perf_counter() - started


def measure(url: str, rounds: int, before=None):
    times = []
    for _ in range(rounds):
        if before:
            before()
        times.append(timed_get(url))
    return statistics.median(times), max(times)


def run_size(connect: str, groups: int, rounds: int, data_dir: str):
    rows = []
    with zk_client(connect) as client:
        TopicRegistry(client).ensure(TOPIC, PARTITIONS)
        place_shards(client)
        started = time.perf_counter()
        for first in range(0, groups, 5000):
            write_groups(client, first, min(5000, groups - first))
        print(f"  wrote {groups:,} groups in {time.perf_counter() - started:.1f} s")

        runner = CliRunner()
        started = time.perf_counter()
        result = runner.invoke(groupctl, ["--zk", connect, "--data-dir", data_dir, "groups", "list", "--output", "json"])
        baseline = time.perf_counter() - started
        assert result.exit_code == 0, result.output

        ends = DataPlaneEnds.open("", {}, data_dir)
        snapshot = ClusterSnapshot(client).start()
        started = time.perf_counter()
        while not snapshot.loaded:
            time.sleep(0.01)
        load = time.perf_counter() - started
        sampler = LagSampler(client, snapshot, ends, 3600)
        started = time.perf_counter()
        sampler.refresh()
        lag_round = time.perf_counter() - started
        console = Console(snapshot, sampler, "n1")
        server = NodeHttpServer(HttpSettings.for_http_addr("127.0.0.1:0"), CollectorRegistry(),
                                lambda: (True, {}), lambda: (True, {}), console.route).start()
        base = server.base_url
        cold = lambda: setattr(console, "_rows_cache", ((), []))  # noqa: E731 (the next request builds the rows)
        some = group_name(groups // 2)
        try:
            rows.append(Row(f"{groups:,} groups: snapshot loaded (watches set)", load, "s"))
            rows.append(Row(f"{groups:,} groups: one lag round (ZooKeeper + log)", lag_round, "s"))
            cases = [
                ("groups page, cold", "/ui/groups", cold),
                ("groups page", "/ui/groups", None),
                ("groups page sorted by lag", "/ui/groups?sort=lag", None),
                ("groups page filtered", f"/ui/groups?q={some[:-1]}", None),
                ("groups page, last page", "/ui/groups?page=100000", None),
                ("API groups (all), cold", "/api/v1/groups", cold),
                ("API groups (all)", "/api/v1/groups", None),
                ("API groups, 50 by lag", "/api/v1/groups?sort=lag&limit=50", None),
                ("group page", f"/ui/groups/{some}", None),
                ("API group offsets", f"/api/v1/groups/{some}/offsets", None),
                ("API group timeline", f"/api/v1/groups/{some}/timeline", None),
                ("overview", "/ui/", None),
                ("API coordinator", "/api/v1/coordinator", None),
            ]
            for name, path, before in cases:
                median, worst = measure(base + path, rounds, before)
                rows.append(Row(f"{groups:,} groups: {name}", median * 1000, "ms median", baseline / median,
                                f"slowest {worst * 1000:.0f} ms"))
            rows.append(Row(f"{groups:,} groups: baseline groupctl groups list", baseline * 1000, "ms"))
        finally:
            server.close()
            snapshot.close()
            ends.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="bin/bench console", description=__doc__.split("\n")[0])
    parser.add_argument("--groups", default="1000,10000", help="comma-separated sizes")
    parser.add_argument("--rounds", type=int, default=15, help="requests per page")
    args = parser.parse_args()
    rows = []
    with zookeeper(fsync=False) as connect, tempfile.TemporaryDirectory(prefix="zkgroups-bench-console-") as data_dir:
        with Log(data_dir) as log:
            for p in range(PARTITIONS):
                log.append(TOPIC, p, [(None, b"x" * 20, 1000, ())] * 200)
        for n, size in enumerate(int(s) for s in args.groups.split(",")):
            chroot = f"{connect}/console-{n}"
            with zk_client(connect) as root:
                root.ensure_path(f"/console-{n}")
            print(f"{size:,} groups:")
            rows += run_size(chroot, size, args.rounds, data_dir)
    print_table(rows, "console latency (ratio: groupctl groups list / console)")


if __name__ == "__main__":
    main()
