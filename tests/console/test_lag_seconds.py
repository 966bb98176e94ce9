"""Lag in seconds against ground truth, on both data planes (the embedded log; Kafka on
librdkafka's mock cluster) and a real ZooKeeper.

Records are produced with known timestamps (record o of every partition is stamped
``BASE + o * STEP_S``); a live member is held back by committing known offsets. Then the age
``groupctl groups describe`` and the console (its rows, and the coordinator's
``zkgroups_group_max_lag_seconds``) report is within ±1 s of now minus the timestamp of the
record at the committed offset (at some moment of the reading). After a rebalance, the next
reading has the new owner's commit, within 1 s of the truth: no stale value. A reading whose
commits did not move reads no record.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager

import pytest
from click.testing import CliRunner

from consumer.cli.context import CliContext
from consumer.cli.exporter import LagExporter
from consumer.cli.groupctl import main
from consumer.dataplane import open_data_plane
from consumer.records import TopicPartition
from consumer.dataplane.log_ends import DataPlaneEnds
from coordinator.console.app import NodeConsole
from coordinator.topics import TopicRegistry
from tests.support.groups import wait_stable
from tests.support.helpers import ok, wait_for

STEP_S = 3
RECORDS = 20
PARTITIONS = 2


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def stamped(request, zk, zk_connect, data_dir, kafka_topic_name):
    """(topic, servers, base_s): RECORDS records in each of PARTITIONS partitions, record o
    stamped base_s + o * STEP_S (the first one RECORDS * STEP_S seconds ago)."""
    servers = ""
    if request.param == "kafka":
        pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
        cluster = request.getfixturevalue("kafka_cluster")
        cluster.create_topic(kafka_topic_name, PARTITIONS)
        servers = cluster.bootstrap_servers
    TopicRegistry(zk).create(kafka_topic_name, PARTITIONS)
    base_s = int(time.time()) - RECORDS * STEP_S
    with open_data_plane(data_dir=data_dir, bootstrap_servers=servers, zk=zk) as plane:
        for p in range(PARTITIONS):
            plane.append(TopicPartition(kafka_topic_name, p),
                         [(None, b"v%d" % o, (base_s + o * STEP_S) * 1000, ()) for o in range(RECORDS)])
    return kafka_topic_name, servers, base_s


def truth(base_s, offset, at):
    """The age at ``at`` of the record at ``offset``: what lag in seconds must say."""
    return at - (base_s + offset * STEP_S)


def near_truth(age, base_s, offset, span) -> bool:
    """``age`` is the truth within 1 s at some moment of ``span`` (start, end): the reading's."""
    start, end = span
    return age is not None and truth(base_s, offset, start) - 1 <= age <= truth(base_s, offset, end) + 1


def describe(zk_connect, data_dir, servers, group):
    args = ["--zk", zk_connect, "--data-dir", data_dir, *(["--bootstrap-servers", servers] if servers else [])]
    start = time.time()
    rows = json.loads(ok(CliRunner().invoke(main, [*args, "groups", "describe", group, "-o", "json"])))["offsets"]
    return {r["partition"]: r for r in rows}, (start, time.time())


def held_back_member(cluster, zk, topic, offsets):
    """A live member owning every partition of ``topic`` that committed ``offsets`` {p: offset}."""
    cluster.node("n1")
    member = cluster.member("g", [topic])
    wait_for(lambda: len(member.owned()) == PARTITIONS, message="the member owns every partition")
    wait_stable(zk, "g", 1)
    member.commit({TopicPartition(topic, p): o for p, o in offsets.items()})
    return member


@contextmanager
def console_of(node, data_dir, servers):
    """The node's console with its snapshot running and lag read only when the test says."""
    console = NodeConsole(node, DataPlaneEnds.open(servers, {}, data_dir))
    console.snapshot.start()
    try:
        wait_for(lambda: console.snapshot.loaded and console.snapshot.group("g") is not None
                 and console.snapshot.group("g").state is not None, message="the console's snapshot has g")
        yield console
    finally:
        console.close()
        console.sampler.ends.close()


def read_lag(console):
    """One round of the console's lag reader: its rows of g and the round's (start, end)."""
    start = time.time()
    console.sampler.refresh()
    reading = console.sampler.reading()
    assert not console.sampler.last_error
    return {r["partition"]: r for r in reading.rows["g"]}, (start, time.time())


def test_lag_seconds_is_the_age_of_the_oldest_unconsumed_record(stamped, cluster, zk, zk_connect, data_dir):
    topic, servers, base = stamped
    held_back_member(cluster, zk, topic, {0: 10, 1: 4})
    rows, span = describe(zk_connect, data_dir, servers, "g")
    for p, offset in ((0, 10), (1, 4)):
        assert rows[p]["lag"] == RECORDS - offset
        assert near_truth(rows[p]["lag_seconds"], base, offset, span), rows[p]
        assert rows[p]["estimated_lag_seconds"] is None  # one reading has no rate

    with console_of(cluster.nodes[0], data_dir, servers) as console:
        rows, span = read_lag(console)
        for p, offset in ((0, 10), (1, 4)):
            assert near_truth(rows[p]["lag_seconds"], base, offset, span), rows[p]
        registry = cluster.nodes[0].metrics.registry
        assert near_truth(registry.get_sample_value("zkgroups_group_max_lag_seconds", {"group": "g"}), base, 4, span)
        page = console.app.route("/ui/groups/g", "")
        assert page.status == 200 and "oldest unconsumed" in page.body.decode() and "lag (time)" in page.body.decode()
        # the same commits again: no record is read, and the ages still are the truth's
        reads = console.sampler.record_times.reads
        rows, span = read_lag(console)
        assert console.sampler.record_times.reads == reads
        assert near_truth(rows[1]["lag_seconds"], base, 4, span)
        # caught up: 0 s, whatever the records' ages
        cluster.members[0].commit({TopicPartition(topic, 0): RECORDS})
        rows, _ = read_lag(console)
        assert (rows[0]["lag"], rows[0]["lag_seconds"], rows[0]["estimated_lag_seconds"]) == (0, 0.0, 0.0)


def test_after_a_rebalance_no_value_is_stale(stamped, cluster, zk, zk_connect, data_dir):
    topic, servers, base = stamped
    first = held_back_member(cluster, zk, topic, {0: 4, 1: 4})
    with console_of(cluster.nodes[0], data_dir, servers) as console:
        rows, span = read_lag(console)
        assert near_truth(rows[1]["lag_seconds"], base, 4, span)
        second = cluster.member("g", [topic])
        state = wait_stable(zk, "g", 2)
        wait_for(lambda: len(first.owned()) == 1 and len(second.owned()) == 1, message="one partition each")
        (moved,) = [tp for tp in second.owned()]
        second.commit({moved: 18})  # the new owner went on from its record 4 to 18
        rows, span = read_lag(console)
        row = rows[moved.partition]
        assert row["consumer_id"] == second.consumer_id and state.generation >= 2
        assert near_truth(row["lag_seconds"], base, 18, span), row  # not record 4's age, 42 s more
        kept = rows[1 - moved.partition]  # the partition that stayed, still at 4
        assert near_truth(kept["lag_seconds"], base, 4, span), kept
        described, span = describe(zk_connect, data_dir, servers, "g")
        assert near_truth(described[moved.partition]["lag_seconds"], base, 18, span)


def test_the_estimate_is_the_lag_over_the_commits_rate(stamped, cluster, zk, zk_connect, data_dir):
    """Commits 10 -> 16 between readings: the rate is 6 records over the readings' interval."""
    topic, servers, _ = stamped
    member = held_back_member(cluster, zk, topic, {0: 10})
    with console_of(cluster.nodes[0], data_dir, servers) as console:
        read_lag(console)
        member.commit({TopicPartition(topic, 0): 16})
        wait_for(lambda: time.time() - console.sampler.reading().at > 0.2, message="time between the readings")
        rows, _ = read_lag(console)
        first, last = list(console.sampler.history.times)[-2:]
        assert rows[0]["estimated_lag_seconds"] == pytest.approx((RECORDS - 16) / (6 / (last - first)), abs=0.01)
        assert rows[1]["estimated_lag_seconds"] is None  # no commit at all: no rate


def test_the_exporter_serves_lag_seconds_per_partition_and_group(stamped, cluster, zk, zk_connect, data_dir):
    topic, servers, base = stamped
    member = held_back_member(cluster, zk, topic, {0: 10, 1: 4})
    cli = CliContext(zk_connect, data_dir, bootstrap_servers=servers)
    exporter = LagExporter(cli)
    try:
        start = time.time()
        exporter.refresh(first=True)
        span = (start, time.time())
        value = exporter.registry.get_sample_value
        for p, offset in ((0, 10), (1, 4)):
            labels = {"group": "g", "topic": topic, "partition": str(p)}
            assert near_truth(value("zkgroups_group_lag_seconds", labels), base, offset, span)
            assert value("zkgroups_group_estimated_lag_seconds", labels) is None
        assert near_truth(value("zkgroups_group_max_lag_seconds", {"group": "g"}), base, 4, span)
        reads = exporter.record_times.reads
        member.commit({TopicPartition(topic, 1): 16})
        wait_for(lambda: time.time() - span[1] > 0.2, message="time between the readings")
        start = time.time()
        exporter.refresh()
        assert exporter.record_times.reads == reads + 1  # only the commit that moved is read
        # 12 records in the time between the readings, which lies between these bounds
        shortest, longest = start - span[1], time.time() - span[0]
        estimate = value("zkgroups_group_estimated_lag_seconds", {"group": "g", "topic": topic, "partition": "1"})
        assert (RECORDS - 16) * shortest / 12 - 0.001 <= estimate <= (RECORDS - 16) * longest / 12 + 0.001
    finally:
        exporter.close()
        cli.close()


@pytest.mark.kafka
@pytest.mark.parametrize("stamped", ["kafka"], indirect=True)
def test_below_what_retention_kept_the_age_is_the_earliest_records(stamped, cluster, zk, zk_connect, data_dir,
                                                                  kafka_cluster):
    """Records 0-5 of partition 0 deleted under a group committed at 2: its oldest record it can
    still consume is 6 (the mock carries DeleteRecords as Kafka's retention would)."""
    topic, servers, base = stamped
    held_back_member(cluster, zk, topic, {0: 2, 1: 2})
    kafka_cluster.delete_records(topic, 0, 6)
    rows, span = describe(zk_connect, data_dir, servers, "g")
    assert near_truth(rows[0]["lag_seconds"], base, 6, span), rows[0]
    assert near_truth(rows[1]["lag_seconds"], base, 2, span), rows[1]
