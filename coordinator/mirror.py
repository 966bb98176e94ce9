"""The topic mirror: the topics of a KRaft Kafka cluster, written into ``/brokers/topics`` by the
leading coordinator, so that watches and rebalances work as they do with a Kafka in ZooKeeper
mode (which registers its topics there itself; a KRaft cluster keeps them in its own metadata
log).

While a node leads, its :class:`TopicMirror` reads the cluster's topics and partition counts (a
Metadata request through librdkafka's AdminClient; internal ``__`` topics left out), compares
them with the registry (:func:`plan_mirror`, pure) and writes each difference in Kafka's format.

Guarantees:

* Every write is a ZooKeeper transaction whose first operation checks the controller's epoch, and
  whose second is a compare-and-set on the topic znode: a deposed leader's mirror writes
  nothing (it stops and ends the term), and a znode someone changed meanwhile is read again.
* Only znodes the mirror wrote are grown or removed: they carry :data:`~coordinator.protocol.cluster.MIRROR_MARK`
  with the id of the Kafka cluster they came from (Kafka's decoder ignores keys it does not
  know). A znode written by anyone else (``groupctl``, a Kafka in ZooKeeper mode, an operator
  who rewrote a mirrored one) or mirrored from another Kafka cluster is left as it is, with one
  line if it disagrees with Kafka. The mark travels with the znode, so every new leader knows
  which znodes are the mirror's without state of its own.
* It never competes with a Kafka in ZooKeeper mode: while brokers are registered under
  ``/brokers/ids`` in the same ZooKeeper (and chroot), that Kafka writes ``/brokers/topics``
  itself, and the mirror writes nothing (one error line).
* Partition counts only grow: a topic Kafka reports with fewer partitions than mirrored keeps
  the known count, with one error line while that lasts.
* A topic deleted in Kafka has its mirrored znode removed, with one line; the coordinator then
  rebalances the groups that consumed it.
* Kafka unreachable, or a topic whose metadata carries an error: nothing is written or removed
  for it, so the last known topics stay. One warning when an outage begins (and one per new
  kind of error while it lasts: refused connections, timeouts and brokers down are one kind;
  authentication or TLS failures others), one line when Kafka answers again; librdkafka's own
  lines go to the ``zkgroups.mirror.librdkafka`` logger at DEBUG. A Metadata request waits at
  most the interval (between 1 and 10 s).
* The work runs on the mirror's own thread, every ``interval_ms`` and at once after
  :meth:`TopicMirror.request_refresh`, which only sets a flag (safe from any thread, a watch
  callback included).

Not provided: Kafka's topic ids are not mirrored, so a topic deleted and re-created between two
refreshes with as many partitions as before is not noticed (nor, with fewer, told apart from a
shrink); groups' committed offsets of a deleted topic stay in ZooKeeper.
"""
from __future__ import annotations

import enum
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple

from coordinator import protocol, read
from coordinator.errors import InvalidConfig, InvalidName
from coordinator.kafka import DEFAULT_TIMEOUT_S, check_bootstrap_servers, confluent_kafka, librdkafka_config
from coordinator.lifecycle import Lifecycle
from coordinator.protocol import TopicZnode
from coordinator.fencing import Deposed, Fence, fenced_commit
from coordinator.topics import TopicRegistry
from coordinator.zkclient import TransactionFailed

log = logging.getLogger("zkgroups.mirror")
librdkafka_log = logging.getLogger("zkgroups.mirror.librdkafka")

DEFAULT_INTERVAL_MS = 10000
#: librdkafka defaults of the mirror's client (the ``[kafka]`` properties may override them).
MIRROR_CLIENT_DEFAULTS = {"client.id": "zkgroups-topic-mirror"}


# ---------------------------------------------------------------- the plan (pure)

@dataclass
class MirrorPlan:
    """What to write so the registry says what Kafka says."""
    create: Dict[str, int] = field(default_factory=dict)               # topic -> partitions
    grow: Dict[str, Tuple[int, int]] = field(default_factory=dict)     # topic -> (mirrored, Kafka's)
    remove: List[str] = field(default_factory=list)                    # deleted in Kafka
    kept: Dict[str, Tuple[int, int]] = field(default_factory=dict)     # fewer in Kafka: (mirrored, Kafka's)
    left_alone: Dict[str, str] = field(default_factory=dict)           # topic -> why its znode is not touched

    @property
    def writes(self) -> int:
        return len(self.create) + len(self.grow) + len(self.remove)


def _not_mirrorable(topic: str, partitions: int) -> Optional[str]:
    try:
        protocol.validate_name(topic)
    except InvalidName as e:
        return str(e)
    if partitions > protocol.MAX_PARTITIONS:
        return (f"it has {partitions:,} partitions in Kafka, more than the {protocol.MAX_PARTITIONS:,} "
                "a topic may have here")
    return None


def plan_mirror(kafka: Mapping[str, Optional[int]], registry: Mapping[str, Optional[TopicZnode]],
                cluster_id: str) -> MirrorPlan:
    """The writes that make ``registry`` follow ``kafka``.

    ``kafka``: topic -> partition count as the cluster ``cluster_id`` reports it (None: its
    metadata has an error; such a topic is left as it is). ``registry``: topic -> its znode
    (None: unreadable). A znode is the mirror's to grow or remove only if it carries this
    cluster's mark."""
    plan = MirrorPlan()
    for topic, count in sorted(kafka.items()):
        if count is None:
            continue
        if topic not in registry:
            problem = _not_mirrorable(topic, count)
            if problem:
                plan.left_alone[topic] = problem
            else:
                plan.create[topic] = count
            continue
        znode = registry[topic]
        if znode is None:
            plan.left_alone[topic] = "its znode is unreadable"
        elif znode.mirrored_from != cluster_id:
            if znode.partitions != count:
                owner = ("it was not written by the mirror" if znode.mirrored_from is None
                         else f"it was mirrored from Kafka cluster {znode.mirrored_from!r}")
                plan.left_alone[topic] = (f"{owner} (it says {znode.partitions} partitions, "
                                          f"Kafka says {count})")
        elif count > znode.partitions:
            problem = _not_mirrorable(topic, count)
            if problem:
                plan.left_alone[topic] = problem
            else:
                plan.grow[topic] = (znode.partitions, count)
        elif count < znode.partitions:
            plan.kept[topic] = (znode.partitions, count)
    plan.remove = sorted(topic for topic, znode in registry.items()
                         if topic not in kafka and znode is not None and znode.mirrored_from == cluster_id)
    return plan


# ---------------------------------------------------------------- what Kafka says

@dataclass
class KafkaTopics:
    """One Metadata answer: the cluster's id, and per topic its partitions' replica lists
    (None for a topic whose metadata carries an error). Internal ``__`` topics left out."""
    cluster_id: str
    replicas: Dict[str, Optional[Dict[int, List[int]]]]

    def counts(self) -> Dict[str, Optional[int]]:
        return {t: (None if r is None else len(r)) for t, r in self.replicas.items()}

    @classmethod
    def from_metadata(cls, metadata) -> "KafkaTopics":
        replicas: Dict[str, Optional[Dict[int, List[int]]]] = {}
        for name, topic in metadata.topics.items():
            if name.startswith("__"):
                continue
            parts = {p.id: list(p.replicas) for p in topic.partitions.values()}
            usable = topic.error is None and parts and sorted(parts) == list(range(len(parts)))
            replicas[name] = parts if usable else None
        return cls(metadata.cluster_id or "", replicas)


# ---------------------------------------------------------------- the client

def _partitions(*counts: int) -> str:
    return " to ".join(str(n) for n in counts) + (" partition" if counts[-1] == 1 else " partitions")


class _DebugLog:
    """librdkafka's log lines at DEBUG: an unreachable cluster makes it log every connection
    attempt, and the mirror reports an outage itself, once."""

    def log(self, level, message, *args):
        librdkafka_log.debug(message, *args)


_QUOTED_VALUE = re.compile(r'Invalid value "[^"]*" for')


def client_config(bootstrap_servers: str, properties: Optional[Mapping[str, object]], on_error) -> dict:
    """The mirror's librdkafka configuration: the user's ``[kafka]`` properties over
    :data:`MIRROR_CLIENT_DEFAULTS`; log lines and errors go to the mirror."""
    config = librdkafka_config(check_bootstrap_servers(bootstrap_servers), properties, MIRROR_CLIENT_DEFAULTS)
    config.update(logger=_DebugLog(), error_cb=on_error)
    return config


def make_admin_client(bootstrap_servers: str, properties: Optional[Mapping[str, object]], on_error=None):
    """An AdminClient for the mirror; a property librdkafka refuses is one InvalidConfig line
    that never shows a value (it may be a secret)."""
    ck = confluent_kafka()
    from confluent_kafka.admin import AdminClient
    try:
        return AdminClient(client_config(bootstrap_servers, properties, on_error or (lambda err: None)))
    except (ck.KafkaException, ValueError, TypeError) as e:
        error = e.args[0] if e.args else e
        message = error.str() if hasattr(error, "str") else str(error)
        raise InvalidConfig(f"[kafka] properties: {_QUOTED_VALUE.sub('Invalid value for', message)}") from None


def check_mirror_config(bootstrap_servers: str, properties: Optional[Mapping[str, object]]) -> None:
    """Fail now, with one line, on what would stop the mirror later: confluent-kafka missing,
    bad bootstrap servers, properties librdkafka refuses. Sends nothing to Kafka."""
    make_admin_client(bootstrap_servers, properties)


# ---------------------------------------------------------------- the mirror

#: librdkafka's errors that all mean "no broker answered": one kind of outage, said once.
_UNREACHABLE = frozenset({"_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN", "_RESOLVE",
                          "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION"})


class _NoAnswer(Exception):
    """Kafka did not answer the Metadata request: ``kind`` is "unreachable" or librdkafka's
    error name (authentication, TLS, ...)."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


class _Stopping(Exception):
    """The mirror was stopped, or leadership is suspended: write nothing more now."""


class MirrorState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class TopicMirror(Lifecycle[MirrorState]):
    """Mirrors the topics of the Kafka cluster at ``bootstrap_servers`` into ``/brokers/topics``,
    fenced by the controller's ``fence`` (its epoch), for one term as controller.

    States (:class:`MirrorState`): NEW --start()--> RUNNING --stop(), or deposed--> STOPPED;
    NEW --stop()--> STOPPED. ``start()`` runs once (later calls do nothing; after ``stop()`` IllegalStateError); ``stop()`` may be
    called any number of times, from any thread (each waits for the thread).

    Threads: the mirror's own thread (``topic-mirror``) does all Kafka and ZooKeeper work and
    alone touches the AdminClient and the reporting state. :meth:`request_refresh` and
    :meth:`stop` only set events; ``refreshes`` (a count, for observers) is written by the
    mirror's thread only. ``active()`` (False while leadership is suspended) and
    ``on_deposed(reason)`` are called on the mirror's thread.
    """

    TRANSITIONS = {MirrorState.NEW: {MirrorState.RUNNING, MirrorState.STOPPED},
                   MirrorState.RUNNING: {MirrorState.STOPPED}, MirrorState.STOPPED: set()}

    def __init__(self, client, fence: Fence, bootstrap_servers: str, properties: Optional[Mapping[str, object]] = None,
                 interval_ms: int = DEFAULT_INTERVAL_MS, active: Callable[[], bool] = lambda: True,
                 on_deposed: Callable[[str], None] = lambda reason: None):
        super().__init__(MirrorState.NEW)
        self.client, self.fence, self.epoch = client, fence, fence.epoch
        self.servers = check_bootstrap_servers(bootstrap_servers)
        self._properties = dict(properties or {})
        self.interval_s = interval_ms / 1000.0
        # A Metadata answer normally takes a round trip; an unreachable cluster costs this much
        # of the mirror's thread per refresh (never the leader's).
        self.timeout_s = min(DEFAULT_TIMEOUT_S, max(1.0, self.interval_s))
        self._active, self._on_deposed = active, on_deposed
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._admin = None
        self.refreshes = 0
        # Reporting (mirror thread only): what was said, so each problem is said once while it lasts.
        self._outage_since: Optional[float] = None
        self._outage_kinds: Set[str] = set()
        self._last_client_error = ""
        self._reported: Set[tuple] = set()
        self._troubles: Set[str] = set()
        self._zookeeper_mode_said = False

    @property
    def stopping(self) -> bool:
        return self.state is MirrorState.STOPPED

    # ------------------------------------------------------------ lifecycle (any thread)

    def start(self) -> "TopicMirror":
        if not self._start_once(MirrorState.RUNNING):
            return self
        self._thread = threading.Thread(target=self._run, name="topic-mirror", daemon=True)
        self._thread.start()
        return self

    def request_refresh(self) -> None:
        """Refresh at once (coalesced with one already asked for). Never blocks."""
        self._wake.set()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop; wait at most ``timeout`` s for the thread (a Metadata request under way ends by
        itself; no write is begun after this returns)."""
        self._set_state(MirrorState.STOPPED)
        self._wake.set()
        thread = self._thread
        if thread and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------ the mirror's thread

    def _run(self) -> None:
        while not self.stopping:
            self._wake.clear()
            deposed = None
            try:
                self._refresh()
                self._troubles.clear()
            except Deposed as e:
                deposed = e
            except _Stopping:
                pass
            except Exception as e:  # ZooKeeper trouble, a bug: said once per kind, tried again next time
                kind = type(e).__name__
                if kind not in self._troubles and not self.stopping:
                    self._troubles.add(kind)
                    log.warning("topic mirror: refresh failed (%s: %s); trying again every %g s", kind, e,
                                self.interval_s)
            self.refreshes += 1
            if deposed is not None:
                log.warning("topic mirror: epoch %d is no longer current; it writes nothing more", self.epoch)
                self.stop(timeout=0)
                self._on_deposed(str(deposed))
                return
            self._wake.wait(self.interval_s)

    def _refresh(self) -> None:
        if not self._active():
            return
        try:
            kafka = self._read_kafka()
        except _NoAnswer as e:
            self._unreachable(e)
            return
        self._reachable()
        if self.stopping:  # stopped during the Metadata request: the term is over
            raise _Stopping()
        if self._zookeeper_mode_kafka():
            return
        znodes = TopicRegistry(self.client).znodes()
        versions = {topic: version for topic, (_, version) in znodes.items()}
        plan = plan_mirror(kafka.counts(), {topic: znode for topic, (znode, _) in znodes.items()}, kafka.cluster_id)
        self._report(plan)
        for topic, count in plan.create.items():
            if self._write(topic, lambda t, path: t.create(path, protocol.encode_mirrored_topic(
                    kafka.replicas[topic], kafka.cluster_id))):
                log.info("topic mirror: topic %s mirrored from Kafka (%s)", topic, _partitions(count))
        for topic, (known, count) in plan.grow.items():
            if self._write(topic, lambda t, path: t.set_data(path, protocol.encode_mirrored_topic(
                    kafka.replicas[topic], kafka.cluster_id), version=versions[topic])):
                log.info("topic mirror: topic %s grew in Kafka from %s", topic, _partitions(known, count))
        for topic in plan.remove:
            if self._write(topic, lambda t, path: t.delete(path, version=versions[topic])):
                log.warning("topic mirror: topic %s was deleted in Kafka; its znode is removed", topic)

    def _zookeeper_mode_kafka(self) -> bool:
        """Whether a Kafka in ZooKeeper mode registers brokers in this ZooKeeper (said once)."""
        brokers = read.children(self.client, protocol.BROKER_IDS)
        if brokers and not self._zookeeper_mode_said:
            log.error("topic mirror: a Kafka in ZooKeeper mode is registered here (%s has brokers %s); it writes "
                      "%s itself, so the mirror writes nothing: do not give bootstrap servers to coordinators "
                      "that share its ZooKeeper", protocol.BROKER_IDS, ", ".join(brokers[:5]), protocol.BROKER_TOPICS)
        self._zookeeper_mode_said = bool(brokers)
        return bool(brokers)

    def _write(self, topic: str, operation) -> bool:
        """One fenced transaction: the epoch check, then ``operation`` on the topic's znode.
        False if the znode changed since it was read (it is read again at once)."""
        if self.stopping or not self._active():
            raise _Stopping()
        path = protocol.topic_path(topic)
        t = self.client.transaction()
        t.check(self.fence.path, self.fence.epoch)
        operation(t, path)
        try:
            fenced_commit(t, self.fence)
            return True
        except TransactionFailed as e:
            log.debug("topic mirror: %s changed while it was written (%s); reading it again", path,
                      type(e.error).__name__)
            self._wake.set()
            return False

    def _read_kafka(self) -> KafkaTopics:
        ck = confluent_kafka()
        if self._admin is None:
            self._admin = make_admin_client(self.servers, self._properties, self._on_client_error)
        try:
            return KafkaTopics.from_metadata(self._admin.list_topics(timeout=self.timeout_s))
        except ck.KafkaException as e:
            error = e.args[0] if e.args else None
            kind = error.name() if hasattr(error, "name") else type(e).__name__
            kind = "unreachable" if kind in _UNREACHABLE else kind
            raise _NoAnswer(kind, error.str() if hasattr(error, "str") else str(e)) from None
        finally:
            self._admin.poll(0)  # deliver librdkafka's queued log lines and errors

    def _on_client_error(self, err) -> None:
        self._last_client_error = err.str()

    # ------------------------------------------------------------ reporting (mirror thread)

    def _unreachable(self, e: _NoAnswer) -> None:
        kind, detail = e.kind, e.detail
        if self._last_client_error and self._last_client_error not in detail:
            detail += f"; {self._last_client_error}"
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self._outage_kinds = {kind}
            log.warning("topic mirror: Kafka at %s did not answer (%s); the topics mirrored so far are kept, "
                        "trying again every %g s", self.servers, detail, self.interval_s)
        elif kind not in self._outage_kinds:
            self._outage_kinds.add(kind)
            log.warning("topic mirror: Kafka at %s still does not answer, now: %s", self.servers, detail)
        else:
            log.debug("topic mirror: Kafka at %s did not answer (%s)", self.servers, detail)

    def _reachable(self) -> None:
        self._last_client_error = ""
        if self._outage_since is not None:
            log.info("topic mirror: Kafka at %s answers again after %.0f s", self.servers,
                     time.monotonic() - self._outage_since)
            self._outage_since = None

    def _report(self, plan: MirrorPlan) -> None:
        """One line per problem while it lasts (said again if it comes back after going)."""
        now: Set[tuple] = set()
        for topic, (known, count) in plan.kept.items():
            now.add(("kept", topic, known, count))
            if ("kept", topic, known, count) not in self._reported:
                log.error("topic mirror: topic %s has %d partitions in Kafka, fewer than the %d mirrored; "
                          "partitions are never removed, so %d are kept", topic, count, known, known)
        for topic, why in plan.left_alone.items():
            now.add(("left", topic, why))
            if ("left", topic, why) not in self._reported:
                log.warning("topic mirror: topic %s is left as it is in ZooKeeper: %s", topic, why)
        self._reported = now
