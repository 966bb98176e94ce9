"""A coordinator node (seed 001, seed 000's "every broker coordinates a subset of the groups").

Every node runs two roles (see :mod:`coordinator.shards` for why):

* **Controller candidate.** All nodes contend in kazoo's election under
  ``/consumers/coordinator/election`` (each contender watches only its predecessor). The winner
  bumps the controller epoch, publishes ``/consumers/coordinator/leader`` (fenced) and runs the
  :class:`~coordinator.controller.Controller` for its term: it places shards on live nodes
  and mirrors a KRaft Kafka cluster's topics when configured. SIGTERM (``close()``) resigns at
  once.
* **Shard leader** (:class:`~coordinator.groups.GroupCoordinator`, :mod:`coordinator.groups`).
  The node registers itself under ``/consumers/coordinator/nodes`` and leads the groups of
  every shard the controller placed on it: watches, the request queue, the handler threads
  running the rebalance pipeline.

One node alone is the controller and leads every shard: it runs everything.

Guarantees: every write of a group is fenced by its shard's epoch in the same transaction, and
every controller write by the controller epoch, so a group has at most one coordinator able to
write at a time; a group is never handled by two threads at once and change events are
coalesced per group; watch and connection callbacks never call ZooKeeper (they only record and
queue). A node whose connection is SUSPENDED stops writing at once and gives up its shards and
the controller role if the connection is not back within a grace shorter than the session
timeout; on LOST it drops everything, registers again and leads what the controller gives it.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import os
import socket
import threading
from typing import Any, Dict, Optional

import tenacity
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError
from kazoo.protocol.states import KazooState

from coordinator import protocol
from coordinator.acl import parse_auth
from coordinator.zktls import parse_tls
from coordinator.config import DEFAULT_SESSION_TIMEOUT_MS, check_kafka_properties, positive
from coordinator.controller import Controller
from coordinator.errors import InvalidConfig
from coordinator.fencing import (Leadership, bump_epoch, controller_fence, fenced, fenced_commit,
                                 highest_recorded_epoch)
from coordinator.groups import GroupCoordinator
from coordinator.kafka import check_bootstrap_servers
from coordinator.lifecycle import Lifecycle
from coordinator.metrics import CoordinatorMetrics
from coordinator.zkclient import TransactionFailed, close_client, commit, start_client

log = logging.getLogger("zkgroups.coordinator")

#: Tries of the controller epoch's compare-and-set before the node gives up the election and contends again.
EPOCH_BUMP_ATTEMPTS = 5


@dataclasses.dataclass
class CoordinatorConfig:
    """A coordinator node's settings (``coordinatord`` options, its TOML file's [coordinator] table)."""
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    rebalance_timeout_ms: int = 30000
    max_rebalance_retries: int = 4
    rebalance_backoff_ms: int = 200
    failed_retry_interval_ms: int = 30000   # a Failed group is tried again after this
    check_interval_ms: int = 60000          # periodic full check of every group (safety net)
    settle_ms: int = 0                      # optional wait before a group is read (bursts coalesce anyway)
    handler_threads: int = 32               # groups rebalanced at once per node (each waits for its members' acks)
    suspend_grace_ratio: float = 0.5        # step down if SUSPENDED longer than this × session
    shards: int = 16                        # groups are spread over this many shards (fixed at first start)
    # The topic mirror (coordinator/mirror.py), for a Kafka cluster in KRaft mode only: a Kafka
    # in ZooKeeper mode writes /brokers/topics itself, and a mirror would fight it.
    bootstrap_servers: str = ""             # the Kafka cluster whose topics the leader mirrors; "": none
    kafka: dict = dataclasses.field(default_factory=dict, repr=False)  # librdkafka properties (secrets: never shown)
    mirror_interval_ms: int = 10000         # refresh interval (also refreshed at once on demand)
    zk_auth: Any = dataclasses.field(default=None, repr=False)  # the coordinators' ZooKeeper identity (coordinator/acl.py)
    zk_tls: Any = dataclasses.field(default=None, repr=False)   # TLS to ZooKeeper (coordinator/zktls.py); None: plaintext
    zk_sasl: Any = dataclasses.field(default=None, repr=False)  # a SASL (DIGEST-MD5) identity: user:password or @file

    def validate(self):
        positive(self, "session_timeout_ms", "rebalance_timeout_ms", "failed_retry_interval_ms",
                 "check_interval_ms", "handler_threads", "suspend_grace_ratio", "mirror_interval_ms")
        if self.max_rebalance_retries < 0 or self.rebalance_backoff_ms < 0 or self.settle_ms < 0:
            raise InvalidConfig("retries, backoff and settle must be >= 0")
        if self.suspend_grace_ratio >= 1:
            raise InvalidConfig("suspend_grace_ratio must be < 1 (the grace is shorter than the session)")
        if not 1 <= self.shards <= protocol.MAX_SHARD_COUNT:
            raise InvalidConfig(f"shards must be in 1..{protocol.MAX_SHARD_COUNT}, got {self.shards}")
        self.kafka = check_kafka_properties(self.kafka, "kafka")
        self.zk_auth = parse_auth(self.zk_auth, "zk_auth")
        self.zk_tls = parse_tls(self.zk_tls, "zk_tls")
        self.zk_sasl = parse_auth(self.zk_sasl, "zk_sasl")
        if self.bootstrap_servers:
            self.bootstrap_servers = check_bootstrap_servers(self.bootstrap_servers)
        elif self.kafka:
            raise InvalidConfig("kafka properties are given but bootstrap_servers is not: "
                                "they are for the topic mirror, which needs the Kafka cluster's address")


class NodeState(enum.Enum):
    NEW = "new"
    STARTED = "started"
    CLOSED = "closed"


class Coordinator(Lifecycle[NodeState]):
    """One coordinator node.

    States (:class:`NodeState`): NEW --start()--> STARTED --close()--> CLOSED, and NEW
    --close()--> CLOSED. ``start()`` once, ``close()`` once (a second call of either does
    nothing); a ``start()`` after ``close()`` raises IllegalStateError.

    Threads: the election thread (``_contend()``) runs the election and, while this node is
    the controller, the :class:`~coordinator.controller.Controller`; the
    :class:`~coordinator.groups.GroupCoordinator` has an event thread and handler threads of its
    own; kazoo's connection listener only records the connection's state (``_connection``, the
    one place it is kept: :attr:`suspended` and every term read it), ends terms, queues events
    and starts the grace timer. ``_term`` (the controller term) is replaced only by the
    election thread; other threads read it once into a local."""

    TRANSITIONS = {NodeState.NEW: {NodeState.STARTED, NodeState.CLOSED}, NodeState.STARTED: {NodeState.CLOSED},
                   NodeState.CLOSED: set()}

    def __init__(self, connect: str, node_id: Optional[str] = None, config: Optional[CoordinatorConfig] = None,
                 metrics: Optional[CoordinatorMetrics] = None):
        super().__init__(NodeState.NEW)
        self.connect = connect
        self.host = socket.gethostname()
        self.node_id = node_id or f"{self.host}-{os.getpid()}"
        protocol.validate_name(self.node_id, "node id")
        self.config = config or CoordinatorConfig()
        self.config.validate()  # a config made in code is checked as one read from a file is
        self.client = None
        self.groups: Optional[GroupCoordinator] = None
        self._term: Optional[Leadership] = None
        self._controller: Optional[Controller] = None
        self._thread: Optional[threading.Thread] = None
        self._election = None
        self._grace_timer: Optional[threading.Timer] = None
        self._connection = KazooState.CONNECTED  # kazoo's last word on the connection (its listener writes it)
        self.elected = threading.Event()    # set while this node is the controller (for tests and tools)
        self.metrics = metrics or CoordinatorMetrics()  # its own registry: serve it with coordinator.metrics
        self.metrics.attach(self)

    # ------------------------------------------------------------ lifecycle

    def _lifecycle_name(self) -> str:
        return f"node {self.node_id}"

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (the node is giving everything up, or has)."""
        return self.state is NodeState.CLOSED

    def start(self) -> "Coordinator":
        if not self._start_once(NodeState.STARTED):
            return self
        self.client = start_client(self.connect, self.config.session_timeout_ms, auth=self.config.zk_auth,
                                   roles=("coordinator", "admin"), tls=self.config.zk_tls, sasl=self.config.zk_sasl)
        self.metrics.count_requests(self.client)
        self.client.add_listener(self._on_connection_state)
        self.groups = GroupCoordinator(self).start()
        self._thread = threading.Thread(target=self._contend, name=f"election-{self.node_id}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Abandon the current attempts, resign so another node leads at once, give up the
        shards (the controller places them elsewhere), disconnect."""
        if not self._set_state(NodeState.CLOSED):
            return
        term = self._term
        if term:
            term.end("shutting down")
        if self._election:
            self._election.cancel()
        if self.groups:
            self.groups.stop()
        if self._thread:
            # Disconnected, the last writes would wait for a reconnect: closing the client fails them instead.
            self._thread.join(timeout=15 if self.client and self.client.connected else 1)
        if self.client:
            close_client(self.client)

    @property
    def is_leader(self) -> bool:
        """Whether this node is the controller now."""
        term = self._term
        return term is not None and not term.ended

    @property
    def epoch(self) -> Optional[int]:
        """The controller epoch, while this node is the controller."""
        term = self._term
        return term.epoch if term else None

    @property
    def suspended(self) -> bool:
        """Whether the connection to ZooKeeper is not up now (suspended, or the session lost and
        not yet replaced): nothing of this node may be written meanwhile."""
        return self._connection is not KazooState.CONNECTED

    def shards(self) -> Dict[int, int]:
        """{shard: epoch} of the shards this node leads now."""
        return self.groups.held() if self.groups else {}

    def request_mirror_refresh(self) -> None:
        """Ask the topic mirror to look at Kafka now (the controller's; from any node)."""
        controller = self._controller
        if controller is not None and self.is_leader:
            controller.request_mirror_refresh()
        elif self.client is not None:
            self.client.ensure_path_async(protocol.MIRROR_REFRESH).rawlink(
                lambda _: self.client.set_async(protocol.MIRROR_REFRESH, b""))

    # ------------------------------------------------------------ the controller election

    def _contend(self) -> None:
        while not self.closed:
            try:
                self.client.ensure_path(protocol.ELECTION)
                self._election = self.client.Election(protocol.ELECTION, self.node_id)
                self._election.run(self._lead)
            except Exception as e:  # connection trouble while contending or resigning
                if self.closed:
                    break
                log.warning("node %s: election interrupted (%s); contending again", self.node_id, e)
                self._wait_state({NodeState.CLOSED}, 0.2)

    def _lead(self) -> None:
        if self.closed:
            return
        epoch = self._bump_epoch()
        self.metrics.elected()  # before the term shows: a scrape never sees a controller not counted
        term = self._term = Leadership(epoch, suspended=lambda: self.suspended)
        if self.closed:  # close() ran while we were being elected and saw no term to end
            term.end("shutting down")
        info = protocol.LeaderInfo(self.node_id, self.host, os.getpid(), epoch, protocol.now_ms())
        self._publish_leader(info)
        log.info("node %s elected controller, epoch %d", self.node_id, epoch,
                 extra={"node": self.node_id, "epoch": epoch, "reason": "elected controller"})
        self.elected.set()
        controller = self._controller = Controller(self.client, self.config, self.node_id, term)
        try:
            controller.run()
        finally:
            self.elected.clear()
            controller.stop()
            self._controller = None
            log.info("node %s steps down as controller (epoch %d): %s", self.node_id, epoch,
                     term.reason or "term ended",
                     extra={"node": self.node_id, "epoch": epoch, "reason": term.reason or "term ended"})
            self._unpublish_leader(info)
            self._term = None

    @tenacity.retry(retry=tenacity.retry_if_exception_type((BadVersionError, NodeExistsError)),
                    stop=tenacity.stop_after_attempt(EPOCH_BUMP_ATTEMPTS),
                    before_sleep=tenacity.before_sleep_log(log, logging.WARNING), reraise=True)
    def _bump_epoch(self) -> int:
        """The next controller epoch: a compare-and-set on the epoch znode, whose version is the
        epoch. Only the elected node bumps it, so a conflict means someone else wrote it:
        retried a few times, then the election is given up and contended again. A missing
        epoch znode is restored above the last recorded one first."""
        return bump_epoch(self.client, protocol.EPOCH, lambda: highest_recorded_epoch(self.client), "the controller's")

    def _publish_leader(self, info: protocol.LeaderInfo) -> None:
        """Create the leader znode, replacing one left by a controller that resigned without
        cleaning up (we hold the election lock now); fenced by our epoch like every write."""
        fence = controller_fence(info.epoch)
        t = fenced(self.client, fence)
        if self.client.exists(protocol.LEADER):
            t.delete(protocol.LEADER)
        t.create(protocol.LEADER, info.encode(), ephemeral=True)
        fenced_commit(t, fence)

    def _unpublish_leader(self, info: protocol.LeaderInfo) -> None:
        t = fenced(self.client, controller_fence(info.epoch))  # never delete a newer controller's znode
        t.delete(protocol.LEADER)
        try:
            commit(t)
        except (TransactionFailed, KazooException):
            pass  # gone with our session, or already replaced

    # ------------------------------------------------------------ connection state (kazoo thread: no ZK calls)

    def _on_connection_state(self, state) -> None:
        term, groups, controller = self._term, self.groups, self._controller
        self._connection = state
        if state == KazooState.SUSPENDED:
            grace = self.config.session_timeout_ms * self.config.suspend_grace_ratio / 1000.0
            self._grace_timer = threading.Timer(grace, self._grace_expired, args=(term,))
            self._grace_timer.daemon = True
            self._grace_timer.start()
        elif state == KazooState.CONNECTED:
            if self._grace_timer:
                self._grace_timer.cancel()
            if controller is not None and term and not term.ended:
                controller.reconnected()
            if groups:
                groups.reconnected()
        elif state == KazooState.LOST:
            if term:
                term.end("ZooKeeper session lost")
            if groups:
                groups.session_lost()

    def _grace_expired(self, term: Optional[Leadership]) -> None:
        if not self.suspended:
            return
        reason = "disconnected from ZooKeeper longer than the grace period"
        if term:
            term.end(reason)
        if self.groups:
            self.groups.end_all(reason)
