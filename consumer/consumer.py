"""``Consumer``: a kafka-python-style consumer on zkgroups' coordinator and embedded log.

Threads: the application calls ``poll()``; the member thread (consumer.member) applies the
coordinator's commands; the fetcher thread prefetches. Rebalance listener callbacks always
run on the application's thread, inside ``poll()`` (or ``close()``), as in Kafka:

- revocation: the member asks to stop; the partitions are paused at once (no record of them
  is returned any more); at the next ``poll()`` — i.e. once the application has finished the
  previous batch — positions are committed (auto-commit), ``on_partitions_revoked`` runs, and
  only then are the owner nodes released. If ``poll()`` is not called within
  ``max_poll_interval_ms`` the consumer leaves the group without committing and rejoins on
  its next ``poll()``.
- assignment: owner nodes are claimed by the member thread, fetching starts paused, and the
  next ``poll()`` calls ``on_partitions_assigned`` before any record of them is returned.

Delivery is at-least-once: a record can be returned twice only if it was returned after the
last successful commit of a partition that then moved to another member.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Set

from coordinator import config as cfg
from coordinator import protocol
from coordinator.assignors import STRATEGIES
from coordinator.errors import (CommitFailedError, IllegalStateError, InvalidConfig, NoOffsetForPartition,
                                OffsetOutOfRange, ZkGroupsError)
from coordinator.zkclient import DEFAULT_CONNECT, close_client, start_client
from consumer.fetcher import Fetcher
from consumer.log import Log
from consumer.member import GroupMember, MemberListener
from consumer.records import ConsumerRecord, OffsetAndTimestamp, TopicPartition

log = logging.getLogger("zkgroups.consumer")

START_POSITIONS = ("committed", "earliest", "latest", "timestamp")
#: poll(0) still waits this long for a lease renewal's round trip (only when the lease lapsed).
LEASE_RENEWAL_MIN_WAIT_S = 0.05


class WakeupException(ZkGroupsError):
    """``poll()`` was interrupted by ``wakeup()``."""


@dataclass
class ConsumerConfig:
    auto_offset_reset: str = "latest"          # earliest | latest | none (no committed offset)
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5000
    max_poll_records: int = 500
    max_poll_interval_ms: int = 300000
    session_timeout_ms: int = 10000
    fetch_max_bytes: int = 52428800
    max_partition_fetch_bytes: int = 1048576
    fetch_max_wait_ms: int = 100
    client_id: str = "zkgroups"
    assignment_strategy: tuple = ("range",)
    start_position: str = "committed"          # committed | earliest | latest | timestamp (seed 002)
    start_timestamp_ms: int = 0
    connect_timeout_s: float = 10.0

    def validate(self):
        if self.auto_offset_reset not in ("earliest", "latest", "none"):
            raise InvalidConfig(f"auto_offset_reset must be earliest, latest or none, not {self.auto_offset_reset!r}")
        if self.start_position not in START_POSITIONS:
            raise InvalidConfig(f"start_position must be one of {', '.join(START_POSITIONS)}")
        cfg.positive(self, "auto_commit_interval_ms", "max_poll_records", "max_poll_interval_ms",
                     "session_timeout_ms", "fetch_max_bytes", "max_partition_fetch_bytes")
        if isinstance(self.assignment_strategy, str):
            self.assignment_strategy = (self.assignment_strategy,)
        self.assignment_strategy = tuple(self.assignment_strategy)
        unknown = [s for s in self.assignment_strategy if s not in STRATEGIES]
        if unknown or not self.assignment_strategy:
            raise InvalidConfig(f"assignment_strategy: unknown strategy {unknown[0]!r} (known: "
                                f"{', '.join(sorted(STRATEGIES))})" if unknown else
                                "assignment_strategy must name at least one strategy")


class ConsumerRebalanceListener:
    """Override any of these; they run on the thread that calls ``poll()``."""

    def on_partitions_revoked(self, revoked: Set[TopicPartition]) -> None:
        pass

    def on_partitions_assigned(self, assigned: Set[TopicPartition]) -> None:
        pass

    def on_partitions_lost(self, lost: Set[TopicPartition]) -> None:
        """The partitions were taken away without a chance to commit (session lost, eviction)."""
        self.on_partitions_revoked(lost)


class _Revocation:
    def __init__(self, partitions: Set[TopicPartition]):
        self.partitions = partitions
        self.done = threading.Event()


class Consumer:
    """A member of consumer group ``group_id``.

    ``topics`` is a list of topic names or ``{topic: streams}``; ``pattern`` a regex of
    topics to follow (``exclude=True`` for a black list). ``zk`` is a connect string or a
    started kazoo client (shared, not closed by us); ``zk`` and ``data_dir`` default to the
    environment (``ZK_CONNECT``, ``ZKGROUPS_DATA_DIR``) as for the CLIs. ``consumer_id`` overrides the generated
    ``<group>_<host>-<ms>-<8 hex>`` (it must be unique in the group and a valid znode name).
    """

    def __init__(self, group_id: str, topics=None, pattern: Optional[str] = None, *, exclude: bool = False,
                 zk=None, data_dir: Optional[str] = None, listener: Optional[ConsumerRebalanceListener] = None,
                 consumer_id: Optional[str] = None, log_options: Optional[dict] = None, **config):
        self.config = cfg.build(ConsumerConfig, config, "consumer config")
        zk = zk or os.environ.get("ZK_CONNECT", DEFAULT_CONNECT)
        data_dir = data_dir or os.environ.get("ZKGROUPS_DATA_DIR", "./data")
        if (topics is None) == (pattern is None):
            raise InvalidConfig("give either topics or pattern")
        if pattern is not None:
            subscription = {pattern: 1}
            kind = protocol.PATTERN_BLACK_LIST if exclude else protocol.PATTERN_WHITE_LIST
        else:
            if isinstance(topics, str):  # Consumer("billing", "orders"): one topic, not five letters
                topics = [topics]
            subscription = dict(topics) if isinstance(topics, dict) else {t: 1 for t in topics}
            kind = protocol.PATTERN_STATIC
        self.group_id = group_id
        self._subscription, self._pattern = subscription, kind
        self.listener = listener or ConsumerRebalanceListener()
        self._own_client = isinstance(zk, str)
        self.client = start_client(zk, self.config.session_timeout_ms, self.config.connect_timeout_s) \
            if self._own_client else zk
        self.log = Log(data_dir, **(log_options or {}))
        self.fetcher = Fetcher(self.log, self.config.max_poll_records, self.config.max_partition_fetch_bytes,
                               self.config.fetch_max_bytes, self.config.fetch_max_wait_ms, on_error=self._on_fetch_error)
        self._lock = threading.Lock()
        self._revocations: List[_Revocation] = []
        self._assigned_pending: Set[TopicPartition] = set()
        self._lost_pending: Set[TopicPartition] = set()
        self._errors: List[Exception] = []
        self._user_paused: Set[TopicPartition] = set()
        self._committed_positions: Dict[TopicPartition, int] = {}
        self._last_poll = time.monotonic()
        self._in_poll = False
        self._closing = False
        self._closed = False
        self._evicted = False
        self._wakeup = False
        self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_ms / 1000.0
        self._async_commits = ThreadPoolExecutor(1, thread_name_prefix="commit-async")
        self._streams: Optional[Streams] = None
        self.fetcher.start()
        self.member = GroupMember(self.client, group_id, subscription, kind, self.config.assignment_strategy,
                                  self.config.client_id, _Bridge(self), consumer_id,
                                  session_timeout_ms=self.config.session_timeout_ms)
        self.member.start()
        self._watchdog = threading.Thread(target=self._watch_poll_interval, name="poll-watchdog", daemon=True)
        self._watchdog.start()

    @classmethod
    def from_config(cls, path: str, group_id: str, topics=None, pattern: Optional[str] = None,
                    **overrides) -> "Consumer":
        """A consumer configured by a TOML file: ``zk``, ``data_dir`` and any config key, at the
        top level or in a ``[consumer]`` table; keyword arguments win over the file."""
        values = cfg.load_toml(path)
        values = dict(values.get("consumer", values))
        values.update(overrides)
        zk, data_dir = values.pop("zk", None), values.pop("data_dir", values.pop("data-dir", None))
        return cls(group_id, topics, pattern, zk=zk, data_dir=data_dir, **values)

    # ------------------------------------------------------------ identity

    @property
    def consumer_id(self) -> str:
        return self.member.consumer_id

    def subscription(self) -> Set[str]:
        return set(self._subscription)

    def assignment(self) -> Set[TopicPartition]:
        return set(self.member.owned())

    # ------------------------------------------------------------ poll

    def poll(self, timeout_ms: int = 0, max_records: Optional[int] = None) -> Dict[TopicPartition, List[ConsumerRecord]]:
        """Up to ``max_records`` (default ``max_poll_records``) records, fairly across partitions."""
        self._check_open()
        deadline = time.monotonic() + timeout_ms / 1000.0
        self._last_poll = time.monotonic()
        self._in_poll = True
        try:
            if self._evicted:
                self._evicted = False
                log.info("consumer %s rejoins group %s", self.consumer_id, self.group_id)
                self.member.rejoin()
            while True:
                self._run_callbacks()
                remaining = deadline - time.monotonic()
                if not self._may_hand_out(remaining):
                    # Another member may own our partitions by now: hand out nothing.
                    self._check_wakeup()
                    if time.monotonic() >= deadline:
                        return {}
                    continue
                self._maybe_auto_commit()
                remaining = deadline - time.monotonic()
                records = self.fetcher.poll(max_records, timeout=max(0.0, min(remaining, 0.5)))
                if records:
                    if self.member.holds_lease():
                        return records
                    # The lease lapsed while we waited (the process may have been frozen): keep
                    # them until a round trip confirms the session that owns them.
                    self.fetcher.give_back(records)
                    continue
                self._check_wakeup()
                if remaining <= 0:
                    return {}
        finally:
            self._in_poll = False
            self._last_poll = time.monotonic()

    def __iter__(self):
        while not self._closed:
            for records in self.poll(timeout_ms=500).values():
                yield from records

    def _may_hand_out(self, remaining: float) -> bool:
        """Whether records of owned partitions may be returned now: connected, and the session
        that owns them proved alive recently (the member's lease; renewed here if it lapsed)."""
        if not self.member.wait_connected(max(0.0, min(remaining, 0.5))):
            return False
        return self.member.holds_lease() or self.member.renew_lease(max(LEASE_RENEWAL_MIN_WAIT_S, min(remaining, 0.5)))

    def _check_wakeup(self) -> None:
        if self._wakeup:
            self._wakeup = False
            raise WakeupException("poll() was woken up")

    def wakeup(self) -> None:
        """Interrupt a blocking ``poll()`` (raises WakeupException there). Thread-safe."""
        self._wakeup = True
        self.fetcher.wakeup()

    def streams(self) -> List["Stream"]:
        """For a ``{topic: n}`` subscription: n iterators, each over the partitions assigned to
        its stream id (``<consumer-id>-<i>``), for n threads to consume (the legacy high-level
        consumer's model). A background thread polls for them, so do not call ``poll()`` too.

        A record counts as consumed once its stream hands it out: ``commit()`` and auto-commit
        commit those positions, so a record is redelivered after a rebalance only if its
        stream's thread had not asked for the next one yet (at-least-once)."""
        if self._streams is None:
            self._streams = Streams(self, max(self._subscription.values()))
        return self._streams.iterators

    # ------------------------------------------------------------ callbacks on the poll thread

    def _run_callbacks(self) -> None:
        with self._lock:
            error = self._errors.pop(0) if self._errors else None
            lost, self._lost_pending = self._lost_pending, set()
            revocations, self._revocations = self._revocations, []
            assigned, self._assigned_pending = self._assigned_pending, set()
        if lost:
            self.listener.on_partitions_lost(lost)
        for r in revocations:
            self._finish_revocation(r)
        if assigned:
            assigned &= set(self.member.owned())
            if assigned:
                self.listener.on_partitions_assigned(assigned)
                self.fetcher.resume(self._known(assigned - self._user_paused))
        if error is not None:
            raise error

    def _finish_revocation(self, r: _Revocation) -> None:
        try:
            if self.config.enable_auto_commit:
                try:
                    self.commit(self._positions_of(r.partitions))
                except ZkGroupsError as e:  # refused, or ZooKeeper unreachable: the next owner redelivers
                    log.warning("consumer %s: commit before revocation failed: %s", self.consumer_id, e)
            self.listener.on_partitions_revoked(set(r.partitions))
        finally:
            r.done.set()

    def _positions_of(self, partitions) -> Dict[TopicPartition, int]:
        """What a commit of ``partitions`` means: the positions of returned records, or in
        streams mode the positions of records the streams handed out."""
        if self._streams is not None:
            return self._streams.consumed(partitions)
        out = {}
        for tp in partitions:
            try:
                out[tp] = self.fetcher.position(tp)
            except (KeyError, ZkGroupsError):
                continue
        return out

    # member thread -> consumer (only record, or wait for the poll thread)

    def _revoke(self, partitions: Set[TopicPartition]) -> Optional[Dict[TopicPartition, int]]:
        self.fetcher.pause(self._known(partitions))  # no record of them is returned from now on
        r = _Revocation(set(partitions))
        if not self._closing:  # close() has already committed and called the listener
            with self._lock:
                self._revocations.append(r)
            if self._in_poll:
                self.fetcher.wakeup()  # a poll() waiting for records handles it now
            while not r.done.wait(0.05):
                if self._closing or self._closed:
                    break
                if not self._in_poll and time.monotonic() - self._last_poll > self.config.max_poll_interval_ms / 1000.0:
                    log.warning("consumer %s: poll() not called within max_poll_interval_ms=%d; leaving the group",
                                self.consumer_id, self.config.max_poll_interval_ms)
                    with self._lock:
                        if r in self._revocations:
                            self._revocations.remove(r)
                    self._evicted = True
                    return None
        self.fetcher.revoke(self._known(partitions))
        for tp in partitions:
            self._committed_positions.pop(tp, None)
        return {}

    def _assign(self, added: Dict[TopicPartition, str], committed: Dict[TopicPartition, Optional[int]]) -> None:
        positions, initial = {}, {}
        for tp in added:
            offset = committed.get(tp)
            if offset is None:
                offset = self._initial_offset(tp)
                if offset is None:
                    with self._lock:
                        self._errors.append(NoOffsetForPartition(f"no committed offset for {tp} and auto_offset_reset is none"))
                    continue
                if self.config.start_position != "committed":
                    initial[tp] = offset
            positions[tp] = offset
            self._committed_positions[tp] = committed.get(tp)
        if initial:
            # Fix the group's starting point (seed 002's control variable): every later owner
            # of the partition starts from the same offset.
            try:
                self.member.commit(initial)
                self._committed_positions.update(initial)
            except ZkGroupsError as e:
                log.warning("consumer %s: could not record start offsets: %s", self.consumer_id, e)
        self.fetcher.assign(positions, paused=True)  # until on_partitions_assigned has run in poll()
        with self._lock:
            self._assigned_pending |= set(positions)
        if self._in_poll:
            self.fetcher.wakeup()

    def _lost(self, partitions: Set[TopicPartition]) -> None:
        self.fetcher.revoke(self._known(partitions))
        with self._lock:
            self._lost_pending |= set(partitions)
            self._assigned_pending -= set(partitions)

    def _known(self, partitions) -> Set[TopicPartition]:
        """The partitions the fetcher has (one without a start offset never reached it)."""
        return set(partitions) & self.fetcher.assigned()

    def _initial_offset(self, tp: TopicPartition) -> Optional[int]:
        mode = self.config.start_position
        if mode == "committed":
            mode = self.config.auto_offset_reset
        if mode == "earliest":
            return self.log.earliest_offset(tp.topic, tp.partition)
        if mode == "latest":
            return self.log.latest_offset(tp.topic, tp.partition)
        if mode == "timestamp":
            found = self.log.offset_for_time(tp.topic, tp.partition, self.config.start_timestamp_ms)
            return found if found is not None else self.log.latest_offset(tp.topic, tp.partition)
        return None  # "none"

    def _on_fetch_error(self, tp: TopicPartition, exc: BaseException) -> None:
        if isinstance(exc, OffsetOutOfRange) and self.config.auto_offset_reset != "none":
            target = exc.earliest if self.config.auto_offset_reset == "earliest" else exc.latest
            log.warning("consumer %s: %s; resetting to %s offset %d", self.consumer_id, exc,
                        self.config.auto_offset_reset, target)
            self.fetcher.seek(tp, target)
            return
        with self._lock:
            self._errors.append(exc)
        self.fetcher.wakeup()

    def _watch_poll_interval(self) -> None:
        limit = self.config.max_poll_interval_ms / 1000.0
        while not self._closed:
            time.sleep(min(1.0, limit / 4))
            if (not self._in_poll and not self._evicted and not self._closing and self.member.registered
                    and time.monotonic() - self._last_poll > limit):
                log.warning("consumer %s: poll() not called within max_poll_interval_ms=%d; leaving the group",
                            self.consumer_id, self.config.max_poll_interval_ms)
                self._evicted = True
                self.member.evict()

    # ------------------------------------------------------------ offsets

    def commit(self, offsets: Optional[Dict[TopicPartition, int]] = None) -> None:
        """Commit ``offsets`` (default: the positions of all returned records). Raises
        CommitFailedError for a partition this member does not own any more."""
        self._check_open()
        if offsets is None:
            offsets = self._positions_of(self.member.owned())
        offsets = {tp: getattr(o, "offset", o) for tp, o in offsets.items()}
        changed = {tp: o for tp, o in offsets.items() if self._committed_positions.get(tp) != o}
        if not changed:
            return
        self.member.commit(changed)
        self._committed_positions.update(changed)

    def commit_async(self, offsets=None, callback: Optional[Callable] = None):
        """Commit on a background thread; ``callback(offsets, exception_or_None)``."""
        if offsets is None:
            offsets = self._positions_of(self.member.owned())

        def run():
            try:
                self.commit(offsets)
                error = None
            except Exception as e:
                error = e
            if callback:
                callback(offsets, error)
        return self._async_commits.submit(run)

    def _maybe_auto_commit(self) -> None:
        if self.config.enable_auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_ms / 1000.0
            try:
                self.commit()
            except ZkGroupsError as e:
                log.warning("consumer %s: auto-commit failed: %s", self.consumer_id, e)

    def committed(self, tp: TopicPartition) -> Optional[int]:
        return self.member.committed(tp)

    def position(self, tp: TopicPartition) -> int:
        return self.fetcher.position(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.fetcher.seek(tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or self.assignment():
            self.fetcher.seek(tp, self.log.earliest_offset(tp.topic, tp.partition))

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for tp in partitions or self.assignment():
            self.fetcher.seek(tp, self.log.latest_offset(tp.topic, tp.partition))

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        return {tp: self.log.earliest_offset(tp.topic, tp.partition) for tp in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        return {tp: self.log.latest_offset(tp.topic, tp.partition) for tp in partitions}

    def offsets_for_times(self, timestamps: Dict[TopicPartition, int]) -> Dict[TopicPartition, Optional[OffsetAndTimestamp]]:
        out = {}
        for tp, ts in timestamps.items():
            offset = self.log.offset_for_time(tp.topic, tp.partition, ts)
            out[tp] = None if offset is None else OffsetAndTimestamp(offset, ts)
        return out

    # ------------------------------------------------------------ flow control

    def pause(self, *partitions: TopicPartition) -> None:
        self._user_paused |= set(partitions)
        self.fetcher.pause(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._user_paused -= set(partitions)
        with self._lock:
            pending = set(self._assigned_pending)
        self.fetcher.resume(set(partitions) - pending)

    def paused(self) -> Set[TopicPartition]:
        return set(self._user_paused)

    # ------------------------------------------------------------ lifecycle

    def close(self, autocommit: bool = True) -> None:
        """Commit (if auto-commit), run on_partitions_revoked, leave the group."""
        if self._closed:
            return
        self._closing = True
        if self._streams is not None:
            self._streams.stop()
        try:
            # A clean leave needs ZooKeeper: wait for a suspended connection at most one
            # session timeout, after which the session is gone anyway.
            reachable = self.member.wait_connected(self.config.session_timeout_ms / 1000.0)
            owned = set(self.member.owned())
            if owned and reachable:
                r = _Revocation(owned)
                if not autocommit:
                    self.config.enable_auto_commit = False
                self.fetcher.pause(self._known(owned))
                self._finish_revocation(r)
            elif owned:
                log.warning("consumer %s: ZooKeeper unreachable; closing without committing, its partitions "
                            "move when the session ends", self.consumer_id)
                self.listener.on_partitions_lost(owned)
            self.member.close(timeout=30.0 if reachable else 1.0)
        finally:
            self._closed = True
            self.fetcher.close()
            self._async_commits.shutdown(wait=True)
            self.log.close()
            if self._own_client:
                close_client(self.client)

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("consumer is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Bridge(MemberListener):
    """The member thread's view of the consumer."""

    def __init__(self, consumer: Consumer):
        self.consumer = consumer

    def revoke(self, partitions):
        return self.consumer._revoke(partitions)

    def assign(self, added, committed):
        self.consumer._assign(added, committed)

    def lost(self, partitions):
        self.consumer._lost(partitions)


class Streams:
    """The dispatcher behind :meth:`Consumer.streams`: polls and hands batches to per-stream
    queues. A stream whose queue is full has its partitions paused, so polling (and with it
    liveness and rebalancing) never waits for a slow stream."""

    QUEUE_BATCHES = 4

    def __init__(self, consumer: Consumer, count: int):
        self.consumer = consumer
        self.queues = [queue.Queue() for _ in range(count)]
        self.iterators = [Stream(self, i) for i in range(count)]
        self._consumed: Dict[TopicPartition, int] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._throttled: Set[TopicPartition] = set()
        self._thread = threading.Thread(target=self._run, name="streams", daemon=True)
        self._thread.start()

    def consumed(self, partitions) -> Dict[TopicPartition, int]:
        with self._lock:
            return {tp: self._consumed[tp] for tp in partitions if tp in self._consumed}

    def handed_out(self, tp: TopicPartition, offset: int) -> bool:
        """Record that a stream returns this record; False if the partition is gone."""
        if tp not in self.consumer.member.owned():
            return False
        with self._lock:
            self._consumed[tp] = offset + 1
        return True

    def stop(self) -> None:
        self._stopped.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        for q in self.queues:
            q.put(None)  # wake the iterators: the consumer is closing

    def _run(self) -> None:
        c = self.consumer
        while not self._stopped.is_set():
            owned = c.member.owned()
            full = {tp for tp, stream in owned.items()
                    if self.queues[_stream_index(stream) % len(self.queues)].qsize() >= self.QUEUE_BATCHES}
            if full != self._throttled:
                c.fetcher.pause(c._known(full - self._throttled))
                c.fetcher.resume(c._known((self._throttled - full) - c._user_paused))
                self._throttled = full
            try:
                batch = c.poll(timeout_ms=200)
            except Exception as e:  # surface to the stream threads' logs; keep the group alive
                log.error("consumer %s streams: %s", c.consumer_id, e)
                continue
            for tp, records in batch.items():
                stream = owned.get(tp) or c.member.owned().get(tp)
                if stream is not None:
                    self.queues[_stream_index(stream) % len(self.queues)].put((tp, records))


class Stream:
    """One stream's records, in order per partition; iteration ends when the consumer closes."""

    def __init__(self, streams: Streams, index: int):
        self._streams, self.index = streams, index
        self._batch: List[ConsumerRecord] = []
        self._tp: Optional[TopicPartition] = None
        self._pos = 0

    def __iter__(self):
        return self

    def __next__(self) -> ConsumerRecord:
        while True:
            while self._pos < len(self._batch):
                record = self._batch[self._pos]
                self._pos += 1
                if self._streams.handed_out(self._tp, record.offset):
                    return record
                self._pos = len(self._batch)  # the partition moved: drop the rest
            item = self._streams.queues[self.index].get()
            if item is None:
                self._streams.queues[self.index].put(None)
                raise StopIteration
            self._tp, self._batch = item
            self._pos = 0


def _stream_index(stream: str) -> int:
    return int(stream.rsplit("-", 1)[1])
