"""Committed offsets: the one reader of offsets znodes with their versions, a member's fenced
commits, and the commits of a reader outside the group.

* :func:`read_offsets` (and its pipelined halves :func:`read_offsets_async` and
  :func:`offsets_answers`) reads ``offsets/<topic>/<partition>`` znodes as (data, version),
  version None where there is none. The member reads its tokens with it, ``groupctl groups
  reset-offsets`` its compare-and-set versions (:mod:`consumer.cli.reset`), and
  :func:`commit_unowned` the versions that fence it.
* :class:`Holdings` is what a :class:`~consumer.member.GroupMember` holds — its partitions,
  the session that holds their owner nodes, their fencing tokens, the writes that got no
  answer — and the commits those tokens fence.
* :func:`commit_unowned` commits for a reader that is not a member (a Spark query).

Guarantees
----------
* **Fencing token.** Claiming a partition rewrites its offsets znode in the same transaction
  that creates its owner node (:mod:`consumer.ownership`); the member remembers the version
  that write leaves. Every commit is a ``set_data`` at exactly that version. So once another
  member has claimed the partition, no commit of this one can land, whatever it was doing
  (paused, cut off, late), and the new owner starts from the last offset committed before its
  claim. Each partition has its own token: a commit writes the partitions still held and
  refuses the others by name. A write whose answer was lost is checked before the partition
  is written again (:meth:`Holdings.settle_uncertain`): the token is dropped only on proof
  that the partition was lost.
* **Bounded writes.** A commit of many partitions is written in transactions of at most
  :data:`COMMIT_PARTITIONS`, one after the other, each fenced as above.
* Readers outside the group commit through :func:`commit_unowned`: only forward, only where no
  live member owns the partition, and compare-and-set on the same znode, so a claim in between
  wins.

Threads: any thread may call :meth:`Holdings.commit`; ``Holdings.commit_lock`` makes whole
commits (read a token, write, record the new token) one at a time, so two writes never race
with one token. ``Holdings.lock`` guards ``owned``, ``session``, ``tokens``, ``uncertain`` (and
the member's lease). Lock order: ``commit_lock`` before ``lock``; no ZooKeeper call under ``lock``.
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, Iterable, List, Optional, Set, Tuple

from kazoo.exceptions import NoNodeError

from coordinator import protocol
from coordinator.errors import CommitFailedError, CorruptZnode, ZooKeeperUnavailable
from coordinator.zkclient import UNREACHABLE, TransactionFailed, commit, session_id, wait_in_order
from consumer.ownership import CLAIM_PARTITIONS, Role, Stored, Write, add_ops, commit_ops, completed_ops
from consumer.records import TopicPartition

log = logging.getLogger("zkgroups.member")

#: A commit writes the offsets of at most this many partitions per transaction.
COMMIT_PARTITIONS = 2 * CLAIM_PARTITIONS

#: Why a commit of a partition is refused (:func:`refusal` fills in the verb).
CLAIMED_SINCE = "{was} claimed by another member after this one"
NOT_OWNED = "{is} not owned by this member"
HOLD_LOST = "{is} no longer held by this member (its owner node was deleted or taken over)"
SESSION_ENDED = "{was} owned by a ZooKeeper session that ended"
#: A refusal names at most this many partitions per reason.
REFUSALS_NAMED = 10


def refusal(refused: Dict[TopicPartition, str], written: int = 0) -> CommitFailedError:
    """The CommitFailedError for ``refused`` ({partition: one of the reasons above}); ``written``:
    how many partitions of the same commit were written."""
    reasons = []
    for why in sorted(set(refused.values())):
        partitions = sorted(tp for tp, w in refused.items() if w == why)
        names = ", ".join(str(tp) for tp in partitions[:REFUSALS_NAMED])
        if len(partitions) > REFUSALS_NAMED:
            names += f" and {len(partitions) - REFUSALS_NAMED} more"
        one = len(partitions) == 1
        reasons.append(f"{names} " + why.format(was="was" if one else "were", **{"is": "is" if one else "are"}))
    others = f" ({written} other partition{'s' if written != 1 else ''} committed)" if written else ""
    return CommitFailedError(f"commit refused: {'; '.join(reasons)}{others}", refused)


# ---------------------------------------------------------------- the one reader

def read_offsets_async(client, group: str, partitions: Iterable[TopicPartition]):
    """Send the reads of ``partitions``' offsets znodes: [(partition, its async get)]."""
    return [(tp, client.get_async(protocol.offsets_path(group, tp.topic, tp.partition))) for tp in partitions]


def offsets_answers(gets) -> Dict[TopicPartition, Stored]:
    """{partition: (data, version)} from :func:`read_offsets_async`'s reads; (``NO_OFFSET``,
    None) where there is no znode. Other errors are raised."""
    out = {}
    for tp, a in gets:
        try:
            raw, stat = a.get()
            out[tp] = (raw, stat.version)
        except NoNodeError:
            out[tp] = (protocol.NO_OFFSET, None)
    return out


def read_offsets(client, group: str, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, Stored]:
    """{partition: (data, znode version)} of the offsets znodes (pipelined); version None when absent."""
    gets = read_offsets_async(client, group, partitions)
    wait_in_order([a for _, a in gets])
    return offsets_answers(gets)


def decode_stored(group: str, tp: TopicPartition, raw: bytes) -> Optional[int]:
    """The offset in ``raw`` (None: nothing committed); CorruptZnode if it is not one."""
    return protocol.decode_offset(raw, protocol.offsets_path(group, tp.topic, tp.partition))


def read_completed(client, group: str,
                   committed: Dict[TopicPartition, Optional[int]]) -> Dict[TopicPartition, Set[int]]:
    """{partition: offsets completed above its committed offset} from the completed znodes
    (pipelined). A record counts only while its base is the committed offset now: a commit
    that wrote the offset alone (a plain consumer, a reset) makes it stale. A corrupt one is
    logged and read as empty (the records are processed again)."""
    gets = [(tp, client.get_async(protocol.completed_path(group, tp.topic, tp.partition))) for tp in committed]
    wait_in_order([a for _, a in gets])
    out: Dict[TopicPartition, Set[int]] = {}
    for tp, a in gets:
        try:
            found = protocol.decode_completed(a.get()[0], protocol.completed_path(group, tp.topic, tp.partition))
        except NoNodeError:
            found = None
        except CorruptZnode as e:
            log.error("%s; processing those records again", e)
            found = None
        out[tp] = set(found[1]) if found is not None and found[0] == committed[tp] else set()
    return out


# ---------------------------------------------------------------- a member's fenced commits

class Holdings:
    """What a member holds — ``owned`` ({partition: stream id}), ``session`` (the session that
    holds their owner nodes), ``tokens`` (each partition's offsets znode version after this
    member's last write), ``uncertain`` ((data, version) of a write that got no answer) — and
    the commits those tokens fence. Threads and locks: see the module docstring."""

    def __init__(self, client, group: str, name: str, timeout_s: float, connected: threading.Event):
        self.client, self.group, self._name = client, group, name
        self._timeout_s = timeout_s
        self._connected = connected  # cleared while the connection is suspended
        self.lock = threading.Lock()
        self.commit_lock = threading.Lock()
        self.owned: Dict[TopicPartition, str] = {}
        self.session: Optional[int] = None
        self.tokens: Dict[TopicPartition, int] = {}
        self.uncertain: Dict[TopicPartition, Tuple[bytes, int]] = {}
        self._completed_znodes: Set[TopicPartition] = set()  # known to exist (commit_lock)

    def owned_now(self) -> Dict[TopicPartition, str]:
        with self.lock:
            return dict(self.owned)

    def tokens_of(self, partitions) -> Dict[TopicPartition, int]:
        """The tokens of ``partitions`` that this member still holds (a partition whose token
        was found taken over is left to its new owner)."""
        with self.lock:
            return {tp: self.tokens[tp] for tp in partitions if tp in self.tokens}

    def add_locked(self, claimed: Dict[TopicPartition, str], tokens: Dict[TopicPartition, int]) -> None:
        """Own ``claimed`` with their ``tokens`` (caller holds ``lock``)."""
        for tp, stream in claimed.items():
            self.owned[tp] = stream
            self.tokens[tp] = tokens[tp]

    def forget(self, partitions: Set[TopicPartition]) -> None:
        """No longer own ``partitions`` (their owner nodes were released)."""
        with self.lock:
            for tp in partitions:
                self.owned.pop(tp, None)
                self.tokens.pop(tp, None)
                self.uncertain.pop(tp, None)

    def forget_all_locked(self) -> None:
        self.owned.clear()
        self.tokens.clear()
        self.uncertain.clear()
        self.session = None

    def decode_committed(self, tp: TopicPartition, raw: bytes) -> Optional[int]:
        try:
            return decode_stored(self.group, tp, raw)
        except CorruptZnode as e:
            log.error("member %s: %s; treating it as no committed offset", self._name, e)
            return None

    def committed(self, tp: TopicPartition) -> Optional[int]:
        """The group's committed offset of ``tp`` (None: none yet)."""
        path = protocol.offsets_path(self.group, tp.topic, tp.partition)
        if not self._connected.is_set():
            raise ZooKeeperUnavailable(f"cannot read the committed offset of {tp}: not connected to ZooKeeper")
        try:
            raw, _ = self.client.get_async(path).get(timeout=self._timeout_s)
        except NoNodeError:
            return None
        except UNREACHABLE as e:
            raise ZooKeeperUnavailable(f"cannot read the committed offset of {tp}: {type(e).__name__}") from None
        return self.decode_committed(tp, raw)

    def commit(self, offsets: Dict[TopicPartition, int],
               completed: Optional[Dict[TopicPartition, bytes]] = None) -> None:
        """See :meth:`consumer.member.GroupMember.commit`."""
        if offsets:
            with self.commit_lock:
                self.commit_locked(offsets, completed or {})

    def _ensure_completed(self, partitions: Iterable[TopicPartition]) -> None:
        """Create the completed znodes of ``partitions`` that may not exist (empty: nothing
        recorded; harmless outside the fence), so the fenced transaction only sets them."""
        for tp in partitions:
            if tp not in self._completed_znodes:
                self.client.ensure_path(protocol.completed_path(self.group, tp.topic, tp.partition))
                self._completed_znodes.add(tp)

    def commit_locked(self, offsets: Dict[TopicPartition, int],
                      completed: Optional[Dict[TopicPartition, bytes]] = None) -> None:
        """Write ``offsets`` in transactions of at most :data:`COMMIT_PARTITIONS`, one after
        the other (see :data:`~consumer.ownership.CLAIM_PARTITIONS` for why). A transaction
        refused for one partition applied nothing: it is sent again without that partition. A
        lost answer stops there: the parts before it are written, and each partition holds
        either its new offset or the one before, as always. Caller holds ``commit_lock``."""
        writes, refused = self.fenced_offsets(offsets)
        completed = completed or {}
        written = 0
        for i in range(0, len(writes), COMMIT_PARTITIONS):
            part = writes[i:i + COMMIT_PARTITIONS]
            while part:
                # A partition's completed offsets go in the transaction its offset write fences.
                self._ensure_completed(w[0] for w in part if w[0] in completed)
                ops = commit_ops(self.group, part) + completed_ops(self.group, completed, (w[0] for w in part))
                t = self.client.transaction()
                add_ops(t, ops)
                try:
                    commit(t, timeout=self._timeout_s)
                except TransactionFailed as e:
                    if ops[e.index].role is Role.COMPLETED:  # deleted meanwhile: created again, sent again
                        self._completed_znodes.discard(ops[e.index].partition)
                        continue
                    refused[ops[e.index].partition] = CLAIMED_SINCE
                    part = part[:e.index] + part[e.index + 1:]
                    continue
                except UNREACHABLE as e:  # no answer: the write may or may not have applied
                    with self.lock:
                        for tp, data, version in part:
                            self.uncertain[tp] = (data, version)
                    raise ZooKeeperUnavailable(f"commit failed: {type(e).__name__}") from None
                self.written(part)
                written += len(part)
                break
        if refused:
            raise refusal(refused, written)

    def fenced_offsets(self, offsets: Dict[TopicPartition, int]) -> Tuple[List[Write], Dict[TopicPartition, str]]:
        """([(tp, data, the version to write at)], {tp: why it is refused}): the writes of those
        of ``offsets`` this member may commit, and the others. ZooKeeperUnavailable: nothing
        may be written now. Caller holds ``commit_lock``."""
        if not offsets:
            return [], {}
        sid = session_id(self.client)
        if sid is None or not self._connected.is_set():
            raise ZooKeeperUnavailable("commit failed: not connected to ZooKeeper")
        with self.lock:
            owned_session = self.session
        if owned_session is not None and owned_session != sid:
            return [], {tp: SESSION_ENDED for tp in offsets}
        try:
            self.settle_uncertain(set(offsets))
        except UNREACHABLE as e:  # unsettled writes stay uncertain until a check is answered
            raise ZooKeeperUnavailable(f"commit failed: {type(e).__name__} (checking an unanswered write)") from None
        writes, refused = [], {}
        with self.lock:
            for tp, offset in offsets.items():
                if tp in self.owned and tp in self.tokens:
                    writes.append((tp, protocol.encode_offset(offset), self.tokens[tp]))
                else:
                    refused[tp] = HOLD_LOST if tp in self.owned else NOT_OWNED
        return writes, refused

    def settle_uncertain(self, partitions: Set[TopicPartition]) -> None:
        """Find out what became of writes that got no answer, and so what the tokens of their
        partitions are: ``_read_holds`` tells. While this session's owner node of a
        partition stands, no one else has written its offsets znode since this member claimed
        it (another claim needs that node gone; a reader's commit or a reset, no owner at all),
        so the znode's version is the result of this member's own writes, whichever applied:
        the token. Only an owner node gone, or another session's, proves the partition lost:
        then the token is dropped. A version older than the write's (a server behind, which a
        sync rules out) settles nothing: the write stays uncertain."""
        with self.lock:
            partitions = set(partitions) & set(self.uncertain)
            session = self.session
        if not partitions:
            return
        found = self._read_holds(partitions)
        with self.lock:
            for tp, (version, holder) in found.items():
                if tp not in self.uncertain:
                    continue  # forgotten meanwhile
                _, expected = self.uncertain[tp]
                if holder is not None and holder == session and version is not None:
                    if version < expected:
                        continue
                    if tp in self.tokens:
                        self.tokens[tp] = version
                else:
                    self.tokens.pop(tp, None)  # the hold ended: lost
                del self.uncertain[tp]

    def _read_holds(self, partitions) -> Dict[TopicPartition, Tuple[Optional[int], Optional[int]]]:
        """{tp: (its offsets znode's version, None if there is none; the session holding its
        owner node, None if there is none)}, in one round trip: a sync first, so the server
        answering is as new as ZooKeeper's leader was then (a session reconnected after a lost
        answer may be on a server that has not applied that write yet: it is only as new as
        what the session saw), then the offsets znodes, then the owner nodes."""
        synced = self.client.sync_async(protocol.offsets_path(self.group))
        versions = read_offsets_async(self.client, self.group, partitions)
        owners = [(tp, self.client.exists_async(protocol.owners_path(self.group, tp.topic, tp.partition)))
                  for tp in partitions]
        wait_in_order([synced] + [a for _, a in versions + owners])
        synced.get()
        read = offsets_answers(versions)
        found = {}
        for tp, a in owners:
            stat = a.get()
            found[tp] = (read[tp][1], stat.ephemeralOwner if stat is not None else None)
        return found

    def written(self, writes: Iterable[Write]) -> None:
        """Record the tokens ``writes`` (applied) left."""
        with self.lock:
            for tp, _, version in writes:
                if tp in self.tokens:
                    self.tokens[tp] = version + 1


# ---------------------------------------------------------------- commits of an outside reader

#: How often :func:`commit_unowned` re-reads and retries after another writer got in between.
UNOWNED_COMMIT_ATTEMPTS = 3


def commit_unowned(client, group: str, offsets: Dict[TopicPartition, int]) -> Dict[TopicPartition, str]:
    """Commit ``offsets`` to ``group`` for a reader that is not a member of it (a Spark query
    reading the group's topics); returns {partition: why it was not written} for the refused ones.

    A partition is written only while no live member owns it (no owner node) and only forward:
    an offset at or past ``offsets[tp]`` is left as it is (not a refusal). Every write is a
    compare-and-set on the offsets znode's version read *before* the owner node was found
    absent (or a create where there was none); a member's claim rewrites that znode in the same
    transaction that creates its owner node, so a claim in between makes the write fail instead
    of landing under the new owner. Writes go in one transaction; one that another writer got
    in first is read again and retried, at most :data:`UNOWNED_COMMIT_ATTEMPTS` times.
    ZooKeeper errors (unreachable, ``NoAuthError``) are raised."""
    refused: Dict[TopicPartition, str] = {}
    pending = dict(offsets)
    for _ in range(UNOWNED_COMMIT_ATTEMPTS):
        reads = read_offsets_async(client, group, pending)  # first: the version that fences
        owners = {tp: client.exists_async(protocol.owners_path(group, tp.topic, tp.partition)) for tp in pending}
        stored = offsets_answers(reads)
        t, order = client.transaction(), []
        for tp, target in sorted(pending.items()):
            if owners[tp].get() is not None:
                refused[tp] = "a live member of the group owns it"
                continue
            raw, version = stored[tp]
            try:
                current = None if version is None else decode_stored(group, tp, raw)
            except CorruptZnode:
                current = None  # overwritten, as a reset does
            if current is not None and current >= target:
                continue
            path = protocol.offsets_path(group, tp.topic, tp.partition)
            if version is None:
                client.ensure_path(protocol.offsets_path(group, tp.topic))
                t.create(path, protocol.encode_offset(target))
            else:
                t.set_data(path, protocol.encode_offset(target), version=version)
            order.append(tp)
        if not order:
            return refused
        try:
            commit(t)
            return refused
        except TransactionFailed as e:
            pending = {tp: pending[tp] for tp in order}  # the others need nothing more
            log.info("commit to group %s: %s changed meanwhile; reading it again", group, order[e.index])
    for tp in pending:
        refused[tp] = "its committed offset kept changing (a member claimed it, or another writer)"
    return refused
