"""Static membership (``group_instance_id``) against a real ZooKeeper and a real coordinator.

- A static member closed and started again within its grace gets exactly its partitions back:
  the group's generation is unchanged, the others get no command, and nobody else owns its
  partitions meanwhile.
- A leader that takes over while a static member is away keeps holding it (the hold and its
  start are in the group state), and the return is still a restore.
- A static member whose session expires (for real) registers again and gets its partitions
  back at the same generation; the others get no command.
- A second live process with the same instance id is fenced: ``FencedInstanceIdError`` from
  the Consumer API, one line and exit 1 from ``groupctl consume``; the first keeps its partitions.
- A rolling restart of 4 ``groupctl consume`` processes (each SIGTERMed, then started again)
  moves no partition: ownership, read from the owner nodes all along, never leaves the first
  assignment, and the generation never changes.
- Past the grace a departed static member is dropped (an ordinary rebalance), and its return
  is an ordinary rebalance too.
- A SIGKILLed static member started again at once waits for its old session to expire, then
  gets the same partitions; the only records delivered twice are ones its predecessor printed
  after its last commit (the at-least-once window).
- A static member frozen (SIGSTOP) past its session, replaced meanwhile by a new process with
  its instance id, is fenced when it wakes (one line, exit 1) and changes nothing: the
  registration stays the new process's, which commits to the end.
"""
from __future__ import annotations

import signal
import subprocess
import threading

import pytest

from coordinator import protocol, read
from coordinator.errors import FencedInstanceIdError
from coordinator.topics import TopicRegistry
from consumer.consumer import Consumer
from consumer.member import GroupMember
from tests.support.groups import Recorder, command_count, expire_session, read_state, wait_stable
from tests.support.helpers import GROUPCTL, assert_failed, committed, wait_for
from tests.cli.test_groupctl_consume import ConsumeProcess, _Producer

SESSION_MS = 1500


def static_member(cluster, group, instance, topics=("t",), grace_ms=15000):
    rec = Recorder()
    m = GroupMember(cluster.client(SESSION_MS), group, {t: 1 for t in topics}, listener=rec,
                    session_timeout_ms=SESSION_MS, group_instance_id=instance, static_grace_ms=grace_ms).start()
    m.recorder = rec
    cluster.members.append(m)
    return m


def share(state, consumer_id):
    return {(t, p) for t, parts in state.assignment.items() for p, s in parts.items()
            if protocol.consumer_of_stream(s) == consumer_id}


def owner_nodes(zk, group, topic):
    """{partition: stream id} read from the owner nodes."""
    out = {}
    for p in zk.get_children(protocol.owners_path(group, topic)):
        try:
            out[int(p)] = zk.get(protocol.owners_path(group, topic, int(p)))[0].decode()
        except Exception:  # released while we read
            continue
    return out


def channel_commands(zk, group, consumer_id):
    """How many commands were ever written to one member's channel."""
    return zk.get(protocol.channel_path(group, consumer_id))[1].cversion


class OwnershipWatcher:
    """Samples the owner nodes until stopped and records every (partition, stream) seen."""

    def __init__(self, zk, group, topic):
        self.seen, self.stopped = set(), threading.Event()
        self.thread = threading.Thread(target=self._run, args=(zk, group, topic), daemon=True)
        self.thread.start()

    def _run(self, zk, group, topic):
        while not self.stopped.wait(0.01):
            self.seen |= set(owner_nodes(zk, group, topic).items())

    def stop(self):
        self.stopped.set()
        self.thread.join(10)
        return self.seen


def test_restart_within_the_grace_gets_the_same_partitions_without_a_rebalance(cluster, zk):
    cluster.node("n")
    TopicRegistry(zk).create("t", 6)
    a, b, c = (static_member(cluster, "g", i) for i in ("a", "b", "c"))
    before = wait_stable(zk, "g", 3)
    b_share = share(before, b.consumer_id)
    wait_for(lambda: {tp.partition for tp in b.recorder.owned} == {p for _, p in b_share}, message="b owns its share")
    others = {m.consumer_id: (channel_commands(zk, "g", m.consumer_id), m.generation, m.rebalances) for m in (a, c)}

    b.close()
    away = wait_for(lambda: (s := read_state(zk, "g")).static.get(b.consumer_id) and
                    s.static[b.consumer_id].away_since and s, message="b recorded away")
    assert away.generation == before.generation and away.assignment == before.assignment
    assert sorted(away.members) == sorted(before.members) and away.state == protocol.STABLE
    assert set(owner_nodes(zk, "g", "t")).isdisjoint({p for _, p in b_share}), "b's partitions owned while away"

    b2 = static_member(cluster, "g", "b")
    assert b2.consumer_id == b.consumer_id
    wait_for(lambda: {tp.partition for tp in b2.recorder.owned} == {p for _, p in b_share}, message="b's share back")
    after = wait_stable(zk, "g", 3)
    assert after.generation == before.generation and after.assignment == before.assignment
    assert after.static[b.consumer_id].away_since is None
    for m in (a, c):
        assert (channel_commands(zk, "g", m.consumer_id), m.generation, m.rebalances) == others[m.consumer_id], \
            f"{m.consumer_id} was sent a command"
    assert owner_nodes(zk, "g", "t") == {p: s for t, parts in before.assignment.items() for p, s in parts.items()}


def test_a_new_leader_keeps_holding_an_away_member(cluster, zk):
    """The hold lives in the group state: a leader that takes over while a static member is
    away neither rebalances nor restarts its grace, and its return is a restore."""
    first_node = cluster.node("n1")
    TopicRegistry(zk).create("t", 4)
    a, b = static_member(cluster, "g", "a"), static_member(cluster, "g", "b")
    before = wait_stable(zk, "g", 2)
    b.close()
    away = wait_for(lambda: (s := read_state(zk, "g")).static[b.consumer_id].away_since and s, message="b away")

    cluster.node("n2")
    first_node.close()
    wait_for(lambda: read.all_verified(zk) and {n for n, _, _ in read.shard_leaders(zk).values()} == {"n2"},
             20, message="n2 leads and verified every group")
    held = read_state(zk, "g")
    assert held.static[b.consumer_id].away_since == away.static[b.consumer_id].away_since
    assert (held.generation, held.assignment) == (before.generation, before.assignment)

    b2 = static_member(cluster, "g", "b")
    wait_for(lambda: len(b2.recorder.owned) == 2, message="b's partitions back")
    after = wait_stable(zk, "g", 2)
    assert (after.generation, after.assignment) == (before.generation, before.assignment)
    assert len(a.recorder.owned) == 2


def test_an_expired_session_of_a_static_member_costs_no_rebalance(cluster, zk, zk_connect):
    """Its session expires (for real), it reports its partitions lost, registers again in a new
    session and gets the same partitions back at the same generation; the other gets nothing."""
    cluster.node("n")
    TopicRegistry(zk).create("t", 4)
    a, b = static_member(cluster, "g", "a"), static_member(cluster, "g", "b")
    before = wait_stable(zk, "g", 2)
    wait_for(lambda: len(a.recorder.owned) == 2 and len(b.recorder.owned) == 2, message="both own their share")
    a_share, b_commands = set(a.recorder.owned), channel_commands(zk, "g", b.consumer_id)

    expire_session(a.client, zk_connect)
    wait_for(lambda: any(kind == "lost" for kind, _ in a.recorder.events), message="a reports its partitions lost")
    wait_for(lambda: a.recorder.owned == a_share and a.registered, message="a's partitions back")
    after = wait_stable(zk, "g", 2)
    assert (after.generation, after.assignment) == (before.generation, before.assignment)
    assert channel_commands(zk, "g", b.consumer_id) == b_commands


def test_a_second_live_process_with_the_same_instance_id_is_fenced(cluster, zk, zk_connect, data_dir,
                                                                   subprocess_env):
    cluster.node("n")
    TopicRegistry(zk).create("t", 2)
    first = static_member(cluster, "g", "web-1")
    state = wait_stable(zk, "g", 1)
    commands = command_count(zk, "g")

    with pytest.raises(FencedInstanceIdError, match="web-1.*in use by another live consumer"):
        Consumer("g", ["t"], zk=zk_connect, data_dir=data_dir, group_instance_id="web-1",
                 session_timeout_ms=SESSION_MS)

    proc = subprocess.run([*GROUPCTL, "--zk", zk_connect, "--data-dir", data_dir, "consume", "g", "t",
                           "--group-instance-id", "web-1", "--session-timeout-ms", str(SESSION_MS)],
                          env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "in use by another live consumer" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr

    # The first one was never disturbed.
    assert first.registered and len(first.recorder.owned) == 2
    now = read_state(zk, "g")
    assert (now.generation, now.assignment) == (state.generation, state.assignment)
    assert command_count(zk, "g") == commands


@pytest.mark.parametrize("args,match", [
    (["--group-instance-id", "bad/id"], "group instance id name 'bad/id' is illegal"),
    (["--group-instance-id", "x", "--consumer-id", "y"], "not both"),
    (["--static-grace-ms", "1000"], "needs --group-instance-id"),
])
def test_bad_instance_ids_are_one_line(groupctl, zk, args, match):
    TopicRegistry(zk).create("t", 1)
    result = groupctl("consume", "g", "t", *args)
    assert_failed(result, match, exit_code=result.exit_code or 1)
    assert result.exit_code != 0


def test_past_the_grace_the_group_rebalances_as_usual(cluster, zk):
    cluster.node("n")
    TopicRegistry(zk).create("t", 4)
    a = static_member(cluster, "g", "a", grace_ms=500)
    b = static_member(cluster, "g", "b", grace_ms=500)
    before = wait_stable(zk, "g", 2)

    b.close()
    dropped = wait_stable(zk, "g", 1, after_generation=before.generation)
    assert dropped.members == [a.consumer_id] and share(dropped, a.consumer_id) == {("t", p) for p in range(4)}
    assert b.consumer_id not in dropped.static
    wait_for(lambda: len(a.recorder.owned) == 4, message="a owns everything")

    b2 = static_member(cluster, "g", "b", grace_ms=500)
    back = wait_stable(zk, "g", 2, after_generation=dropped.generation)
    assert back.assignment == before.assignment  # range over the same members again
    wait_for(lambda: len(b2.recorder.owned) == 2 and len(a.recorder.owned) == 2, message="split again")


def _consume(zk_connect, data_dir, instance, config, env, tmp_path, n):
    """``groupctl consume`` as static member ``instance``: its grace from ``config`` (a TOML
    file) or, given an int, from ``--static-grace-ms``."""
    grace = ["--static-grace-ms", str(config)] if isinstance(config, int) else ["--config", str(config)]
    return ConsumeProcess(zk_connect, data_dir, ["g", "t", "--group-instance-id", instance, *grace,
                                                  "--from-beginning", "--session-timeout-ms", str(SESSION_MS)],
                          env, tmp_path / f"{instance}-{n}.log")


def _stop_all(procs) -> None:
    """Stop every process, even when one of them is slow to go (it is killed then)."""
    for proc in procs:
        if proc is None:
            continue
        try:
            proc.stop()
        except subprocess.TimeoutExpired:
            pass  # stop() killed it


def _grace_config(tmp_path, grace_ms):
    config = tmp_path / "consumer.toml"
    config.write_text(f"[consumer]\nstatic_grace_ms = {grace_ms}\nauto_offset_reset = \"earliest\"\n")
    return config


def test_a_rolling_restart_moves_no_partition(cluster, zk, zk_connect, data_dir, subprocess_env, tmp_path):
    cluster.node("n")
    TopicRegistry(zk).create("t", 8)
    producer = _Producer(data_dir, "t", 8)
    config = _grace_config(tmp_path, 60000)
    instances = [f"i{n}" for n in range(4)]
    procs = {i: _consume(zk_connect, data_dir, i, config, subprocess_env, tmp_path, 0) for i in instances}
    done = []
    try:
        first = wait_stable(zk, "g", 4, timeout=90)
        assignment = {p: s for t, parts in first.assignment.items() for p, s in parts.items()}
        wait_for(lambda: owner_nodes(zk, "g", "t") == assignment, 90, message="every partition owned")
        watcher = OwnershipWatcher(zk, "g", "t")
        for n, i in enumerate(instances):
            old = procs[i]
            assert old.stop() == 0, old.stderr()
            done.append(old)
            procs[i] = _consume(zk_connect, data_dir, i, config, subprocess_env, tmp_path, 1)
            wait_for(lambda: owner_nodes(zk, "g", "t") == assignment, 90, message=f"{i}'s partitions owned again")
        seen = watcher.stop()
        moved = {(p, s) for p, s in seen if assignment[p] != s}
        assert moved == set(), f"partitions moved: {sorted(moved)}"
        last = read_state(zk, "g")
        assert last.generation == first.generation and last.assignment == first.assignment
        assert last.state == protocol.STABLE

        produced = producer.stop()
        everything = {(p, o) for p, end in produced.items() for o in range(end)}
        wait_for(lambda: everything <= set().union(*(c.delivered() for c in [*done, *procs.values()])), 120,
                 message="every record delivered")
    finally:
        producer.stop()
        _stop_all([*done, *procs.values()])
    for proc in [*done, *procs.values()]:
        assert "Traceback" not in proc.stderr(), proc.stderr()


def test_a_sigkilled_static_member_restarted_in_the_grace_gets_its_partitions_back(
        cluster, zk, zk_connect, data_dir, subprocess_env, tmp_path):
    cluster.node("n")
    TopicRegistry(zk).create("t", 4)
    producer = _Producer(data_dir, "t", 4)
    config = 60000   # --static-grace-ms
    a = _consume(zk_connect, data_dir, "a", config, subprocess_env, tmp_path, 0)
    b = _consume(zk_connect, data_dir, "b", config, subprocess_env, tmp_path, 0)
    b2 = None
    try:
        first = wait_stable(zk, "g", 2, timeout=90)
        b_id = protocol.static_consumer_id("g", "b")
        b_parts = {p for _, p in share(first, b_id)}
        wait_for(lambda: b_parts <= {p for p, _ in b.delivered()}, 90, message="b delivering its share")
        a_commands = channel_commands(zk, "g", protocol.static_consumer_id("g", "a"))

        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(10)
        at_kill = committed(zk, "g", "t", 4)   # nobody can commit b's partitions until it is back
        b2 = _consume(zk_connect, data_dir, "b", config, subprocess_env, tmp_path, 1)
        wait_for(lambda: b_parts <= {p for p, _ in b2.delivered()}, 90, message="b's partitions back to b")
        assert {p for p, _ in b2.delivered()} == b_parts

        last = read_state(zk, "g")
        assert last.generation == first.generation and last.assignment == first.assignment
        assert channel_commands(zk, "g", protocol.static_consumer_id("g", "a")) == a_commands

        produced = producer.stop()
        everything = {(p, o) for p, end in produced.items() for o in range(end)}
        wait_for(lambda: everything <= a.delivered() | b.delivered() | b2.delivered(), 120,
                 message="every record delivered")
        twice = (b.delivered() & b2.delivered()) | (a.delivered() & (b.delivered() | b2.delivered()))
        outside = {(p, o) for p, o in twice if p not in b_parts or o < (at_kill[p] or 0)}
        assert outside == set(), f"delivered twice outside the at-least-once window: {sorted(outside)[:10]}"
        assert a.stop() == 0 and b2.stop() == 0
    finally:
        producer.stop()
        _stop_all([a, b, b2])


def test_a_frozen_static_member_replaced_meanwhile_is_fenced_when_it_wakes(
        cluster, zk, zk_connect, data_dir, subprocess_env, tmp_path):
    """SIGSTOPped past its session: its partitions are held for it; a new process with its
    instance id takes them back; the old one, woken, is fenced (one line, exit 1), and its late
    commit cannot land (the new process's claim moved the token)."""
    cluster.node("n")
    TopicRegistry(zk).create("t", 2)
    producer = _Producer(data_dir, "t", 2)
    config = _grace_config(tmp_path, 60000)
    old = _consume(zk_connect, data_dir, "a", config, subprocess_env, tmp_path, 0)
    new = None
    a_id = protocol.static_consumer_id("g", "a")
    try:
        first = wait_stable(zk, "g", 1, timeout=90)
        wait_for(lambda: {p for p, _ in old.delivered()} == {0, 1}, 90, message="the old process delivering")
        old.proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: not zk.exists(protocol.ids_path("g", a_id)), 90, message="its session expired")
        new = _consume(zk_connect, data_dir, "a", config, subprocess_env, tmp_path, 1)
        wait_for(lambda: {p for p, _ in new.delivered()} == {0, 1}, 90, message="the new process delivering")

        old.proc.send_signal(signal.SIGCONT)
        assert old.proc.wait(90) == 1
        lines = [line for line in old.stderr().splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "in use by another live consumer" in lines[0], old.stderr()
        assert "Traceback" not in old.stderr()

        assert zk.exists(protocol.ids_path("g", a_id)) is not None, "the fenced process removed the registration"
        last = read_state(zk, "g")
        assert last.generation == first.generation and last.assignment == first.assignment
        produced = producer.stop()
        wait_for(lambda: committed(zk, "g", "t", 2) == produced, 120, message="the new process commits the end")
        assert new.stop() == 0
    finally:
        producer.stop()
        _stop_all([old, new])
