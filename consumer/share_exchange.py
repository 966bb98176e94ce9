"""A share member's one write per partition: its acknowledgements, its next acquisition and the
dead letters it takes on, in one compare-and-set of the share-partition's znode.

The rules of the state are :mod:`coordinator.share_partition`'s; this module reads the znode,
applies them, reads the records the state names from the data plane, and writes the state back
at the version it read (a write that lost the race is made again on what the winner wrote).
Nothing is written when nothing changed, so an idle member only reads.

Dead letters (:meth:`ShareExchange.write_letters`): a member that finds archived records waiting for the
group's dead-letter topic claims some (in the same write), appends them to the topic with the
original topic, partition, offset, delivery count and reason in headers, and marks them
written. A claim that expired (its writer died or paused past the lock) is taken over by the
next member, which first looks in the topic for the letters already there, from the offset the
first claim recorded, and a writer looks once more that its claim is still held just before it
appends: so each archived record is written once. The one schedule left that writes a second
copy (found by the model checker, tests/model/share_protocol.py): a writer paused past the lock
*between that last look and its append*, while the next writer scans and appends; the headers
tell the copies apart.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from kazoo.exceptions import (BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError, OperationTimeoutError,
                               RolledBackError, SessionExpiredError)

from coordinator import share_partition as rules
from coordinator.errors import OffsetOutOfRange, ZooKeeperUnavailable
from coordinator.protocol.share import (DEAD_LETTER, REASONS, ShareGroupConfig, SharePartitionState,
                                        share_members_path, share_partitions_path)
from consumer.records import ShareRecord, TopicPartition

log = logging.getLogger("zkgroups.share")

#: Compare-and-set attempts of one write before it waits for the next poll (others won them all).
CAS_TRIES = 25
#: What ZooKeeper raises while the connection is away (or the session was just replaced).
CONNECTION_ERRORS = (ConnectionLoss, OperationTimeoutError, SessionExpiredError)
#: How long a write waits for a lost connection to come back before it gives up (ZooKeeperUnavailable).
RECONNECT_WAIT_S = 30.0
#: Dead letters one write claims at most.
DEAD_LETTER_BATCH = 500
#: The headers a dead letter carries (beside the record's own).
DLQ_HEADERS = ("zkgroups.dlq.group", "zkgroups.dlq.topic", "zkgroups.dlq.partition", "zkgroups.dlq.offset",
               "zkgroups.dlq.delivery.count", "zkgroups.dlq.reason")

#: (first, last, type, delay ms) of one token's records.
Ack = Tuple[int, int, rules.AcknowledgeType, int]


@dataclass
class Outcome:
    """What one write did: whether it was made, the records acquired (with their token), the
    offsets whose acknowledgement was refused, the dead letters claimed."""
    written: bool = False
    token: int = 0
    records: List[ShareRecord] = field(default_factory=list)
    refused: List[Tuple[int, int]] = field(default_factory=list)
    letters: Tuple[int, list] = (0, [])
    dlq_scan: int = -1       # where a writer of the claimed letters looks for those already written


class ShareExchange:
    """The reads and writes of one member's share-partitions (one thread: the consumer's)."""

    def __init__(self, client, plane, group: str, member_id: str, config: Callable[[], ShareGroupConfig]):
        self.client, self.plane, self.group, self.member_id = client, plane, group, member_id
        self.config = config
        self.writes = 0          # znode writes made (the cost the docs give per 1,000 records)
        self.conflicts = 0       # writes that lost the race and were made again
        self._missing_said: Set[str] = set()   # dead-letter topics said to be missing
        # The state this member wrote last, per partition, at the version its write made: the
        # next write starts from it without a read (if someone wrote since, that write fails
        # on the version, and the state is read).
        self._written: Dict[TopicPartition, Tuple[SharePartitionState, int]] = {}
        self._sequence = 0       # numbers this member's writes (their ids)
        self._registration = share_members_path(group, member_id)
        # Set when a write found this member's registration gone (its session ended, or it was
        # removed): it must register again before it writes (ShareConsumer does, and clears it).
        self.unregistered = False

    def exchange(self, tp: TopicPartition, acks: Dict[int, List[Ack]], want: int,
                 undelivered: Sequence[Tuple[int, int, int]] = ()) -> Outcome:
        """Apply ``acks`` ({token: acks}), give back ``undelivered`` ((token, first, last) never
        handed to the application), acquire up to ``want`` records and claim pending dead
        letters, in one write. ``written`` False: the state could not be written (too many
        races, or ZooKeeper away); nothing of it took effect."""
        path = share_partitions_path(self.group, tp.topic, tp.partition)
        fresh: List[ShareRecord] = []
        for _ in range(CAS_TRIES):
            cached = self._written.pop(tp, None)
            state, version = (rules.copy(cached[0]), cached[1]) if cached else self._read(tp, path)
            if state is None:
                continue
            config = self.config()
            outcome = Outcome()
            for token, token_acks in acks.items():
                outcome.refused += rules.acknowledge(state, self.member_id, token, token_acks, config)
            for token, first, last in undelivered:
                rules.release_undelivered(state, self.member_id, token, first, last)
            if want > 0:
                fresh = self._fresh(tp, state, fresh, min(want, rules.room(state, config)))
                outcome.token, taken = rules.acquire(state, self.member_id, want, [r.offset for r in fresh], config)
            else:
                taken = []
            if config.dead_letter_topic and any(r[2] == DEAD_LETTER for r in state.ranges):
                end = self._letters_end(tp, config)
                if end is not None:
                    outcome.letters = rules.claim_dead_letters(state, self.member_id, DEAD_LETTER_BATCH, end)
            if not (acks or undelivered or taken or outcome.letters[1]):
                outcome.written = True
                return outcome
            if not self._set(tp, path, state, version):
                if self.unregistered:
                    return Outcome()
                self.conflicts += 1
                continue
            self.writes += 1
            outcome.written = True
            outcome.records = self._records(tp, taken, fresh)
            outcome.dlq_scan = state.dlq_scan
            return outcome
        return Outcome()

    def _set(self, tp: TopicPartition, path: str, state: SharePartitionState, version: int) -> bool:
        """Write ``state`` at ``version``, in one transaction with a check that this member's
        registration exists: True if it was written, False if another write came first or the
        registration is gone (``unregistered``). Each write carries an id of its own (the state
        keeps the last few): a write whose answer was lost (the connection dropped) was made if
        its id is in the znode now.

        The check keeps a member whose session ended from writing on the session that replaced
        it before it registered again: the coordinator ends the locks of members without a
        registration, so records acquired then would be given to another member while this one
        works on them. A session's ephemeral registration is gone once the session has ended,
        so a registration that exists is this session's."""
        self._sequence += 1
        write_id = f"{self.member_id}:{self._sequence}"
        rules.note_write(state, write_id)
        write = self.client.transaction()
        write.check(self._registration, -1)
        write.set_data(path, state.encode(), version=version)
        try:
            registered, written = write.commit()
        except CONNECTION_ERRORS:
            return self._made(path, write_id)
        if isinstance(registered, NoNodeError):
            self.unregistered = True
            return False
        for result in (registered, written):   # anything but a lost race is ZooKeeper's answer (NoAuth, ...)
            if isinstance(result, Exception) and not isinstance(result, (RolledBackError, BadVersionError,
                                                                          NoNodeError)):
                raise result
        if isinstance(written, Exception):   # BadVersion or NoNode: another write came first
            return False
        self._written[tp] = (state, written.version)
        return True

    def _made(self, path: str, write_id: str) -> bool:
        """Whether the write ``write_id`` is in the znode (asked until ZooKeeper answers; a
        connection away for RECONNECT_WAIT_S is ZooKeeperUnavailable)."""
        while True:
            self.wait_connected()
            try:
                raw, _ = self.client.get(path)
            except NoNodeError:
                return False
            except CONNECTION_ERRORS:
                continue
            return write_id in SharePartitionState.decode(raw, path).writes

    def wait_connected(self) -> None:
        """Wait (bounded) for the connection to come back; ZooKeeperUnavailable past the bound."""
        deadline = time.monotonic() + RECONNECT_WAIT_S
        while not self.client.connected:
            if time.monotonic() > deadline:
                raise ZooKeeperUnavailable(f"ZooKeeper has been away for {RECONNECT_WAIT_S:.0f} s")
            time.sleep(0.05)

    # ------------------------------------------------------------ reads

    def _read(self, tp: TopicPartition, path: str) -> Tuple[Optional[SharePartitionState], int]:
        try:
            raw, stat = self.client.get(path)
        except CONNECTION_ERRORS:
            self.wait_connected()
            return None, -1
        except NoNodeError:
            self._create(tp, path)
            return None, -1
        return SharePartitionState.decode(raw, path), stat.version

    def _create(self, tp: TopicPartition, path: str) -> None:
        """The partition's first state: at its log end (``latest``) or start (``earliest``)."""
        reset = self.config().auto_offset_reset
        offsets = (self.plane.latest_offsets if reset == "latest" else self.plane.earliest_offsets)([tp])
        try:
            self.client.create(path, rules.initial(offsets[tp]).encode(), makepath=True)
        except NodeExistsError:
            pass  # another member made it first

    def _fresh(self, tp: TopicPartition, state: SharePartitionState, read: List[ShareRecord],
               n: int) -> List[ShareRecord]:
        """Up to ``n`` never-delivered records from ``state.end`` (those read for a write that
        lost its race are used again where they still fit)."""
        read = [r for r in read if r.offset >= state.end]
        if n <= 0:
            return []
        if read and read[0].offset == state.end and len(read) >= n:
            return read[:n]
        try:
            got = self.plane.fetch(tp, state.end, max_records=n)
        except OffsetOutOfRange as e:
            log.warning("share group %s: %s; its records below %d are gone (retention)", self.group, e, e.earliest)
            return []
        return [ShareRecord(*r[:7], 1) for r in got]

    def _records(self, tp: TopicPartition, taken: Sequence[rules.Acquired], fresh: List[ShareRecord]) -> List[ShareRecord]:
        """The records of the acquired ranges, with their delivery counts, in offset order."""
        by_offset = {r.offset: r for r in fresh}
        out: List[ShareRecord] = []
        for first, last, deliveries in taken:
            if first in by_offset:
                out += [by_offset[o] for o in range(first, last + 1) if o in by_offset]
                continue
            offset = first
            while offset <= last:
                got = self.plane.fetch(tp, offset, max_records=last - offset + 1)
                if not got:
                    break
                out += [ShareRecord(*r[:7], deliveries) for r in got if r.offset <= last]
                offset = got[-1].offset + 1
        return out

    # ------------------------------------------------------------ dead letters

    def _letters_end(self, tp: TopicPartition, config: ShareGroupConfig) -> Optional[int]:
        dtp = self.letters_partition(tp, config)
        if dtp is None:
            return None
        return self.plane.latest_offsets([dtp])[dtp]

    def letters_partition(self, tp: TopicPartition, config: ShareGroupConfig) -> Optional[TopicPartition]:
        """The dead-letter topic's partition for ``tp``'s letters (its partition modulo the
        topic's count); None, said once, while the topic does not exist."""
        topic = config.dead_letter_topic
        count = self.plane.partition_counts([topic]).get(topic)
        if not count:
            if topic not in self._missing_said:
                self._missing_said.add(topic)
                log.error("share group %s: the dead-letter topic %s does not exist; archived records wait for it",
                          self.group, topic)
            return None
        return TopicPartition(topic, tp.partition % count)

    def write_letters(self, tp: TopicPartition, outcome: Outcome) -> bool:
        """Append the letters ``outcome`` claimed (those not in the topic already) and mark them written."""
        token, letters = outcome.letters
        dtp = self.letters_partition(tp, self.config())
        if dtp is None:
            return False
        written = self._written_letters(dtp, tp, outcome.dlq_scan)
        batch = []
        for first, last, deliveries, reason in letters:
            for record in self._records(tp, [(first, last, deliveries)], []):
                if record.offset not in written:
                    batch.append(self._letter(record, deliveries, reason))
        if batch:
            if not self._still_claimed(tp, token):
                return False   # the claim ended while we scanned: the next writer scans again and writes them
            self.plane.append(dtp, batch)
        return self._mark_written(tp, token)

    def _still_claimed(self, tp: TopicPartition, token: int) -> bool:
        """Whether this member still holds the dead-letter claim ``token`` (read now)."""
        self._written.pop(tp, None)
        state, _ = self._read(tp, share_partitions_path(self.group, tp.topic, tp.partition))
        held = state.held.get(token) if state is not None else None
        return held is not None and held[0] == self.member_id

    def _letter(self, record: ShareRecord, deliveries: int, reason: int) -> tuple:
        values = (self.group, record.topic, record.partition, record.offset, deliveries, REASONS[reason])
        headers = tuple(record.headers) + tuple((k, str(v).encode()) for k, v in zip(DLQ_HEADERS, values))
        return (record.key, record.value, record.timestamp, headers)

    def _written_letters(self, dtp: TopicPartition, tp: TopicPartition, scan_from: int) -> Set[int]:
        """Offsets of ``tp`` whose letters are in ``dtp`` from ``scan_from`` on (a claim taken over)."""
        found: Set[int] = set()
        if scan_from < 0:
            return found
        offset = scan_from
        wanted = (self.group.encode(), tp.topic.encode(), str(tp.partition).encode())
        while True:
            got = self.plane.fetch(dtp, offset, max_records=1000)
            if not got:
                return found
            for record in got:
                headers = dict(record.headers or ())
                if tuple(headers.get(k) for k in DLQ_HEADERS[:3]) == wanted:
                    found.add(int(headers[DLQ_HEADERS[3]]))
            offset = got[-1].offset + 1

    def _mark_written(self, tp: TopicPartition, token: int) -> bool:
        path = share_partitions_path(self.group, tp.topic, tp.partition)
        self._written.pop(tp, None)
        for _ in range(CAS_TRIES):
            state, version = self._read(tp, path)
            if state is None:
                continue
            if not rules.dead_letters_written(state, self.member_id, token):
                return False   # the claim expired: its next writer finds these letters and skips them
            if self._set(tp, path, state, version):
                self.writes += 1
                return True
            if self.unregistered:
                return False   # as an expired claim: the next writer finds these letters
            self.conflicts += 1
        return False


def member_gone(client, group: str, member_id: str) -> None:
    """Remove a member's registration (its close)."""
    try:
        client.delete(share_members_path(group, member_id))
    except NoNodeError:
        pass
