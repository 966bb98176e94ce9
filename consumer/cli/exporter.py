"""``groupctl exporter``: every group's committed offsets, log-end offsets and lag as Prometheus
metrics (as kafka-lag-exporter and Burrow do for Kafka's groups).

Every ``--interval`` seconds it reads what ``groupctl groups describe --all-groups`` shows
(:func:`consumer.cli.describe.all_offsets_rows`: the same rows, so both always agree) from
ZooKeeper and the data plane (the embedded log, or Kafka with ``--bootstrap-servers``), and
serves the last reading at ``http://HOST:PORT/metrics``. A scrape never reads ZooKeeper itself,
so scrapers cannot load it; the values are at most one interval old
(``zkgroups_exporter_last_refresh_timestamp_seconds`` says when they were read).

Metrics (name, type, labels: meaning):

* ``zkgroups_group_committed_offset`` gauge {group, topic, partition}: the group's committed offset
* ``zkgroups_group_log_end_offset`` gauge {group, topic, partition}: the partition's log end
* ``zkgroups_group_lag`` gauge {group, topic, partition}: log end minus committed offset
* ``zkgroups_group_total_lag`` gauge {group}: the group's lag summed
* ``zkgroups_group_lag_seconds`` gauge {group, topic, partition}: the age of the oldest
  unconsumed record (:mod:`coordinator.lagtime`; 0 when caught up)
* ``zkgroups_group_estimated_lag_seconds`` gauge {group, topic, partition}: the lag over the
  recent consumption rate (absent while the rate is unknown or 0)
* ``zkgroups_group_max_lag_seconds`` and ``zkgroups_group_max_estimated_lag_seconds`` gauge
  {group}: the largest of the group's partitions (what to scale a group on)
* ``zkgroups_exporter_groups`` gauge: groups read at the last refresh
* ``zkgroups_exporter_last_refresh_timestamp_seconds`` gauge: when (Unix time) they were read
* ``zkgroups_exporter_refresh_duration_seconds`` gauge: how long the last reading took
* ``zkgroups_exporter_refresh_failures_total`` counter {error}: readings that failed (the last
  good one is still served)

A partition without a committed offset (or whose log end cannot be read) has no committed
offset or lag sample, as ``describe`` shows ``-``. The records' timestamps are read only for
a committed offset not read at an earlier refresh: a group whose commits do not move costs no
reads of the data plane.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import List

import click
from kazoo.exceptions import KazooException
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from consumer.cli import describe
from consumer.cli.context import CliContext, pass_cli
from consumer.dataplane.record_times import RecordTimesReader
from coordinator import lagtime, read
from coordinator.cli.common import Seconds, report
from coordinator.errors import ZkGroupsError
from coordinator.metrics_server import MetricsServer, check_port
from coordinator.signals import on_stop_signals

log = logging.getLogger("zkgroups.exporter")

DEFAULT_INTERVAL_S = 10.0


class LagExporter:
    """The last reading of every group's offsets and the registry serving it.

    Threads: :meth:`refresh` runs on the command's thread (the only one using ZooKeeper and
    the data plane); the HTTP server's thread collects. ``_rows`` is replaced whole under
    ``_lock``, never changed in place.
    """

    def __init__(self, cli: CliContext):
        self.cli = cli
        self.registry = CollectorRegistry()
        self.failures = Counter("zkgroups_exporter_refresh_failures", "Readings of the groups that failed.",
                                ["error"], registry=self.registry)
        self._lock = threading.Lock()
        self._rows: List[dict] = []
        self._groups = 0
        self._read_at = 0.0
        self._took = 0.0
        self._reader = None  # the data plane is opened by the first refresh, not here
        self.record_times = lagtime.RecordTimes(self._read_times)
        self.history = lagtime.CommitHistory()
        self.registry.register(self)

    def refresh(self, first: bool = False) -> None:
        """Read every group's offsets; a failure keeps the last reading (the ``first`` one raises:
        an exporter that cannot read anything at all says so and exits, as the other tools do)."""
        started = time.monotonic()
        try:
            snapshots = describe.read_groups(self.cli.zk, read.groups(self.cli.zk), skip_unreadable=True)
            rows = describe.all_offsets_rows(self.cli, snapshots, self.record_times, self.history)
        except (KazooException, ZkGroupsError) as e:
            if first:
                raise
            self.failures.labels(type(e).__name__).inc()
            log.warning("exporter: reading the groups failed (%s: %s); serving the last reading", type(e).__name__, e)
            return
        with self._lock:
            self._rows, self._groups = rows, len(snapshots)
            self._read_at, self._took = time.time(), time.monotonic() - started

    def describe(self):
        return []

    def collect(self):
        with self._lock:
            rows, groups, read_at, took = self._rows, self._groups, self._read_at, self._took
        labels = ["group", "topic", "partition"]
        committed = GaugeMetricFamily("zkgroups_group_committed_offset", "The group's committed offset.", labels=labels)
        end = GaugeMetricFamily("zkgroups_group_log_end_offset", "The partition's log end offset.", labels=labels)
        lag = GaugeMetricFamily("zkgroups_group_lag", "Log end offset minus the committed offset.", labels=labels)
        total = GaugeMetricFamily("zkgroups_group_total_lag", "Sum of the group's lag.", labels=["group"])
        totals = {}
        for row in rows:
            key = [row["group"], row["topic"], str(row["partition"])]
            if row["current_offset"] is not None:
                committed.add_metric(key, row["current_offset"])
            if row["log_end_offset"] is not None:
                end.add_metric(key, row["log_end_offset"])
            if row["lag"] is not None:
                lag.add_metric(key, row["lag"])
                totals[row["group"]] = totals.get(row["group"], 0) + row["lag"]
        for group, value in sorted(totals.items()):
            total.add_metric([group], value)
        ages = _age_gauges(rows)
        count = GaugeMetricFamily("zkgroups_exporter_groups", "Groups read at the last refresh.")
        count.add_metric([], groups)
        when = GaugeMetricFamily("zkgroups_exporter_last_refresh_timestamp_seconds", "When the groups were read.")
        when.add_metric([], read_at)
        duration = GaugeMetricFamily("zkgroups_exporter_refresh_duration_seconds", "How long the last reading took.")
        duration.add_metric([], took)
        return [committed, end, lag, total, *ages, count, when, duration]

    def _read_times(self, spots):
        if self._reader is None:
            self._reader = RecordTimesReader(self.cli.data_plane)
        return self._reader(spots)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


def _age_gauges(rows: List[dict]) -> List[GaugeMetricFamily]:
    """Lag in seconds per partition and each group's largest (absent where unknown)."""
    out = []
    for field, help_ in (("lag_seconds", "Age of the oldest unconsumed record."),
                         ("estimated_lag_seconds", "The lag over the recent consumption rate.")):
        gauge = GaugeMetricFamily(f"zkgroups_group_{field}", help_, labels=["group", "topic", "partition"])
        for row in rows:
            if row[field] is not None:
                gauge.add_metric([row["group"], row["topic"], str(row["partition"])], row[field])
        biggest = GaugeMetricFamily(f"zkgroups_group_max_{field}", f"{help_} The group's largest.", labels=["group"])
        for group, value in sorted(lagtime.group_max(rows, field).items()):
            if value is not None:
                biggest.add_metric([group], value)
        out += [gauge, biggest]
    return out


@click.command()
@click.option("--port", type=int, required=True, metavar="PORT",
              help="Serve the metrics at http://HOST:PORT/metrics (0: any free port; the line printed says which).")
@click.option("--interval", type=Seconds(), default=DEFAULT_INTERVAL_S, show_default=True, metavar="SECONDS",
              help="Read the groups' offsets this often.")
@pass_cli
def exporter(cli: CliContext, port: int, interval: float) -> None:
    """Serve every group's committed offsets, log-end offsets and lag per partition as Prometheus
    metrics (the figures of 'groups describe --all-groups'), read every --interval seconds."""
    lag = LagExporter(cli)
    server = MetricsServer(lag.registry, check_port(port, "--port")).start()
    stopping = threading.Event()
    on_stop_signals(stopping.set)
    try:
        lag.refresh(first=True)
        report(f"exporter serving {server.url} (groups read every {interval:g} s)", "zkgroups.exporter",
               port=server.port)
        while not stopping.wait(interval):
            lag.refresh()
    finally:
        server.close()
        lag.close()
