"""A topic grown from 100 to 10,000 partitions under a live group, as users run it.

Three ``groupctl consume`` processes and a ``coordinatord``, all with their defaults. The
growth must not make ZooKeeper drop anyone's connection: the claims, the first commits and the
releases at the end are written in transactions small enough that no session's heartbeats wait
behind them for long (:data:`consumer.ownership.CLAIM_PARTITIONS`). Not timed (``bin/bench growth``
measures it); it fails if any process logs a lost connection or session.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from coordinator import protocol
from coordinator.testing.zkserver import die_with_parent
from coordinator.topics import TopicRegistry
from coordinator.zkclient import wait_in_order
from tests.support.groups import read_state
from tests.support.helpers import wait_for
from tests.cli.test_groupctl_consume import ConsumeProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: What a log says when a ZooKeeper connection or session was lost.
LOST = re.compile(r"ConnectionLoss|Connection dropped|SessionExpired|session lost")


def stable_with(zk, members: int, partitions: int) -> bool:
    state = read_state(zk, "g")
    return (state.state == protocol.STABLE and len(state.members) == members
            and sum(len(parts) for parts in state.assignment.values()) == partitions)


def all_committed(zk, partitions) -> bool:
    """Every one of ``partitions`` has an offset committed (each consumer commits where it starts)."""
    gets = [zk.get_async(protocol.offsets_path("g", "t", p)) for p in partitions]
    wait_in_order(gets)
    try:
        return all(a.get()[0] for a in gets)
    except Exception:  # not created yet
        return False


def exit_code(proc: subprocess.Popen):
    """Its exit status once it ends (one SIGTERM was sent: a second one could land while the
    interpreter shuts down, when the default action kills it); "killed" after 60 s."""
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return "killed"


def test_a_growth_to_ten_thousand_partitions_loses_no_connection(zk, zk_connect, data_dir, subprocess_env,
                                                                 tmp_path):
    TopicRegistry(zk).create("t", 100)
    coordinator_log = tmp_path / "coordinatord.log"
    with open(coordinator_log, "w") as log:
        coordinator = subprocess.Popen([sys.executable, "-m", "consumer.cli.coordinatord", "--zk", zk_connect,
                                        "--node-id", "n1"], env=subprocess_env, stdout=subprocess.DEVNULL,
                                       stderr=log, preexec_fn=die_with_parent)
    consumers = [ConsumeProcess(zk_connect, data_dir, ["g", "t"], subprocess_env, tmp_path / f"consumer-{i}.log")
                 for i in range(3)]
    try:
        wait_for(lambda: stable_with(zk, 3, 100), 60, interval=0.1, message="the group Stable on 100 partitions")
        TopicRegistry(zk).add_partitions("t", 10_000)
        wait_for(lambda: stable_with(zk, 3, 10_000), 120, interval=0.2,
                 message="the group Stable on 10,000 partitions")
        assert len(zk.get_children(protocol.owners_path("g", "t"))) == 10_000
        wait_for(lambda: all_committed(zk, range(0, 10_000, 97)), 60, interval=0.5,
                 message="the consumers committed where they start")
    finally:
        try:
            for c in consumers:  # all at once: each releases its 3,300-odd partitions
                c.proc.send_signal(signal.SIGTERM)
            codes = [exit_code(c.proc) for c in consumers]
        finally:
            coordinator.terminate()
            coordinator.wait(30)
    assert codes == [0, 0, 0]
    for path in [coordinator_log] + [c.log_path for c in consumers]:
        with open(path) as f:
            lost = [line.strip() for line in f if LOST.search(line)]
        assert not lost, f"{path.name}: {lost[:3]}"
