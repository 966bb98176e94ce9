"""``Consumer``: a kafka-python-style consumer on zkgroups' coordinator, reading the embedded log
or Kafka brokers (the data plane: :mod:`consumer.dataplane`).

Threads: the application calls ``poll()``; the member thread (consumer.member) applies the
coordinator's commands; on the embedded log the fetcher's thread prefetches (on Kafka,
librdkafka's threads do). Rebalance listener callbacks always run on the application's thread,
inside ``poll()`` (or ``close()``), as in Kafka: how a revocation, an assignment or a loss
reaches the consumer is :mod:`consumer.partition_changes`.

Delivery is at-least-once: a record can be returned twice only if it was returned after the
last successful commit of a partition that then moved to another member.
"""
from __future__ import annotations

import enum
import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Union

from kazoo.client import KazooClient

from coordinator import config as cfg
from coordinator.errors import CommitFailedError, IllegalStateError, ZkGroupsError
from coordinator.lifecycle import Lifecycle
from coordinator.zkclient import close_client, start_client
from consumer.config import ConsumerConfig, Topics, build_consumer_config, subscription_of  # noqa: F401 (ConsumerConfig: importable from here too)
from consumer.dataplane import DataPlane, open_data_plane
from consumer.deserializers import Deserializers
from consumer.commits import Commits
from consumer.hand_out import HandOut, WakeupException  # noqa: F401 (WakeupException: poll()'s, importable from here)
from consumer.handoff import Handoff, Revocation
from consumer.iteration import Unyielded
from consumer.lookups import Lookups
from consumer.log import Columns
from consumer.member import GroupMember
from consumer.metrics import ConsumerMetrics, snapshot
from consumer.poll_interval import PollInterval
from consumer.partition_changes import PartitionChanges
from consumer.records import ConsumerRecord, OffsetAndMetadata, TopicPartition
from consumer.streams import Stream, Streams

log = logging.getLogger("zkgroups.consumer")

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


@dataclass(frozen=True)
class GroupMetadata:
    """Who this consumer is in its group (kafka-python's ``group_metadata``)."""
    group_id: str
    member_id: str
    generation: int      # the last generation applied; -1 before the first assignment
    rebalances: int      # how many generations this member has applied
    connected: bool      # to ZooKeeper, now
    state: str           # a ConsumerState value


class Consumer(Lookups, Lifecycle[ConsumerState]):
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

    States (:class:`ConsumerState`), changed only through ``_set_state``
    (:class:`~coordinator.lifecycle.Lifecycle`)::

        ACTIVE ──poll() not called within max_poll_interval_ms──▶ EVICTED ──poll()──▶ ACTIVE
        ACTIVE, EVICTED ──close()──▶ CLOSING ──▶ CLOSED

    Threads and locks
    -----------------
    * The **application thread** calls the public methods (one thread at a time, as with
      kafka-python; :meth:`wakeup` is the one call safe from any thread). Listener callbacks
      run on it, inside ``poll()`` and ``close()``. It alone touches ``_user_paused``, the
      iterator's records (``_unyielded``, :mod:`consumer.iteration`) and the hand-out loop
      (``_hand_out``, :mod:`consumer.hand_out`).
    * The **member thread** (:class:`~consumer.member.GroupMember`) and the **fetcher's**
      prefetch thread (the embedded log's; on Kafka, fetch errors come in ``poll()``'s reads)
      act through ``_changes``
      (:class:`~consumer.partition_changes.PartitionChanges`, its own thread rules), which
      leaves what the application's thread must do in ``_handoff``.
    * The **watchdog** thread (``poll_interval``, :mod:`consumer.poll_interval`) evicts the
      member when ``poll()`` is not called in time; the **commit-async** thread runs
      :meth:`commit_async`'s commits (``_commits``, :mod:`consumer.commits`, whose committed
      positions are thread-safe).
    """

    TRANSITIONS = {
        ConsumerState.ACTIVE: {ConsumerState.EVICTED, ConsumerState.CLOSING},
        ConsumerState.EVICTED: {ConsumerState.ACTIVE, ConsumerState.CLOSING},
        ConsumerState.CLOSING: {ConsumerState.CLOSED},
        ConsumerState.CLOSED: set(),
    }

    def __init__(self, group_id: str, topics: Topics = None, pattern: Optional[str] = None, *,
                 exclude: bool = False, zk: Union[None, str, KazooClient] = None, data_dir: Optional[str] = None,
                 listener: Optional[ConsumerRebalanceListener] = None, consumer_id: Optional[str] = None,
                 log_options: Optional[dict] = None, kafka: Optional[dict] = None, **config: Any) -> None:
        super().__init__(ConsumerState.ACTIVE)
        self.config = build_consumer_config(config)
        zk = zk or cfg.default_connect()
        data_dir = data_dir or cfg.default_data_dir()
        self.group_id = group_id
        self._subscription, kind = subscription_of(topics, pattern, exclude)
        self.listener = listener or ConsumerRebalanceListener()
        self._deserializers = Deserializers(self.config.key_deserializer, self.config.value_deserializer) \
            if self.config.key_deserializer or self.config.value_deserializer else None
        self._convert = None if self._deserializers is None else self._deserializers.one  # what iteration applies
        self._handoff = Handoff()
        self._user_paused: Set[TopicPartition] = set()
        self.poll_interval = PollInterval(self.config.max_poll_interval_ms, self._evict_overdue, self._is_open)
        self._streams: Optional[Streams] = None
        self._metrics: Optional[ConsumerMetrics] = None  # with metrics_port: counted per poll and commit
        self._own_client = isinstance(zk, str)
        self._client = start_client(zk, self.config.session_timeout_ms, self.config.connect_timeout_s,
                                    auth=self.config.zk_auth, tls=self.config.zk_tls, sasl=self.config.zk_sasl) \
            if self._own_client else zk
        try:
            self._join(data_dir, kafka, log_options, kind, consumer_id)
        except BaseException:
            if self._metrics is not None:
                self._metrics.close()
            if self._own_client:
                close_client(self._client)
            raise
        self.poll_interval.start()

    def _join(self, data_dir: str, kafka: Optional[dict], log_options: Optional[dict], kind: str,
              consumer_id: Optional[str]) -> None:
        """Serve the metrics (first: a port in use fails before joining the group), open the
        data plane and the fetcher, and join the group."""
        if self.config.metrics_port is not None:
            self._metrics = ConsumerMetrics(self).serve(self.config.metrics_port)
        self._plane: DataPlane = open_data_plane(data_dir=data_dir, bootstrap_servers=self.config.bootstrap_servers
                                                 or None, kafka=kafka, log_options=log_options)
        self._fetcher = self._plane.open_fetcher(
            group_id=self.group_id, max_poll_records=self.config.max_poll_records,
            max_partition_fetch_bytes=self.config.max_partition_fetch_bytes,
            fetch_max_bytes=self.config.fetch_max_bytes, fetch_max_wait_ms=self.config.fetch_max_wait_ms,
            on_error=self._on_fetch_error)
        self._unyielded = Unyielded(self._fetcher)  # the iterator's records not yielded yet
        self._commits = Commits(self.group_id, lambda: self.consumer_id, self._plane, self.config,
                                lambda: self.positions_of(self._member.owned()))
        self._changes = PartitionChanges(self, self._plane, self._fetcher, self._handoff, self._commits.committed)
        self._fetcher.start()
        self._member = GroupMember(self._client, self.group_id, self._subscription, kind,
                                   self.config.assignment_strategy, self.config.client_id, self._changes, consumer_id,
                                   session_timeout_ms=self.config.session_timeout_ms,
                                   group_instance_id=self.config.group_instance_id or None,
                                   static_grace_ms=self.config.static_grace_ms or None)
        self._changes.member = self._member
        self._commits.write = self._member.commit if self._metrics is None else \
            (lambda changed: self._metrics.timed_commit(self._member.commit, changed))
        self._hand_out = HandOut(self._member, self._changes, self._fetcher, self._commits.maybe_auto_commit)
        self._member.start(report_every=self.config.connect_timeout_s)

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
        return self._hand_out.handed_out_at

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
        return self._changes.reached() & set(self._member.owned())

    # ------------------------------------------------------------ poll

    def metrics(self, raw: bool = False) -> Dict[str, float]:
        """This consumer's metrics now (kafka-python's call): {sample name with its labels:
        value}, as Prometheus would scrape them (``zkgroups_consumer_lag{partition="0",topic="t"}``).
        Without ``metrics_port`` only what is read at a scrape (positions, lag, owned
        partitions, generation); with it the counters of records, bytes and commits too.
        ``raw=True``: prometheus_client's metric families instead."""
        return snapshot(self, self._metrics, raw)

    @property
    def metrics_server(self):
        """Where ``metrics_port`` serves the metrics (``.url``, ``.port``); None without it."""
        return None if self._metrics is None else self._metrics.server

    def poll(self, timeout_ms: int = 0, max_records: Optional[int] = None) -> Dict[TopicPartition, List[ConsumerRecord]]:
        """Up to ``max_records`` (default ``max_poll_records``) records, fairly across partitions,
        waiting up to ``timeout_ms`` for some. Runs the rebalance listener's callbacks first.

        Returns ``{}`` when nothing arrived in time, and while the member cannot prove that it
        still owns its partitions (ZooKeeper unreachable, the lease lapsed). Raises
        WakeupException after :meth:`wakeup`, NoOffsetForPartition (``auto_offset_reset="none"``),
        a data-plane error such as LogCorrupted or FetchFailed once for the partition it
        concerns, after every record of that partition before the unreadable offset was returned
        (the others keep flowing; ``seek`` past the damage to go on), and IllegalStateError once
        closed. With a ``key_deserializer`` or ``value_deserializer``, RecordDeserializationError
        once a record they fail on is next (:mod:`consumer.deserializers`)."""
        self._unyielded.give_back()
        batch = self._counted_poll(timeout_ms, max_records)
        if self._deserializers is None or not batch:
            return batch
        batch, back, failure = self._deserializers.batch(batch)
        self._fetcher.give_back(back)  # the failing record stays next: its place is not lost
        if failure is not None and not batch:
            raise failure
        return batch

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
        self._unyielded.give_back()
        return self._poll(timeout_ms, max_records, self._fetcher.poll_columns)

    def poll_batch(self, timeout_ms: int = 0, max_records: Optional[int] = None) -> Dict[TopicPartition, list]:
        """The fast path: what :meth:`poll` returns, each partition's records in the data
        plane's own form, with no object made per record — on Kafka librdkafka's ``Message`` objects
        as it made them (``m.value()``, ``m.offset()``, ...), on the embedded log its
        :class:`~consumer.log.Columns` (as :meth:`poll_columns`). Everything else is as for
        ``poll``: callbacks first, only owned partitions, nothing without the lease, positions
        advanced over what is returned (``commit()`` and ``position()`` mean the same),
        ``max_records``, pause and seek. No deserializers and no metrics count."""
        self._unyielded.give_back()
        return self._poll(timeout_ms, max_records, self._fetcher.poll_batch)

    def _poll(self, timeout_ms: int, max_records: Optional[int], take: Optional[Callable] = None) -> dict:
        """``poll()``, or with ``take`` (the fetcher's ``poll_columns`` or ``poll_batch``) those."""
        take = take or self._fetcher.poll
        self._check_open()
        if self._member.fenced is not None:
            raise self._member.fenced
        self.poll_interval.entered()
        try:
            if self._state is ConsumerState.EVICTED and self._set_state(ConsumerState.ACTIVE,
                                                                         expect={ConsumerState.EVICTED}):
                log.info("consumer %s rejoins group %s", self.consumer_id, self.group_id)
                self._member.rejoin()
            return self._hand_out.poll(timeout_ms, max_records, take)
        finally:
            self.poll_interval.left()

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """``for record in consumer``: :meth:`__next__`'s records, as a generator (faster per
        record); a new loop goes on where the last one stopped."""
        return self._unyielded.records(self._counted_poll, self._convert, self.config.consumer_timeout_ms,
                                       self._is_open)

    def __next__(self) -> ConsumerRecord:
        """The next record (``for record in consumer``), waiting up to ``consumer_timeout_ms``
        (default: until closed) for one; StopIteration then, or once closed. A record counts as
        consumed once it is yielded: a loop left by ``break`` leaves the position after the last
        record it saw, and the rest of the batch comes next (:mod:`consumer.iteration`)."""
        record = self._unyielded.pop(self._convert)  # the fast path: a record held
        if record is not None:
            return record
        return self._unyielded.next(self._counted_poll, self._convert, self.config.consumer_timeout_ms, self._is_open)

    def _is_open(self) -> bool:
        return self._state is not ConsumerState.CLOSED

    def _counted_poll(self, timeout_ms: float, max_records: Optional[int]) -> dict:
        if self._metrics is not None:
            return self._metrics.timed_poll(self._poll, timeout_ms, max_records)
        return self._poll(timeout_ms, max_records)

    def wakeup(self) -> None:
        """Interrupt a blocking ``poll()`` (raises WakeupException there). Safe from any thread."""
        self._hand_out.wakeup()

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

    def _on_fetch_error(self, tp: TopicPartition, exc: BaseException) -> None:
        self._changes.on_fetch_error(tp, exc)

    def _evict_overdue(self) -> None:
        """The watchdog found ``poll()`` overdue: leave the group (the next poll rejoins)."""
        if self._member.registered and self.evict_overdue():
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
        self._commits.commit(offsets)

    def commit_async(self, offsets: Optional[Dict[TopicPartition, int]] = None,
                     callback: Optional[Callable] = None) -> Future:
        """Commit on a background thread (one at a time, in order); ``callback(offsets,
        exception_or_None)`` runs there, with ``offsets`` as {partition: OffsetAndMetadata}
        (kafka-python's). Returns a ``concurrent.futures.Future``: its result is None, or
        the commit's exception."""
        return self._commits.commit_async(offsets, callback)

    def commit_completed(self, offsets: Dict[TopicPartition, int], completed: Dict[TopicPartition, bytes]) -> None:
        """Commit ``offsets`` with, in the same fenced transactions, the offsets completed above
        them (``completed``: {partition: encoded Completed}): a parallel consumer's commit
        (:mod:`consumer.parallel`). Raises as :meth:`commit`.

        :meta private:"""
        self._check_open()
        try:
            self._member.commit(offsets, completed)
        except CommitFailedError as e:
            self._commits.committed.record({tp: o for tp, o in offsets.items() if tp not in e.partitions})
            raise
        self._commits.committed.record(offsets)

    def committed(self, tp: TopicPartition, metadata: bool = False) -> Union[None, int, OffsetAndMetadata]:
        """The group's committed offset of ``tp`` (any partition, owned or not; None if nothing
        was committed), as an OffsetAndMetadata with ``metadata=True``. Raises
        ZooKeeperUnavailable when ZooKeeper cannot be reached."""
        offset = self._member.committed(tp)
        return OffsetAndMetadata(offset) if metadata and offset is not None else offset

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record ``poll()`` (or the iterator) hands out for ``tp``.
        IllegalStateError for a partition this consumer does not own (or whose start offset is
        not known yet)."""
        fetched = self._fetcher.position(tp)
        first = self._unyielded.first_offset(tp, fetched)
        return fetched if first is None else first

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` next (buffered records are dropped; a reported fetch
        error of ``tp`` is cleared). IllegalStateError for a partition this consumer does not own."""
        self._unyielded.take([tp])
        self._fetcher.seek(tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """``seek`` to the earliest retained offset (default: every owned partition)."""
        for tp, offset in self._plane.earliest_offsets(partitions or self.assignment()).items():
            self._fetcher.seek(tp, offset)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """``seek`` to the end (default: every owned partition): only new records follow."""
        for tp, offset in self._plane.latest_offsets(partitions or self.assignment()).items():
            self._fetcher.seek(tp, offset)

    # ------------------------------------------------------------ flow control

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching and returning ``partitions`` until ``resume`` (kept across rebalances
        for partitions that stay; partitions not owned are remembered but have no effect)."""
        self._user_paused |= set(partitions)
        self._unyielded.give_back(partitions)
        self._fetcher.pause(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        """Undo ``pause``; partitions not owned are ignored."""
        self._user_paused -= set(partitions)
        self._fetcher.resume(set(partitions) - self._handoff.pending_assigned())

    def paused(self) -> Set[TopicPartition]:
        """The partitions ``pause`` was called for (and not resumed)."""
        return set(self._user_paused)

    # ------------------------------------------------------------ for Streams, ConsumerMetrics, PartitionChanges (this package only)

    @property
    def closing(self) -> bool:
        """Whether ``close()`` has begun (it commits and revokes itself).

        :meta private:"""
        return self._state in (ConsumerState.CLOSING, ConsumerState.CLOSED)

    def evict_overdue(self) -> bool:
        """Move from ACTIVE to EVICTED, saying why once; False if not active (evicted or
        closing already). The next ``poll()`` rejoins.

        :meta private:"""
        if not self._set_state(ConsumerState.EVICTED, expect={ConsumerState.ACTIVE}):
            return False
        log.warning("consumer %s: poll() not called within max_poll_interval_ms=%d; leaving the group",
                    self.consumer_id, self.config.max_poll_interval_ms)
        return True

    def positions_of(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        """What a commit of ``partitions`` means: the positions of returned records, or in
        streams mode the positions of records the streams handed out.

        :meta private:"""
        if self._streams is not None:
            return self._streams.consumed(partitions)
        out = {}
        for tp in partitions:
            try:
                out[tp] = self.position(tp)
            except (KeyError, ZkGroupsError):
                continue
        return out

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
        self._fetcher.pause(self._changes.known(pause))
        self._fetcher.resume(self._changes.known(set(resume) - self._user_paused))

    def log_end_offsets(self, partitions: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        """The data plane's end offsets of ``partitions`` (ZkGroupsError if it does not answer).

        :meta private:"""
        return self._fetcher.end_offsets(partitions)

    # ------------------------------------------------------------ lifecycle

    def close(self, autocommit: bool = True) -> None:
        """Commit (if auto-commit and ``autocommit``) what was handed out, run
        on_partitions_revoked, leave the group. Once; later calls do nothing. Waits at most one
        session timeout for an unreachable ZooKeeper, then reports the partitions lost and
        leaves by session expiry."""
        if not self._set_state(ConsumerState.CLOSING, expect={ConsumerState.ACTIVE, ConsumerState.EVICTED}):
            return
        self._unyielded.give_back()
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
                self._fetcher.pause(self._changes.known(owned))
                self._changes.finish_revocation(Revocation(owned))
            elif owned:
                log.warning("consumer %s: ZooKeeper unreachable; closing without committing, its partitions "
                            "move when the session ends", self.consumer_id)
                self.listener.on_partitions_lost(owned)
            self._member.close(timeout=30.0 if reachable else 1.0)
        finally:
            self._set_state(ConsumerState.CLOSED)
            self._fetcher.close()
            self._commits.close()
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

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """Close; without committing when an exception leaves the ``with`` block (its records
        may not have been processed: kafka-python 3 does the same)."""
        self.close(autocommit=exc_type is None)
