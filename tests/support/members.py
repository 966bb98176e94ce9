"""Group members driven by hand: :class:`ActingLeader` writes commands as the node leading a
shard does, :class:`Sent` records what a member's client sends, :class:`Keeper` is a listener
that keeps what a claim found; the ``consumers`` fixture. Shared by the member's test files
(``tests/consumer/test_member_safety.py``, ``test_claims.py``, ``test_offsets.py``,
``test_channel.py``, ``test_uncertain_commit.py``)."""
from __future__ import annotations

import pytest

from consumer import Consumer, TopicPartition
from consumer.member import MemberListener
from coordinator import protocol

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


class _Answer:
    """A transaction's async answer that records when its ``get`` is called."""

    def __init__(self, answer, on_get):
        self._answer, self._on_get = answer, on_get

    def get(self, *args, **kwargs):
        self._on_get()
        return self._answer.get(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._answer, name)


class Sent:
    """Records what a client sends: the paths it reads, and each transaction it commits as
    [(operation, path)] (paths as the client names them, without its chroot); in ``events``,
    ("commit", i) as transaction i is sent and ("answer", i) as its answer is read.
    ``before_commit(operations)``, if given, runs just before each transaction is sent."""

    def __init__(self, client, before_commit=None):
        self.reads, self.transactions, self.events = [], [], []
        get_async, transaction = client.get_async, client.transaction
        chroot = len(client.chroot or "")

        def get(path, *args, **kwargs):
            self.reads.append(path)
            return get_async(path, *args, **kwargs)

        def recorded():
            t = transaction()
            commit_async = t.commit_async

            def commit():
                if before_commit is not None:
                    before_commit(t.operations)
                i = len(self.transactions)
                self.transactions.append([(type(op).__name__, op.path[chroot:]) for op in t.operations])
                self.events.append(("commit", i))
                return _Answer(commit_async(), lambda: self.events.append(("answer", i)))
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


def claim_as_another_member(client, group, tp):
    """Claim ``tp`` on ``client``'s session as a member does: its owner node, and its offsets
    znode rewritten at the version just read (the new owner's token)."""
    raw, stat = client.get(protocol.offsets_path(group, tp.topic, tp.partition))
    t = client.transaction()
    t.create(protocol.owners_path(group, tp.topic, tp.partition), b"other", ephemeral=True)
    t.set_data(protocol.offsets_path(group, tp.topic, tp.partition), raw, version=stat.version)
    assert all(not isinstance(r, Exception) for r in t.commit())
