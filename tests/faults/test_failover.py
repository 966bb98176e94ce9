"""coordinatord processes under real failures: SIGKILL, SIGSTOP/SIGCONT, SIGTERM; and the
ZooKeeper leader of a 3-server ensemble killed under a running group."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from coordinator import protocol
from coordinator.topics import TopicRegistry
from coordinator.testing.zkserver import Ensemble, four_letter, local_classpath
from tests.support.groups import Cluster, leader_info, read_state, wait_stable
from tests.support.helpers import wait_for

pytestmark = pytest.mark.zk  # starts ZooKeeper servers of its own

SESSION_MS = 1000


@pytest.fixture
def nodes(zk_connect, subprocess_env, tmp_path):
    procs = {}

    def start(name, session_ms=SESSION_MS):
        with open(tmp_path / f"{name}.log", "w") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "consumer.cli.coordinatord", "--zk", zk_connect, "--node-id", name,
                 "--session-timeout-ms", str(session_ms), "--rebalance-timeout-ms", "2000"],
                env=subprocess_env, stdout=subprocess.DEVNULL, stderr=log)
        return procs[name]
    yield start, procs
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
        p.wait(10)


def current_leader(zk):
    try:
        return leader_info(zk)
    except Exception:
        return None


def test_sigkill_leader_another_leads_within_session_timeout(zk, nodes):
    start, procs = nodes
    for name in ("c1", "c2", "c3"):
        start(name)
    first = wait_for(lambda: current_leader(zk), 20, message="first leader")
    killed_at = time.monotonic()
    procs[first.node_id].kill()
    new = wait_for(lambda: (lambda i: i if i and i.node_id != first.node_id else None)(current_leader(zk)),
                   SESSION_MS / 1000 + 5, message="new leader")
    took = time.monotonic() - killed_at
    assert new.epoch > first.epoch
    assert took < SESSION_MS / 1000 + 3.0, f"failover took {took:.2f}s"


def test_paused_leader_resumed_cannot_write(zk, zk_connect, nodes):
    start, procs = nodes
    TopicRegistry(zk).create("t", 4)
    start("c1")
    first = wait_for(lambda: current_leader(zk), 20, message="first leader")
    start("c2")
    cluster = Cluster(zk_connect)
    try:
        cluster.member("g", ["t"])
        s = wait_stable(zk, "g", 1, timeout=20)
        procs["c1"].send_signal(signal.SIGSTOP)
        new = wait_for(lambda: (lambda i: i if i and i.node_id == "c2" else None)(current_leader(zk)), 15,
                       message="c2 leads")
        cluster.member("g", ["t"])
        s2 = wait_stable(zk, "g", 2, after_generation=s.generation, timeout=20)
        procs["c1"].send_signal(signal.SIGCONT)
        cluster.member("g", ["t"])
        s3 = wait_stable(zk, "g", 3, after_generation=s2.generation, timeout=20)
        assert s2.epoch == s3.epoch == new.epoch > first.epoch
        # Give the resumed node time to act; it must not have written under its old epoch.
        wait_for(lambda: procs["c1"].poll() is None, message="c1 alive")
        assert read_state(zk, "g").epoch == new.epoch
    finally:
        cluster.close()


def test_sigterm_leader_resigns_and_another_leads_at_once(zk, nodes):
    start, procs = nodes
    start("c1", session_ms=30_000)
    wait_for(lambda: current_leader(zk), 20, message="c1 leads")
    start("c2")
    wait_for(lambda: len(zk.get_children(protocol.ELECTION)) == 2, 20, message="c2 contends")
    procs["c1"].send_signal(signal.SIGTERM)
    # Well within c1's 30 s session: the hand-over did not wait for the session to expire.
    wait_for(lambda: (lambda i: i if i and i.node_id == "c2" else None)(current_leader(zk)), 10, message="c2 leads")
    assert procs["c1"].wait(10) == 0


@pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")
def test_zookeeper_leader_killed_in_a_3_server_ensemble_nothing_rebalances(tmp_path, data_dir):
    """Losing the ZooKeeper leader of a 3-server ensemble: every client reconnects to a
    survivor within its session, so consumers keep their partitions (no new generation) and
    consume what is produced meanwhile; offsets end at the log's end."""
    from consumer import Consumer, TopicPartition
    from consumer.log import Log
    from coordinator.zkclient import close_client, start_client
    with Ensemble(3, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk")) as ens:
        zk = start_client(ens.connect, 6000)
        TopicRegistry(zk).create("t", 4)
        log = Log(data_dir)

        def produce(n):
            for p in range(4):
                log.append("t", p, [(None, b"v", 0, ()) for _ in range(n)])

        cluster = Cluster(ens.connect, session_timeout_ms=6000)
        consumers = []
        try:
            cluster.node("a"), cluster.node("b")
            consumers = [Consumer("g", ["t"], zk=ens.connect, data_dir=data_dir, session_timeout_ms=6000,
                                  auto_offset_reset="earliest", enable_auto_commit=False) for _ in range(2)]
            seen = []

            def consume_all(total):
                def step():
                    for c in consumers:
                        for records in c.poll(timeout_ms=50).values():
                            seen.extend((r.partition, r.offset) for r in records)
                        c.commit()
                    return len(set(seen)) >= total
                wait_for(step, 30, interval=0, message=f"{total} records consumed")

            produce(10)
            consume_all(40)
            state = wait_stable(zk, "g", 2)
            zk_leader = next(s for s in ens.servers if "Mode: leader" in four_letter("127.0.0.1", s.client_port, "srvr"))
            zk_leader.kill()
            produce(10)
            consume_all(80)
            committed = {p: consumers[0].committed(TopicPartition("t", p)) for p in range(4)}
            assert committed == {p: 20 for p in range(4)}
            assert read_state(zk, "g").generation == state.generation  # no rebalance was needed
        finally:
            for c in consumers:
                c.close()
            cluster.close()
            close_client(zk)
            log.close()
