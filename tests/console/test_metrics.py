"""Prometheus metrics over real HTTP: a coordinatord process's counters follow the rebalances it
made (generation by generation), a consumer's follow the records it consumed, ``groupctl
exporter`` serves the lag ``groups describe`` shows, and bad metrics ports are one line."""
from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import urllib.request

import pytest
from kazoo.exceptions import NoNodeError
from prometheus_client.parser import text_string_to_metric_families

from prometheus_client import generate_latest

from consumer.consumer import Consumer
from coordinator import protocol, read
from coordinator.metrics import CoordinatorMetrics
from coordinator.zkclient import close_client, start_client
from coordinator.topics import TopicRegistry
from tests.support.helpers import GROUPCTL, assert_one_line_error, fill, wait_for

COORDINATORD = [sys.executable, "-m", "consumer.cli.coordinatord"]


def scrape(url: str) -> dict:
    """{(sample name, sorted label items): value} of one scrape."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return samples_of(response.read().decode())


def samples_of(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@contextlib.contextmanager
def process(argv, env, log_path):
    """A child process with stderr in ``log_path``; SIGTERMed (then killed) at the end."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def served_url(log_path, pattern=r"metrics served at (http://\S+)") -> str:
    found = wait_for(lambda: re.search(pattern, log_path.read_text()), 20, message="the metrics line")
    return found.group(1)


class Poller:
    """A consumer polled by a thread of its own, as an application would (closed by ``stop``)."""

    def __init__(self, consumer: Consumer):
        self.consumer, self.stopping, self.records = consumer, threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping.is_set():
            for records in self.consumer.poll(timeout_ms=50).values():
                self.records += len(records)

    def stop(self):
        self.stopping.set()
        self.thread.join(10)
        self.consumer.close()


def test_coordinatord_metrics_follow_the_rebalances(tmp_path, subprocess_env, zk_connect, zk, data_dir):
    """After each membership change the scrape shows exactly as many rebalances (over all
    outcomes) and histogram observations as generations were written for the group, its generation, members and
    state, and the controller's election and epoch."""
    TopicRegistry(zk).ensure("orders", 4)
    log_path = tmp_path / "node.log"
    args = ["--zk", zk_connect, "--node-id", "n1", "--metrics-port", "0", "--session-timeout-ms", "2000"]
    pollers = []
    with process(COORDINATORD + args, subprocess_env, log_path):
        url = served_url(log_path)
        wait_for(lambda: value(scrape(url), "zkgroups_controller") == 1, 20, message="the node leads")
        samples = scrape(url)
        assert value(samples, "zkgroups_controller_elections_total") == 1
        assert value(samples, "zkgroups_controller_epoch") == wait_for(lambda: read.leader(zk), 10).epoch
        wait_for(lambda: sum(v for (name, _), v in scrape(url).items() if name == "zkgroups_shard_leader") == 16,
                 20, message="the node leads every shard")

        def settled(members: int) -> int:
            state = read.group_state(zk, "billing")
            return state.generation if state.state == protocol.STABLE and len(state.members) == members else 0

        for members in (1, 2, 3, 2):
            if members > len(pollers):
                pollers.append(Poller(Consumer("billing", ["orders"], zk=zk_connect, data_dir=data_dir,
                                               session_timeout_ms=2000, auto_offset_reset="earliest")))
            else:
                pollers.pop().stop()
            generation = wait_for(lambda: settled(members), 20, message=f"{members} members stable")

            def counted():
                s = scrape(url)
                return s if value(s, "zkgroups_group_generation", group="billing") == generation else None
            samples = wait_for(counted, 20, message=f"generation {generation} in the scrape")
            # Every generation written is one rebalance, whatever its outcome (a generation superseded
            # by a further change may still be the one that ends Stable, with no new commands).
            assert sum(v for (name, labels), v in samples.items()
                       if name == "zkgroups_rebalances_total" and ("group", "billing") in labels) == generation
            assert value(samples, "zkgroups_rebalance_duration_seconds_count", group="billing") == generation
            assert value(samples, "zkgroups_group_members", group="billing") == members
            assert value(samples, "zkgroups_group_state", group="billing", state="Stable") == 1
            assert value(samples, "zkgroups_group_state", group="billing", state="Rebalancing") == 0
            assert value(samples, "zkgroups_groups_failed") == 0
        assert value(samples, "zkgroups_zookeeper_requests_total", op="transaction") >= generation
        assert value(samples, "zkgroups_zookeeper_errors_total", op="get_data", error="NoNodeError") >= 0
        assert value(samples, "zkgroups_watch_event_handling_seconds_count", kind="ids") >= 1
        assert ("zkgroups_watch_events_queued", ()) in samples
        assert ("zkgroups_rebalance_requests_queued", ()) in samples
        for poller in pollers:
            poller.stop()
    assert "Traceback" not in log_path.read_text()


def test_coordinatord_json_logs_carry_rebalance_fields(tmp_path, subprocess_env, zk_connect, zk, data_dir):
    """The rebalance-completed and election lines carry group, generation, reason, members,
    moved and duration_ms as JSON fields."""
    TopicRegistry(zk).ensure("orders", 2)
    log_path = tmp_path / "node.log"
    args = ["--zk", zk_connect, "--node-id", "n1", "--log-format", "json", "--metrics-port", "0"]
    with process(COORDINATORD + args, subprocess_env, log_path):
        served_url(log_path, r'"message": "metrics served at (http://[^"\s]+)')
        poller = Poller(Consumer("billing", ["orders"], zk=zk_connect, data_dir=data_dir, session_timeout_ms=2000))
        try:
            wait_for(lambda: "generation 1 Stable" in log_path.read_text(), 20, message="the rebalance line")
        finally:
            poller.stop()
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    done = next(line for line in lines if "generation 1 Stable" in line["message"])
    assert {k: done[k] for k in ("group", "generation", "members", "moved")} == \
        {"group": "billing", "generation": 1, "members": 1, "moved": 2}
    assert done["reason"] and done["duration_ms"] >= 0
    elected = next(line for line in lines if "elected controller" in line["message"])
    assert elected["epoch"] >= 1 and elected["node"] == "n1" and elected["reason"]
    assert next(line for line in lines if line["message"].startswith("metrics served at"))["port"] > 0


def test_a_failed_group_is_counted_and_shown_until_it_recovers(cluster, zk):
    """A group whose only member never acks: one failed rebalance per run, the group Failed
    in the state gauge and the failed-groups count, until a live member makes it Stable."""
    TopicRegistry(zk).create("t", 2)
    node = cluster.node("n")
    mute = cluster.client()
    mute.ensure_path(protocol.channel_path("g", "g_mute-1-0"))
    mute.create(protocol.ids_path("g", "g_mute-1-0"), protocol.Registration({"t": 1}).encode(), ephemeral=True,
                makepath=True)
    wait_for(lambda: read.group_state(zk, "g").state == protocol.FAILED, 20, message="Failed")

    def shown(state):
        s = samples_of(generate_latest(node.metrics.registry).decode())
        return s if value(s, "zkgroups_group_state", group="g", state=state) == 1 else None
    samples = wait_for(lambda: shown(protocol.FAILED), 10, message="Failed in the metrics")
    assert value(samples, "zkgroups_groups_failed") == 1
    assert value(samples, "zkgroups_rebalances_total", group="g", outcome="failed") >= 1
    assert value(samples, "zkgroups_rebalances_total", group="g", outcome="stable") == 0
    mute.delete(protocol.ids_path("g", "g_mute-1-0"))
    healthy = cluster.member("g", ["t"])
    wait_for(lambda: len(healthy.recorder.owned) == 2, 20, message="recovered")
    samples = wait_for(lambda: shown(protocol.STABLE), 10, message="Stable in the metrics")
    assert value(samples, "zkgroups_groups_failed") == 0
    assert value(samples, "zkgroups_group_state", group="g", state=protocol.FAILED) == 0
    assert value(samples, "zkgroups_rebalances_total", group="g", outcome="stable") >= 1
    assert value(samples, "zkgroups_group_generation", group="g") == read.group_state(zk, "g").generation


def test_consumer_metrics_move_with_records_and_commits(zk_connect, zk, data_dir, cluster):
    """records and bytes consumed equal what poll() returned, lag per partition is the log end
    minus the position, commits are timed and counted."""
    cluster.node("n1")
    fill(data_dir, "orders", [30, 20, 10], zk=zk)
    c = Consumer("billing", ["orders"], zk=zk_connect, data_dir=data_dir, auto_offset_reset="earliest",
                 enable_auto_commit=False, max_poll_records=7, metrics_port=0)
    try:
        url = c.metrics_server.url
        got, nbytes, polls = 0, 0, 0
        while got < 25:
            batch = c.poll(timeout_ms=200)
            polls += 1
            got += sum(len(rs) for rs in batch.values())
            nbytes += sum(len(r.value) for rs in batch.values() for r in rs)
        samples = scrape(url)
        assert value(samples, "zkgroups_consumer_records_consumed_total") == got
        assert value(samples, "zkgroups_consumer_bytes_consumed_total") == nbytes
        assert value(samples, "zkgroups_consumer_poll_duration_seconds_count") == polls
        assert value(samples, "zkgroups_consumer_owned_partitions") == 3
        lag = {p: value(samples, "zkgroups_consumer_lag", topic="orders", partition=str(p)) for p in range(3)}
        positions = {p: c.position(("orders", p)) for p in range(3)}
        assert lag == {p: [30, 20, 10][p] - positions[p] for p in range(3)}
        assert sum(lag.values()) == 60 - got
        c.commit()
        samples = scrape(url)
        assert value(samples, "zkgroups_consumer_commits_total") == 1
        assert value(samples, "zkgroups_consumer_commit_duration_seconds_count") == 1
        assert value(samples, "zkgroups_consumer_generation") == c.group_metadata().generation
        assert value(samples, "zkgroups_consumer_info", group="billing", member=c.consumer_id,
                     client_id="zkgroups") == 1
        while got < 60:
            got += sum(len(rs) for rs in c.poll(timeout_ms=200).values())
        samples = scrape(url)
        assert value(samples, "zkgroups_consumer_records_consumed_total") == 60
        assert all(value(samples, "zkgroups_consumer_lag", topic="orders", partition=str(p)) == 0 for p in range(3))
    finally:
        c.close()


def test_groupctl_consume_serves_its_metrics(tmp_path, subprocess_env, zk_connect, zk, data_dir, cluster):
    """A groupctl consume process with --metrics-port 0: its records counter reaches what it
    printed, its lag reaches 0, and more records move both."""
    cluster.node("n1")
    fill(data_dir, "orders", [30, 20], zk=zk)
    out_path, log_path = tmp_path / "out.jsonl", tmp_path / "consume.log"
    argv = GROUPCTL + ["--zk", zk_connect, "--data-dir", data_dir, "consume", "g", "orders", "--metrics-port", "0"]
    with open(out_path, "w") as out, open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=subprocess_env, stdout=out, stderr=log)
    try:
        url = served_url(log_path)

        def caught_up(total):
            s = scrape(url)
            lag = [value(s, "zkgroups_consumer_lag", topic="orders", partition=str(p)) for p in range(2)]
            return s if value(s, "zkgroups_consumer_records_consumed_total") == total and lag == [0, 0] else None
        samples = wait_for(lambda: caught_up(50), 30, message="50 records consumed")
        assert value(samples, "zkgroups_consumer_owned_partitions") == 2
        assert value(samples, "zkgroups_consumer_commits_total") >= 1
        wait_for(lambda: len(out_path.read_text().splitlines()) == 50, 10, message="50 lines printed")
        from consumer.log import Log
        with Log(data_dir) as log:
            log.append("orders", 0, [(None, b"more-%d" % i, 1, ()) for i in range(7)])
        wait_for(lambda: caught_up(57), 30, message="57 records consumed")
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0 and "Traceback" not in log_path.read_text()


def test_exporter_serves_the_lag_describe_shows(tmp_path, subprocess_env, zk_connect, zk, data_dir, cluster, groupctl):
    """Two groups at different committed offsets: every (group, topic, partition) the exporter
    serves has the committed offset, log end and lag of ``groups describe -o json``."""
    cluster.node("n1")
    fill(data_dir, "orders", [40, 25], zk=zk)
    for group, take in (("billing", 30), ("audit", 5)):
        with Consumer(group, ["orders"], zk=zk_connect, data_dir=data_dir, auto_offset_reset="earliest",
                      enable_auto_commit=False, max_poll_records=take) as c:
            wait_for(lambda: c.poll(timeout_ms=100), 20, message="records")
            c.commit()
    described = json.loads(groupctl("groups", "describe", "--all-groups", "-o", "json").stdout)["offsets"]
    assert described and any(row["lag"] for row in described)
    samples = exporter_matches(described, ["--zk", zk_connect, "--data-dir", data_dir], tmp_path, subprocess_env)
    assert value(samples, "zkgroups_exporter_groups") == 2
    assert value(samples, "zkgroups_group_total_lag", group="audit") == \
        sum(row["lag"] for row in described if row["group"] == "audit")


@pytest.mark.kafka
def test_exporter_on_kafka(tmp_path, subprocess_env, zk_connect, zk, kafka_cluster, kafka_topic_name, groupctl):
    """On Kafka the log ends come from Kafka, and still equal describe's."""
    from consumer.producer import Producer
    kafka_cluster.create_topic(kafka_topic_name, 3)
    TopicRegistry(zk).create(kafka_topic_name, 3)
    with Producer(bootstrap_servers=kafka_cluster.bootstrap_servers) as producer:
        for i in range(60):
            producer.send(kafka_topic_name, b"v%d" % i, key=b"k%d" % i)
    servers = ["--bootstrap-servers", kafka_cluster.bootstrap_servers]
    r = groupctl(*servers, "groups", "reset-offsets", "g", "--topic", f"{kafka_topic_name}:0,1", "--to-earliest",
                 "--execute")
    assert r.exit_code == 0, r.output
    described = json.loads(groupctl(*servers, "groups", "describe", "g", "-o", "json").stdout)["offsets"]
    assert [row["lag"] is not None for row in described] == [True, True, False]
    exporter_matches(described, ["--zk", zk_connect, *servers], tmp_path, subprocess_env)


def exporter_matches(described, global_args, tmp_path, env) -> dict:
    """Run ``groupctl exporter`` until a scrape has every row of ``described`` (a describe's
    JSON offsets): committed offset, log end and lag; the last scrape."""
    log_path = tmp_path / "exporter.log"
    argv = GROUPCTL + global_args + ["exporter", "--port", "0", "--interval", "0.2"]
    with process(argv, env, log_path):
        url = served_url(log_path, r"exporter serving (http://\S+)")

        def matches():
            s = scrape(url)
            for row in described:
                labels = {"group": row["group"], "topic": row["topic"], "partition": str(row["partition"])}
                for name, field in (("zkgroups_group_committed_offset", "current_offset"),
                                    ("zkgroups_group_log_end_offset", "log_end_offset"), ("zkgroups_group_lag", "lag")):
                    present = (name, tuple(sorted(labels.items()))) in s
                    if present != (row[field] is not None) or (present and value(s, name, **labels) != row[field]):
                        return None
            return s
        samples = wait_for(matches, 20, message="the exporter's offsets")
    assert "Traceback" not in log_path.read_text()
    return samples


def _port_in_use():
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen(1)
    return sock


@pytest.mark.parametrize("port", ["-1", "65536", "abc", "in-use"])
def test_bad_metrics_ports_are_one_line(port, subprocess_env, zk_connect, data_dir):
    """coordinatord, groupctl consume and groupctl exporter: a port out of range, not a number
    or taken is one error line, a non-zero exit, no traceback."""
    holder = _port_in_use() if port == "in-use" else None
    port = str(holder.getsockname()[1]) if holder else port
    try:
        for argv in (COORDINATORD + ["--zk", zk_connect, "--metrics-port", port],
                     GROUPCTL + ["--zk", zk_connect, "--data-dir", data_dir, "consume", "g", "t", "--metrics-port", port],
                     GROUPCTL + ["--zk", zk_connect, "--data-dir", data_dir, "exporter", "--port", port]):
            r = subprocess.run(argv, env=subprocess_env, capture_output=True, text=True, timeout=60)
            assert_one_line_error(r.returncode, r.stdout, r.stderr, "port" if holder is None else port)
    finally:
        if holder:
            holder.close()


@pytest.mark.parametrize("setting, match", [("metrics_port = 70000", "metrics_port must be a port number"),
                                            ('metrics_port = "9000"', "metrics_port must be a whole number")])
def test_bad_metrics_port_in_the_config_file_is_one_line(setting, match, tmp_path, subprocess_env, zk_connect):
    config = tmp_path / "node.toml"
    config.write_text(f"[coordinator]\n{setting}\n")
    r = subprocess.run(COORDINATORD + ["--zk", zk_connect, "--config", str(config)], env=subprocess_env,
                       capture_output=True, text=True, timeout=60)
    assert_one_line_error(r.returncode, r.stdout, r.stderr, match)


def test_requests_and_their_errors_are_counted_by_operation(zk_connect):
    metrics = CoordinatorMetrics()
    client = start_client(zk_connect)
    try:
        metrics.count_requests(client)
        client.ensure_path("/counted")
        for _ in range(3):
            client.get("/counted")
        for _ in range(2):
            with pytest.raises(NoNodeError):
                client.get("/counted/missing")
        t = client.transaction()
        t.create("/counted", b"")  # exists: the transaction fails, and is no request error
        t.commit()
    finally:
        close_client(client)
    samples = samples_of(generate_latest(metrics.registry).decode())
    assert value(samples, "zkgroups_zookeeper_requests_total", op="get_data") == 5
    assert value(samples, "zkgroups_zookeeper_errors_total", op="get_data", error="NoNodeError") == 2
    assert value(samples, "zkgroups_zookeeper_requests_total", op="transaction") == 1
