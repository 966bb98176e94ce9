"""Prometheus metrics of one :class:`~consumer.consumer.Consumer` (opt-in: ``metrics_port``).

Each consumer has its own ``CollectorRegistry``. Counts that move with records and commits are
updated once per ``poll()`` or ``commit()`` (never per record, never with a ZooKeeper call);
everything else is read from the consumer when Prometheus scrapes: lag asks the data plane for
the log end of the owned partitions then (a file stat on the embedded log, one ListOffsets on
Kafka), once per scrape, not per poll.

=============================================  =========  ================  ==================================
name                                           type       labels            meaning
=============================================  =========  ================  ==================================
zkgroups_consumer_info                         gauge      group, member,    1; who this consumer is
                                                          client_id
zkgroups_consumer_records_consumed_total       counter                      records poll() returned
zkgroups_consumer_bytes_consumed_total         counter                      key + value bytes of those records
zkgroups_consumer_poll_duration_seconds        histogram                    time spent in poll()
zkgroups_consumer_commits_total                counter                      commits written to ZooKeeper
zkgroups_consumer_commit_duration_seconds      histogram                    time a commit took (successful or not)
zkgroups_consumer_commit_failures_total        counter    error             commits refused or unanswered, by error
zkgroups_consumer_seconds_since_last_poll      gauge                        0 while in poll()
zkgroups_consumer_owned_partitions             gauge                        partitions this member owns
zkgroups_consumer_generation                   gauge                        the last generation applied (-1: none)
zkgroups_consumer_rebalances_total             counter                      generations this member applied
zkgroups_consumer_position                     gauge      topic, partition  next offset poll() returns
zkgroups_consumer_log_end_offset               gauge      topic, partition  the partition's log end (at scrape)
zkgroups_consumer_lag                          gauge      topic, partition  records behind the log end
=============================================  =========  ================  ==================================

``Consumer.metrics()`` returns the same samples as a dict (:func:`snapshot`), with or without
``metrics_port``; without it, only the scrape-time view (no counters).

Not provided: lag of partitions the consumer does not own (``groupctl exporter`` shows every
group's), and counts from before the consumer was created.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from coordinator.errors import ZkGroupsError
from coordinator.metrics_server import MetricsServer
from consumer.records import column

POLL_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 10.0)


class ConsumerMetrics:
    """The metrics of ``consumer``; ``serve(port)`` starts the HTTP endpoint.

    Threads: ``timed_poll`` runs on the application's thread, ``timed_commit`` on whichever
    thread commits (application, commit-async, member); prometheus_client's metrics are
    thread-safe. The scrape (the HTTP server's thread) only reads the consumer's thread-safe
    views (its member's owned partitions, the fetcher's positions) and the data plane's ends.
    """

    def __init__(self, consumer, registry: Optional[CollectorRegistry] = None):
        self.consumer = consumer
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.records = Counter("zkgroups_consumer_records_consumed", "Records poll() returned.", registry=r)
        self.bytes = Counter("zkgroups_consumer_bytes_consumed", "Key and value bytes of the records poll() returned.",
                             registry=r)
        self.poll_seconds = Histogram("zkgroups_consumer_poll_duration_seconds", "Time spent in poll().",
                                      buckets=POLL_BUCKETS, registry=r)
        self.commits = Counter("zkgroups_consumer_commits", "Commits written to ZooKeeper.", registry=r)
        self.commit_seconds = Histogram("zkgroups_consumer_commit_duration_seconds", "Time a commit took.",
                                        buckets=COMMIT_BUCKETS, registry=r)
        self.commit_failures = Counter("zkgroups_consumer_commit_failures", "Commits refused or not answered.",
                                       ["error"], registry=r)
        self.server: Optional[MetricsServer] = None
        r.register(_ConsumerCollector(consumer))

    def serve(self, port: int) -> "ConsumerMetrics":
        self.server = MetricsServer(self.registry, port).start()
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def timed_poll(self, poll: Callable, timeout_ms, max_records):
        started = time.perf_counter()
        try:
            batch = poll(timeout_ms, max_records)
        finally:
            self.poll_seconds.observe(time.perf_counter() - started)
        if batch:
            count = size = 0
            for records in batch.values():
                count += len(records)
                size += sum(map(len, column(records, "value")))
                size += sum(map(len, filter(None, column(records, "key"))))  # C-level: no frame per record
            self.records.inc(count)
            self.bytes.inc(size)
        return batch

    def timed_commit(self, commit: Callable, offsets) -> None:
        started = time.perf_counter()
        try:
            commit(offsets)
        except ZkGroupsError as e:
            self.commit_failures.labels(type(e).__name__).inc()
            raise
        finally:
            self.commit_seconds.observe(time.perf_counter() - started)
        self.commits.inc()


class _ConsumerCollector:
    """The scrape-time view of a consumer."""

    def __init__(self, consumer):
        self.consumer = consumer

    def describe(self):
        return []

    def collect(self):
        c = self.consumer
        if not c.started:
            return []  # still starting
        meta = c.group_metadata()
        info = GaugeMetricFamily("zkgroups_consumer_info", "Who this consumer is.",
                                 labels=["group", "member", "client_id"])
        info.add_metric([c.group_id, meta.member_id, c.config.client_id], 1)
        since = GaugeMetricFamily("zkgroups_consumer_seconds_since_last_poll",
                                  "Seconds since poll() last returned (0 while in poll()).")
        since.add_metric([], c.poll_interval.seconds_since_poll())
        generation = GaugeMetricFamily("zkgroups_consumer_generation", "The last generation this member applied.")
        generation.add_metric([], meta.generation)
        rebalances = CounterMetricFamily("zkgroups_consumer_rebalances", "Generations this member applied.")
        rebalances.add_metric([], meta.rebalances)
        owned = c.assignment()
        owned_gauge = GaugeMetricFamily("zkgroups_consumer_owned_partitions", "Partitions this member owns.")
        owned_gauge.add_metric([], len(owned))
        labels = ["topic", "partition"]
        position = GaugeMetricFamily("zkgroups_consumer_position", "Next offset poll() returns.", labels=labels)
        end = GaugeMetricFamily("zkgroups_consumer_log_end_offset", "The partition's log end offset.", labels=labels)
        lag = GaugeMetricFamily("zkgroups_consumer_lag", "Records behind the log end.", labels=labels)
        positions = {}
        for tp in sorted(owned):
            try:
                positions[tp] = c.position(tp)
            except ZkGroupsError:
                continue  # not started yet (its start offset is being found)
        try:
            ends = c.log_end_offsets(positions) if positions else {}
        except ZkGroupsError:  # the data plane did not answer: positions only
            ends = {}
        for tp, pos in positions.items():
            key = [tp.topic, str(tp.partition)]
            position.add_metric(key, pos)
            if tp in ends:
                end.add_metric(key, ends[tp])
                lag.add_metric(key, max(0, ends[tp] - pos))
        return [info, since, generation, rebalances, owned_gauge, position, end, lag]


def snapshot(consumer, metrics: Optional[ConsumerMetrics], raw: bool = False):
    """``Consumer.metrics()``: {sample name with its labels: value} of ``metrics``' registry,
    or without one of what a scrape reads from the consumer; ``raw``: the metric families."""
    families = list(metrics.registry.collect() if metrics is not None else _ConsumerCollector(consumer).collect())
    if raw:
        return families
    out = {}
    for family in families:
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out
