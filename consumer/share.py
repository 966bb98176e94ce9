"""The ``ShareConsumer``: a member of a share group, a queue over topics (KIP-932's share groups).

Every member may receive records of every partition of its topics; each record is locked to
the member it was given to until that member acknowledges it or the lock ends, then it is
delivered again (up to the group's delivery limit, after the group's backoff), archived, and
written to the group's dead-letter topic if it has one. So a share group may have more members
than partitions, and a slow record holds up no other. No order is promised, not even within a
partition. The state lives in ZooKeeper per share-partition, changed a poll's worth at a time
(:mod:`consumer.share_exchange`); lock expiry and backoff are judged by the group's coordinator
alone, by its own clock (:mod:`coordinator.share_decider`).

.. code-block:: python

    from consumer import ShareConsumer, AcknowledgeType

    with ShareConsumer("workers", ["jobs"], share_acknowledgement_mode="explicit") as consumer:
        while True:
            for record in consumer.poll(timeout_ms=1000):
                try:
                    handle(record)
                    consumer.acknowledge(record)                            # ACCEPT
                except Retryable:
                    consumer.acknowledge(record, AcknowledgeType.RELEASE, delay_ms=5000)
                except Exception:
                    consumer.acknowledge(record, AcknowledgeType.REJECT)    # archived / dead-lettered
            consumer.commit_sync()

Acknowledgement modes (``share_acknowledgement_mode``): ``implicit`` (the default) — every
record a ``poll()`` returned is accepted by the next ``poll()``, ``commit_sync()``,
``commit_async()`` or ``close()``; ``explicit`` — the application acknowledges each record,
and ``poll()`` refuses to run while a record of the previous one has no acknowledgement
(a RENEW does not count: the record stays held, its lock extended). Acknowledgements are sent
with the next ``poll()`` or ``commit_sync()``/``commit_async()``/``close()``.

Threads: like Kafka's, a ShareConsumer is not thread-safe — one application thread calls it,
but for ``wakeup()``. Its only other thread is kazoo's, which records a lost session
(the member registers again on the next call).
"""
from __future__ import annotations

import enum
import logging
import os
import random
import socket
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from coordinator import config as cfg
from coordinator.acl import parse_auth
from coordinator.errors import AcknowledgementRefused, CorruptZnode, IllegalStateError, InvalidConfig, ZkGroupsError
from coordinator.lifecycle import Lifecycle
from coordinator.protocol import topic_matcher, validate_name
from coordinator.protocol.share import (ShareGroupConfig, ShareMember, share_group_path, share_members_path)
from coordinator.share_partition import AcknowledgeType
from coordinator.zkclient import LOST_CONNECTION, REPLACE, close_client, create_ephemeral, start_client
from coordinator.zktls import parse_tls
from consumer.dataplane import DataPlane, open_data_plane, topic_partitions
from consumer.hand_out import WakeupException
from consumer.joining import join_waiting_out_lost_connections
from consumer.records import ShareRecord, TopicPartition
from consumer.share_buffer import Prefetched
from consumer.share_exchange import CONNECTION_ERRORS, Ack, Outcome, ShareExchange, member_gone

log = logging.getLogger("zkgroups.share")

MODES = ("implicit", "explicit")
#: An idle poll looks again after this, doubling up to the max (records released elsewhere, new records).
IDLE_WAIT_S, IDLE_WAIT_MAX_S = 0.02, 0.2
#: The partitions of a pattern's (or a growing topic's), and the group's member count, are looked up again this often.
REFRESH_S = 2.0

#: (record or (topic, partition, offset), result) — what an acknowledgement commit callback gets per partition.
AckCallback = Callable[[Dict[TopicPartition, List[int]], Optional[Exception]], None]


class ShareConsumerState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


class ShareConsumer(Lifecycle[ShareConsumerState]):
    """A member of the share group ``group_id`` over ``topics`` (names) or ``pattern`` (a regex
    that must match a whole topic name), on the embedded log under ``data_dir`` or on Kafka at
    ``bootstrap_servers``.

    States: OPEN --close()--> CLOSED (once; a second ``close()`` does nothing; every other call
    after it raises IllegalStateError)."""

    TRANSITIONS = {ShareConsumerState.OPEN: {ShareConsumerState.CLOSED}, ShareConsumerState.CLOSED: set()}

    def __init__(self, group_id: str, topics: Union[None, str, Sequence[str]] = None, pattern: Optional[str] = None,
                 *, zk: Any = None, data_dir: Optional[str] = None, bootstrap_servers: str = "",
                 share_acknowledgement_mode: str = "implicit", max_poll_records: int = 500,
                 acknowledgement_commit_callback: Optional[AckCallback] = None, client_id: str = "zkgroups",
                 session_timeout_ms: int = cfg.DEFAULT_SESSION_TIMEOUT_MS, connect_timeout_s: float = 10.0,
                 kafka: Optional[dict] = None, log_options: Optional[dict] = None,
                 zk_auth: Any = None, zk_tls: Any = None, zk_sasl: Any = None) -> None:
        super().__init__(ShareConsumerState.OPEN)
        self.group_id = validate_name(group_id, "group")
        self.topics, self.pattern = _subscription(topics, pattern)
        if share_acknowledgement_mode not in MODES:
            raise InvalidConfig(f"share_acknowledgement_mode must be implicit or explicit, "
                                f"not {str(share_acknowledgement_mode)[:40]!r}")
        if not isinstance(max_poll_records, int) or not 1 <= max_poll_records <= 100_000:
            raise InvalidConfig(f"max_poll_records must be between 1 and 100,000, not {max_poll_records!r}")
        self.explicit = share_acknowledgement_mode == "explicit"
        self.max_poll_records = max_poll_records
        self.callback = acknowledgement_commit_callback
        self.member_id = validate_name(f"{group_id}_{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}", "member id")
        self._member = ShareMember(self.topics, self.pattern or "", _host(), client_id)
        self._handed: Dict[TopicPartition, Dict[int, int]] = {}   # given to the application: offset -> token
        self._pending: Dict[TopicPartition, Dict[int, Tuple[AcknowledgeType, int]]] = {}  # offset -> (type, delay)
        self._renewed: Dict[TopicPartition, set] = {}
        self._refused: Dict[TopicPartition, List[int]] = {}
        self._acknowledged: set = set()                            # partitions acknowledged since the last commit
        self._partitions: List[TopicPartition] = []
        self._buffer = Prefetched()                                # acquired, not handed out yet
        self._pending_since = 0.0                                  # when the oldest unsent acknowledgement was made
        self._members = 1                                          # the group's members, as last counted
        self._refreshed = 0.0
        self._turn = random.randrange(1 << 16)  # members start at different partitions
        self._wakeup = threading.Event()
        self._lost = threading.Event()
        self._group_config = ShareGroupConfig()
        self._own_client = not (zk is not None and not isinstance(zk, str))
        self._client = start_client(zk or cfg.default_connect(), session_timeout_ms, connect_timeout_s,
                                    auth=parse_auth(zk_auth, "zk_auth"), tls=parse_tls(zk_tls, "zk_tls"),
                                    sasl=parse_auth(zk_sasl, "zk_sasl")) if self._own_client else zk
        try:
            self._plane: DataPlane = open_data_plane(data_dir=data_dir, bootstrap_servers=bootstrap_servers or None,
                                                     kafka=kafka, zk=self._client, log_options=log_options)
            self._exchange = ShareExchange(self._client, self._plane, self.group_id, self.member_id,
                                           lambda: self._group_config)
            self._join(connect_timeout_s)
        except BaseException:
            if self._own_client:
                close_client(self._client)
            raise

    # ------------------------------------------------------------ the group

    def _join(self, report_every: float) -> None:
        """Follow the connection and the group's settings, then join (refuse a consumer group's
        name, register), waiting out a lost connection as a consumer-group member does."""
        self._client.add_listener(self._connection_changed)   # first: a session ended while joining is noticed
        try:
            self._client.DataWatch(share_group_path(self.group_id), self._settings_changed)   # kazoo's thread
        except LOST_CONNECTION:
            pass   # the watch's own listener reads the settings again once the client is connected
        join_waiting_out_lost_connections(self._client, self.group_id, self.member_id, self._join_once, report_every)

    def _join_once(self) -> None:
        from coordinator.protocol import ids_path
        if self._client.exists(ids_path(self.group_id)) and self._client.get_children(ids_path(self.group_id)):
            raise InvalidConfig(f"group {self.group_id} is a consumer group with members; "
                                f"a share group needs a name of its own")
        self._client.ensure_path(share_members_path(self.group_id))
        self._register()
        self._refresh_partitions()

    def _settings_changed(self, data, _stat) -> None:
        if data is not None:
            try:
                self._group_config = ShareGroupConfig.decode(data, share_group_path(self.group_id))
            except Exception as e:  # a corrupt znode: keep the settings we had, say why once per change
                log.error("share group %s: %s; keeping its previous settings", self.group_id, e)

    def _connection_changed(self, state) -> None:
        if state == KazooState.LOST:   # kazoo's thread: record only
            self._lost.set()

    def _register(self) -> None:
        self._lost.clear()
        self._exchange.unregistered = False
        create_ephemeral(self._client, share_members_path(self.group_id, self.member_id), self._member.encode(),
                         lambda _holder: REPLACE, stopped=lambda: self.state is ShareConsumerState.CLOSED)

    def _refresh_partitions(self) -> None:
        if self.pattern is not None:
            matcher = topic_matcher(self.pattern)
            counts = {t: n for t, n in self._plane.partition_counts().items() if matcher.fullmatch(t)}
        else:
            counts = topic_partitions(self._plane, self._client, self.topics)
        self._partitions = [TopicPartition(t, p) for t in sorted(counts) for p in range(counts[t])]
        self._members = max(1, len(self._client.get_children(share_members_path(self.group_id))))
        self._refreshed = time.monotonic()

    def _keep_up(self) -> None:
        """Register again after a lost session, look at the partitions and members again when
        due, give back what waited too long."""
        if self._lost.is_set() or self._exchange.unregistered:
            self._register_again()
        if time.monotonic() - self._refreshed > REFRESH_S:
            self._refresh_partitions()
        self._buffer.drop_stale(self._group_config.lock_duration_ms)

    def _register_again(self) -> None:
        """The session ended or the registration is gone: the coordinator releases what this
        member held, so what it acquired and did not hand out is forgotten; register again."""
        self._buffer.forget()
        self._register()

    def _fair_share(self) -> int:
        """The most records this member takes at once: its share of the records the group may
        have in flight (each partition's lock limit), so that when members far outnumber what
        may be in flight, every member still gets some (32 members, 4 partitions: 250 each)."""
        return max(1, self._group_config.max_record_locks * len(self._partitions) // self._members)

    # ------------------------------------------------------------ the API

    def poll(self, timeout_ms: float = 0, max_records: Optional[int] = None) -> List[ShareRecord]:
        """Records acquired for this member (at most ``max_poll_records``, or ``max_records``),
        waiting up to ``timeout_ms`` for some; [] if none came. First sends the acknowledgements
        of the previous poll (implicit mode: all of its records accepted)."""
        self._check_open()
        self._close_previous_poll()
        want = min(max_records or self.max_poll_records, self.max_poll_records)
        deadline = time.monotonic() + max(0.0, timeout_ms) / 1000
        wait = IDLE_WAIT_S
        while True:
            lock_ms = self._group_config.lock_duration_ms
            try:
                self._keep_up()
                if not self._buffer or (self._pending and time.monotonic() - self._pending_since > lock_ms / 4000):
                    self._round(self._buffer.acquisition_size(self.max_poll_records, self._fair_share()))
            except CONNECTION_ERRORS:   # ZooKeeper away: what was not written waits (bounded: ZooKeeperUnavailable)
                self._exchange.wait_connected()
            records = self._buffer.take(want, self._handed, lock_ms)
            left = deadline - time.monotonic()
            if records or left <= 0:
                return records
            if self._wakeup.wait(min(wait, left)):
                self._wakeup.clear()
                raise WakeupException("wakeup() was called")
            wait = min(wait * 2, IDLE_WAIT_MAX_S)

    def acknowledge(self, record: ShareRecord, type: AcknowledgeType = AcknowledgeType.ACCEPT,
                    delay_ms: int = 0) -> None:
        """Say what became of ``record`` (explicit mode): ACCEPT (processed), RELEASE (deliver it
        again, not before ``delay_ms`` or the group's backoff), REJECT (archive it), RENEW (still
        working: extend its lock). Sent with the next poll or commit."""
        self._check_open()
        if not self.explicit:
            raise IllegalStateError("acknowledge() needs share_acknowledgement_mode='explicit'")
        if not isinstance(type, AcknowledgeType):
            raise InvalidConfig(f"type must be an AcknowledgeType, not {type!r}")
        if not isinstance(delay_ms, int) or not 0 <= delay_ms <= 3_600_000 or (delay_ms and type is not
                                                                                 AcknowledgeType.RELEASE):
            raise InvalidConfig(f"delay_ms must be 0..3,600,000 and only with RELEASE, not {delay_ms!r}")
        tp = TopicPartition(record.topic, record.partition)
        if record.offset not in self._handed.get(tp, ()):
            raise IllegalStateError(f"record {tp}@{record.offset} is not held by this consumer "
                                    f"(acknowledged already, or not delivered to it)")
        self._pending.setdefault(tp, {})[record.offset] = (type, delay_ms)
        self._pending_since = self._pending_since or time.monotonic()
        if type is AcknowledgeType.RENEW:
            self._renewed.setdefault(tp, set()).add(record.offset)

    def commit_sync(self) -> Dict[TopicPartition, Optional[AcknowledgementRefused]]:
        """Send the acknowledgements now (implicit mode: of every record the last poll returned).
        Returns {partition: None, or the AcknowledgementRefused of the records whose lock had
        ended} for every partition acknowledged since the last commit."""
        self._check_open()
        self._close_previous_poll(committing=True)
        self._flush()
        results = {tp: None for tp in self._acknowledged}
        results.update({tp: AcknowledgementRefused(tp, offsets) for tp, offsets in self._refused.items()})
        self._refused, self._acknowledged = {}, set()
        return results

    def commit_async(self) -> None:
        """Send the acknowledgements now; their results go to the acknowledgement commit callback."""
        self.commit_sync()

    def wakeup(self) -> None:
        """Make a blocked (or the next) ``poll()`` raise WakeupException (any thread)."""
        self._wakeup.set()

    def assignment(self) -> List[TopicPartition]:
        """The partitions this member takes records from: every partition of its topics."""
        return list(self._partitions)

    def stats(self) -> Dict[str, int]:
        """What this member wrote: share-partition writes and the races it lost."""
        return {"writes": self._exchange.writes, "conflicts": self._exchange.conflicts}

    def close(self) -> None:
        """Send the acknowledgements (implicit mode: accept what the last poll returned; explicit:
        release what has none), leave the group, and release the clients."""
        if self.state is ShareConsumerState.CLOSED:
            return
        try:
            self._close_previous_poll(committing=True, closing=True)
            self._buffer.give_back_all()
            self._flush()
        except Exception as e:  # ZooKeeper away: the coordinator releases our records when our member znode goes
            log.warning("share group %s: acknowledgements not sent at close (%s)", self.group_id, e)
        self._set_state(ShareConsumerState.CLOSED)
        try:
            member_gone(self._client, self.group_id, self.member_id)
        except Exception:
            pass
        self._plane.close()
        if self._own_client:
            close_client(self._client)

    def __enter__(self) -> "ShareConsumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ polls and writes

    def _check_open(self) -> None:
        if self.state is ShareConsumerState.CLOSED:
            raise IllegalStateError("this ShareConsumer is closed")

    def _close_previous_poll(self, committing: bool = False, closing: bool = False) -> None:
        """Implicit mode: accept every record handed out. Explicit: a poll may not start while a
        record has no acknowledgement (a commit just sends what there is; a close releases the rest)."""
        for tp, offsets in self._handed.items():
            pending = self._pending.get(tp, {})
            renewed = self._renewed.get(tp, set())
            missing = [o for o in offsets if o not in pending and o not in renewed]
            if not missing:
                continue
            pending = self._pending.setdefault(tp, pending)
            if not self._pending_since:
                self._pending_since = time.monotonic()
            if not self.explicit:
                pending.update((o, (AcknowledgeType.ACCEPT, 0)) for o in missing)
            elif closing:
                pending.update((o, (AcknowledgeType.RELEASE, 0)) for o in offsets if o not in pending)
            elif not committing:
                raise IllegalStateError(f"explicit acknowledgement: {len(missing)} record(s) of {tp} from the "
                                        f"last poll have none (first: offset {min(missing)}); acknowledge them first")

    def _acks_of(self, tp: TopicPartition) -> Dict[int, List[Ack]]:
        """The pending acknowledgements of ``tp`` as {token: ranges of one type}."""
        handed = self._handed.get(tp, {})
        out: Dict[int, List[Ack]] = {}
        for offset in sorted(self._pending.get(tp, ())):
            kind, delay = self._pending[tp][offset]
            token = handed.get(offset)
            if token is None:
                continue
            acks = out.setdefault(token, [])
            if acks and acks[-1][1] + 1 == offset and acks[-1][2:] == (kind, delay):
                acks[-1] = (acks[-1][0], offset, kind, delay)
            else:
                acks.append((offset, offset, kind, delay))
        return out

    def _round(self, want: int) -> None:
        """One pass over the partitions: each with acknowledgements or undelivered records to
        send, or while records are still wanted, gets one write (all of it together); what is
        acquired goes to the buffer."""
        n = len(self._partitions)
        if not n:
            return
        self._turn += 1
        order = [self._partitions[(self._turn + i) % n] for i in range(n)]
        for tp in sorted(order, key=lambda p: p not in self._pending):   # acknowledgements first
            wanted = want - self._buffer.size
            if wanted <= 0 and tp not in self._pending and not self._buffer.undelivered.get(tp):
                continue
            self._write(tp, max(0, wanted))

    def _flush(self) -> None:
        """Send every pending acknowledgement and undelivered record (no acquisition), riding
        out a lost connection (bounded: ZooKeeperUnavailable)."""
        for tp in set(self._pending) | set(self._buffer.undelivered):
            while True:
                try:
                    self._write(tp, 0)
                    break
                except CONNECTION_ERRORS:
                    self._exchange.wait_connected()

    def _write(self, tp: TopicPartition, want: int) -> None:
        started = time.monotonic()
        outcome = self._exchange.exchange(tp, self._acks_of(tp), want, self._buffer.undelivered.get(tp, ()))
        if not outcome.written and self._exchange.unregistered:   # write again once registered
            self._register_again()
            outcome = self._exchange.exchange(tp, self._acks_of(tp), want, self._buffer.undelivered.get(tp, ()))
        if outcome.written:
            self._buffer.undelivered.pop(tp, None)
            self._acknowledgements_sent(tp, outcome)
            self._buffer.add(tp, outcome.token, started, outcome.records)

    def _acknowledgements_sent(self, tp: TopicPartition, outcome: Outcome) -> None:
        pending = self._pending.pop(tp, {})
        if not self._pending:
            self._pending_since = 0.0
        handed, renewed = self._handed.get(tp, {}), self._renewed.get(tp, set())
        for offset, (kind, _) in pending.items():
            if kind is AcknowledgeType.RENEW:
                continue
            handed.pop(offset, None)
            renewed.discard(offset)
        refused = [o for a, b in outcome.refused for o in range(a, b + 1) if o in pending]
        for offset in refused:
            handed.pop(offset, None)
            renewed.discard(offset)
        if pending:
            self._acknowledged.add(tp)
        if refused:
            self._refused.setdefault(tp, []).extend(refused)
        if outcome.letters[1]:
            self._exchange.write_letters(tp, outcome)
        if self.callback is not None and pending:
            error = AcknowledgementRefused(tp, refused) if refused else None
            self.callback({tp: sorted(o for o in pending if pending[o][0] is not AcknowledgeType.RENEW)}, error)


#: Compare-and-set attempts of :func:`configure_share_group` before it gives up (the settings kept changing).
CONFIGURE_TRIES = 10


def configure_share_group(zk: Any, group_id: str, settings: Mapping[str, object]) -> Tuple[ShareGroupConfig, bool]:
    """Set ``settings`` ({Kafka-style key: value}, e.g. ``{"share.auto.offset.reset": "earliest"}``)
    of the share group ``group_id`` through the started client ``zk``, creating the group if it
    does not exist; the other settings keep their values. Returns (the settings now, whether
    the group was created). A bad key or value is InvalidConfig and changes nothing."""
    updates = {str(k): str(v) for k, v in settings.items()}
    ShareGroupConfig().with_settings(updates)   # checked before anything is written
    path = share_group_path(validate_name(group_id, "group"))
    for _ in range(CONFIGURE_TRIES):
        try:
            raw, stat = zk.get(path)
        except NoNodeError:
            config = ShareGroupConfig().with_settings(updates)
            try:
                zk.create(path, config.encode(), makepath=True)
                return config, True
            except NodeExistsError:
                continue
        try:
            current = ShareGroupConfig.decode(raw, path)
        except CorruptZnode as e:
            log.warning("%s; the settings not given start from their defaults", e)
            current = ShareGroupConfig()
        config = current.with_settings(updates)
        try:
            zk.set(path, config.encode(), version=stat.version)
            return config, False
        except (BadVersionError, NoNodeError):
            continue
    raise ZkGroupsError(f"share group {group_id!r}: its settings kept changing while configuring; nothing was set")


def _subscription(topics, pattern) -> Tuple[List[str], Optional[str]]:
    if (topics is None) == (pattern is None):
        raise InvalidConfig("give topics or a pattern (one of them)")
    if pattern is not None:
        try:
            topic_matcher(pattern)
        except ValueError as e:
            raise InvalidConfig(str(e)) from None
        return [], pattern
    names = [topics] if isinstance(topics, str) else list(topics)
    if not names:
        raise InvalidConfig("give at least one topic")
    return [validate_name(t) for t in names], None


def _host() -> str:
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:60]
    return name or "host"
