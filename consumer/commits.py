"""A consumer's commits: fenced writes of its positions through its member, what was last
committed (so an unchanged position is not written again), auto-commit's clock,
``commit_async``'s thread, and the copy of each commit to Kafka for Kafka's tools.

Guarantees: every commit goes through the member's fenced commit (a partition that moved is
refused, never overwritten); the positions recorded as committed are exactly those written (a
refused partition is not recorded); the copy to Kafka is made only after ZooKeeper's commit
succeeded, and its failure is a warning, never the commit's.

Thread rule: :meth:`Commits.commit` may run on the application's thread, the commit-async
thread and the member thread (the commit before a revocation): ``committed``
(:class:`~consumer.partition_changes.CommittedPositions`) is thread-safe and the member's commit
is too. ``commit_async`` runs its commits one at a time, in order, on one thread.
:meth:`Commits.maybe_auto_commit` is the application thread's (it alone keeps the clock).
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Dict, Mapping, Optional

from coordinator.errors import CommitFailedError, ZkGroupsError
from consumer.partition_changes import CommittedPositions
from consumer.records import OffsetAndMetadata, TopicPartition

log = logging.getLogger("zkgroups.consumer")


class Commits:
    """The commits of the consumer whose parts are given: ``write(changed)`` is its member's
    fenced commit (timed by its metrics, when it has them), ``plane`` its data plane (for the
    copy to Kafka with ``kafka_commit_offsets``), ``config`` its ConsumerConfig (read at each
    use: ``close(autocommit=False)`` turns auto-commit off), ``positions()`` what a commit of
    everything owned means now."""

    def __init__(self, group_id: str, describe: Callable[[], str], plane, config,
                 positions: Callable[[], Dict[TopicPartition, int]]):
        self.group_id, self._describe, self._plane, self.config = group_id, describe, plane, config
        self._next_auto_commit = time.monotonic() + config.auto_commit_interval_ms / 1000.0
        self._positions = positions
        self.committed = CommittedPositions()
        self.write: Optional[Callable[[Dict[TopicPartition, int]], None]] = None  # set once the member exists
        self._async = ThreadPoolExecutor(1, thread_name_prefix="commit-async")

    def commit(self, offsets: Optional[Mapping[TopicPartition, object]] = None) -> None:
        """Write ``offsets`` (ints, or objects with ``.offset``; default: every owned
        position) where they changed since the last commit. CommitFailedError names the
        refused partitions, after the others were written."""
        if offsets is None:
            offsets = self._positions()
        changed = self.committed.changed({tp: getattr(o, "offset", o) for tp, o in offsets.items()})
        if not changed:
            return
        try:
            self.write(changed)
        except CommitFailedError as e:  # the partitions it does not name were written
            self.committed.record({tp: o for tp, o in changed.items() if tp not in e.partitions})
            raise
        self.committed.record(changed)
        if self.config.kafka_commit_offsets:
            try:  # after ZooKeeper's fenced commit, never instead of it
                self._plane.commit_offsets(self.group_id, changed)
            except ZkGroupsError as e:
                log.warning("consumer %s: copying offsets to Kafka failed (ZooKeeper has them): %s",
                            self._describe(), e)

    def commit_async(self, offsets: Optional[Mapping[TopicPartition, object]],
                     callback: Optional[Callable]) -> Future:
        """:meth:`commit` on the commit-async thread; ``callback({tp: OffsetAndMetadata},
        exception_or_None)`` runs there. The Future fails with the commit's exception."""
        if offsets is None:
            offsets = self._positions()
        offsets = {tp: o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(getattr(o, "offset", o))
                   for tp, o in offsets.items()}

        def run():
            try:
                self.commit(offsets)
                error = None
            except Exception as e:
                error = e
            if callback:
                callback(offsets, error)
            if error is not None:
                raise error
        return self._async.submit(run)

    def maybe_auto_commit(self) -> None:
        """With auto-commit on, commit every position at most once per interval (a failure is a warning)."""
        if self.config.enable_auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_ms / 1000.0
            try:
                self.commit()
            except ZkGroupsError as e:
                log.warning("consumer %s: auto-commit failed: %s", self._describe(), e)

    def close(self) -> None:
        """Wait for the async commits queued."""
        self._async.shutdown(wait=True)
