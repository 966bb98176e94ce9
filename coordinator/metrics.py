"""Prometheus metrics of a coordinator node, and serving a registry over HTTP.

Every :class:`CoordinatorMetrics` has its own ``CollectorRegistry`` (never the process-wide
default), so several nodes in one process (tests, the benchmarks) do not collide. What changes
only on events (elections, rebalances, ZooKeeper requests, event handling) is counted where it
happens, by one call; what is a state (controller or not, shards led, each group's state,
generation and members, queue depths) is read from the node when Prometheus scrapes, so it is
never stale and costs nothing between scrapes.

Metrics (names follow Prometheus' conventions: base units, ``_total`` for counters):

========================================  =========  ==================  ==========================================
name                                      type       labels              meaning
========================================  =========  ==================  ==========================================
zkgroups_controller                       gauge                          1 while this node is the controller
zkgroups_controller_epoch                 gauge                          the controller epoch of its term (absent otherwise)
zkgroups_controller_elections_total       counter                        times this node was elected controller
zkgroups_shard_leader                     gauge      shard               1 for each shard this node leads
zkgroups_shard_epoch                      gauge      shard               the epoch of each shard it leads
zkgroups_shards                           gauge                          shards groups are spread over (absent until read)
zkgroups_group_state                      gauge      group, state        1 for the group's state (Empty, Rebalancing, Stable, Failed), 0 for the others
zkgroups_group_generation                 gauge      group               the group's generation
zkgroups_group_members                    gauge      group               members in the last assignment
zkgroups_groups_failed                    gauge                          groups of this node whose state is Failed
zkgroups_rebalances_total                 counter    group, outcome      rebalances that wrote a generation, by outcome
zkgroups_rebalance_duration_seconds       histogram  group               how long those took (first read to Stable)
zkgroups_watch_events_queued              gauge                          watch events waiting for the event thread
zkgroups_rebalance_requests_queued        gauge                          groups waiting for a handler thread
zkgroups_watch_event_handling_seconds     histogram  kind                time the event thread spent on one event
zkgroups_zookeeper_requests_total         counter    op                  requests sent to ZooKeeper (a transaction is one)
zkgroups_zookeeper_errors_total           counter    op, error           requests that ended in an error (NoNode included)
zkgroups_share_records_total              counter    group, event        share-group records this node released or made
                                                                         available: ``lock_expired``, ``released_member_gone``,
                                                                         ``delay_ended``
zkgroups_share_in_flight_records          gauge      group, state        records in the windows of each share group it leads,
                                                                         by state (``acquired``, ``available``, ...)
========================================  =========  ==================  ==========================================

With the console on (:mod:`coordinator.console`), the node's registry also serves, for the
groups it leads, ``zkgroups_group_total_lag`` {group}, ``zkgroups_group_max_lag_seconds`` and
``zkgroups_group_max_estimated_lag_seconds`` {group} (lag in seconds: :mod:`coordinator.lagtime`),
``zkgroups_group_rebalancing_seconds`` {group} and ``zkgroups_console_lag_read_timestamp_seconds``
(:class:`~coordinator.console.app.ConsoleCollector`).

Rebalance outcomes: ``stable`` / ``empty`` (done: every member acked), ``failed`` (retries
exhausted; the group is Failed), ``superseded`` (the group changed while members applied it;
computed again at once), ``deposed`` (another node leads the shard now), ``abandoned``
(leadership ending), ``error`` (a ZooKeeper or other error; retried). A check that found
ownership already right writes no generation and is not counted.

Guarantees: a scrape never calls ZooKeeper and never blocks a coordinator thread for longer
than copying a few small dicts under their locks. Not provided: history across restarts
(counters start at 0 with the process, as Prometheus expects).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Dict, Optional, Tuple

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from coordinator import protocol
from coordinator.errors import ConsumerRebalanceFailedException
from coordinator.fencing import Deposed
from coordinator.rebalance import Abandoned, Superseded

GROUP_STATES = (protocol.EMPTY, protocol.REBALANCING, protocol.STABLE, protocol.FAILED)
#: The names of a share-partition range's states in metrics (the znode keeps two letters).
SHARE_STATE_NAMES = {"av": "available", "aq": "acquired", "dl": "delayed", "ok": "accepted", "ar": "archived",
                     "dq": "dead_letter_pending", "dw": "dead_letter_writing"}
#: Rebalances take milliseconds to a rebalance timeout (30 s by default).
REBALANCE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
EVENT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


# ---------------------------------------------------------------- the coordinator's metrics

class CoordinatorMetrics:
    """The metrics of one coordinator node (see the module docstring).

    Threads: the counting methods are called from the election, event, handler and kazoo
    threads (prometheus_client's metrics are thread-safe); ``_groups`` is guarded by ``_lock``.
    The scrape-time view reads the node through ``attach(node)``.
    """

    def __init__(self, registry: Optional[CollectorRegistry] = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.elections = Counter("zkgroups_controller_elections", "Times this node was elected controller.",
                                 registry=r)
        self.rebalances = Counter("zkgroups_rebalances", "Rebalances that wrote a generation, by outcome.",
                                  ["group", "outcome"], registry=r)
        self.rebalance_seconds = Histogram("zkgroups_rebalance_duration_seconds",
                                           "Duration of rebalances that wrote a generation.", ["group"],
                                           buckets=REBALANCE_BUCKETS, registry=r)
        self.event_seconds = Histogram("zkgroups_watch_event_handling_seconds",
                                       "Time the event thread spent handling one watch event.", ["kind"],
                                       buckets=EVENT_BUCKETS, registry=r)
        self.zk_requests = Counter("zkgroups_zookeeper_requests", "Requests sent to ZooKeeper.", ["op"], registry=r)
        self.zk_errors = Counter("zkgroups_zookeeper_errors", "ZooKeeper requests that ended in an error.",
                                 ["op", "error"], registry=r)
        self.share_records = Counter("zkgroups_share_records", "Records of share groups whose lock or delay "
                                     "ended, by event.", ["group", "event"], registry=r)
        self._lock = threading.Lock()
        self._groups: Dict[str, Tuple[str, int, int]] = {}   # group -> (state, generation, members)
        self._node = None
        r.register(_NodeCollector(self))

    def attach(self, node) -> None:
        """Read the state of ``node`` (a :class:`~coordinator.coordinator.Coordinator`) at scrape time."""
        self._node = node

    # ---- events

    def elected(self) -> None:
        self.elections.inc()

    @contextmanager
    def handling(self, kind: str):
        """Time the handling of one watch event of ``kind``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.event_seconds.labels(kind).observe(time.perf_counter() - started)

    @contextmanager
    def rebalance(self, group: str, generations: Dict[str, int]):
        """Count one handling of ``group``; the block sets ``.outcome`` to the rebalancer's
        :class:`~coordinator.rebalance.Outcome`. ``generations``: the rebalancer's last
        generation per group (what a generation written before an exception was)."""
        run = _Run()
        before = generations.get(group, 0)
        started = time.monotonic()
        try:
            yield run
        except ConsumerRebalanceFailedException:
            self._set_group(group, protocol.FAILED, generations.get(group, 0), None)
            self._count(group, "failed", started)
            raise
        except Exception as e:
            if generations.get(group, 0) != before:  # a generation was written, then this
                self._count(group, _OUTCOMES.get(type(e), "error"), started)
            raise
        outcome = run.outcome
        if outcome is None:
            return
        self._set_group(group, outcome.state, outcome.generation, outcome.members)
        if outcome.changed:  # (ownership found right wrote no generation: not counted)
            self._count(group, outcome.state.lower(), started)

    def _count(self, group: str, outcome: str, started: float) -> None:
        self.rebalances.labels(group, outcome).inc()
        self.rebalance_seconds.labels(group).observe(time.monotonic() - started)

    def _set_group(self, group: str, state: str, generation: int, members: Optional[int]) -> None:
        with self._lock:
            if members is None:
                members = self._groups.get(group, ("", 0, 0))[2]
            self._groups[group] = (state, generation, members)

    def groups(self) -> Dict[str, Tuple[str, int, int]]:
        """{group: (state, generation, members)} as last handled by this node."""
        with self._lock:
            return dict(self._groups)

    # ---- ZooKeeper requests

    def count_requests(self, client) -> None:
        """Count every request ``client`` (a started KazooClient) sends from now on, and its
        errors. Cheap per request: the counter child is looked up once per request type, and
        an error is counted where kazoo records it (the answer's ``set_exception``, in its
        connection thread), not by a callback per answer, which kazoo would hand to another
        thread through its completion queue."""
        call = client._call
        requests, errors = self.zk_requests, self.zk_errors
        counters: Dict[type, Tuple[str, object]] = {}

        def counted(request, async_object):
            kind = type(request)
            if kind not in counters:
                op = _OP_NAMES.get(kind) or _op_name(kind)
                counters[kind] = (op, requests.labels(op))
            op, counter = counters[kind]
            counter.inc()
            record = async_object.set_exception

            def set_exception(exception):
                errors.labels(op, type(exception).__name__).inc()
                record(exception)
            async_object.set_exception = set_exception
            return call(request, async_object)

        client._call = counted


class _Run:
    outcome = None


#: How a rebalance that wrote a generation ended, by the exception that ended it.
_OUTCOMES = {Superseded: "superseded", Deposed: "deposed", Abandoned: "abandoned"}


_OP_NAMES: Dict[type, str] = {}


def _op_name(kind: type) -> str:
    """kazoo's request class as a snake_case op name: GetChildren2 -> get_children2."""
    name = "".join(f"_{c.lower()}" if c.isupper() else c for c in kind.__name__).lstrip("_")
    _OP_NAMES[kind] = name
    return name


class _NodeCollector:
    """The scrape-time view of a node (gauges), read without calling ZooKeeper."""

    def __init__(self, metrics: CoordinatorMetrics):
        self.metrics = metrics

    def describe(self):
        return []  # collected lazily: nothing to check at registration

    def collect(self):
        node = self.metrics._node
        controller = GaugeMetricFamily("zkgroups_controller", "1 while this node is the controller.")
        epoch = GaugeMetricFamily("zkgroups_controller_epoch", "The controller epoch of this node's term.")
        shard_leader = GaugeMetricFamily("zkgroups_shard_leader", "1 for each shard this node leads.", labels=["shard"])
        shard_epoch = GaugeMetricFamily("zkgroups_shard_epoch", "The epoch of each shard this node leads.",
                                        labels=["shard"])
        state = GaugeMetricFamily("zkgroups_group_state", "1 for the group's state, 0 for the others.",
                                  labels=["group", "state"])
        generation = GaugeMetricFamily("zkgroups_group_generation", "The group's generation.", labels=["group"])
        members = GaugeMetricFamily("zkgroups_group_members", "Members in the group's last assignment.",
                                    labels=["group"])
        failed = GaugeMetricFamily("zkgroups_groups_failed", "Groups led by this node whose state is Failed.")
        events = GaugeMetricFamily("zkgroups_watch_events_queued", "Watch events waiting for the event thread.")
        queued = GaugeMetricFamily("zkgroups_rebalance_requests_queued", "Groups waiting for a handler thread.")
        shards = GaugeMetricFamily("zkgroups_shards", "Shards groups are spread over.")
        led: Callable[[str], bool] = lambda group: True
        if node is not None:
            controller.add_metric([], 1 if node.is_leader else 0)
            term_epoch = node.epoch
            if term_epoch is not None:
                epoch.add_metric([], term_epoch)
            for shard, shard_ep in sorted(node.shards().items()):
                shard_leader.add_metric([str(shard)], 1)
                shard_epoch.add_metric([str(shard)], shard_ep)
            groups = node.groups
            if groups is not None:
                events.add_metric([], groups.events_queued())
                if groups.shard_count is not None:
                    shards.add_metric([], groups.shard_count)
                queued.add_metric([], groups.requests.queued())
                led = groups.leads
        count_failed = 0
        for group, (s, gen, n) in sorted(self.metrics.groups().items()):
            if not led(group):
                continue
            for name in GROUP_STATES:
                state.add_metric([group, name], 1 if name == s else 0)
            generation.add_metric([group], gen)
            members.add_metric([group], n)
            count_failed += s == protocol.FAILED
        failed.add_metric([], count_failed)
        in_flight = GaugeMetricFamily("zkgroups_share_in_flight_records", "Records in the windows of each share "
                                      "group this node leads, by state.", labels=["group", "state"])
        share = node.groups.share.report() if node is not None and node.groups is not None else {}
        for group, totals in sorted(share.items()):
            for name, n in sorted(totals.items()):
                in_flight.add_metric([group, SHARE_STATE_NAMES.get(name, name)], n)
        return [controller, epoch, shard_leader, shard_epoch, shards, state, generation, members, failed, events,
                queued, in_flight]
