"""The rebalance handlers of a node: a pool of threads that take groups from the blocking
:class:`~coordinator.requests.RebalanceRequests` and run each through the read → compute → diff →
write → wait pipeline (:mod:`coordinator.rebalance`), half of
:class:`~coordinator.groups.GroupCoordinator` (the other half, the event thread that queues
the groups, is :mod:`coordinator.shard_follower`).

A run is fenced by the term its group is led under (:class:`~coordinator.fencing.ShardTerm`);
what it ends in decides what comes next: a generation (logged, recorded in the timeline), a
retry after ``failed_retry_interval_ms`` (the retry limit reached: the group is Failed, and
tried again), the term's end (deposed), a run again at once (superseded by a change), nothing
(the group was deleted).
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from typing import List

from kazoo.exceptions import KazooException

from coordinator import protocol
from coordinator.errors import ConsumerRebalanceFailedException
from coordinator.fencing import Deposed, ShardTerm
from coordinator.lifecycle import Lifecycle
from coordinator.rebalance import Abandoned, GroupDeleted, GroupRebalancer, Outcome, Superseded
from coordinator.requests import GroupIndex, RebalanceRequests
from coordinator.shard_follower import ShardFollower
from coordinator.shard_terms import ShardTerms
from coordinator.timeline import TimelineRecorder

log = logging.getLogger("zkgroups.coordinator")  # the node's lines, whichever half writes them


class PoolState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class RebalanceHandlers(Lifecycle[PoolState]):
    """``config.handler_threads`` threads rebalancing the groups ``requests`` hands out.

    States (:class:`PoolState`): NEW --start()--> RUNNING --stop()--> STOPPED (NEW --stop()-->
    STOPPED); by compare-and-set, a second call does nothing (a ``start()`` after ``stop()``
    raises IllegalStateError).

    Threads: each handler rebalances one group at a time (``requests`` never hands a group to
    two at once). ``rebalancer``, ``index`` and ``timeline`` are safe to share; what they need
    of the event thread's side goes through the follower's any-thread calls (``request``,
    ``verified``, a copy of ``topics``, one ``group_watches.get``) and the shared ``terms``.
    """

    TRANSITIONS = {
        PoolState.NEW: {PoolState.RUNNING, PoolState.STOPPED},
        PoolState.RUNNING: {PoolState.STOPPED},
        PoolState.STOPPED: set(),
    }

    def __init__(self, node, terms: ShardTerms, follower: ShardFollower, requests: RebalanceRequests,
                 rebalancer: GroupRebalancer, index: GroupIndex, timeline: TimelineRecorder):
        super().__init__(PoolState.NEW)
        self.node, self.config = node, node.config
        self.terms, self.follower, self.requests = terms, follower, requests
        self.rebalancer, self.index, self.timeline = rebalancer, index, timeline
        self._threads: List[threading.Thread] = []

    def _lifecycle_name(self) -> str:
        return f"node {self.node.node_id} (rebalance handlers)"

    def start(self) -> None:
        if not self._start_once(PoolState.RUNNING):
            return
        for i in range(self.config.handler_threads):
            t = threading.Thread(target=self._handle, name=f"rebalance-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Wake every handler and wait for each (a run in flight ends with its term)."""
        if not self._set_state(PoolState.STOPPED):
            return
        self.requests.close(len(self._threads))
        for t in self._threads:
            t.join(timeout=5)

    def _handle(self) -> None:
        while True:
            group = self.requests.take(timeout=5.0)  # stop() wakes every handler at once
            if group is None:
                if self.state is PoolState.STOPPED:
                    return
                continue
            if self.config.settle_ms:
                time.sleep(self.config.settle_ms / 1000.0)  # let a burst of changes land in one request
            self.requests.begin(group)
            try:
                self._rebalance(group)
            finally:
                self.requests.done(group)

    def _rebalance(self, group: str) -> None:
        term = self.terms.of(group)
        if term is None or not term.active:
            return
        try:
            with self.node.metrics.rebalance(group, self.rebalancer.generations) as counted:
                outcome = counted.outcome = self.rebalancer.run(
                    group, lambda: dict(self.follower.topics), term.fence, abort=lambda: not term.active, observe=self._observe,
                    changed=lambda: self.requests.changed(group), members_watch=self.follower.group_watches.get(group))
            self._ran(group, term, outcome)
        except ConsumerRebalanceFailedException as e:
            log.error("ConsumerRebalanceFailedException: %s; retrying in %d ms", e,
                      self.config.failed_retry_interval_ms,
                      extra={"group": group, "generation": self.rebalancer.generations.get(group, 0),
                             "reason": str(e)})
            self.terms.retry_later(group, self.config.failed_retry_interval_ms)
            self.timeline.record(group, term.fence, failed=True)
            self.follower.verified(group)
        except Deposed as e:
            term.end(f"deposed: {e}")
            log.info("node %s: shard %d: %s", self.node.node_id, term.shard, e)
        except Abandoned:
            self.follower.request(group)  # for whoever leads it next in this node, if we resume
        except Superseded:
            log.info("group %s: changed during the rebalance; computing it again", group)  # queued again by done()
            self.timeline.record(group, term.fence, superseded=True)
        except GroupDeleted as e:
            log.log(logging.INFO if e.first else logging.DEBUG, "%s; nothing left to rebalance", e,
                    extra={"group": group, "reason": "group deleted"})
            self.follower.verified(group)
        except KazooException as e:
            if term.active:
                log.warning("group %s: ZooKeeper error during rebalance (%s); retrying", group, type(e).__name__)
                self.terms.retry_later(group, self.config.rebalance_backoff_ms)
        except Exception:
            log.exception("group %s: unexpected error during rebalance; retrying later", group)
            self.terms.retry_later(group, self.config.failed_retry_interval_ms)

    def _ran(self, group: str, term: ShardTerm, outcome: Outcome) -> None:
        """A run ended without raising: say what it changed, record it in the timeline (a
        generation, or a static member's hold), look again when something is still missing."""
        if outcome.changed:
            fields = {"group": group, "generation": outcome.generation, "reason": ", ".join(outcome.reasons) or "-",
                      "members": outcome.members, "moved": outcome.moved, "duration_ms": round(outcome.duration_ms, 1)}
            log.info("group %s generation %d %s: reason=%s members=%d moved=%d duration=%.1fms%s",
                     group, outcome.generation, outcome.state, ", ".join(outcome.reasons) or "-",
                     outcome.members, outcome.moved, outcome.duration_ms,
                     f" excluded={outcome.excluded}" if outcome.excluded else "", extra=fields)
        if outcome.changed or outcome.recheck_ms is not None:  # a generation, or a static hold
            self.timeline.record(group, term.fence, outcome)
        if outcome.unavailable:  # look again for the squatted partitions later
            self.terms.retry_later(group, self.config.failed_retry_interval_ms)
        if outcome.recheck_ms is not None:  # a static member is away: look again when its grace ends
            self.terms.retry_later(group, outcome.recheck_ms)
        self.follower.verified(group)

    def _observe(self, group: str, registrations) -> None:
        """A handler saw the group's members: index their subscriptions, and if one names a
        topic the registry lacks (or a regex matches none), ask the topic mirror to look at
        once, so a new Kafka topic is served in about a Metadata round trip, not an interval."""
        registrations = list(registrations)
        self.index.update(group, registrations)
        if self.config.bootstrap_servers:
            topics = dict(self.follower.topics)  # a copy: the event thread may change it meanwhile
            if any(not set(reg.subscription) <= topics.keys() if reg.pattern == protocol.PATTERN_STATIC
                   else not reg.topics(topics) for reg in registrations):
                self.node.request_mirror_refresh()
