"""The claim and release transactions of a member (pure: they build, they do not send).

A member owns a partition once one transaction created its ephemeral
``owners/<topic>/<partition>`` node and rewrote its ``offsets/<topic>/<partition>`` znode
(compare-and-set at the version read just before, or a create where there was none): the
version that write leaves is the partition's **fencing token**, which every later commit of
the member must match (:mod:`consumer.offsets`). It gives a partition up in a transaction that
deletes the owner node together with either the final commit of its offset or a check of its
token, so a member that lost the partition never deletes its new owner's node.

:func:`claim_transactions` and :func:`release_transactions` write those transactions, at most
:data:`CLAIM_PARTITIONS` partitions each (the acks and the registration go with the last),
as lists of :class:`Op`; each op carries its :class:`Role` and partition, so the index of a
failed operation (``TransactionFailed.index``) says what failed: ``part.ops[e.index].role``,
never arithmetic on the order the builder happened to use. :class:`consumer.member.GroupMember`
and the benchmark's light members (``tests/benchmarks/lightmembers.py``) both send these.

Guarantees: the operations of one transaction are in a fixed order (claim: owner nodes, then
offsets znodes, then acks; release: offset writes, then per partition a token check where
nothing is written and the owner node's delete, then the deletes asked for); every partition
of the input is in exactly one transaction. Not provided: sending, retrying, or deciding
which partitions are free (the member does that, with ZooKeeper's answers).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from coordinator import protocol
from consumer.records import TopicPartition

#: A claim creates the owner nodes of at most this many partitions per transaction (and
#: writes as many offsets znodes; a member pipelines them). ZooKeeper runs the writes of all
#: its clients one at a time, so one transaction of thousands of operations holds up
#: every other session's requests, heartbeats included, and costs it more per operation than
#: several small ones (10 members claiming 900 new partitions each: one transaction each, other
#: sessions waited 2-3 s; 100 partitions a transaction, 0.2-0.3 s, and all was claimed sooner).
#: A release deletes as many owner nodes per transaction.
CLAIM_PARTITIONS = 100

#: (data, znode version) of an offsets znode as read; version None: there is none.
Stored = Tuple[bytes, Optional[int]]
#: (partition, data, the version to write at): one fenced offset write.
Write = Tuple[TopicPartition, bytes, int]


class Role(enum.Enum):
    """What one operation of a claim or a release does."""
    OWN = "create the owner node"
    TOKEN = "rewrite the offsets znode (the fencing token)"
    COMMIT = "write an offset at its token"
    CHECK = "check a token"
    COMPLETED = "write the offsets completed above a commit"
    RELEASE = "delete the owner node"
    DELETE = "delete a command or the registration"


@dataclass(frozen=True)
class Op:
    """One operation: ``kind`` is the kazoo transaction method (create, set_data, check,
    delete); ``partition`` None for a DELETE."""
    role: Role
    kind: str
    path: str
    partition: Optional[TopicPartition] = None
    data: bytes = b""
    version: int = -1
    ephemeral: bool = False


@dataclass
class Part:
    """One transaction of a claim or a release."""
    ops: List[Op] = field(default_factory=list)
    #: The partitions it claims (with their stream ids) or releases.
    partitions: Dict[TopicPartition, str] = field(default_factory=dict)
    #: Claim: each partition's token once it applied. Release: unused.
    tokens: Dict[TopicPartition, int] = field(default_factory=dict)
    #: Release: the offset writes in it (for the tokens they leave).
    writes: List[Write] = field(default_factory=list)

    def role(self, index: int) -> Role:
        """The role of the operation at ``index`` (a ``TransactionFailed.index``)."""
        return self.ops[index].role

    def transaction(self, client):
        """A kazoo transaction of ``client`` holding these operations."""
        t = client.transaction()
        add_ops(t, self.ops)
        return t


def add_ops(t, ops: Iterable[Op]) -> None:
    """Add ``ops`` to the kazoo transaction ``t``, in order."""
    for op in ops:
        if op.kind == "create":
            t.create(op.path, op.data, ephemeral=op.ephemeral)
        elif op.kind == "set_data":
            t.set_data(op.path, op.data, version=op.version)
        elif op.kind == "check":
            t.check(op.path, op.version)
        else:
            t.delete(op.path)


def _chunks(items: Sequence, size: int) -> List[list]:
    """``items`` in runs of at most ``size``; one empty run for none (a transaction that only
    deletes, or nothing)."""
    return [list(items[i:i + size]) for i in range(0, len(items), size)] or [[]]


def _deletes(paths: Iterable[str]) -> List[Op]:
    return [Op(Role.DELETE, "delete", path) for path in paths]


def commit_ops(group: str, writes: Iterable[Write]) -> List[Op]:
    """A compare-and-set write of each (partition, data, expected version) of ``writes``."""
    return [Op(Role.COMMIT, "set_data", protocol.offsets_path(group, tp.topic, tp.partition), tp, data, version)
            for tp, data, version in writes]


def completed_ops(group: str, completed: Mapping[TopicPartition, bytes],
                  partitions: Iterable[TopicPartition]) -> List[Op]:
    """The writes of ``completed`` ({partition: encoded Completed}) of ``partitions``, for the
    transaction whose offset writes fence them (the znodes exist: see Holdings)."""
    return [Op(Role.COMPLETED, "set_data", protocol.completed_path(group, tp.topic, tp.partition), tp, completed[tp])
            for tp in partitions if tp in completed]


def claim_transactions(group: str, claim: Mapping[TopicPartition, str], current: Mapping[TopicPartition, Stored],
                       deletes: Sequence[str] = (), per: int = CLAIM_PARTITIONS) -> List[Part]:
    """The transactions that claim ``claim`` ({partition: stream id}), in its order, ``per``
    partitions each: the owner nodes (ephemeral, holding the stream id), then the offsets
    znodes rewritten with the data read at the version read (``current``: {partition: (data,
    version)}, version None: created empty), then, in the last, the deletes of ``deletes``
    (acks). Each part's ``tokens`` are the versions its writes leave. With nothing to claim,
    one part that only deletes (no operation at all if there is nothing to delete)."""
    parts = []
    chunks = _chunks(list(claim), per)
    for k, chunk in enumerate(chunks):
        part = Part(partitions={tp: claim[tp] for tp in chunk})
        for tp in chunk:
            part.ops.append(Op(Role.OWN, "create", protocol.owners_path(group, tp.topic, tp.partition), tp,
                               claim[tp].encode(), ephemeral=True))
        for tp in chunk:
            raw, version = current[tp]
            path = protocol.offsets_path(group, tp.topic, tp.partition)
            if version is None:
                part.ops.append(Op(Role.TOKEN, "create", path, tp, protocol.NO_OFFSET))
                part.tokens[tp] = 0
            else:
                part.ops.append(Op(Role.TOKEN, "set_data", path, tp, raw, version))
                part.tokens[tp] = version + 1
        if k == len(chunks) - 1:
            part.ops += _deletes(deletes)
        parts.append(part)
    return parts


def release_transactions(group: str, tokens: Mapping[TopicPartition, int], writes: Sequence[Write] = (),
                         deletes: Sequence[str] = (), per: int = CLAIM_PARTITIONS) -> List[Part]:
    """The transactions that release the partitions of ``tokens`` ({partition: its token}),
    ``per`` each, committing ``writes`` with them: each transaction's offset writes first
    (those of partitions kept go with the first), then for each partition a check of its
    token where no write of it is in the transaction, and the delete of its owner node; the
    deletes of ``deletes`` (acks, the registration) with the last."""
    by_partition = {w[0]: w for w in writes}
    chunks = _chunks(list(tokens), per)
    parts = []
    for k, chunk in enumerate(chunks):
        part = Part(partitions={tp: "" for tp in chunk})
        part.writes = [by_partition[tp] for tp in chunk if tp in by_partition]
        if k == 0:  # offsets of partitions kept are written with the first
            part.writes = [w for w in writes if w[0] not in tokens] + part.writes
        part.ops = commit_ops(group, part.writes)
        for tp in chunk:
            if tp not in by_partition:
                part.ops.append(Op(Role.CHECK, "check", protocol.offsets_path(group, tp.topic, tp.partition), tp,
                                   version=tokens[tp]))
            part.ops.append(Op(Role.RELEASE, "delete", protocol.owners_path(group, tp.topic, tp.partition), tp))
        if k == len(chunks) - 1:
            part.ops += _deletes(deletes)
        parts.append(part)
    return parts


def release_one(group: str, tp: TopicPartition, token: int) -> List[Op]:
    """Release ``tp`` alone: its token checked, its owner node deleted."""
    return release_transactions(group, {tp: token})[0].ops


def partition_numbers(names) -> Set[int]:
    """The partition numbers among the child names of an owners/ or offsets/ directory
    (anything else found there is no partition of ours)."""
    return {int(n) for n in names if n.isascii() and n.isdigit()}
