"""How a member claims and releases partitions: the ZooKeeper side of its ownership
(:mod:`consumer.ownership` builds the transactions; :class:`~consumer.offsets.Holdings` records
what they leave).

A claim looks at which partitions are still held and at their offsets znodes, in one round
trip, claims the free ones (owner nodes and fencing tokens,
:data:`~consumer.ownership.CLAIM_PARTITIONS` a transaction), waits for the others to be
released (a watch on their owners directories) and gives way to a newer decision. A release
commits the final offsets and deletes the owner nodes in the same transactions, or piece by
piece when that cannot apply. A partition just claimed that the member's listener cannot
serve is released at once, nothing committed, and again until its release goes through
(``release_unserved``).

Threads: the member thread only (the watches it sets are kazoo's: they only record).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

from kazoo.exceptions import NoNodeError

from coordinator import protocol
from coordinator.errors import CommitFailedError, ZooKeeperUnavailable
from coordinator.zkclient import UNREACHABLE, TransactionFailed, commit, transaction_results, wait_in_order
from consumer.lease import Lease
from consumer.offsets import Holdings, offsets_answers, read_offsets, read_offsets_async, refusal
from consumer.ownership import Part, Role, add_ops, claim_transactions, partition_numbers, release_one, \
    release_transactions
from consumer.records import TopicPartition

log = logging.getLogger("zkgroups.member")


def _children(pending) -> List[str]:
    """A get_children answer; [] if the directory is gone (it is made before a claim: gone
    means nothing is held, no offsets znode exists)."""
    try:
        return pending.get()
    except NoNodeError:
        return []


class Claims:
    """The claims and releases of member ``name`` in ``group``, recorded in ``holdings`` (and
    ``lease``: a claim proves the session alive)."""

    def __init__(self, client, group: str, name: str, holdings: Holdings, lease: Lease, session_timeout_s: float):
        self.client, self.group, self._name = client, group, name
        self._holdings, self._lease, self._session_timeout_s = holdings, lease, session_timeout_s
        # Per topic: the partitions whose offsets znodes the last listing of offsets/<topic>
        # showed (and the ones this member created since). A claim reads the offsets znodes
        # of these with its listings; a new partition has none to read.
        self.offsets_listed: Dict[str, Set[int]] = {}
        self._unserved: Set[TopicPartition] = set()   # claimed, refused by the listener, release pending

    def claim(self, added: Dict[TopicPartition, str], acks: List[str], session: int,
              committed: Dict[TopicPartition, Optional[int]], superseded: Callable[[List[str]], bool]) -> bool:
        """Claim ``added`` on ``session`` and delete ``acks``; True once done, False if
        ``superseded(acks)`` said a newer decision or a shutdown waits. ``committed`` gets the
        committed offset of each partition as soon as it is claimed (also when the claim is
        interrupted or fails later). The member made the directories of their topics.

        Each round looks at which of the partitions are still held (a listing of
        owners/<topic> per topic, whose watch wakes us when an owner node goes) and at their
        offsets znodes (after the listing, so a partition released before it has its final
        commit in them: see ``_look_at``), in one round trip; then it claims those that are
        free, :data:`~consumer.ownership.CLAIM_PARTITIONS` a transaction: each creates the owner
        nodes of its partitions and rewrites their offsets znodes at the versions just read, or
        creates the ones that do not exist (the fencing token). They go out pipelined, in one
        round trip, but for the one that claims the last of them and deletes the acks: it goes
        once all the others applied."""
        waiting = dict(added)
        released = threading.Event()

        def watch(_event):
            released.set()  # kazoo's thread: record only

        while True:
            released.clear()
            held, current = self._look_at(waiting, watch)
            free = [tp for tp in waiting if tp not in held]
            last = len(free) == len(waiting)  # also when there is nothing to claim: just ack
            if free or last:
                parts = claim_transactions(self.group, {tp: waiting[tp] for tp in free}, current,
                                           acks if last else [])
                # Independent transactions go out together; the one carrying the acks only
                # once all the others applied (an ack says every partition is claimed).
                together, after = (parts[:-1], parts[-1:]) if last else (parts, [])
                failed = (self._claim_parts(together, current, session, committed, waiting)
                          or self._claim_parts(after, current, session, committed, waiting))
                if failed is None:
                    if last:
                        return True
                    continue  # claim the others as they are released
                part, e = failed
                if isinstance(e.error, NoNodeError) and part.role(e.index) is Role.DELETE:  # an ack already gone
                    acks = [p for p in acks if self.client.exists(p)]
                # else an owner node was taken or an offset written since we looked: look again
            if superseded(acks):
                return False
            if not free and not released.wait(0.25):
                self._adopt_own(waiting, session, committed)  # quiet for a while: is one of them ours?

    def _claim_parts(self, parts: List[Part], current, session: int, committed: Dict[TopicPartition, Optional[int]],
                     waiting: Dict[TopicPartition, str]) -> Optional[Tuple[Part, TransactionFailed]]:
        """Send claim transactions (:func:`~consumer.ownership.claim_transactions`: the owner
        nodes, the offsets znodes at the versions in ``current``, the acks of the last)
        pipelined, in one round trip; record the partitions of each that applied as owned and
        no longer ``waiting``. The first that could not apply (nothing of it did) and its
        failure, or None. Any other error (an answer lost, a refusal such as NoAuth) is raised
        once those that applied are recorded."""
        sent = time.monotonic()
        answers = [(part, part.transaction(self.client).commit_async() if part.ops else None) for part in parts]
        wait_in_order([a for _, a in answers if a is not None])
        failed, error = None, None
        for part, answer in answers:
            try:
                if answer is not None:
                    transaction_results(answer.get())
            except TransactionFailed as e:
                failed = failed or (part, e)
                continue
            except UNREACHABLE as e:
                error = error or e
                continue
            for tp in part.partitions:
                self.offsets_listed.setdefault(tp.topic, set()).add(tp.partition)
                del waiting[tp]
            self._record_claim(part.partitions, {tp: current[tp] for tp in part.partitions}, part.tokens, session,
                               sent, committed)
        if error is not None:
            raise error
        return failed

    def _look_at(self, waiting: Dict[TopicPartition, str], watch):
        """Which of ``waiting`` hold an owner node (listings of owners/<topic> watched by
        ``watch``), and {partition: (data, version)} of their offsets znodes, version None
        where there is none: all read after the owner listings.

        One pipelined round trip: the owner listings, a listing of offsets/<topic> and reads of
        the offsets znodes the last listing showed. A partition that has none (new in a topic
        that grew: most of a growth's) costs no read; the claim creates its znode, and fails if
        it appeared since. Only znodes made since the last listing are read in a second round
        trip."""
        topics = sorted({tp.topic for tp in waiting})
        owners = [(t, self.client.get_children_async(protocol.owners_path(self.group, t), watch=watch)) for t in topics]
        offsets_dirs = [(t, self.client.get_children_async(protocol.offsets_path(self.group, t))) for t in topics]
        known = [tp for tp in waiting if tp.partition in self.offsets_listed.get(tp.topic, ())]
        reads = read_offsets_async(self.client, self.group, known)
        wait_in_order([a for _, a in owners + offsets_dirs] + [a for _, a in reads])
        held = {TopicPartition(t, p) for t, a in owners for p in partition_numbers(_children(a))}
        for topic, a in offsets_dirs:
            self.offsets_listed[topic] = partition_numbers(_children(a))
        current = {tp: (protocol.NO_OFFSET, None) for tp in waiting}
        current.update(offsets_answers(reads))
        read = set(known)
        missed = [tp for tp in waiting if tp not in read and tp.partition in self.offsets_listed[tp.topic]]
        if missed:
            current.update(read_offsets(self.client, self.group, missed))
        return held, current

    def _record_claim(self, claimed: Dict[TopicPartition, str], offsets, tokens: Dict[TopicPartition, int],
                      session: int, sent: float, committed: Dict[TopicPartition, Optional[int]]) -> None:
        """Record partitions this session now owns, with their tokens and committed offsets."""
        for tp, (raw, _) in offsets.items():
            committed[tp] = self._holdings.decode_committed(tp, raw)
        with self._holdings.lock:
            self._holdings.add_locked(claimed, tokens)
            if claimed:
                self._lease.proved_locked(session, sent)  # the claim proved the session

    def _adopt_own(self, waiting: Dict[TopicPartition, str], session: int,
                   committed: Dict[TopicPartition, Optional[int]]) -> None:
        """Take over owner nodes this session holds but did not know of (a claim whose answer
        was lost to a connection error): without this we would wait for ourselves. That claim
        rewrote the offsets znode too, so its current version is our token."""
        sent = time.monotonic()
        checks = [(tp, self.client.exists_async(protocol.owners_path(self.group, tp.topic, tp.partition)))
                  for tp in waiting]
        mine = {}
        for tp, a in checks:
            stat = a.get()
            if stat is not None and stat.ephemeralOwner == session:
                mine[tp] = waiting[tp]
        if not mine:
            return
        offsets = read_offsets(self.client, self.group, mine)
        tokens = {}
        for tp, (raw, version) in offsets.items():
            if version is None:  # cannot happen after our own claim; recreate the token anyway
                self.client.create(protocol.offsets_path(self.group, tp.topic, tp.partition), protocol.NO_OFFSET)
                version = 0
            tokens[tp] = version
            del waiting[tp]
        self._record_claim(mine, offsets, tokens, session, sent, committed)

    def release(self, offsets: Dict[TopicPartition, int], release: Set[TopicPartition], deletes: List[str],
                what: str) -> None:
        """Commit ``offsets`` (fenced), release the owner nodes of ``release`` and delete
        ``deletes`` (acks, the registration): one transaction, or one per
        :data:`~consumer.ownership.CLAIM_PARTITIONS` released partitions, one after the other,
        ``deletes`` in the last. A partition's owner node is deleted in the transaction that writes its offset, or
        together with a check of its token, so a member that lost a partition never deletes its
        new owner's node. If a transaction cannot apply, the commit of what is left is tried
        alone and the rest is done piece by piece: nothing stays held because one part failed."""
        h = self._holdings
        with h.commit_lock:
            h.settle_uncertain(set(offsets) | set(release))
            try:
                writes, refused = h.fenced_offsets(offsets)
            except ZooKeeperUnavailable as e:
                log.warning("member %s: %s without committing: %s", self._name, what, e)
                writes, refused = [], {}
            if refused:
                log.warning("member %s: %s: %s", self._name, what, refusal(refused))
            done: Set[TopicPartition] = set()   # released, or written, by a transaction that applied
            for part in release_transactions(self.group, h.tokens_of(release), writes, deletes):
                try:
                    if part.ops:
                        commit(part.transaction(self.client), timeout=self._session_timeout_s)
                    h.written(part.writes)
                    done |= set(part.partitions) | {tp for tp, _, _ in part.writes}
                except TransactionFailed as e:
                    failed = "a commit was refused" if part.role(e.index) is Role.COMMIT else \
                        "a node was gone or a partition was claimed"
                    break
            else:
                return
            log.info("member %s: %s did not apply atomically (%s); going on step by step", self._name,
                     what, failed)
            left = {tp: offset for tp, offset in offsets.items() if tp not in done and tp not in refused}
            if writes and left:
                try:
                    h.commit_locked(left)
                except (CommitFailedError, ZooKeeperUnavailable) as e:
                    log.warning("member %s: %s: %s", self._name, what, e)
            pending = []
            for tp, token in h.tokens_of(set(release) - done).items():
                t = self.client.transaction()
                add_ops(t, release_one(self.group, tp, token))
                pending.append(t.commit_async())
            pending += [self.client.delete_async(path) for path in deletes]
            for a in pending:  # what is gone, or no longer ours, is left alone
                try:
                    a.get(timeout=self._session_timeout_s)
                except UNREACHABLE:
                    pass

    @property
    def unserved(self) -> Set[TopicPartition]:
        """Partitions claimed that the listener refused, whose release has not gone through yet."""
        return self._unserved

    def release_unserved(self, partitions: Set[TopicPartition] = frozenset(), why: str = "") -> None:
        """Give up partitions just claimed that the listener cannot serve, nothing committed
        (with none given: retry those whose release did not go through). They stay owned until
        their release went through, so a stop-fetcher for them still releases them, and none is
        left held by this session unknown to it; a ZooKeeper error is retried by the member
        thread (the next channel read, or housekeeping).

        Released rather than kept (parked, as a failed fetch is): a partition kept would stay
        owned by a member that cannot read it, and neither the coordinator nor any other member
        could tell. Released, its owner node is gone, so the coordinator's next check
        (``check_interval_ms``; verification records the owner nodes) finds it not owned and
        gives it out again: once the cause is gone (permissions restored, the broker back) it is
        consumed, and until then every attempt is reported again. Reporting the partition to the
        coordinator instead, so that it could place it on another member, would need a new kind
        of znode and assignors that honour it, for a cause (a shared disk's permissions, a
        cluster's reachability) that most often strikes every member alike."""
        if partitions:
            log.info("member %s: releasing %s, which it cannot serve (%s); the coordinator assigns %s again at "
                     "its next check", self._name, ", ".join(str(tp) for tp in sorted(partitions)), why,
                     "it" if len(partitions) == 1 else "them")
            self._unserved |= partitions
        pending = self._unserved & set(self._holdings.owned_now())  # revoked or lost since: released already
        self._unserved = pending
        if pending:
            self.release({}, pending, [], "releasing partitions it cannot serve")
            self._holdings.forget(pending)
            self._unserved -= pending

    def delete_all(self, paths: List[str]) -> None:
        """Delete ``paths`` (pipelined); ones already gone or failing are left to the session end."""
        pending = [self.client.delete_async(path) for path in paths]
        for a in pending:
            try:
                a.get(timeout=self._session_timeout_s)
            except UNREACHABLE:
                pass
