"""A commit whose answer never came (the write may or may not have applied) is checked at the
next commit; when that check gets no answer either, the commit fails as ZooKeeper being
unreachable, never with kazoo's bare ConnectionLoss (``groupctl consume`` waits out the one and
exited on the other: found by ``bin/chaos`` under connections that kept dropping).

The ZooKeeper server of this test's own is frozen (SIGSTOP) while a request is out: its
answer never comes and the client drops the connection after its read timeout, as a network
cut that drops the answers does.
"""
from __future__ import annotations

import os
import signal

import pytest

from consumer import Consumer, TopicPartition
from coordinator.errors import ZooKeeperUnavailable
from coordinator.testing.zkserver import Ensemble, local_classpath
from coordinator.zkclient import close_client, start_client
from tests.helpers import fill, wait_for
from tests.test_consumer import consume_until
from tests.test_member_safety import ActingLeader, committed

pytestmark = [pytest.mark.zk, pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")]

TP = TopicPartition("t", 0)
SESSION_MS = 6000  # the read timeout (2/3 of it) ends each frozen request; the session outlives the freeze


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_commit_checking_an_unanswered_write_without_an_answer_is_zookeeper_unavailable(tmp_path):
    with Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk")) as ensemble:
        server = ensemble.servers[0].proc
        zk = start_client(ensemble.connect, 20000)
        data_dir = str(tmp_path / "data")
        fill(data_dir, "t", [50], zk=zk)
        leader = ActingLeader(zk, "g")
        a = Consumer("g", ["t"], zk=ensemble.connect, data_dir=data_dir, auto_offset_reset="earliest",
                     session_timeout_ms=SESSION_MS)
        try:
            leader.assign({a.consumer_id: [0]})
            assert len(consume_until(a, 50)) == 50
            a.commit({TP: 10})

            for offset in (20, 30):  # 20: the write gets no answer; 30: nor does the check of 20
                os.kill(server.pid, signal.SIGSTOP)
                wait_for(lambda: stopped(server.pid), message="the server stopped")  # every thread, not just signalled
                try:
                    with pytest.raises(ZooKeeperUnavailable):
                        a.commit({TP: offset})
                finally:
                    os.kill(server.pid, signal.SIGCONT)
                wait_for(lambda: a._client.connected, timeout=SESSION_MS / 1000, message="the member reconnects")

            a.commit({TP: 40})  # the check is answered now: whether 20 applied or not, 40 goes through
            assert committed(zk) == b"40"
        finally:
            a.close()
            close_client(zk)
