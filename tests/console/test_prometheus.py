"""The shipped alert rules and Grafana dashboard in a running Prometheus: Debian's ``prometheus``
server, started by the test with monitoring/prometheus/prometheus.yml, scraping coordinatord
processes (the console on), a consumer's metrics port and ``groupctl exporter`` every second,
with the rules rendered by :func:`tests.support.prometheus.shortened_rules` (every duration
divided by 60: ``for: 5m`` is 5 s; the expressions otherwise as shipped).

Real parts drive each alert: a member that never acks (the group Rebalancing, then Failed), a
group whose log grows past its committed offset, a consumer whose commits are refused, a SIGKILLed
node holding shards until its session expires, every node SIGKILLed. Each alert goes pending,
then firing, and resolves once its condition ends. The node leading the Failed group and the
lagging one is SIGKILLed while both alerts fire: they fire on (the same alerts, active since the
same moment) until the node taking the shard over reports both groups. Then every dashboard
query returns data over the run. A second test has Prometheus scrape a Spark group job's driver."""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
import urllib.parse

import pytest
import yaml

from consumer.consumer import Consumer
from consumer.log import Log
from consumer.records import TopicPartition
from coordinator import protocol, read
from coordinator.errors import CommitFailedError
from coordinator.topics import TopicRegistry
from tests.console.test_metrics import COORDINATORD, process, served_url
from tests.console.test_monitoring import RULES, dashboard_queries
from tests.support.helpers import GROUPCTL, fill, ok, wait_for
from tests.support.prometheus import PROMETHEUS, PrometheusServer, shortened_rules

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus: install Debian's prometheus package "
                                                           "(bin/setup does)")

CONFIG = RULES.replace("zkgroups-alerts.yml", "prometheus.yml")
SHARDS = 4
#: One attempt (no retry) waits 10 s for acks: long enough for ZkgroupsGroupRebalancingTooLong
#: (over 5 s, for 1 s) to fire before the group is Failed.
NODE_ARGS = ["--metrics-port", "0", "--shards", str(SHARDS), "--rebalance-timeout-ms", "10000",
             "--max-rebalance-retries", "0", "--failed-retry-interval-ms", "60000", "--lag-interval", "0.5"]
COORDINATORS, CONSUMERS, EXPORTER, SPARK = ("zkgroups-coordinators", "zkgroups-consumers", "zkgroups-exporter",
                                            "zkgroups-spark")


def example_config(tmp_path) -> dict:
    """monitoring/prometheus/prometheus.yml as the tests run it: scrapes and evaluations every
    second, the rules shortened for that clock."""
    with open(CONFIG) as f:
        config = yaml.safe_load(f)
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    with open(RULES) as f:
        (tmp_path / "zkgroups-alerts.yml").write_text(shortened_rules(f.read()))
    config["rule_files"] = [str(tmp_path / "zkgroups-alerts.yml")]
    return config


class Nodes:
    """coordinatord processes scraped by ``prom``; a killed node stays a target (its scrapes fail)."""

    def __init__(self, prom: PrometheusServer, zk_connect, data_dir, env, tmp_path):
        self.prom, self.zk_connect, self.data_dir, self.env, self.tmp_path = prom, zk_connect, data_dir, env, tmp_path
        self.procs, self.targets = {}, {}

    def start(self, name: str, session_ms: int) -> str:
        log_path = self.tmp_path / f"{name}.log"
        with open(log_path, "w") as log:
            self.procs[name] = subprocess.Popen(
                COORDINATORD + ["--zk", self.zk_connect, "--node-id", name, "--session-timeout-ms", str(session_ms),
                                "--data-dir", self.data_dir, *NODE_ARGS],
                env=self.env, stdout=subprocess.DEVNULL, stderr=log)
        self.targets[name] = urllib.parse.urlsplit(served_url(log_path)).netloc
        self.prom.set_targets(COORDINATORS, list(self.targets.values()))
        return self.targets[name]

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait(10)

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name)


def key(labels: dict) -> tuple:
    return tuple(sorted(labels.items()))


def selector(name: str, labels: dict) -> str:
    return "{" + ",".join([f'alertname="{name}"'] + [f'{k}="{v}"' for k, v in labels.items()]) + "}"


def first_seen(prom, name: str, labels: dict, since: float) -> dict:
    """{alert state: when Prometheus first recorded it} from the raw ALERTS samples since ``since``."""
    window = int(time.time() - since) + 2
    out = {}
    for series in prom.query(f"ALERTS{selector(name, labels)}[{window}s]"):
        times = [float(t) for t, _ in series["values"] if float(t) >= since]
        if times:
            out[series["metric"]["alertstate"]] = min(times)
    return out


def fires(prom, name: str, labels: dict, since: float, timeout: float = 60) -> dict:
    """Wait until the alert fires; it was pending first. The alert, as /api/v1/alerts shows it."""
    def firing():
        alert = prom.alerts(name).get(key(labels))
        return alert if alert and alert["state"] == "firing" else None
    alert = wait_for(firing, timeout, 0.2, f"{name} {labels} firing")
    seen = first_seen(prom, name, labels, since)
    assert seen.get("pending", float("inf")) < seen["firing"], (name, seen)
    return alert


def resolves(prom, name: str, labels: dict, timeout: float = 60) -> None:
    wait_for(lambda: key(labels) not in prom.alerts(name) and not prom.query(f"ALERTS{selector(name, labels)}"),
             timeout, 0.2, f"{name} {labels} resolved")


def on_shard(prefix: str, shard: int) -> str:
    return next(f"{prefix}-{i}" for i in range(1000) if protocol.shard_of(f"{prefix}-{i}", SHARDS) == shard)


@contextlib.contextmanager
def repeating(step, interval: float):
    """``step()`` every ``interval`` seconds on a thread of its own, until the block ends."""
    stop = threading.Event()

    def run():
        while not stop.wait(interval):
            step()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def test_alerts_fire_and_resolve_in_prometheus_and_survive_a_failover(tmp_path, subprocess_env, zk_connect, zk,
                                                                        data_dir, groupctl):
    started = time.time()
    with PrometheusServer(str(tmp_path), example_config(tmp_path), jobs=[COORDINATORS, CONSUMERS, EXPORTER]) as prom:
        nodes = Nodes(prom, zk_connect, data_dir, subprocess_env, tmp_path)
        consumer = None
        stack = contextlib.ExitStack()
        try:
            # n1 is the controller throughout; n3's session is long, so its shards wait for it (phase 4).
            # The 10 s rebalance timeout and n2's 2 s session keep the Failed group unreported for
            # about 13 s after n2 dies: within the rule's 20 min, divided by 60.
            nodes.start("n1", 2000)
            wait_for(lambda: getattr(read.leader(zk), "node_id", None) == "n1", 20, message="n1 leads")
            nodes.start("n2", 2000)
            nodes.start("n3", 5000)
            wait_for(lambda: {n for n, _, verified in read.shard_leaders(zk).values() if verified} == {"n1", "n2", "n3"}
                     and read.all_verified(zk), 30, message="every shard placed and verified")
            victim_shard = next(s for s, (n, _, _) in sorted(read.shard_leaders(zk).items()) if n == "n2")
            failed, lagging = on_shard("billing", victim_shard), on_shard("lagging", victim_shard)

            # 1. A member that never acks: Rebalancing for 10 s (too long), then Failed.
            TopicRegistry(zk).ensure("orders", 2)
            mute = protocol.ids_path(failed, f"{failed}_mute-1-0")
            zk.ensure_path(protocol.channel_path(failed, f"{failed}_mute-1-0"))
            zk.create(mute, protocol.Registration({"orders": 1}).encode(), ephemeral=True, makepath=True)
            # A group committed at 0 on a log that grows: over 1,000 behind and further each second.
            fill(data_dir, "feed", [1500], zk=zk)
            ok(groupctl("groups", "reset-offsets", lagging, "--topic", "feed", "--to-earliest", "--execute"))
            # A consumer committing a partition it was never given: every commit refused.
            TopicRegistry(zk).ensure("work", 1)
            consumer = Consumer("committers", ["work"], zk=zk_connect, data_dir=data_dir, metrics_port=0,
                                enable_auto_commit=False, session_timeout_ms=2000)
            prom.set_targets(CONSUMERS, [f"127.0.0.1:{consumer.metrics_server.port}"])
            consumer.poll(timeout_ms=100)
            commit_labels = {"instance": f"127.0.0.1:{consumer.metrics_server.port}", "error": "CommitFailedError"}

            def refused():
                with contextlib.suppress(CommitFailedError):
                    consumer.commit({TopicPartition("feed", 0): 1})

            with Log(data_dir) as log, repeating(lambda: log.append("feed", 0, [(None, b"more", 1, ())] * 20), 0.2):
                with repeating(refused, 0.1):
                    fires(prom, "ZkgroupsGroupRebalancingTooLong", {"group": failed}, started)
                    fires(prom, "ZkgroupsCommitFailures", commit_labels, started)
                resolves(prom, "ZkgroupsGroupRebalancingTooLong", {"group": failed})  # Failed now
                resolves(prom, "ZkgroupsCommitFailures", commit_labels)
                alerts = {(name, group): fires(prom, name, {"group": group}, started)
                          for name, group in (("ZkgroupsGroupFailed", failed), ("ZkgroupsLagGrowing", lagging))}

                # 2. The node reporting both groups dies mid-alert; another takes the shard and runs
                # the group again (another 10 s) before it reports it Failed.
                assert {r["metric"]["instance"] for r in prom.query(
                    f'zkgroups_group_state{{group="{failed}",state="Failed"}} == 1 '
                    f'or zkgroups_group_total_lag{{group="{lagging}"}}')} == {nodes.targets["n2"]}
                nodes.kill("n2")
                broken = {}  # {alert: how it looked when it was first not the same firing alert}

                def reported_by_another():
                    for (name, group), before in alerts.items():
                        now = prom.alerts(name).get(key({"group": group}))
                        if not now or (now["state"], now["activeAt"]) != ("firing", before["activeAt"]):
                            broken.setdefault(name, now)
                    rows = prom.query(f'zkgroups_group_state{{group="{failed}",state="Failed"}} == 1 '
                                      f'or zkgroups_group_total_lag{{group="{lagging}"}}')
                    return len(rows) == 2 and nodes.targets["n2"] not in {r["metric"]["instance"] for r in rows}
                wait_for(reported_by_another, 60, 0.2, "both groups reported by another node")
                reported_by_another()
                assert not broken, broken

            # 3. The conditions end: the mute member leaves (Empty), the group catches up.
            zk.delete(mute)
            ok(groupctl("groups", "reset-offsets", lagging, "--topic", "feed", "--to-latest", "--execute"))
            resolves(prom, "ZkgroupsGroupFailed", {"group": failed})
            resolves(prom, "ZkgroupsLagGrowing", {"group": lagging})

            # The lag exporter, scraped from here on (after the failover: its lag would have kept
            # the lag alert up on its own).
            exporter_log = tmp_path / "exporter.log"
            exporter = stack.enter_context(process(
                GROUPCTL + ["--zk", zk_connect, "--data-dir", data_dir, "exporter", "--port", "0", "--interval", "0.5"],
                subprocess_env, exporter_log))
            exporter_url = served_url(exporter_log, r"exporter serving (http://\S+)")
            prom.set_targets(EXPORTER, [urllib.parse.urlsplit(exporter_url).netloc])

            # 4. n3 dies holding shards: they have no leader until its 5 s session expires.
            resolves(prom, "ZkgroupsShardWithoutLeader", {})  # (n2's shards may have waited a moment)
            since = time.time()
            nodes.kill("n3")
            fires(prom, "ZkgroupsShardWithoutLeader", {}, since)
            resolves(prom, "ZkgroupsShardWithoutLeader", {})

            # 5. No node left, then a new one is elected.
            since = time.time()
            nodes.kill("n1")
            fires(prom, "ZkgroupsNoController", {}, since)
            nodes.start("n4", 2000)
            resolves(prom, "ZkgroupsNoController", {})

            wait_for(lambda: prom.query(f'zkgroups_group_total_lag{{job="{EXPORTER}",group="{lagging}"}} == 0')
                     and prom.query(f'zkgroups_exporter_groups{{job="{EXPORTER}"}} >= 3'), 30, 0.5,
                     "the exporter's lag in Prometheus")
            assert exporter.poll() is None

            # Every dashboard query, as Grafana runs it (a range query), has data over the run.
            empty = [(title, expr) for title, expr in dashboard_queries()
                     if not prom.query_range(expr, started, time.time(), 1.0)]
            assert not empty, empty
        finally:
            stack.close()
            nodes.close()
            if consumer is not None:
                consumer.close()
    for path in [*tmp_path.glob("n*.log"), tmp_path / "exporter.log"]:
        assert "Traceback" not in path.read_text(), path


@pytest.mark.spark
def test_prometheus_scrapes_a_spark_group_jobs_driver(tmp_path, zk, zk_connect, data_dir):
    """A stream job of two workers with ``metrics_port=0``, scraped in the example's Spark job:
    its run, both workers up, the records processed going up and the lag, through Prometheus' API."""
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None:
        pytest.skip("pyspark needs a Java runtime")
    from consumer.spark import GroupJob, ParquetBatchWriter, local_session
    from coordinator.coordinator import Coordinator, CoordinatorConfig
    from tests.spark.test_spark import WORKER_CONFIG, Producer

    # Acks may be slow while the Python workers start: a generic rebalance timeout.
    node = Coordinator(zk_connect, "n1", CoordinatorConfig(session_timeout_ms=2000, rebalance_timeout_ms=10000,
                                                           rebalance_backoff_ms=50, failed_retry_interval_ms=1000))
    node.start()
    spark = local_session("local[2]", "zkgroups-prometheus-tests", log_level="ERROR")
    runner = None
    try:
        fill(data_dir, "sp", [200, 200], zk=zk)
        writer = ParquetBatchWriter(str(tmp_path / "out"), fsync=False, align=100)
        job = GroupJob(spark, "gsp", ["sp"], writer, zk=zk_connect, data_dir=data_dir, workers=2, mode="stream",
                       duration_s=90, align=100, batch_end=writer.existing_end, metrics_port=0,
                       progress_interval_s=None, consumer_config=WORKER_CONFIG)
        with PrometheusServer(str(tmp_path), example_config(tmp_path), jobs=[SPARK]) as prom, \
                Producer(data_dir, "sp", 2, 2, pause_s=0.05):
            runner = threading.Thread(target=job.run, daemon=True)
            runner.start()
            server = wait_for(lambda: job.metrics_server, 90, message="the driver's metrics server")
            prom.set_targets(SPARK, [f"127.0.0.1:{server.port}"])
            # (the lag is absent while a worker does not know its own yet)
            wait_for(lambda: prom.query(f'zkgroups_spark_workers_up{{job="{SPARK}"}} == 2')
                     and prom.query("increase(zkgroups_spark_records_processed_total[5s]) > 0")
                     and prom.query("zkgroups_spark_lag >= 0"), 90, 0.5,
                     "both workers up, records processed and the lag known, in Prometheus")
            [info] = prom.query("zkgroups_spark_info == 1")
            assert {k: info["metric"][k] for k in ("group", "run", "mode", "job")} == \
                {"group": "gsp", "run": job.run_id, "mode": "stream", "job": SPARK}
            job.request_stop()
            runner.join(60)
            assert not runner.is_alive()
    finally:
        if runner is not None and runner.is_alive():
            job.request_stop()
            runner.join(60)
        spark.stop()
        node.close()
