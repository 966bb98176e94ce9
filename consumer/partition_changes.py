"""How a change of a consumer's partitions reaches its fetcher, its poll thread and its
rebalance listener.

The coordinator's commands reach a :class:`~consumer.consumer.Consumer` on its group member's
thread, which calls a :class:`PartitionChanges` (the consumer's
:class:`~consumer.member.MemberListener`); a fetch error arrives on the fetcher's thread. Both
act on the fetcher at once (pause, drop, start paused, seek) and leave the rest in a
:class:`~consumer.handoff.Handoff` for the application's thread, which runs it inside
``poll()`` (:meth:`PartitionChanges.run_callbacks`): commits before a revocation, the listener's
callbacks, resuming what was assigned, raising errors. So the listener always runs on the
application's thread, as in Kafka:

- **revoke**: the partitions are paused at once (no record of them is returned any more); at
  the next ``poll()`` — once the application has finished the previous batch — positions are
  committed (auto-commit), ``on_partitions_revoked`` runs, and only then does the member
  release the owner nodes. If ``poll()`` is not called within ``max_poll_interval_ms`` the
  consumer is evicted instead, without committing.
- **assign**: the member thread has claimed the owner nodes; each partition starts at its
  committed offset, else at the configured start position (recorded as the group's starting
  point); fetching starts paused, and the next ``poll()`` calls ``on_partitions_assigned``
  before any record of them is returned. A partition the data plane cannot open is handed
  back to the member, which releases it, and ``poll()`` raises its FetchFailed.
- **lost**: dropped at once; ``on_partitions_lost`` runs at the next ``poll()``.

:class:`CommittedPositions` remembers what was last committed per partition, so that a commit
of unchanged positions writes nothing.

Threads: ``revoke``, ``assign`` and ``lost`` run on the member thread; ``on_fetch_error`` on the
fetcher's thread (or a ``poll()`` reading itself); ``run_callbacks`` and ``finish_revocation``
on the application's thread. ``_reached_lock`` guards ``_reached`` (written by the member
thread, read by ``reached()`` on any thread); everything else is the fetcher's, the
hand-off's or :class:`CommittedPositions`' (each thread-safe).
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Dict, Iterable, Optional, Set

from coordinator.errors import FetchFailed, NoOffsetForPartition, OffsetOutOfRange, ZkGroupsError
from consumer.handoff import Handoff, Revocation
from consumer.member import MemberListener
from consumer.records import TopicPartition

if TYPE_CHECKING:
    from consumer.consumer import Consumer
    from consumer.dataplane import DataPlane
    from consumer.member import GroupMember

log = logging.getLogger("zkgroups.consumer")


class CommittedPositions:
    """What this consumer last committed (or found committed) per partition, so unchanged
    positions are not committed again. Any thread (one lock)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._positions: Dict[TopicPartition, Optional[int]] = {}

    def known(self, committed: Dict[TopicPartition, Optional[int]]) -> None:
        """Partitions just assigned, with their committed offsets (kept where one is known)."""
        with self._lock:
            for tp, offset in committed.items():
                self._positions.setdefault(tp, offset)

    def changed(self, offsets: Dict[TopicPartition, int]) -> Dict[TopicPartition, int]:
        """The part of ``offsets`` not committed already."""
        with self._lock:
            return {tp: o for tp, o in offsets.items() if self._positions.get(tp) != o}

    def record(self, offsets: Dict[TopicPartition, int]) -> None:
        with self._lock:
            self._positions.update(offsets)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                self._positions.pop(tp, None)


class PartitionChanges(MemberListener):
    """The member thread's and the fetcher's side of a consumer (see the module docstring),
    and the poll thread's handling of what they left. ``member`` is bound once the member
    exists (it is built with this listener)."""

    def __init__(self, consumer: "Consumer", plane: "DataPlane", fetcher, handoff: Handoff,
                 committed: CommittedPositions):
        self.consumer, self.config = consumer, consumer.config
        self.plane, self.fetcher, self.handoff, self.committed = plane, fetcher, handoff, committed
        self.member: Optional["GroupMember"] = None
        self._reached_lock = threading.Lock()
        self._reached: Set[TopicPartition] = set()  # handed over by the member thread, not yet taken back
        self._checked_topics: Set[str] = set()      # topics whose data was looked for (member thread)

    def reached(self) -> Set[TopicPartition]:
        """The partitions whose assignment reached the fetcher and was not taken back."""
        with self._reached_lock:
            return set(self._reached)

    def known(self, partitions) -> Set[TopicPartition]:
        """The partitions the fetcher has (one without a start offset never reached it)."""
        return set(partitions) & self.fetcher.assigned()

    # ------------------------------------------------------------ the member thread

    def revoke(self, partitions: Set[TopicPartition]) -> Optional[Dict[TopicPartition, int]]:
        self._forget(partitions)
        self.fetcher.pause(self.known(partitions))  # no record of them is returned from now on
        if not self.consumer.closing:  # close() commits itself
            r = self.handoff.revoke(partitions)
            if self.consumer.poll_interval.in_poll:
                self.fetcher.wakeup()  # a poll() waiting for records handles it now
            while not r.done.wait(0.05):
                if self.consumer.closing:
                    break
                if self.consumer.poll_interval.overdue():
                    self.handoff.withdraw(r)
                    self.consumer.evict_overdue()
                    return None
        self.fetcher.revoke(self.known(partitions))
        return {}

    def assign(self, added: Dict[TopicPartition, str],
               committed: Dict[TopicPartition, Optional[int]]) -> Dict[TopicPartition, BaseException]:
        """Start fetching ``added`` (paused until on_partitions_assigned has run in poll()).
        Returns the partitions the data plane cannot open (their start offset cannot be looked
        up: an unreadable partition directory, a broker that does not answer), each with its
        error: the member releases them, and poll() raises the error, as for a failed fetch."""
        positions, known, refused = self._start_positions(added, committed)
        self._warn_of_topics_without_data({tp.topic for tp in positions})
        self.fetcher.assign(positions, paused=True)  # until on_partitions_assigned has run in poll()
        with self._reached_lock:  # after the fetcher has them: seek() accepts what assignment() shows
            self._reached |= set(added) - set(refused)
        self.handoff.assigned(known)  # after the fetcher has them: the poll thread resumes them
        for tp, e in refused.items():
            self.handoff.error(e if isinstance(e, FetchFailed) else FetchFailed(tp.topic, tp.partition, e))
        if self.consumer.poll_interval.in_poll:
            self.fetcher.wakeup()
        return refused

    def lost(self, partitions: Set[TopicPartition]) -> None:
        self._forget(partitions)
        self.fetcher.revoke(self.known(partitions))
        self.handoff.lost(set(partitions))

    def _forget(self, partitions: Set[TopicPartition]) -> None:
        with self._reached_lock:
            self._reached -= set(partitions)

    def _start_positions(self, added, committed):
        """({partition: where fetching starts}, {partition: its committed offset, or the start
        offset recorded now}, {partition: why it cannot be opened})."""
        positions, initial, refused = {}, {}, {}
        for tp in added:
            offset = committed.get(tp)
            if offset is None:
                try:
                    offset = self._initial_offset(tp)
                except (OSError, ZkGroupsError) as e:
                    refused[tp] = e
                    continue
                if offset is None:
                    self.handoff.error(NoOffsetForPartition(f"no committed offset for {tp} and auto_offset_reset is none"))
                    continue
                if self.config.start_position != "committed":
                    initial[tp] = offset
            positions[tp] = offset
        known = {tp: committed.get(tp) for tp in positions}
        if initial:
            # Fix the group's starting point (seed 002's control variable): every later owner
            # of the partition starts from the same offset.
            try:
                self.member.commit(initial)
                known.update(initial)
            except ZkGroupsError as e:
                log.warning("consumer %s: could not record start offsets: %s", self.member.consumer_id, e)
        return positions, known, refused

    def _initial_offset(self, tp: TopicPartition) -> Optional[int]:
        mode = self.config.start_position
        if mode == "committed":
            mode = self.config.auto_offset_reset
        if mode == "earliest":
            return self.plane.earliest_offsets([tp])[tp]
        if mode == "latest":
            return self.plane.latest_offsets([tp])[tp]
        if mode == "timestamp":
            found = self.plane.offsets_for_times({tp: self.config.start_timestamp_ms})[tp]
            return found if found is not None else self.plane.latest_offsets([tp])[tp]
        return None  # "none"

    def _warn_of_topics_without_data(self, topics: Set[str]) -> None:
        for topic in topics - self._checked_topics:
            self._checked_topics.add(topic)
            try:
                has_data = self.plane.has_data(topic)
            except OSError:  # the data directory cannot be listed: the partitions' reads say so
                has_data = True
            if not has_data:
                log.warning("consumer %s: topic %s has no data in %s yet; if records were produced to it, "
                            "they are somewhere else", self.member.consumer_id, topic, self.plane.describe())

    # ------------------------------------------------------------ the fetcher's thread

    def on_fetch_error(self, tp: TopicPartition, exc: BaseException) -> None:
        """A partition's fetch failed: an offset out of range is reset as configured; any
        other error waits for ``poll()`` (after the records fetched before it)."""
        if isinstance(exc, OffsetOutOfRange) and self.config.auto_offset_reset != "none":
            target = exc.earliest if self.config.auto_offset_reset == "earliest" else exc.latest
            log.warning("consumer %s: %s; resetting to %s offset %d", self.consumer.consumer_id, exc,
                        self.config.auto_offset_reset, target)
            self.fetcher.seek(tp, target)
            return
        if not isinstance(exc, ZkGroupsError):  # name the partition, keep the cause
            exc = FetchFailed(tp.topic, tp.partition, exc)
        self.handoff.error(exc)
        self.fetcher.wakeup()

    # ------------------------------------------------------------ the poll thread

    def run_callbacks(self) -> None:
        """Run what the member thread and the fetcher left: the listener's callbacks for lost,
        revoked and assigned partitions (resuming those), then raise one error if any."""
        lost, revocations, assigned, error = self.handoff.take(self.fetcher.holding)
        listener = self.consumer.listener
        if lost:
            listener.on_partitions_lost(lost)
        for r in revocations:
            self.finish_revocation(r)
        if assigned:
            owned = self.member.owned()
            assigned = {tp: offset for tp, offset in assigned.items() if tp in owned}
            if assigned:
                self.committed.known(assigned)
                listener.on_partitions_assigned(set(assigned))
                self.fetcher.resume(self.known(set(assigned) - self.consumer.paused()))
        if error is not None:
            raise error

    def finish_revocation(self, r: Revocation) -> None:
        """Commit ``r``'s positions (with auto-commit), run on_partitions_revoked, and let the
        member thread release them."""
        try:
            if self.config.enable_auto_commit:
                try:
                    self.consumer.commit(self.consumer.positions_of(r.partitions))
                except ZkGroupsError as e:  # refused, or ZooKeeper unreachable: the next owner redelivers
                    log.warning("consumer %s: commit before revocation failed: %s", self.consumer.consumer_id, e)
            self.consumer.listener.on_partitions_revoked(set(r.partitions))
        finally:
            self.committed.forget(r.partitions)
            r.done.set()
