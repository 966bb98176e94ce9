"""End-to-end accounting with real processes: a producer keeps writing while consumers join,
leave, get SIGKILLed and the leader coordinator is SIGKILLed. At the end every produced record
was consumed, committed offsets equal the end offsets, and every duplicate lies in a window
the protocol allows: after the last commit of a partition whose owner was killed."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from coordinator import protocol, read
from coordinator.topics import TopicRegistry
from consumer import Producer
from consumer.log import Log
from tests.support.groups import leader_info, read_state
from tests.support.helpers import check_consumed, wait_for

TOPIC, GROUP, PARTITIONS, SESSION_MS = "e2e", "e2e-group", 6, 1000


def test_every_record_consumed_through_joins_kills_and_failover(zk, zk_connect, data_dir, subprocess_env, tmp_path):
    TopicRegistry(zk).create(TOPIC, PARTITIONS)
    procs = {}

    def start(name, *args):
        out = open(tmp_path / f"{name}.out", "w")
        procs[name] = subprocess.Popen([sys.executable, "-m", *args], env=subprocess_env, stdout=out,
                                       stderr=open(tmp_path / f"{name}.err", "w"))

    def coordinator(name):
        start(name, "consumer.cli.coordinatord", "--zk", zk_connect, "--node-id", name,
              "--session-timeout-ms", str(SESSION_MS), "--rebalance-timeout-ms", "3000")

    def consumer(name):
        start(name, "consumer.cli.groupctl", "--zk", zk_connect, "--data-dir", data_dir, "consume", GROUP,
              TOPIC, "--idle-exit", "3", "--session-timeout-ms", str(SESSION_MS))

    def members():
        return set(read.children(zk, protocol.ids_path(GROUP)))

    def printed(name):
        return (tmp_path / f"{name}.out").read_text().count("\n")

    def stable_with(expected):
        state = read_state(zk, GROUP)
        return state.state == protocol.STABLE and set(state.members) == set(expected)

    stop = threading.Event()

    def produce():
        with Producer(zk, data_dir) as p:
            while not stop.is_set():
                for i in range(20):
                    p.send(TOPIC, b"v", key=str(i).encode())
                p.flush()
                time.sleep(0.01)

    try:
        coordinator("c1")
        coordinator("c2")
        wait_for(lambda: zk.exists(protocol.LEADER), 20, message="leader")
        producer = threading.Thread(target=produce)
        producer.start()
        consumer("a")
        consumer("b")
        wait_for(lambda: len(members()) == 2, 20, message="a and b registered")
        before_c = members()
        consumer("c")
        wait_for(lambda: len(members()) == 3 and read_state(zk, GROUP).state == protocol.STABLE, 20,
                 message="c joined")
        victim_id = (members() - before_c).pop()
        wait_for(lambda: printed("c") > 0, 20, message="c consuming")
        # SIGKILL c; its partitions stay owned until its session expires, so its committed
        # offsets can still be read: anything it printed at or after them may come again.
        state = read_state(zk, GROUP)
        procs["c"].send_signal(signal.SIGKILL)
        procs["c"].wait()
        windows = {}
        for topic, parts in state.assignment.items():
            for p, stream in parts.items():
                if protocol.consumer_of_stream(stream) == victim_id:
                    windows[p] = read.committed_offsets(zk, GROUP, [(topic, p)])[(topic, p)] or 0
        wait_for(lambda: victim_id not in members(), 20, message="c's session expired")
        wait_for(lambda: stable_with(members()), 20, message="the group Stable without c")
        old = leader_info(zk)
        procs[old.node_id].send_signal(signal.SIGKILL)
        coordinator("c3")
        wait_for(lambda: zk.exists(protocol.LEADER) and leader_info(zk).epoch > old.epoch, 20, message="new leader")
        before_d = members()
        consumer("d")
        wait_for(lambda: len(members()) == 3 and stable_with(members()) and printed("d") > 0, 20,
                 message="d joined and consuming")
        procs["b"].send_signal(signal.SIGTERM)  # a clean leave
        wait_for(lambda: procs["b"].poll() is not None and stable_with(members()) and len(members()) == 2, 20,
                 message="b left cleanly")
        stop.set()
        producer.join()
        for name in ("a", "d"):
            assert procs[name].wait(60) == 0, (tmp_path / f"{name}.err").read_text()[-2000:]
        assert procs["b"].wait(30) == 0
    finally:
        stop.set()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()

    log = Log(data_dir)
    ends = {p: log.latest_offset(TOPIC, p) for p in range(PARTITIONS)}
    assert sum(ends.values()) > 500
    check_consumed([tmp_path / f"{name}.out" for name in "abcd"], ends, tmp_path / "c.out", windows)
    committed = read.committed_offsets(zk, GROUP, [(TOPIC, p) for p in range(PARTITIONS)])
    assert {p: committed[(TOPIC, p)] for p in range(PARTITIONS)} == ends
