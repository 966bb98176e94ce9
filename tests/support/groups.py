"""Building blocks for coordinator tests: nodes, members with recording listeners, state reads."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from coordinator import protocol, read
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.zkclient import close_client, start_client
from consumer.member import GroupMember, MemberListener
from tests.support.helpers import wait_for

FAST = dict(session_timeout_ms=1500, rebalance_timeout_ms=1500, max_rebalance_retries=1,
            rebalance_backoff_ms=50, failed_retry_interval_ms=1000, check_interval_ms=60000)


class Recorder(MemberListener):
    """Records what the member was told, in order."""

    def __init__(self):
        self.owned = set()
        self.events = []
        self.lock = threading.Lock()

    def revoke(self, partitions):
        with self.lock:
            self.owned -= partitions
            self.events.append(("revoked", frozenset(partitions)))
        return {}

    def assign(self, added, committed):
        with self.lock:
            self.owned |= set(added)
            self.events.append(("assigned", frozenset(added)))

    def lost(self, partitions):
        with self.lock:
            self.owned -= partitions
            self.events.append(("lost", frozenset(partitions)))


class Cluster:
    """Coordinators and members against one chroot; everything is closed at the end."""

    def __init__(self, connect: str, **config):
        self.connect = connect
        self.config = CoordinatorConfig(**{**FAST, **config})
        self.nodes, self.members, self.clients, self.procs = [], [], [], []

    def node(self, name: str) -> Coordinator:
        n = Coordinator(self.connect, name, self.config).start()
        self.nodes.append(n)
        return n

    def leader(self, timeout=10.0) -> Coordinator:
        # elected: set once the leader znode is written (is_leader comes a moment before it)
        return wait_for(lambda: next((n for n in self.nodes if n.is_leader and n.elected.is_set()), None), timeout,
                        message="a leader")

    def client(self, session_ms=1500):
        c = start_client(self.connect, session_ms)
        self.clients.append(c)
        return c

    def member(self, group, topics, pattern=protocol.PATTERN_STATIC, strategies=("range",), session_ms=1500):
        rec = Recorder()
        sub = topics if isinstance(topics, dict) else {t: 1 for t in topics}
        m = GroupMember(self.client(session_ms), group, sub, pattern, strategies, listener=rec).start()
        m.recorder = rec
        self.members.append(m)
        return m

    def spawn(self, *args, env=None) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        self.procs.append(p)
        return p

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        for m in self.members:
            try:
                m.close(timeout=5)
            except Exception:
                pass
        for n in self.nodes:
            n.close()
        for c in self.clients:
            close_client(c)


read_state = read.group_state


def wait_stable(zk, group, members, timeout=15.0, after_generation=0) -> protocol.GroupState:
    def check():
        s = read_state(zk, group)
        return s if (s.state == protocol.STABLE and len(s.members) == members
                     and s.generation > after_generation) else None
    return wait_for(check, timeout, message=f"group {group} Stable with {members} members")


def owned_by(members):
    """{member: set of partitions} as the members themselves see it."""
    return [frozenset(m.recorder.owned) for m in members]


def assert_exclusive_and_complete(members, topic, partitions):
    owned = [p for m in members for p in m.recorder.owned if p.topic == topic]
    assert sorted(p.partition for p in owned) == list(range(partitions)), owned


def leader_info(zk) -> protocol.LeaderInfo:
    info = read.leader(zk)
    assert info is not None, "no leader"
    return info


def expire_session(client, connect):
    """Expire ``client``'s session for real: a second client takes it over and closes it."""
    session_id, password = client.client_id
    hosts = connect.split("/", 1)[0]
    twin = KazooClient(hosts=hosts, client_id=(session_id, password))
    twin.start(timeout=10)
    twin.stop()
    twin.close()


def command_count(zk, group) -> int:
    """How many commands were ever written in this group (sequence counters of channels)."""
    total = 0
    try:
        for cid in zk.get_children(protocol.channel_path(group)):
            _, stat = zk.get(protocol.channel_path(group, cid))
            total += stat.cversion
    except NoNodeError:
        pass
    return total


def read_json_lines(proc, until, timeout=15.0):
    """Read JSON lines from a child until ``until(obj)`` is true; return that object."""
    result = {}

    def reader():
        for line in proc.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if until(obj):
                result["obj"] = obj
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    assert "obj" in result, "child did not report in time"
    return result["obj"]


def stop_process(proc, sig=signal.SIGKILL):
    os.kill(proc.pid, sig)
    proc.wait(10)
