"""A member never hands out or commits records of a partition it no longer owns.

The lease under a frozen process (a real ``groupctl consume`` SIGSTOPped past its session),
the fencing token on every commit and release path, adopted owner nodes, and a deposed
leader's writes to the leader znode. Real ZooKeeper throughout; where these tests play the
leader themselves, they write commands exactly as a leader does (epoch, generation, state).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from kazoo.exceptions import BadVersionError, NodeExistsError

from consumer import Consumer, Producer, TopicPartition
from consumer.member import GroupMember, MemberListener
from consumer.offsets import COMMIT_PARTITIONS
from consumer.ownership import CLAIM_PARTITIONS
from coordinator import protocol
from coordinator.controller import Controller
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.errors import CommitFailedError
from coordinator.fencing import Deposed, Leadership
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from tests.support.groups import Recorder, read_state
from tests.support.helpers import GROUPCTL, fill, wait_for
from tests.consumer.test_consumer import consume_until

TP = TopicPartition("t", 0)


class ActingLeader:
    """Writes commands the way the node leading the group's shard does (one transaction per
    generation fenced by the shard's epoch: the group state, then stop-fetcher and
    start-fetcher per member). One shard: every group is in shard 0."""

    def __init__(self, zk, group: str):
        self.zk, self.group, self.generation = zk, group, 0
        zk.ensure_path(protocol.COORDINATOR)
        if not zk.exists(protocol.SHARDS):
            zk.create(protocol.SHARDS, protocol.ShardsInfo(1).encode())
        self.epoch_path = protocol.shard_epoch_path(0)
        zk.ensure_path(self.epoch_path)
        self.epoch = zk.set(self.epoch_path, b"bumped").version

    def assign(self, shares):
        """``shares``: {consumer id: [partitions of topic t]}."""
        self.generation += 1
        g, gen, epoch = self.group, self.generation, self.epoch
        ownership = {cid: {"t": {p: f"{cid}-0" for p in parts}} for cid, parts in shares.items()}
        state = protocol.GroupState(gen, protocol.REBALANCING, list(shares), {}, "range", "", epoch)
        t = self.zk.transaction()
        t.check(self.epoch_path, epoch)
        if self.zk.exists(protocol.state_path(g)):
            t.set_data(protocol.state_path(g), state.encode())
        else:
            t.create(protocol.state_path(g), state.encode())
        for cid, own in ownership.items():
            prefix = protocol.command_prefix(g, cid)
            t.create(prefix, protocol.Command(protocol.STOP_FETCHER, gen, epoch, consumer_id=cid).encode(),
                     sequence=True)
            t.create(prefix, protocol.Command(protocol.START_FETCHER, gen, epoch, own, consumer_id=cid).encode(),
                     sequence=True)
        assert all(not isinstance(r, Exception) for r in t.commit())

    def acked(self, cid) -> bool:
        return not self.zk.get_children(protocol.channel_path(self.group, cid))


def committed(zk, group="g", tp=TP):
    return zk.get(protocol.offsets_path(group, tp.topic, tp.partition))[0]


@pytest.fixture
def consumers(zk_connect, data_dir):
    made = []

    def make(**config):
        config = {"auto_offset_reset": "earliest", "session_timeout_ms": 4000, **config}
        c = Consumer("g", ["t"], zk=zk_connect, data_dir=data_dir, **config)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


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


def test_an_owner_node_whose_claim_answer_was_lost_is_adopted_and_commits(zk, data_dir, consumers):
    """A claim transaction applied but its answer never came back (a connection error): the
    member finds its own session's owner node, adopts it with the token that claim wrote, and
    its commits go through."""
    fill(data_dir, "t", [50] * 1, zk=zk)
    leader = ActingLeader(zk, "g")
    a = consumers()
    stream = f"{a.consumer_id}-0"
    t = a._client.transaction()  # what a's lost claim wrote, on a's own session
    a._client.ensure_path(protocol.owners_path("g", "t"))
    a._client.ensure_path(protocol.offsets_path("g", "t"))
    t.create(protocol.owners_path("g", "t", 0), stream.encode(), ephemeral=True)
    t.create(protocol.offsets_path("g", "t", 0), protocol.NO_OFFSET)
    t.commit()
    leader.assign({a.consumer_id: [0]})
    assert len(consume_until(a, 50)) == 50
    a.commit()
    assert committed(zk) == b"50"


def test_a_deposed_controller_cannot_write(zk, zk_connect):
    """A controller whose epoch is no longer current (another node was elected behind its
    back) can write neither the leader znode nor the shards; it does not delete the new
    controller's znode either."""
    old = Coordinator(zk_connect, "old")
    old.client = zk  # not started: only its writes are exercised
    zk.ensure_path(protocol.EPOCH)
    old_epoch = zk.set(protocol.EPOCH, b"1").version
    new_epoch = zk.set(protocol.EPOCH, b"2").version  # another node was elected since
    new_info = protocol.LeaderInfo("new", "h", 1, new_epoch, protocol.now_ms())
    zk.create(protocol.LEADER, new_info.encode(), ephemeral=True)
    old_info = protocol.LeaderInfo("old", "h", 2, old_epoch, protocol.now_ms())

    with pytest.raises(Deposed):
        old._publish_leader(old_info)
    with pytest.raises(Deposed):
        Controller(zk, CoordinatorConfig(), "old", Leadership(old_epoch))._ensure_shards()
    assert not zk.exists(protocol.SHARDS)
    old._unpublish_leader(old_info)
    assert protocol.LeaderInfo.decode(zk.get(protocol.LEADER)[0]) == new_info


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


def test_commands_are_numbered_one_after_the_last_created(zk):
    """What a member relies on to read its commands in the listing's round trip: ZooKeeper
    numbers a sequential node one after the last child created under its parent, whatever was
    deleted since, also inside one transaction (a coordinator writes stop and start at once)."""
    zk.ensure_path(protocol.channel_path("g", "m"))
    last = -1
    for _ in range(3):
        t = zk.transaction()
        for _ in range(2):
            t.create(protocol.command_prefix("g", "m"), b"{}", sequence=True)
        created = t.commit()
        assert created == [protocol.command_path("g", "m", last + i) for i in (1, 2)]
        assert protocol.command_sequence(created[-1]) == last + 2
        last += 2
        for path in created:
            zk.delete(path)


def test_a_member_reads_its_commands_whether_or_not_their_names_were_guessed(zk):
    """The channel listed empty and its last command known: the next two are read with the
    listing. A command the guess missed (someone else's node was created in the channel
    meanwhile) is read in a second round trip; the epoch and generation are always read after
    the commands."""
    member = GroupMember(zk, "g", {"t": 1}, consumer_id="m")
    member._channel.last_command = -1  # as after start() made the channel
    zk.ensure_path(protocol.channel_path("g", "m"))
    assert member._channel.read() == ([], None, None)

    def write(generation):  # as a coordinator does: the state, then stop and start
        state = protocol.GroupState(generation=generation).encode()
        if zk.exists(protocol.state_path("g")):
            zk.set(protocol.state_path("g"), state)
        else:
            zk.create(protocol.state_path("g"), state, makepath=True)
        t = zk.transaction()
        t.create(protocol.command_prefix("g", "m"), protocol.Command(protocol.STOP_FETCHER, generation, 1,
                                                                     consumer_id="m").encode(), sequence=True)
        t.create(protocol.command_prefix("g", "m"), protocol.Command(protocol.START_FETCHER, generation, 1, {},
                                                                     consumer_id="m").encode(), sequence=True)
        return t.commit()

    for generation, disturb in ((1, False), (2, False), (3, True)):
        if disturb:  # the guess is now wrong
            zk.delete(zk.create(protocol.command_prefix("g", "m"), b"", sequence=True))
        paths = write(generation)
        commands, _, seen_generation = member._channel.read()
        assert [p for p, _ in commands] == paths and seen_generation == generation
        assert [c.option for _, c in commands] == [protocol.STOP_FETCHER, protocol.START_FETCHER]
        for path in paths:  # the acks
            zk.delete(path)
        assert member._channel.read() == ([], None, None)


class Sent:
    """Records what a client sends: the paths it reads, and each transaction it commits as
    [(operation, path)] (paths as the client names them, without its chroot)."""

    def __init__(self, client):
        self.reads, self.transactions = [], []
        get_async, transaction = client.get_async, client.transaction
        chroot = len(client.chroot or "")

        def get(path, *args, **kwargs):
            self.reads.append(path)
            return get_async(path, *args, **kwargs)

        def recorded():
            t = transaction()
            commit_async = t.commit_async

            def commit():
                self.transactions.append([(type(op).__name__, op.path[chroot:]) for op in t.operations])
                return commit_async()
            t.commit_async = commit
            return t
        client.get_async, client.transaction = get, recorded

    def counts(self, kind: str, prefix: str):
        """Per transaction, how many ``kind`` operations on paths under ``prefix`` it had (those with any)."""
        counted = [sum(k == kind and p.startswith(prefix + "/") for k, p in t) for t in self.transactions]
        return [n for n in counted if n]

    def with_ops_under(self, prefix: str):
        """The indexes of the transactions with an operation under ``prefix``."""
        return [i for i, t in enumerate(self.transactions) if any(p.startswith(prefix + "/") for _, p in t)]


class Keeper(MemberListener):
    """Records the committed offsets a claim found; revoking, commits ``1000 + partition``."""

    def __init__(self):
        self.committed = {}

    def assign(self, added, committed):
        self.committed.update(committed)

    def revoke(self, partitions):
        return {tp: 1000 + tp.partition for tp in partitions}


def test_a_claim_reads_only_offsets_znodes_that_exist_and_fences_every_partition(zk, zk_connect):
    """Member m gets partitions 0-249 of t. 0 has an offsets znode m saw when it joined, 1 one
    made after that (as another member's claim or a reader's commit makes one), the others
    none (new: the topic grew). The claim reads those two and no other offsets znode, and
    claims in transactions of at most CLAIM_PARTITIONS partitions, the ack in the last. Every
    partition's offsets znode was then written by the claim: a write at a version from before
    it is refused, and m commits through its own tokens."""
    zk.create(protocol.offsets_path("g", "t", 0), b"7", makepath=True)
    client = start_client(zk_connect, session_timeout_ms=10000)  # 250 partitions on a loaded machine
    try:
        leader = ActingLeader(zk, "g")
        keeper = Keeper()
        member = GroupMember(client, "g", {"t": 1}, consumer_id="m", listener=keeper).start()
        zk.create(protocol.offsets_path("g", "t", 1), b"5")
        sent = Sent(client)
        leader.assign({"m": list(range(250))})
        wait_for(lambda: leader.acked("m"), message="m claimed its partitions")
        # the listener hears of a claim once its last transaction (the one with the ack) is done
        wait_for(lambda: len(keeper.committed) == 250, message="m handed its partitions to the listener")

        offsets = protocol.offsets_path("g", "t")
        assert sorted(p for p in sent.reads if p.startswith(offsets + "/")) == [f"{offsets}/0", f"{offsets}/1"]
        owners = protocol.owners_path("g", "t")
        assert sent.counts("Create", owners) == [CLAIM_PARTITIONS, CLAIM_PARTITIONS, 250 - 2 * CLAIM_PARTITIONS]
        claims = sent.with_ops_under(owners)
        assert sent.with_ops_under(protocol.channel_path("g", "m")) == [claims[-1]]  # the ack, with the last
        assert keeper.committed[TopicPartition("t", 0)] == 7 and keeper.committed[TopicPartition("t", 1)] == 5
        assert all(keeper.committed[TopicPartition("t", p)] is None for p in range(2, 250))

        for p in (0, 1):  # rewritten by the claim (same data, next version): an older token is refused
            assert zk.get(protocol.offsets_path("g", "t", p))[1].version == 1
            with pytest.raises(BadVersionError):
                zk.set(protocol.offsets_path("g", "t", p), b"99", version=0)
        with pytest.raises(NodeExistsError):  # created by the claim: no one else creates it now
            zk.create(protocol.offsets_path("g", "t", 2), b"99")
        member.commit({TopicPartition("t", p): 40 + p for p in (0, 1, 2)})
        assert [zk.get(protocol.offsets_path("g", "t", p))[0] for p in (0, 1, 2)] == [b"40", b"41", b"42"]
        member.close()
    finally:
        close_client(client)


def test_commits_and_releases_of_many_partitions_go_in_parts(zk, zk_connect):
    """m owns 250 partitions. A commit of all their offsets is written in transactions of at
    most COMMIT_PARTITIONS; revoking all of them (their offsets written, their owner nodes
    deleted) in transactions of at most CLAIM_PARTITIONS, the ack in the last. Every offset
    lands and every owner node goes."""
    client = start_client(zk_connect, session_timeout_ms=10000)  # 250 partitions on a loaded machine
    try:
        leader = ActingLeader(zk, "g")
        keeper = Keeper()
        member = GroupMember(client, "g", {"t": 1}, consumer_id="m", listener=keeper).start()
        leader.assign({"m": list(range(250))})
        wait_for(lambda: leader.acked("m"), message="m claimed its partitions")
        wait_for(lambda: len(keeper.committed) == 250, message="m handed its partitions to the listener")
        sent = Sent(client)
        member.commit({TopicPartition("t", p): p for p in range(250)})
        offsets, owners = protocol.offsets_path("g", "t"), protocol.owners_path("g", "t")
        assert sent.counts("SetData", offsets) == [COMMIT_PARTITIONS, 250 - COMMIT_PARTITIONS]
        assert all(zk.get(protocol.offsets_path("g", "t", p))[0] == str(p).encode() for p in range(250))

        sent.transactions.clear()
        leader.assign({"m": []})
        wait_for(lambda: leader.acked("m"), message="m released its partitions")
        assert sent.counts("Delete", owners) == [CLAIM_PARTITIONS, CLAIM_PARTITIONS, 250 - 2 * CLAIM_PARTITIONS]
        releases = sent.with_ops_under(owners)
        assert sent.with_ops_under(protocol.channel_path("g", "m")) == [releases[-1]]
        assert zk.get_children(owners) == []
        assert all(zk.get(protocol.offsets_path("g", "t", p))[0] == str(1000 + p).encode() for p in range(250))
        member.close()
    finally:
        close_client(client)


def test_partitions_claimed_before_a_newer_command_are_handed_to_the_listener(zk, zk_connect):
    """m is given t-0 and t-1 while another session holds t-1: it claims t-0 and waits for t-1.
    A newer command then gives it t-0 alone. m keeps t-0, and its listener is told of it: a
    partition owned and never handed over would never be fetched (found by bin/chaos)."""
    holder, client = start_client(zk_connect, 4000), start_client(zk_connect, 4000)
    try:
        leader = ActingLeader(zk, "g")
        recorder = Recorder()
        member = GroupMember(client, "g", {"t": 1}, consumer_id="m", listener=recorder).start()
        holder.create(protocol.owners_path("g", "t", 1), b"other", ephemeral=True, makepath=True)
        leader.assign({"m": [0, 1]})

        def owner_of_t0():
            stat = zk.exists(protocol.owners_path("g", "t", 0))
            return stat and stat.ephemeralOwner
        wait_for(lambda: owner_of_t0() == client.client_id[0], message="m claimed t-0")
        leader.assign({"m": [0]})
        wait_for(lambda: leader.acked("m"), message="m applied the newer command")
        wait_for(lambda: recorder.owned == {TP}, message="the listener was told of t-0")
        assert set(member.owned()) == {TP}
        member.close()
    finally:
        close_client(client)
        close_client(holder)


def claim_as_another_member(client, group, tp):
    """Claim ``tp`` on ``client``'s session as a member does: its owner node, and its offsets
    znode rewritten at the version just read (the new owner's token)."""
    raw, stat = client.get(protocol.offsets_path(group, tp.topic, tp.partition))
    t = client.transaction()
    t.create(protocol.owners_path(group, tp.topic, tp.partition), b"other", ephemeral=True)
    t.set_data(protocol.offsets_path(group, tp.topic, tp.partition), raw, version=stat.version)
    assert all(not isinstance(r, Exception) for r in t.commit())


def test_a_commit_writes_the_partitions_still_owned_and_names_the_refused_ones(zk, zk_connect):
    """m owns t-0 and t-1; t-1 moves to another member (m's owner node deleted under it, the
    other claims it). A commit of t-0, t-1 and t-2 (never m's) writes t-0 and then raises
    CommitFailedError naming t-1 and t-2; t-1 keeps the new owner's offset. Before, the one
    refused partition kept the whole commit from being written (bin/chaos: a partition's
    progress was never committed because another one of the same commit was refused)."""
    client, other = start_client(zk_connect, 4000), start_client(zk_connect, 4000)
    t0, t1, t2 = (TopicPartition("t", p) for p in range(3))
    try:
        leader = ActingLeader(zk, "g")
        member = GroupMember(client, "g", {"t": 1}, consumer_id="m", listener=Keeper()).start()
        leader.assign({"m": [0, 1]})
        # The ack goes with the claim's transaction; the member records what it holds just after.
        wait_for(lambda: leader.acked("m") and {t0, t1} <= set(member.owned()), message="m claimed its partitions")
        member.commit({t0: 5, t1: 5})
        zk.delete(protocol.owners_path("g", "t", 1))
        claim_as_another_member(other, "g", t1)

        with pytest.raises(CommitFailedError) as refused:
            member.commit({t0: 10, t1: 20, t2: 30})
        assert committed(zk, tp=t0) == b"10" and committed(zk, tp=t1) == b"5"
        assert refused.value.partitions == {t1, t2}
        assert "t-1 was claimed by another member" in str(refused.value)
        assert "t-2 is not owned by this member" in str(refused.value)
        member.close()
    finally:
        close_client(client)
        close_client(other)
