"""coordinatord processes under real failures: SIGKILL, SIGSTOP/SIGCONT, SIGTERM."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from coordinator import protocol
from coordinator.topics import TopicRegistry
from tests.groups import Cluster, leader_info, read_state, wait_stable
from tests.helpers import wait_for

SESSION_MS = 1000


@pytest.fixture
def nodes(zk_connect, subprocess_env, tmp_path):
    procs = {}

    def start(name):
        with open(tmp_path / f"{name}.log", "w") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "coordinator.cli.coordinatord", "--zk", zk_connect, "--node-id", name,
                 "--session-timeout-ms", str(SESSION_MS), "--rebalance-timeout-ms", "2000"],
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
    start("c1")
    wait_for(lambda: current_leader(zk), 20, message="c1 leads")
    start("c2")
    wait_for(lambda: len(zk.get_children(protocol.ELECTION)) == 2, 20, message="c2 contends")
    t0 = time.monotonic()
    procs["c1"].send_signal(signal.SIGTERM)
    wait_for(lambda: (lambda i: i if i and i.node_id == "c2" else None)(current_leader(zk)), 10, message="c2 leads")
    assert time.monotonic() - t0 < SESSION_MS / 1000, "handover waited for a session timeout"
    assert procs["c1"].wait(10) == 0
