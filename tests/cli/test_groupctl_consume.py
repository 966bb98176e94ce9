"""``groupctl consume`` as a model consumer, run as real processes under real failures.

- A refused commit (its session ended while it was stopped; the partition moved to another
  member) is one warning: it keeps running, rejoins and keeps delivering.
- An error ``poll()`` raises ends it with one line and exit 1, after it left the group.
- ``--idle-exit`` counts from the start: with no coordinator it still exits.
- Started while no ZooKeeper answers, it waits (one line per ``--zk-timeout``) and consumes
  once ZooKeeper is up; SIGTERM while it waits ends it with exit 0.
- (slow) The ZooKeeper server it is connected to, then the ensemble's leader, killed under
  two consumers of a 3-server ensemble while records keep coming: both keep running and
  deliver everything.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import pytest

from consumer.log import Log
from coordinator import protocol
from coordinator.topics import TopicRegistry
from coordinator.testing.zkserver import Ensemble, four_letter, free_port, local_classpath
from tests.support.groups import read_state
from tests.support.helpers import committed, fill, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GROUPCTL = os.path.join(ROOT, "bin", "groupctl")


class ConsumeProcess:
    """``groupctl consume`` as a child: its JSON lines are collected by a reader thread (started
    now, or later with ``read()``), its stderr goes to a file."""

    def __init__(self, connect: str, data_dir: str, args, env, log_path, read: bool = True):
        self.log_path = log_path
        self.records = []
        self.lock = threading.Lock()
        with open(log_path, "w") as stderr:
            self.proc = subprocess.Popen([GROUPCTL, "--zk", connect, "--data-dir", data_dir, "consume", *args],
                                         env=env, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL)
        self._reader = None
        if read:
            self.read()

    def read(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            record = json.loads(line)
            with self.lock:
                self.records.append((record["partition"], record["offset"]))

    def delivered(self) -> set:
        with self.lock:
            return set(self.records)

    def stderr(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def blocked_writing(self) -> bool:
        """True while the child's main thread waits to write into its stdout pipe (nobody
        reads it): it is in the middle of printing a batch it has not committed yet."""
        with open(f"/proc/{self.proc.pid}/wchan") as f:
            return "pipe_write" in f.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)


def members(zk, group):
    return sorted(zk.get_children(protocol.ids_path(group))) if zk.exists(protocol.ids_path(group)) else []


def stable_with(zk, group, expected) -> bool:
    s = read_state(zk, group)
    return s.state == protocol.STABLE and sorted(s.members) == sorted(expected)


@pytest.mark.skipif(not os.path.exists("/proc/self/wchan"), reason="needs /proc/<pid>/wchan (Linux)")
def test_a_refused_commit_is_one_warning_and_it_keeps_consuming(cluster, zk, zk_connect, data_dir,
                                                               subprocess_env, tmp_path):
    cluster.node("n")
    TopicRegistry(zk).create("t", 2)
    fill(data_dir, "t", [3000, 3000])  # far more JSON than a pipe holds
    a = ConsumeProcess(zk_connect, data_dir, ["g", "t", "--consumer-id", "a", "--session-timeout-ms", "1000"],
                       subprocess_env, tmp_path / "a.log", read=False)
    b = None
    try:
        # a prints a batch into a pipe nobody reads: it blocks before committing that batch.
        wait_for(a.blocked_writing, 30, message="a blocked writing a batch")
        os.kill(a.proc.pid, signal.SIGSTOP)
        wait_for(lambda: "a" not in members(zk, "g"), 20, message="a's session expired")
        b = ConsumeProcess(zk_connect, data_dir, ["g", "t", "--consumer-id", "b"], subprocess_env, tmp_path / "b.log")
        wait_for(lambda: committed(zk, "g", "t", 2) == {0: 3000, 1: 3000}, 30, message="b committed everything")

        os.kill(a.proc.pid, signal.SIGCONT)
        a.read()  # a finishes its batch; its commit is refused (or dropped: its session ended)
        wait_for(lambda: "will be delivered again" in a.stderr(), 30, message="a's warning")
        assert a.proc.poll() is None, a.stderr()
        assert all(line.startswith("warning: ") for line in a.stderr().splitlines()), a.stderr()
        assert committed(zk, "g", "t", 2) == {0: 3000, 1: 3000}, "a stale commit overwrote the new owner's"

        # a rejoins and keeps delivering: after the rebalance each owns one partition.
        wait_for(lambda: stable_with(zk, "g", ["a", "b"]), 30, message="a and b Stable")
        fill(data_dir, "t", [5, 5])
        new = {(p, o) for p in (0, 1) for o in range(3000, 3005)}
        wait_for(lambda: new <= a.delivered() | b.delivered(), 30, message="the new records delivered")
        assert any(o >= 3000 for _, o in a.delivered()), "a delivered nothing after its refused commit"
        assert {(p, o) for p in (0, 1) for o in range(3005)} <= a.delivered() | b.delivered()
        wait_for(lambda: committed(zk, "g", "t", 2) == {0: 3005, 1: 3005}, 30, message="all committed")
        assert a.stop() == 0 and b.stop() == 0
        assert "Traceback" not in a.stderr() + b.stderr()
    finally:
        for proc in (a, b):
            if proc is not None:
                proc.stop()


def test_an_error_raised_by_poll_is_one_line_after_leaving_the_group(cluster, zk, zk_connect, data_dir,
                                                                    subprocess_env, tmp_path):
    cluster.node("n")
    TopicRegistry(zk).create("t", 1)
    fill(data_dir, "t", [5])
    config = tmp_path / "consumer.toml"
    config.write_text('[consumer]\nauto_offset_reset = "none"\n')  # and the group has no committed offset
    proc = subprocess.run([GROUPCTL, "--zk", zk_connect, "--data-dir", data_dir, "consume", "g", "t",
                           "--config", str(config), "--idle-exit", "20"],
                          env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["error: no committed offset for t-0 and auto_offset_reset is none"], proc.stderr
    assert members(zk, "g") == []
    wait_for(lambda: read_state(zk, "g").state == protocol.EMPTY, message="the group is Empty")


def test_idle_exit_counts_from_the_start_without_a_coordinator(zk, zk_connect, data_dir, subprocess_env):
    TopicRegistry(zk).create("t", 1)
    fill(data_dir, "t", [3])
    proc = subprocess.run([GROUPCTL, "--zk", zk_connect, "--data-dir", data_dir, "consume", "g", "t",
                           "--idle-exit", "0.5"], env=subprocess_env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr.strip() == "consumed 0 records"


# ---------------------------------------------------------------- ZooKeeper away at the start

@pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")
def test_consume_started_before_zookeeper_waits_for_it_then_consumes(tmp_path, subprocess_env):
    """No ZooKeeper answers yet: consume says so once per --zk-timeout (its own line: no
    traceback, no kazoo lines) and keeps waiting; once ZooKeeper is up it joins and consumes.
    Before, it exited 75 after --zk-timeout (bin/chaos starts consumers while ZooKeeper has
    lost its quorum)."""
    from tests.support.groups import Cluster
    from coordinator.zkclient import close_client, start_client
    ensemble = Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk"))  # ports chosen, not started
    connect, data_dir = ensemble.connect + "/app", str(tmp_path / "data")
    env = dict(subprocess_env, ZKGROUPS_ZK_TIMEOUT="0.5")
    consumer = ConsumeProcess(connect, data_dir, ["g", "t", "--consumer-id", "a"], env, tmp_path / "a.log")
    cluster = zk = None
    try:
        wait_for(lambda: consumer.stderr().count("not reachable yet") >= 2, 30, message="two waiting lines")
        assert consumer.proc.poll() is None
        assert all(line.startswith("warning: ZooKeeper at ") for line in consumer.stderr().splitlines()), \
            consumer.stderr()
        ensemble.start()
        zk = start_client(connect, 4000)
        fill(data_dir, "t", [5], zk=zk)
        cluster = Cluster(connect)
        cluster.node("n")
        wait_for(lambda: consumer.delivered() == {(0, o) for o in range(5)}, 30, message="the records delivered")
        assert consumer.stop() == 0
        assert "Traceback" not in consumer.stderr() and consumer.stderr().endswith("consumed 5 records\n")
    finally:
        consumer.stop()
        if cluster is not None:
            cluster.close()
        if zk is not None:
            close_client(zk)
        ensemble.close()


def test_sigterm_while_consume_waits_for_zookeeper_ends_it_at_once(tmp_path, subprocess_env):
    """SIGTERM while consume waits for ZooKeeper at its start: one line, exit 0."""
    dead = f"127.0.0.1:{free_port()}"
    env = dict(subprocess_env, ZKGROUPS_ZK_TIMEOUT="0.5")
    consumer = ConsumeProcess(dead, str(tmp_path / "data"), ["g", "t"], env, tmp_path / "a.log")
    try:
        wait_for(lambda: "not reachable yet" in consumer.stderr(), 30, message="the first waiting line")
        consumer.proc.send_signal(signal.SIGTERM)
        assert consumer.proc.wait(10) == 0
        lines = consumer.stderr().splitlines()
        assert lines[-1] == f"stopped while waiting for ZooKeeper at {dead}; consumed 0 records", lines
        assert "Traceback" not in consumer.stderr()
    finally:
        consumer.stop()


# ---------------------------------------------------------------- ZooKeeper failover (slow)

def _server_of_session(ensemble: Ensemble, session_id: int):
    wanted = f"sid=0x{session_id:x},"
    for server in ensemble.servers:
        if server.running and wanted in four_letter("127.0.0.1", server.client_port, "cons"):
            return server
    return None


def _leader(ensemble: Ensemble):
    for server in ensemble.servers:
        if server.running and "Mode: leader" in four_letter("127.0.0.1", server.client_port, "srvr"):
            return server
    return None


class _Producer:
    """Appends a few records to every partition until stopped, so consumers commit all along."""

    def __init__(self, data_dir: str, topic: str, partitions: int):
        self.log, self.topic, self.partitions = Log(data_dir), topic, partitions
        self.stopped = threading.Event()
        self.ends = None  # end offsets, once stopped
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(0.02):  # 3 records to every partition every 20 ms
            for p in range(self.partitions):
                self.log.append(self.topic, p, [(None, b"x", 0, ())] * 3)

    def produced(self) -> set:
        ends = self.ends or {p: self.log.latest_offset(self.topic, p) for p in range(self.partitions)}
        return {(p, o) for p, end in ends.items() for o in range(end)}

    def stop(self) -> dict:
        if self.ends is None:
            self.stopped.set()
            self.thread.join(10)
            self.ends = {p: self.log.latest_offset(self.topic, p) for p in range(self.partitions)}
            self.log.close()
        return self.ends


@pytest.mark.slow
@pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")
def test_consumers_keep_running_through_zookeeper_failovers(tmp_path, subprocess_env):
    from coordinator.zkclient import close_client, start_client
    data_dir = str(tmp_path / "data")
    with Ensemble(3, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk")) as ens:
        zk = start_client(ens.connect, 6000)
        consumers, node, producer = [], None, None
        try:
            TopicRegistry(zk).create("t", 4)
            with open(tmp_path / "node.log", "w") as log:
                node = subprocess.Popen([sys.executable, "-m", "consumer.cli.coordinatord", "--zk", ens.connect,
                                         "--node-id", "n1", "--session-timeout-ms", "6000"],
                                        env=subprocess_env, stdout=subprocess.DEVNULL, stderr=log)
            producer = _Producer(data_dir, "t", 4)
            consumers = [ConsumeProcess(ens.connect, data_dir, ["g", "t", "--consumer-id", cid], subprocess_env,
                                        tmp_path / f"{cid}.log") for cid in ("c1", "c2")]
            wait_for(lambda: stable_with(zk, "g", ["c1", "c2"]), 30, message="c1 and c2 Stable")

            def delivered():
                return set().union(*(c.delivered() for c in consumers))

            def all_delivered(message):
                produced = producer.produced()
                try:
                    wait_for(lambda: produced <= delivered(), 60, message=message)
                except AssertionError as e:
                    states = [(c.proc.poll(), c.stderr()[-500:]) for c in consumers]
                    raise AssertionError(f"{e}; consumers (exit status, stderr): {states}") from None

            all_delivered("records before any failure delivered")
            session = wait_for(lambda: zk.exists(protocol.ids_path("g", "c1")), 10).ephemeralOwner
            victim = wait_for(lambda: _server_of_session(ens, session), 10, message="c1's server")
            failures = [("c1's server", victim)]
            victim.kill()
            ens.wait_serving(30, [s for s in ens.servers if s.running])
            all_delivered("records after c1's server was killed delivered")
            ens.restart(ens.servers.index(victim))

            leader = wait_for(lambda: _leader(ens), 30, message="the ensemble's leader")
            failures.append(("the leader", leader))
            leader.kill()
            wait_for(lambda: _leader(ens), 30, message="a new leader")
            all_delivered("records after the leader was killed delivered")
            ens.restart(ens.servers.index(leader))

            for c in consumers:
                assert c.proc.poll() is None, f"{[f for f, _ in failures]}: {c.stderr()}"
            ends = producer.stop()
            all_delivered("every record delivered")
            wait_for(lambda: committed(zk, "g", "t", 4) == ends, 30, message="everything committed")
            for c in consumers:
                assert c.stop() == 0, c.stderr()
                assert "Traceback" not in c.stderr()
        finally:
            if producer is not None:
                producer.stop()
            for c in consumers:
                c.stop()
            if node is not None:
                node.terminate()
                node.wait(30)
            close_client(zk)


def test_every_intact_record_is_printed_before_the_one_error_line(cluster, zk, zk_connect, data_dir, subprocess_env,
                                                                  tmp_path):
    """A sealed segment truncated after its first batch (offsets 700..899 lost): every record
    before the damage is printed, then one error line names it; exit 1."""
    from tests.dataplane.test_log_damage import BATCH_BYTES, CASES, TOTAL, write_topic
    cluster.node("n")
    write_topic(data_dir)  # topic "t", one partition
    CASES["sealed segment truncated after its first batch"].apply(data_dir, str(tmp_path / "scratch"))
    TopicRegistry(zk).create("t", 1)
    config = tmp_path / "consumer.toml"  # one batch a fetch, and read ahead up to the damage
    config.write_text(f"[consumer]\nmax_poll_records = {TOTAL}\nmax_partition_fetch_bytes = {BATCH_BYTES}\n")
    proc = subprocess.run([GROUPCTL, "--zk", zk_connect, "--data-dir", data_dir, "consume", "g", "t",
                           "--config", str(config), "--idle-exit", "20"],
                          env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert [json.loads(line)["offset"] for line in proc.stdout.splitlines()] == list(range(700))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: t-0: offset 700 cannot be read"), proc.stderr


def _without_dac_override():
    """The command prefix that runs a child without the capabilities that let root ignore file
    permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH): util-linux's setpriv, as root; none
    needed otherwise. None if the permission check cannot be had here."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"] if setpriv else None


@pytest.mark.skipif(_without_dac_override() is None, reason="running as root without setpriv (util-linux)")
def test_an_unreadable_partition_directory_is_one_error_line_and_exit_1(cluster, zk, zk_connect, data_dir,
                                                                         subprocess_env):
    """The partition directory of a one-partition topic is chmod 0 and the consumer may not
    override permissions (as root: run through setpriv with CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH dropped): one line names the partition and the cause, exit 1; the
    partition was released, not kept by a member that cannot read it."""
    cluster.node("n")
    TopicRegistry(zk).create("t", 1)
    fill(data_dir, "t", [5])
    part = os.path.join(data_dir, "t-0")
    os.chmod(part, 0)
    try:
        proc = subprocess.run(_without_dac_override() + [GROUPCTL, "-v", "--zk", zk_connect, "--data-dir", data_dir,
                                                         "consume", "g", "t", "--idle-exit", "4"],
                              env=subprocess_env, capture_output=True, text=True, timeout=60)
    finally:
        os.chmod(part, 0o755)
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: t-0 cannot be read: Permission denied: {part}"], proc.stderr
    assert "unexpected" not in proc.stderr and "Traceback" not in proc.stderr
    assert "releasing t-0, which it cannot serve" in proc.stderr  # -v: the member's INFO line
    assert members(zk, "g") == []
