"""``Consumer``: a kafka-python-style consumer on zkgroups' coordinator, reading the embedded log
or Kafka brokers (the data plane: :mod:`consumer.dataplane`).

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

import enum
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Set, Union

from kazoo.client import KazooClient

from coordinator import config as cfg
from coordinator import protocol
from coordinator.assignors import STRATEGIES
from coordinator.errors import (CommitFailedError, FetchFailed, IllegalStateError, InvalidConfig,
                                NoOffsetForPartition, OffsetOutOfRange, ZkGroupsError)
from coordinator.acl import parse_auth
from coordinator.metrics import check_port
from coordinator.zkclient import close_client, start_client
from consumer.dataplane import DataPlane, open_data_plane
from consumer.handoff import Handoff, Revocation
from consumer.log import Columns
from consumer.member import GroupMember, MemberListener
from consumer.metrics import ConsumerMetrics
from consumer.records import ConsumerRecord, OffsetAndTimestamp, TopicPartition
from consumer.streams import Stream, Streams

log = logging.getLogger("zkgroups.consumer")

START_POSITIONS = ("committed", "earliest", "latest", "timestamp")
#: poll(0) still waits this long for a lease renewal's round trip (only when the lease lapsed).
LEASE_RENEWAL_MIN_WAIT_S = 0.05


#: What ``Consumer(topics=...)`` takes: topic names (one name as a string), or {topic: streams}.
Topics = Union[None, str, Iterable[str], Mapping[str, int]]


class WakeupException(ZkGroupsError):
    """``poll()`` was interrupted by ``wakeup()``."""


@dataclass
class ConsumerConfig:
    auto_offset_reset: str = "latest"          # earliest | latest | none (no committed offset)
    enable_auto_commit: bool = True            # commit positions from poll() and before partitions are revoked
    auto_commit_interval_ms: int = 5000        # at most this often
    max_poll_records: int = 500                # records one poll() returns at most, fairly across partitions
    max_poll_interval_ms: int = 300000         # no poll() for this long: leave the group (rejoin on the next poll)
    session_timeout_ms: int = cfg.DEFAULT_SESSION_TIMEOUT_MS   # the ZooKeeper session: liveness
    fetch_max_bytes: int = 52428800            # bytes one fetch reads at most
    max_partition_fetch_bytes: int = 1048576   # bytes one fetch reads from a partition at most
    fetch_max_wait_ms: int = 100               # idle partitions are looked at again this often
    client_id: str = "zkgroups"                # shown in groups describe and the metrics
    assignment_strategy: tuple = ("sticky", "range")   # preferred first; range: what older members list
    start_position: str = "committed"          # committed | earliest | latest | timestamp (seed 002)
    start_timestamp_ms: int = 0                # for start_position = "timestamp"
    connect_timeout_s: float = 10.0            # to connect (else ZooKeeperUnavailable); a later loss is waited out
    bootstrap_servers: str = ""                # Kafka brokers; "" (and no KAFKA_BOOTSTRAP_SERVERS): the embedded log
    kafka_commit_offsets: bool = False         # also copy commits to Kafka (after ZooKeeper's) for Kafka's tools
    metrics_port: Optional[int] = None         # serve Prometheus metrics on this port (0: any free one); None: off
    group_instance_id: str = ""                # a static member (Kafka's group.instance.id); "": dynamic
    static_grace_ms: int = 0                   # how long a static member's partitions wait for it; 0: session_timeout_ms
    zk_auth: Any = dataclass_field(default=None, repr=False)  # the group's ZooKeeper identity: user:password or @file

    def validate(self) -> None:
        self.zk_auth = parse_auth(self.zk_auth, "zk_auth")  # a file reference is read now; errors never show it
        if self.auto_offset_reset not in ("earliest", "latest", "none"):
            raise InvalidConfig(f"auto_offset_reset must be earliest, latest or none, not {self.auto_offset_reset!r}")
        if self.start_position not in START_POSITIONS:
            raise InvalidConfig(f"start_position must be one of {', '.join(START_POSITIONS)}")
        cfg.positive(self, "auto_commit_interval_ms", "max_poll_records", "max_poll_interval_ms",
                     "session_timeout_ms", "fetch_max_bytes", "max_partition_fetch_bytes")
        if self.metrics_port is not None:
            check_port(self.metrics_port, "metrics_port")
        if self.group_instance_id:
            protocol.validate_name(self.group_instance_id, "group instance id")
        if self.static_grace_ms < 0:
            raise InvalidConfig("static_grace_ms must not be negative (0: the session timeout)")
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


class ConsumerState(enum.Enum):
    ACTIVE = "active"      # a member of its group (joining, or owning partitions)
    EVICTED = "evicted"    # left the group because poll() was not called in time; rejoins at the next poll()
    CLOSING = "closing"
    CLOSED = "closed"


_TRANSITIONS = {
    ConsumerState.ACTIVE: {ConsumerState.EVICTED, ConsumerState.CLOSING},
    ConsumerState.EVICTED: {ConsumerState.ACTIVE, ConsumerState.CLOSING},
    ConsumerState.CLOSING: {ConsumerState.CLOSED},
    ConsumerState.CLOSED: set(),
}


@dataclass(frozen=True)
class GroupMetadata:
    """Who this consumer is in its group (kafka-python's ``group_metadata``)."""
    group_id: str
    member_id: str
    generation: int      # the last generation applied; -1 before the first assignment
    rebalances: int      # how many generations this member has applied
    connected: bool      # to ZooKeeper, now
    state: str           # a ConsumerState value


class Consumer:
    """A member of consumer group ``group_id``.

    ``topics`` is a list of topic names (one name as a string is one topic) or
    ``{topic: streams}``; ``pattern`` a regex of topics to follow (``exclude=True`` for a black
    list). ``zk`` is a connect string or a started kazoo client (shared, not closed by us);
    ``zk`` and ``data_dir`` default to the environment (``ZK_CONNECT``, ``ZKGROUPS_DATA_DIR``) as
    for the CLIs. With ``bootstrap_servers`` (or ``KAFKA_BOOTSTRAP_SERVERS``) records come from
    Kafka instead of the embedded log; ``kafka`` holds librdkafka properties (security, SASL,
    SSL, tuning). ``consumer_id`` overrides the generated ``<group>_<host>-<ms>-<8 hex>`` (it
    must be unique in the group and a valid znode name). With ``group_instance_id`` the consumer
    is a static member (as Kafka's KIP-345): restarted within ``static_grace_ms`` (default: its
    ``session_timeout_ms``) of leaving, it gets its partitions back without a rebalance of the
    others; while another live process holds the same instance id the constructor (or, after a
    session loss, ``poll()``) raises FencedInstanceIdError.

    The constructor connects to ZooKeeper within ``connect_timeout_s`` (ZooKeeperUnavailable,
    retriable, if it cannot); once connected, a connection lost while it joins the group is
    waited out as while it runs, with one warning every ``connect_timeout_s``.

    States (:class:`ConsumerState`), changed through ``_set_state`` under ``_state_lock``::

        ACTIVE ──poll() not called within max_poll_interval_ms──▶ EVICTED ──poll()──▶ ACTIVE
        ACTIVE, EVICTED ──close()──▶ CLOSING ──▶ CLOSED

    Threads and locks
    -----------------
    * The **application thread** calls the public methods (one thread at a time, as with
      kafka-python; :meth:`wakeup` is the one call safe from any thread). Listener callbacks
      run on it, inside ``poll()`` and ``close()``. It alone touches ``_user_paused`` and
      ``_next_auto_commit``.
    * The **member thread** (:class:`~consumer.member.GroupMember`) calls ``_revoke``,
      ``_assign`` and ``_lost`` through ``_Bridge``; it pauses or drops partitions in the
      fetcher (thread-safe) and leaves everything else for the poll thread in ``_handoff``
      (its own lock), waiting for revocations to be finished there.
    * The **fetcher's** prefetch thread (or a ``poll()`` reading itself) reports errors through
      ``_on_fetch_error`` → ``_handoff``.
    * The **watchdog** thread evicts the member when ``poll()`` is not called in time; the
      **commit-async** thread runs :meth:`commit_async`'s commits.
    * ``_assignment_lock`` guards ``_assignment`` (the partitions the member thread handed
      over and has not taken back), written by the member thread, read by ``assignment()``.
    * ``_commit_lock`` guards ``_committed_positions`` (what was last committed, so unchanged
      positions are not committed again), used by the application, commit-async and member
      threads. ``_in_poll`` and ``_last_poll`` are written by the application thread and read
      by the others without a lock (a stale read delays an eviction by one check).
    """

    def __init__(self, group_id: str, topics: Topics = None, pattern: Optional[str] = None, *,
                 exclude: bool = False, zk: Union[None, str, KazooClient] = None, data_dir: Optional[str] = None,
                 listener: Optional[ConsumerRebalanceListener] = None, consumer_id: Optional[str] = None,
                 log_options: Optional[dict] = None, kafka: Optional[dict] = None, **config: Any) -> None:
        self.config = cfg.build(ConsumerConfig, config, "consumer config")
        zk = zk or cfg.default_connect()
        data_dir = data_dir or cfg.default_data_dir()
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
        self._subscription = subscription
        self.listener = listener or ConsumerRebalanceListener()
        self._state = ConsumerState.ACTIVE
        self._handed_out_at: Optional[float] = None
        self._state_lock = threading.Lock()
        self._handoff = Handoff()
        self._commit_lock = threading.Lock()
        self._committed_positions: Dict[TopicPartition, Optional[int]] = {}
        self._user_paused: Set[TopicPartition] = set()
        self._assignment_lock = threading.Lock()
        self._assignment: Set[TopicPartition] = set()  # assigned to us by the member thread, not yet revoked
        self._checked_topics: Set[str] = set()  # topics whose data directory was looked for (member thread)
        self._last_poll = time.monotonic()
        self._in_poll = False
        self._wakeup = False
        self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_ms / 1000.0
        self._streams: Optional[Streams] = None
        self._metrics: Optional[ConsumerMetrics] = None  # with metrics_port: counted per poll and commit
        self._own_client = isinstance(zk, str)
        self._client = start_client(zk, self.config.session_timeout_ms, self.config.connect_timeout_s,
                                    auth=self.config.zk_auth) \
            if self._own_client else zk
        try:
            if self.config.metrics_port is not None:  # first: a port in use fails before joining the group
                self._metrics = ConsumerMetrics(self).serve(self.config.metrics_port)
            self._plane: DataPlane = open_data_plane(
                data_dir=data_dir, bootstrap_servers=self.config.bootstrap_servers or None, kafka=kafka,
                log_options=log_options)
            self._fetcher = self._plane.open_fetcher(
                group_id=group_id, max_poll_records=self.config.max_poll_records,
                max_partition_fetch_bytes=self.config.max_partition_fetch_bytes,
                fetch_max_bytes=self.config.fetch_max_bytes, fetch_max_wait_ms=self.config.fetch_max_wait_ms,
                on_error=self._on_fetch_error)
            self._async_commits = ThreadPoolExecutor(1, thread_name_prefix="commit-async")
            self._fetcher.start()
            self._member = GroupMember(self._client, group_id, subscription, kind, self.config.assignment_strategy,
                                       self.config.client_id, _Bridge(self), consumer_id,
                                       session_timeout_ms=self.config.session_timeout_ms,
                                       group_instance_id=self.config.group_instance_id or None,
                                       static_grace_ms=self.config.static_grace_ms or None)
            self._member.start(report_every=self.config.connect_timeout_s)
        except BaseException:
            if self._metrics is not None:
                self._metrics.close()
            if self._own_client:
                close_client(self._client)
            raise
        self._watchdog = threading.Thread(target=self._watch_poll_interval, name="poll-watchdog", daemon=True)
        self._watchdog.start()

    @classmethod
    def from_config(cls, path: str, group_id: str, topics: Topics = None, pattern: Optional[str] = None,
                    **overrides: Any) -> "Consumer":
        """A consumer configured by a TOML file: ``zk``, ``data_dir`` and any config key, at the
        top level or in a ``[consumer]`` table; keyword arguments win over the file."""
        values = dict(cfg.load_toml(path, "consumer"))
        zk = cfg.take(values, "zk", str, path)
        data_dir = cfg.take(values, "data_dir", str, path)
        kafka = cfg.take(values, "kafka", dict, path)
        values.update(overrides)
        return cls(group_id, topics, pattern, zk=values.pop("zk", zk), data_dir=values.pop("data_dir", data_dir),
                   kafka=values.pop("kafka", kafka), **values)

    def _set_state(self, new: ConsumerState, expect=None) -> bool:
        """Move to ``new`` if the current state is in ``expect`` (any state allowed by the
        transitions if None); False if it was not (another thread changed it first)."""
        with self._state_lock:
            if (expect is not None and self._state not in expect) or new not in _TRANSITIONS[self._state]:
                return False
            self._state = new
            return True

    @property
    def state(self) -> ConsumerState:
        return self._state

    # ------------------------------------------------------------ identity

    @property
    def consumer_id(self) -> str:
        return self._member.consumer_id

    @property
    def handed_out_at(self) -> Optional[float]:
        """When the records the last ``poll()`` (or ``poll_columns()``) returned were handed
        out (``time.time()``, taken after they were fetched and before the lease check that let
        them go): this member owned their partitions at that moment. What an application stamps
        itself after ``poll()`` returns can be later than the ownership (a process frozen just
        then); this cannot. None before the first records."""
        return self._handed_out_at

    def group_metadata(self) -> GroupMetadata:
        """This member's id, generation and connection, for logs and tools (no I/O)."""
        m = self._member
        return GroupMetadata(self.group_id, m.consumer_id, m.generation, m.rebalances, m.wait_connected(0),
                             self._state.value)

    def subscription(self) -> Set[str]:
        """The topics (or the one regex) this consumer subscribed to."""
        return set(self._subscription)

    def assignment(self) -> Set[TopicPartition]:
        """The partitions this member owns now and whose assignment has reached this consumer
        (so ``seek`` and ``pause`` accept them); empty before the first assignment and while
        evicted."""
        with self._assignment_lock:
            reached = set(self._assignment)
        return reached & set(self._member.owned())

    # ------------------------------------------------------------ poll

    @property
    def metrics(self) -> Optional[ConsumerMetrics]:
        """This consumer's metrics (``metrics.server.url``: where they are served); None without ``metrics_port``."""
        return self._metrics

    def poll(self, timeout_ms: int = 0, max_records: Optional[int] = None) -> Dict[TopicPartition, List[ConsumerRecord]]:
        """Up to ``max_records`` (default ``max_poll_records``) records, fairly across partitions,
        waiting up to ``timeout_ms`` for some. Runs the rebalance listener's callbacks first.

        Returns ``{}`` when nothing arrived in time, and while the member cannot prove that it
        still owns its partitions (ZooKeeper unreachable, the lease lapsed). Raises
        WakeupException after :meth:`wakeup`, NoOffsetForPartition (``auto_offset_reset="none"``),
        a data-plane error such as LogCorrupted or FetchFailed once for the partition it
        concerns, after every record of that partition before the unreadable offset was returned
        (the others keep flowing; ``seek`` past the damage to go on), and IllegalStateError once
        closed."""
        if self._metrics is not None:
            return self._metrics.timed_poll(self._poll, timeout_ms, max_records)
        return self._poll(timeout_ms, max_records)

    @property
    def columnar(self) -> bool:
        """Whether :meth:`poll_columns` works: the data plane keeps records in columns (the
        embedded log; not Kafka)."""
        return getattr(self._fetcher, "columnar", False)

    def poll_columns(self, timeout_ms: int = 0, max_records: Optional[int] = None) -> Dict[TopicPartition, List[Columns]]:
        """What :meth:`poll` returns, each partition's records as the embedded log's
        :class:`~consumer.log.Columns` (one per stored batch they span, in offset order; no
        object per record), for readers that want arrays. Everything else is as for ``poll``:
        callbacks first, only owned partitions, nothing handed out without the lease, positions
        advanced over what is returned (so ``commit()`` and ``position()`` mean the same),
        ``max_records``, pause and seek. Mixing it with ``poll()`` works but reads the buffered
        records again at each switch. Not counted in :attr:`metrics`. IllegalStateError where
        the data plane has no columns (:attr:`columnar` is False: call ``poll()``)."""
        if not self.columnar:
            raise IllegalStateError(f"{self._plane.describe()} hands out records, not columns: call poll()")
        return self._poll(timeout_ms, max_records, self._fetcher.poll_columns)

    def _poll(self, timeout_ms: int, max_records: Optional[int], take: Optional[Callable] = None) -> dict:
        """``poll()``, or with ``take`` (the fetcher's ``poll_columns``) ``poll_columns()``."""
        take = take or self._fetcher.poll
        self._check_open()
        if self._member.fenced is not None:
            raise self._member.fenced
        deadline = time.monotonic() + timeout_ms / 1000.0
        self._last_poll = time.monotonic()
        self._in_poll = True
        try:
            if self._state is ConsumerState.EVICTED and self._set_state(ConsumerState.ACTIVE,
                                                                         expect={ConsumerState.EVICTED}):
                log.info("consumer %s rejoins group %s", self.consumer_id, self.group_id)
                self._member.rejoin()
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
                records = take(max_records, timeout=max(0.0, min(remaining, 0.5)))
                if records:
                    handed_out_at = time.time()
                    if self._member.holds_lease():
                        self._handed_out_at = handed_out_at
                        return records
                    # The lease lapsed while we waited (the process may have been frozen): keep
                    # them until a round trip confirms the session that owns them.
                    self._fetcher.give_back(records)
                    continue
                self._check_wakeup()
                if remaining <= 0:
                    return {}
        finally:
            self._in_poll = False
            self._last_poll = time.monotonic()

    def __iter__(self) -> Iterator[ConsumerRecord]:
        while self._state is not ConsumerState.CLOSED:
            for records in self.poll(timeout_ms=500).values():
                yield from records

    def _may_hand_out(self, remaining: float) -> bool:
        """Whether records of owned partitions may be returned now: connected, and the session
        that owns them proved alive recently (the member's lease; renewed here if it lapsed)."""
        if not self._member.wait_connected(max(0.0, min(remaining, 0.5))):
            return False
        return self._member.holds_lease() or self._member.renew_lease(
            max(LEASE_RENEWAL_MIN_WAIT_S, min(remaining, 0.5)))

    def _check_wakeup(self) -> None:
        if self._wakeup:
            self._wakeup = False
            raise WakeupException("poll() was woken up")

    def wakeup(self) -> None:
        """Interrupt a blocking ``poll()`` (raises WakeupException there). Safe from any thread."""
        self._wakeup = True
        self._fetcher.wakeup()

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
        lost, revocations, assigned, error = self._handoff.take(self._fetcher.holding)
        if lost:
            self.listener.on_partitions_lost(lost)
        for r in revocations:
            self._finish_revocation(r)
        if assigned:
            owned = self._member.owned()
            assigned = {tp: offset for tp, offset in assigned.items() if tp in owned}
            if assigned:
                with self._commit_lock:
                    for tp, offset in assigned.items():
                        self._committed_positions.setdefault(tp, offset)
                self.listener.on_partitions_assigned(set(assigned))
                self._fetcher.resume(self._known(set(assigned) - self._user_paused))
        if error is not None:
            raise error

    def _finish_revocation(self, r: Revocation) -> None:
        try:
            if self.config.enable_auto_commit:
                try:
                    self.commit(self._positions_of(r.partitions))
                except ZkGroupsError as e:  # refused, or ZooKeeper unreachable: the next owner redelivers
                    log.warning("consumer %s: commit before revocation failed: %s", self.consumer_id, e)
            self.listener.on_partitions_revoked(set(r.partitions))
        finally:
            with self._commit_lock:
                for tp in r.partitions:
                    self._committed_positions.pop(tp, None)
            r.done.set()

    def _positions_of(self, partitions) -> Dict[TopicPartition, int]:
        """What a commit of ``partitions`` means: the positions of returned records, or in
        streams mode the positions of records the streams handed out."""
        if self._streams is not None:
            return self._streams.consumed(partitions)
        out = {}
        for tp in partitions:
            try:
                out[tp] = self._fetcher.position(tp)
            except (KeyError, ZkGroupsError):
                continue
        return out

    # member thread -> consumer (only record, or wait for the poll thread)

    def _revoke(self, partitions: Set[TopicPartition]) -> Optional[Dict[TopicPartition, int]]:
        self._forget_assignment(partitions)
        self._fetcher.pause(self._known(partitions))  # no record of them is returned from now on
        if self._state not in (ConsumerState.CLOSING, ConsumerState.CLOSED):  # close() commits itself
            r = self._handoff.revoke(partitions)
            if self._in_poll:
                self._fetcher.wakeup()  # a poll() waiting for records handles it now
            while not r.done.wait(0.05):
                if self._state in (ConsumerState.CLOSING, ConsumerState.CLOSED):
                    break
                if not self._in_poll and self._poll_overdue():
                    self._handoff.withdraw(r)
                    if self._set_state(ConsumerState.EVICTED, expect={ConsumerState.ACTIVE}):
                        self._warn_overdue()
                    return None
        self._fetcher.revoke(self._known(partitions))
        return {}

    def _assign(self, added: Dict[TopicPartition, str],
                committed: Dict[TopicPartition, Optional[int]]) -> Dict[TopicPartition, BaseException]:
        """Start fetching ``added`` (paused until on_partitions_assigned has run in poll()).
        Returns the partitions the data plane cannot open (their start offset cannot be looked
        up: an unreadable partition directory, a broker that does not answer), each with its
        error: the member releases them, and poll() raises the error, as for a failed fetch."""
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
                    self._handoff.error(NoOffsetForPartition(f"no committed offset for {tp} and auto_offset_reset is none"))
                    continue
                if self.config.start_position != "committed":
                    initial[tp] = offset
            positions[tp] = offset
        known = {tp: committed.get(tp) for tp in positions}
        if initial:
            # Fix the group's starting point (seed 002's control variable): every later owner
            # of the partition starts from the same offset.
            try:
                self._member.commit(initial)
                known.update(initial)
            except ZkGroupsError as e:
                log.warning("consumer %s: could not record start offsets: %s", self.consumer_id, e)
        for topic in {tp.topic for tp in positions} - self._checked_topics:
            self._checked_topics.add(topic)
            try:
                has_data = self._plane.has_data(topic)
            except OSError:  # the data directory cannot be listed: the partitions' reads say so
                has_data = True
            if not has_data:
                log.warning("consumer %s: topic %s has no data in %s yet; if records were produced to it, "
                            "they are somewhere else", self.consumer_id, topic, self._plane.describe())
        self._fetcher.assign(positions, paused=True)  # until on_partitions_assigned has run in poll()
        with self._assignment_lock:  # after the fetcher has them: seek() accepts what assignment() shows
            self._assignment |= set(added) - set(refused)
        self._handoff.assigned(known)
        for tp, e in refused.items():
            self._handoff.error(e if isinstance(e, FetchFailed) else FetchFailed(tp.topic, tp.partition, e))
        if self._in_poll:
            self._fetcher.wakeup()
        return refused

    def _lost(self, partitions: Set[TopicPartition]) -> None:
        self._forget_assignment(partitions)
        self._fetcher.revoke(self._known(partitions))
        self._handoff.lost(set(partitions))

    def _forget_assignment(self, partitions: Set[TopicPartition]) -> None:
        with self._assignment_lock:
            self._assignment -= set(partitions)

    def _known(self, partitions) -> Set[TopicPartition]:
        """The partitions the fetcher has (one without a start offset never reached it)."""
        return set(partitions) & self._fetcher.assigned()

    def _initial_offset(self, tp: TopicPartition) -> Optional[int]:
        mode = self.config.start_position
        if mode == "committed":
            mode = self.config.auto_offset_reset
        if mode == "earliest":
            return self._plane.earliest_offsets([tp])[tp]
        if mode == "latest":
            return self._plane.latest_offsets([tp])[tp]
        if mode == "timestamp":
            found = self._plane.offsets_for_times({tp: self.config.start_timestamp_ms})[tp]
            return found if found is not None else self._plane.latest_offsets([tp])[tp]
        return None  # "none"

    def _on_fetch_error(self, tp: TopicPartition, exc: BaseException) -> None:
        if isinstance(exc, OffsetOutOfRange) and self.config.auto_offset_reset != "none":
            target = exc.earliest if self.config.auto_offset_reset == "earliest" else exc.latest
            log.warning("consumer %s: %s; resetting to %s offset %d", self.consumer_id, exc,
                        self.config.auto_offset_reset, target)
            self._fetcher.seek(tp, target)
            return
        if not isinstance(exc, ZkGroupsError):  # name the partition, keep the cause
            exc = FetchFailed(tp.topic, tp.partition, exc)
        self._handoff.error(exc)
        self._fetcher.wakeup()

    def _poll_overdue(self) -> bool:
        return time.monotonic() - self._last_poll > self.config.max_poll_interval_ms / 1000.0

    def _warn_overdue(self) -> None:
        log.warning("consumer %s: poll() not called within max_poll_interval_ms=%d; leaving the group",
                    self.consumer_id, self.config.max_poll_interval_ms)

    def _watch_poll_interval(self) -> None:
        limit = self.config.max_poll_interval_ms / 1000.0
        while self._state is not ConsumerState.CLOSED:
            time.sleep(min(1.0, limit / 4))
            if (not self._in_poll and self._member.registered and self._poll_overdue()
                    and self._set_state(ConsumerState.EVICTED, expect={ConsumerState.ACTIVE})):
                self._warn_overdue()
                self._member.evict()

    # ------------------------------------------------------------ offsets

    def commit(self, offsets: Optional[Dict[TopicPartition, int]] = None) -> None:
        """Commit ``offsets`` ({partition: next offset to consume}, or OffsetAndMetadata-like
        objects with ``.offset``; default: the positions of every record returned so far).

        Raises CommitFailedError for partitions this member does not own (never assigned, or
        claimed by another member since), after the others were written (its ``partitions``
        names the refused ones); ZooKeeperUnavailable (retriable) when ZooKeeper cannot be
        reached within a session timeout; IllegalStateError once closed. Offsets of more than
        ``consumer.offsets.COMMIT_PARTITIONS`` partitions are written in several transactions:
        after ZooKeeperUnavailable, those written before it stay written."""
        self._check_open()
        if offsets is None:
            offsets = self._positions_of(self._member.owned())
        offsets = {tp: getattr(o, "offset", o) for tp, o in offsets.items()}
        with self._commit_lock:
            changed = {tp: o for tp, o in offsets.items() if self._committed_positions.get(tp) != o}
        if not changed:
            return
        try:
            if self._metrics is not None:
                self._metrics.timed_commit(self._member.commit, changed)
            else:
                self._member.commit(changed)
        except CommitFailedError as e:  # the partitions it does not name were written
            with self._commit_lock:
                self._committed_positions.update({tp: o for tp, o in changed.items() if tp not in e.partitions})
            raise
        with self._commit_lock:
            self._committed_positions.update(changed)
        if self.config.kafka_commit_offsets:
            try:  # after ZooKeeper's fenced commit, never instead of it
                self._plane.commit_offsets(self.group_id, changed)
            except ZkGroupsError as e:
                log.warning("consumer %s: copying offsets to Kafka failed (ZooKeeper has them): %s",
                            self.consumer_id, e)

    def commit_async(self, offsets: Optional[Dict[TopicPartition, int]] = None,
                     callback: Optional[Callable] = None) -> Future:
        """Commit on a background thread (one at a time, in order); ``callback(offsets,
        exception_or_None)`` runs there. Returns a Future."""
        if offsets is None:
            offsets = self._positions_of(self._member.owned())

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
        """The group's committed offset of ``tp`` (any partition, owned or not; None if nothing
        was committed). Raises ZooKeeperUnavailable when ZooKeeper cannot be reached."""
        return self._member.committed(tp)

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record ``poll()`` returns for ``tp``. IllegalStateError for a
        partition this consumer does not own (or whose start offset is not known yet)."""
        return self._fetcher.position(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` next (buffered records are dropped; a reported fetch
        error of ``tp`` is cleared). IllegalStateError for a partition this consumer does not own."""
        self._fetcher.seek(tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """``seek`` to the earliest retained offset (default: every owned partition)."""
        for tp, offset in self._plane.earliest_offsets(partitions or self.assignment()).items():
            self._fetcher.seek(tp, offset)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """``seek`` to the end (default: every owned partition): only new records follow."""
        for tp, offset in self._plane.latest_offsets(partitions or self.assignment()).items():
            self._fetcher.seek(tp, offset)

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        """Earliest retained offset of each partition (owned or not)."""
        return self._plane.earliest_offsets(partitions)

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        """Offset after the last record of each partition (owned or not)."""
        return self._plane.latest_offsets(partitions)

    def offsets_for_times(self, timestamps: Dict[TopicPartition, int]) -> Dict[TopicPartition, Optional[OffsetAndTimestamp]]:
        """For each partition (owned or not) the earliest offset whose timestamp is at least the
        given one (milliseconds), or None if there is none."""
        found = self._plane.offsets_for_times(timestamps)
        return {tp: None if offset is None else OffsetAndTimestamp(offset, timestamps[tp])
                for tp, offset in found.items()}

    # ------------------------------------------------------------ flow control

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching and returning ``partitions`` until ``resume`` (kept across rebalances
        for partitions that stay; partitions not owned are remembered but have no effect)."""
        self._user_paused |= set(partitions)
        self._fetcher.pause(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        """Undo ``pause``; partitions not owned are ignored."""
        self._user_paused -= set(partitions)
        self._fetcher.resume(set(partitions) - self._handoff.pending_assigned())

    def paused(self) -> Set[TopicPartition]:
        """The partitions ``pause`` was called for (and not resumed)."""
        return set(self._user_paused)

    # ------------------------------------------------------------ for Streams and ConsumerMetrics (this package only)

    @property
    def started(self) -> bool:
        """Whether the member and the fetcher exist (a scrape can come while the consumer starts).

        :meta private:"""
        return getattr(self, "_member", None) is not None and getattr(self, "_fetcher", None) is not None

    def owned_streams(self) -> Dict[TopicPartition, str]:
        """{partition: its stream id} of the partitions this member owns now.

        :meta private:"""
        return self._member.owned()

    def throttle(self, pause: Set[TopicPartition], resume: Set[TopicPartition]) -> None:
        """Stop fetching ``pause`` and fetch ``resume`` again (flow control of the streams);
        partitions the application paused stay paused.

        :meta private:"""
        self._fetcher.pause(self._known(pause))
        self._fetcher.resume(self._known(set(resume) - self._user_paused))

    def seconds_since_poll(self) -> float:
        """Seconds since ``poll()`` last returned; 0 while in ``poll()``.

        :meta private:"""
        return 0.0 if self._in_poll else max(0.0, time.monotonic() - self._last_poll)

    def log_end_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        """The data plane's end offsets of ``partitions`` (ZkGroupsError if it does not answer).

        :meta private:"""
        return self._fetcher.end_offsets(partitions)

    # ------------------------------------------------------------ lifecycle

    def close(self, autocommit: bool = True) -> None:
        """Commit (if auto-commit and ``autocommit``), run on_partitions_revoked, leave the group.
        Once; later calls do nothing. Waits at most one session timeout for an unreachable
        ZooKeeper, then reports the partitions lost and leaves by session expiry."""
        if not self._set_state(ConsumerState.CLOSING, expect={ConsumerState.ACTIVE, ConsumerState.EVICTED}):
            return
        if self._streams is not None:
            self._streams.stop()
        try:
            # A clean leave needs ZooKeeper: wait for a suspended connection at most one
            # session timeout, after which the session is gone anyway.
            reachable = self._member.wait_connected(self.config.session_timeout_ms / 1000.0)
            owned = set(self._member.owned())
            if owned and reachable:
                if not autocommit:
                    self.config.enable_auto_commit = False
                self._fetcher.pause(self._known(owned))
                self._finish_revocation(Revocation(owned))
            elif owned:
                log.warning("consumer %s: ZooKeeper unreachable; closing without committing, its partitions "
                            "move when the session ends", self.consumer_id)
                self.listener.on_partitions_lost(owned)
            self._member.close(timeout=30.0 if reachable else 1.0)
        finally:
            self._set_state(ConsumerState.CLOSED)
            self._fetcher.close()
            self._async_commits.shutdown(wait=True)
            if self._metrics is not None:
                self._metrics.close()
            self._plane.close()
            if self._own_client:
                close_client(self._client)

    def _check_open(self) -> None:
        if self._state is ConsumerState.CLOSED:
            raise IllegalStateError("consumer is closed")

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Bridge(MemberListener):
    """The member thread's view of the consumer."""

    def __init__(self, consumer: Consumer):
        self.consumer = consumer

    def revoke(self, partitions):
        return self.consumer._revoke(partitions)

    def assign(self, added, committed):
        return self.consumer._assign(added, committed)

    def lost(self, partitions):
        self.consumer._lost(partitions)
