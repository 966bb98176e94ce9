"""A member never hands out or commits records of a partition it no longer owns.

The lease under a frozen process (a real ``groupctl consume`` SIGSTOPped past its session) and
the fencing token on every commit and release path of a consumer. Real ZooKeeper throughout;
where these tests play the leader themselves, they write commands exactly as a leader does
(epoch, generation, state: :class:`~tests.support.members.ActingLeader`).

The tests of one part of the member are in the file named after it: claims, adopted owner
nodes and releases in ``test_claims.py``, a commit's refusals in ``test_offsets.py``, the
command channel in ``test_channel.py``, the lease in ``tests/unit/test_lease.py``; a deposed
controller's writes in ``tests/coordinator/test_controller.py``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from consumer import Producer
from coordinator import protocol
from coordinator.errors import CommitFailedError
from coordinator.topics import TopicRegistry
from tests.support.consumers import consume_until
from tests.support.groups import read_state
from tests.support.helpers import GROUPCTL, fill, wait_for
from tests.support.members import TP, ActingLeader, committed, consumers  # noqa: F401 (a fixture)


def test_a_member_that_lost_its_partition_can_neither_commit_nor_release_it(zk, data_dir, consumers):
    """Partition t-0 moves from a to b while a's session lives on (its owner node is deleted
    under it). Every commit path of a is refused and b's offset and owner node are untouched."""
    fill(data_dir, "t", [200] * 1, zk=zk)
    leader = ActingLeader(zk, "g")
    a = consumers(auto_commit_interval_ms=50)
    leader.assign({a.consumer_id: [0]})
    assert len(consume_until(a, 30, max_records=30)) == 30
    a.commit()
    assert committed(zk) == b"30"

    zk.delete(protocol.owners_path("g", "t", 0))  # a's hold ends, but a goes on
    b = consumers()
    leader.assign({b.consumer_id: [0]})
    wait_for(lambda: leader.acked(b.consumer_id), message="b claimed t-0")
    assert [r.offset for r in consume_until(b, 30, max_records=30)] == list(range(30, 60))
    b.commit()
    owner_before = zk.exists(protocol.owners_path("g", "t", 0))

    with pytest.raises(CommitFailedError, match="claimed by another member"):
        a.commit({TP: 45})
    outcome = {}
    failed = a.commit_async({TP: 46}, callback=lambda offsets, error: outcome.setdefault("error", error))
    assert isinstance(failed.exception(10), CommitFailedError)  # the future fails as kafka-python's does
    assert isinstance(outcome["error"], CommitFailedError)
    a.poll(timeout_ms=200)  # auto-commit in the poll loop: refused, logged, poll goes on
    leader.assign({a.consumer_id: [], b.consumer_id: [0]})  # revoke-time commit and release
    wait_for(lambda: (a.poll(20), leader.acked(a.consumer_id))[1], message="a revoked t-0")
    a.close()  # the commit and release on leaving

    assert committed(zk) == b"60"
    owner = zk.exists(protocol.owners_path("g", "t", 0))
    assert owner is not None and owner.ephemeralOwner == owner_before.ephemeralOwner == b._client.client_id[0]
    b.commit({TP: 70})  # the new owner is unaffected
    assert committed(zk) == b"70"


# ---------------------------------------------------------------- a frozen consumer process

def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


@pytest.mark.slow
def test_a_consumer_frozen_past_its_session_hands_out_nothing_of_partitions_another_member_took(
        cluster, zk, zk_connect, data_dir, subprocess_env, tmp_path):
    """SIGSTOP a ``groupctl consume`` past its session timeout while records keep arriving,
    let the other member take its partitions and deliver them, then SIGCONT it: nothing the
    other member delivered is printed again by the resumed one (before, it printed the
    records that arrived during the pause, from partitions it no longer owned)."""
    cluster.node("n")
    TopicRegistry(zk).create("t", 2)
    stop_producing = threading.Event()

    def produce():
        with Producer(zk, data_dir=data_dir, linger_ms=1) as producer:
            i = 0
            while not stop_producing.is_set():
                producer.send("t", b"%d" % i, partition=i % 2)
                i += 1
                if i % 20 == 0:
                    producer.flush()
                    time.sleep(0.01)
    producer = threading.Thread(target=produce)
    producer.start()

    def consumer(name, session_ms):
        out = open(tmp_path / f"{name}.out", "w")
        return subprocess.Popen(GROUPCTL + ["--zk", zk_connect, "--data-dir", data_dir, "consume", "g", "t",
                                            "--with-metadata", "--consumer-id", f"g_{name}",
                                            "--session-timeout-ms", str(session_ms)],
                                env=subprocess_env, stdout=out, stderr=subprocess.PIPE, text=True)
    a, b = consumer("a", 1000), consumer("b", 4000)
    try:
        wait_for(lambda: read_state(zk, "g").state == protocol.STABLE and len(read_state(zk, "g").members) == 2,
                 20, message="both members Stable")
        wait_for(lambda: {r["member"] for r in _lines(tmp_path / "a.out")} == {"g_a"}, 10, message="a delivers")
        os.kill(a.pid, signal.SIGSTOP)
        paused_at = time.time()
        try:
            def b_delivers_a_partitions():
                s = read_state(zk, "g")
                mine = {p for p, stream in s.assignment.get("t", {}).items() if stream.startswith("g_b")}
                return mine == {0, 1} and {r["partition"] for r in _lines(tmp_path / "b.out")
                                            if r["at"] > paused_at} == {0, 1}
            wait_for(b_delivers_a_partitions, 20, message="b owns and delivers both partitions")
            time.sleep(0.3)  # records keep arriving for the frozen consumer's (former) partitions
        finally:
            resumed_at = time.time()
            os.kill(a.pid, signal.SIGCONT)
        wait_for(lambda: len(read_state(zk, "g").members) == 2 and read_state(zk, "g").state == protocol.STABLE,
                 20, message="a rejoined")
    finally:
        stop_producing.set()
        producer.join()
        for proc in (a, b):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (a, b):
            proc.wait(20)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr.read(), b.stderr.read())
    after = {(r["partition"], r["offset"]) for r in _lines(tmp_path / "a.out") if r["at"] >= resumed_at}
    delivered_by_b = {(r["partition"], r["offset"]) for r in _lines(tmp_path / "b.out")}
    assert not after & delivered_by_b, f"{len(after & delivered_by_b)} records handed out again by the frozen member"
