"""groupctl on Kafka: every command that reads or writes records, against librdkafka's mock
cluster and a real ZooKeeper.

Each test's topic is made on the mock (``kafka_cluster.create_topic``) and registered in
ZooKeeper as Kafka in ZooKeeper mode registers it (``TopicRegistry(zk).create``: the
coordinator reads ``/brokers/topics``). Commands run in-process (click's CliRunner) unless the
test is about what a real process prints: ``consume`` under a running coordinator node, bad
bootstrap servers, Kafka unreachable, an AdminClient request the mock does not carry out.
Every error is one line, ``error: ...``, with the exit status of its kind, in bounded time,
with no librdkafka line on stderr.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")

from click.testing import CliRunner  # noqa: E402

from consumer.cli.groupctl import main  # noqa: E402
from consumer.hashing import partition_for_key  # noqa: E402
from consumer.producer import Producer  # noqa: E402
from coordinator.errors import EXIT_RETRIABLE  # noqa: E402
from coordinator.testing.zkserver import free_port  # noqa: E402
from coordinator.topics import TopicRegistry  # noqa: E402
from tests.support.groups import wait_stable  # noqa: E402
from tests.support.helpers import GROUPCTL, assert_failed, assert_one_line_error, committed, ok, wait_for  # noqa: E402

pytestmark = pytest.mark.kafka

BOUND_S = 30  # every command ends within this, whatever it waits for


@pytest.fixture
def topic(kafka_cluster, kafka_topic_name, zk):
    """A 3-partition topic on Kafka, registered in ZooKeeper as Kafka in ZooKeeper mode does."""
    kafka_cluster.create_topic(kafka_topic_name, 3)
    TopicRegistry(zk).create(kafka_topic_name, 3)
    return kafka_topic_name


@pytest.fixture
def kgroupctl(kafka_cluster, zk_connect, data_dir):
    """groupctl in-process on Kafka (the mock cluster) and this test's ZooKeeper chroot."""
    def run(*args, input=None):
        return CliRunner().invoke(main, ["--zk", zk_connect, "--data-dir", data_dir, "--bootstrap-servers",
                                         kafka_cluster.bootstrap_servers, *args], input=input)
    return run


def run_groupctl(args, env, timeout=BOUND_S, input=None):
    """groupctl as a real process; returns (exit status, stdout, stderr, seconds)."""
    started = time.monotonic()
    proc = subprocess.run([*GROUPCTL, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          input=input, stdin=None if input is not None else subprocess.DEVNULL)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started


def table(text: str, header: str):
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    return [line.split() for line in lines[start + 1:] if line.strip()]


def kafka_committed(cluster, group, topic, partitions):
    """The group's committed offsets as Kafka's own tools see them (a plain confluent-kafka consumer)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group})
    try:
        found = consumer.committed([confluent_kafka.TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}


def produce(cluster, topic, keys):
    with Producer(bootstrap_servers=cluster.bootstrap_servers) as producer:
        for key in keys:
            producer.send(topic, b"value-" + key, key=key)


# ---------------------------------------------------------------- topics and produce

def test_topics_list_and_describe_come_from_kafka(kgroupctl, kafka_cluster, topic):
    keys = [b"user-%d" % i for i in range(200)]
    lines = "".join(f"{k.decode()}:v{i}\n" for i, k in enumerate(keys))
    assert "produced 200 records" in ok(kgroupctl("produce", topic, "--key-separator", ":", input=lines))
    assert [topic, "3"] in [row.split() for row in ok(kgroupctl("topics", "list")).splitlines()]
    out = ok(kgroupctl("topics", "describe", topic))
    assert out.startswith(f"topic {topic}: 3 partitions (Kafka at {kafka_cluster.bootstrap_servers})")
    leaders = {p.id: p.leader for p in confluent_kafka.admin.AdminClient(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers}).list_topics(topic, timeout=10).topics[topic]
        .partitions.values()}
    per_partition = [sum(partition_for_key(k, 3) == p for k in keys) for p in range(3)]
    assert table(out, "PARTITION") == [[str(p), str(leaders[p]), "0", str(per_partition[p]), str(per_partition[p])]
                                       for p in range(3)]


def test_produce_places_keys_as_java_does_and_refuses_fsync(kgroupctl, kafka_cluster, topic):
    ok(kgroupctl("produce", topic, "--key", "one-key", "--generate", "20"))
    ok(kgroupctl("produce", topic, "--partition", "1", "--generate", "5"))
    rows = {int(r[0]): int(r[3]) for r in table(ok(kgroupctl("topics", "describe", topic)), "PARTITION")}
    expected = {p: 0 for p in range(3)}
    expected[partition_for_key(b"one-key", 3)] += 20
    expected[1] += 5
    assert rows == expected
    assert_failed(kgroupctl("produce", topic, "--fsync", "never", "--generate", "1"), "--fsync is for the embedded log",
                  exit_code=2)
    assert_failed(kgroupctl("produce", topic, "--partition", "3", "--generate", "1"), "partition 3 of topic")


def test_topics_create_and_add_partitions_end_with_one_line_on_the_mock(kafka_cluster, topic, zk_connect,
                                                                        subprocess_env):
    servers = ["--zk", zk_connect, "--bootstrap-servers", kafka_cluster.bootstrap_servers, "--zk-timeout", "1"]
    for args, said in ((["topics", "create", topic + "-new", "--partitions", "2"], "did not create topic"),
                       (["topics", "add-partitions", topic, "--to", "5"], "did not add partitions to topic")):
        code, out, err, seconds = run_groupctl([*servers, *args], subprocess_env)
        assert code == EXIT_RETRIABLE and seconds < BOUND_S, (code, err)
        assert_one_line_error(code, out, err, said)  # the mock has no controller: CreateTopics times out
    code, out, err, _ = run_groupctl([*servers, "topics", "add-partitions", topic, "--to", "2"], subprocess_env)
    assert code == 1 and "never removed" in err
    code, out, err, _ = run_groupctl([*servers, "topics", "add-partitions", topic, "--to", "3"], subprocess_env)
    assert code == 0 and out.strip() == f"topic {topic} already has 3 partitions"


# ---------------------------------------------------------------- consume, describe, reset

def test_consume_reads_kafka_under_a_coordinator_and_copies_commits_to_kafka(
        cluster, kafka_cluster, topic, zk, zk_connect, kgroupctl, subprocess_env):
    cluster.node("n1")
    keys = [b"k%d" % i for i in range(300)]
    produce(kafka_cluster, topic, keys)
    code, out, err, _ = run_groupctl(
        ["--zk", zk_connect, "--bootstrap-servers", kafka_cluster.bootstrap_servers, "consume", "g", topic,
         "--max-records", "300", "--kafka-commit-offsets", "--session-timeout-ms", "2000"],
        subprocess_env, timeout=60)
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["key"] for r in records) == sorted(k.decode() for k in keys)
    for r in records:
        assert r["partition"] == partition_for_key(r["key"].encode(), 3) and r["value"] == "value-" + r["key"]
    assert "Traceback" not in err and all(line.startswith(("warning: ", "consumed ")) for line in err.splitlines())

    ends = {p: sum(partition_for_key(k, 3) == p for k in keys) for p in range(3)}
    assert committed(zk, "g", topic, 3) == ends
    assert kafka_committed(kafka_cluster, "g", topic, 3) == ends  # Kafka's own tools see the same

    # describe (of a live member's assignment): ZooKeeper's committed offsets against Kafka's log end.
    member = cluster.member("g", [topic])
    wait_for(lambda: len(member.owned()) == 3, message="the member owns every partition")
    produce(kafka_cluster, topic, [b"more-%d" % i for i in range(50)])
    rows = [r[:9] for r in table(ok(kgroupctl("groups", "describe", "g")), "GROUP")]  # (not the ages: they grow)
    assert sum(int(r[5]) for r in rows) == 50
    assert {int(r[2]): int(r[3]) for r in rows} == ends

    # The copy in Kafka is only a copy: whatever it holds, describe shows ZooKeeper's offsets.
    other = confluent_kafka.Consumer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": "g"})
    other.commit(offsets=[confluent_kafka.TopicPartition(topic, p, 1) for p in range(3)], asynchronous=False)
    other.close()
    assert [r[:9] for r in table(ok(kgroupctl("groups", "describe", "g")), "GROUP")] == rows


def test_reset_offsets_uses_kafkas_offsets_and_writes_zookeeper(kgroupctl, kafka_cluster, topic, zk):
    produce(kafka_cluster, topic, [b"k%d" % i for i in range(90)])
    ends = {p: sum(partition_for_key(b"k%d" % i, 3) == p for i in range(90)) for p in range(3)}
    kafka_cluster.delete_records(topic, 0, 2)  # partition 0 now starts at offset 2
    out = ok(kgroupctl("groups", "reset-offsets", "g", "--topic", topic, "--to-earliest"))
    assert "dry run" in out and committed(zk, "g", topic, 3) == {0: None, 1: None, 2: None}
    ok(kgroupctl("groups", "reset-offsets", "g", "--topic", topic, "--to-earliest", "--execute"))
    assert committed(zk, "g", topic, 3) == {0: 2, 1: 0, 2: 0}
    ok(kgroupctl("groups", "reset-offsets", "g", "--topic", topic, "--to-latest", "--execute"))
    assert committed(zk, "g", topic, 3) == ends
    ok(kgroupctl("groups", "reset-offsets", "g", "--topic", topic, "--to-offset", "1", "--execute"))
    assert committed(zk, "g", topic, 3) == {0: 2, 1: 1, 2: 1}  # clamped to what Kafka holds
    # The mock answers every ListOffsets by time with -1 (none): the target is the log end.
    ok(kgroupctl("groups", "reset-offsets", "g", "--topic", topic, "--to-datetime", "2026-01-01T00:00:00",
                 "--execute"))
    assert committed(zk, "g", topic, 3) == ends


def test_describe_says_once_when_an_assigned_topic_is_not_on_kafka(kgroupctl, cluster, zk, kafka_topic_name):
    cluster.node("n1")
    TopicRegistry(zk).create(kafka_topic_name, 1)  # in ZooKeeper only
    member = cluster.member("g", [kafka_topic_name])
    wait_for(lambda: member.owned(), message="an assignment")
    result = kgroupctl("groups", "describe", "g")
    assert result.exit_code == 0, result.output
    assert result.stderr.count(f"warning: topic {kafka_topic_name} is not on Kafka at") == 1
    assert table(result.stdout, "GROUP")[0][4:6] == ["-", "-"]


def test_describe_views_and_json_on_kafka(kgroupctl, cluster, kafka_cluster, topic, zk):
    """Each describe view and its JSON for a group reading Kafka: committed offsets from
    ZooKeeper, log ends from Kafka, owners from the group state."""
    cluster.node("n1")
    produce(kafka_cluster, topic, [b"k%d" % i for i in range(60)])
    ends = {p: sum(partition_for_key(b"k%d" % i, 3) == p for i in range(60)) for p in range(3)}
    ok(kgroupctl("groups", "reset-offsets", "g", "--topic", f"{topic}:0,1", "--to-earliest", "--execute"))
    member = cluster.member("g", [topic])
    wait_for(lambda: len(member.owned()) == 3, message="the member owns every partition")
    wait_stable(zk, "g", 1)  # the member acks before the coordinator records the generation Stable
    cid, host = member.consumer_id, socket.gethostname()

    shown = table(ok(kgroupctl("groups", "describe", "g")), "GROUP")
    rows = [r[:9] for r in shown]
    assert rows == [["g", topic, str(p), "0" if p < 2 else "-", str(ends[p]), str(ends[p]) if p < 2 else "-",
                     cid, host, "-"] for p in range(3)]
    assert [r[9] != "-" for r in shown] == [True, True, False]  # the ages of the records at offset 0
    document = json.loads(ok(kgroupctl("groups", "describe", "g", "--output", "json")))
    assert [[r["group"], r["topic"], str(r["partition"]), "-" if r["current_offset"] is None else str(r["current_offset"]),
             str(r["log_end_offset"]), "-" if r["lag"] is None else str(r["lag"]), r["consumer_id"], r["host"],
             r["client_id"] or "-"] for r in document["offsets"]] == rows

    assert table(ok(kgroupctl("groups", "describe", "g", "--members", "--verbose")), "GROUP") == \
        [["g", cid, host, "-", "3", "range", topic, f"{topic}(0,1,2)"]]
    (member_row,) = json.loads(ok(kgroupctl("groups", "describe", "g", "--members", "-o", "json")))["members"]
    assert member_row["assignment"] == {topic: [0, 1, 2]} and member_row["partitions"] == 3

    state = table(ok(kgroupctl("groups", "describe", "g", "--state")), "GROUP")
    assert state[0][:5] == ["g", "n1", "range", "Stable", "1"]
    (state_row,) = json.loads(ok(kgroupctl("groups", "describe", "--all-groups", "--state", "-o", "json")))["groups"]
    assert [state_row[k] for k in ("group", "coordinator", "assignment_strategy", "state", "members")] == \
        ["g", "n1", "range", "Stable", 1] and str(state_row["generation"]) == state[0][5]

    listing = json.loads(ok(kgroupctl("topics", "list", "-o", "json")))["topics"]
    assert {"topic": topic, "partitions": 3, "error": None} in listing
    described = json.loads(ok(kgroupctl("topics", "describe", topic, "-o", "json")))
    assert described["data_plane"] == "kafka"
    assert [(p["latest"], p["bytes"]) for p in described["partitions"]] == [(ends[p], None) for p in range(3)]
    assert all(isinstance(p["leader"], int) for p in described["partitions"])


def test_reset_offsets_kafka_options_on_kafka(kgroupctl, kafka_cluster, topic, zk, tmp_path):
    """--shift-by, --to-current, partition lists and an --export / --from-file round trip, with
    targets from Kafka's offsets and clamped into them."""
    produce(kafka_cluster, topic, [b"k%d" % i for i in range(90)])
    ends = {p: sum(partition_for_key(b"k%d" % i, 3) == p for i in range(90)) for p in range(3)}
    kafka_cluster.delete_records(topic, 0, 2)  # partition 0 now starts at offset 2
    ok(kgroupctl("groups", "reset-offsets", "g", "--topic", topic, "--to-latest", "--execute"))
    result = kgroupctl("groups", "reset-offsets", "g", "--topic", f"{topic}:0,2", "--shift-by", f"-{ends[0]}",
                       "--execute")
    assert ok(result) and f"warning: {topic}-0: {0} is before the earliest offset 2; using 2" in result.stderr
    assert committed(zk, "g", topic, 3) == {0: 2, 1: ends[1], 2: max(0, ends[2] - ends[0])}
    exported = ok(kgroupctl("groups", "reset-offsets", "g", "--topic", topic, "--to-current", "--export"))
    assert exported == "".join(f"{topic},{p},{o}\n" for p, o in committed(zk, "g", topic, 3).items())
    ok(kgroupctl("groups", "reset-offsets", "g", "--topic", topic, "--to-earliest", "--execute"))
    plan = tmp_path / "plan.csv"
    plan.write_text(exported)
    ok(kgroupctl("groups", "reset-offsets", "g", "--from-file", str(plan), "--execute"))
    assert exported == "".join(f"{topic},{p},{o}\n" for p, o in committed(zk, "g", topic, 3).items())


# ---------------------------------------------------------------- bad input, bounded

def test_bad_or_unreachable_bootstrap_servers_and_unknown_topics_are_one_line(
        kafka_cluster, topic, zk_connect, subprocess_env, tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    base = ["--zk", zk_connect, "--zk-timeout", "1"]
    cases = [
        (["--bootstrap-servers", "no-port", "topics", "list"], 2, "is not host:port"),
        (["--bootstrap-servers", "a:1,,b:2", "topics", "list"], 2, "is not host:port"),
        (["--bootstrap-servers", "host:99999", "topics", "list"], 2, "is not host:port"),
        (["--bootstrap-servers", dead, "topics", "list"], EXIT_RETRIABLE, f"Kafka at {dead} did not answer within 1s"),
        (["--bootstrap-servers", dead, "topics", "describe", topic], EXIT_RETRIABLE, "did not answer"),
        (["--bootstrap-servers", dead, "produce", topic, "--generate", "1"], EXIT_RETRIABLE, "did not answer"),
        (["--bootstrap-servers", dead, "consume", "g", topic, "--max-records", "1"], EXIT_RETRIABLE, "did not answer"),
        (["--bootstrap-servers", dead, "groups", "reset-offsets", "g", "--topic", topic, "--to-earliest"],
         EXIT_RETRIABLE, "did not answer"),
    ]
    servers = ["--bootstrap-servers", kafka_cluster.bootstrap_servers]
    for command in (["topics", "describe", "missing"], ["produce", "missing", "--generate", "1"],
                    ["consume", "g", "missing", "--max-records", "1"],
                    ["groups", "reset-offsets", "g", "--topic", "missing", "--to-latest"]):
        cases.append(([*servers, *command], 1, "topic 'missing' does not exist"))
    cases.append((["--data-dir", str(tmp_path), "consume", "g", topic, "--kafka-commit-offsets"], 2,
                  "--kafka-commit-offsets needs Kafka"))
    for args, exit_code, said in cases:
        code, out, err, seconds = run_groupctl([*base, *args], subprocess_env)
        assert code == exit_code and seconds < BOUND_S, (args, code, err)
        assert_one_line_error(code, out, err, said)
    # librdkafka's own lines are there, in Python logging's form, with -v only.
    code, out, err, _ = run_groupctl([*base, "-v", "--bootstrap-servers", dead, "topics", "list"], subprocess_env)
    assert code == EXIT_RETRIABLE and "Connect to" in err and err.splitlines()[-1].startswith("error: Kafka at")
    assert all(line.startswith(("error: ", "warning: ", "info: ")) for line in err.splitlines()), err
    env = dict(subprocess_env, KAFKA_BOOTSTRAP_SERVERS="not a server list")
    code, out, err, _ = run_groupctl([*base, "topics", "list"], env)
    assert code == 2 and "KAFKA_BOOTSTRAP_SERVERS" in err
    assert_one_line_error(code, out, err, "is not host:port")


def test_kafka_config_files_pass_properties_through_and_never_show_them(
        kafka_cluster, topic, zk_connect, subprocess_env, tmp_path):
    base = ["--zk", zk_connect, "--zk-timeout", "2"]
    good = tmp_path / "good.toml"
    good.write_text(f'[kafka]\n"bootstrap.servers" = "{kafka_cluster.bootstrap_servers}"\n'
                    'client.id = "groupctl-test"\n')  # a dotted key: a nested table in TOML
    code, out, err, _ = run_groupctl([*base, "--kafka-config", str(good), "topics", "list"], subprocess_env)
    assert code == 0 and topic in out, err
    secret = tmp_path / "secret.toml"
    secret.write_text('"security.protocol" = "sasl_hunter2"\n"sasl.password" = "hunter2"\n')
    for verbose in ([], ["-v"], ["-v", "--log-format", "json"]):
        code, out, err, _ = run_groupctl([*base, *verbose, "--bootstrap-servers", kafka_cluster.bootstrap_servers,
                                          "--kafka-config", str(secret), "topics", "list"], subprocess_env)
        assert code == 1 and "hunter2" not in out + err, err
        assert "security.protocol" in err.splitlines()[-1]
    lonely = tmp_path / "lonely.toml"
    lonely.write_text('"client.id" = "x"\n')
    code, out, err, _ = run_groupctl([*base, "--kafka-config", str(lonely), "topics", "list"], subprocess_env)
    assert_one_line_error(code, out, err, "--kafka-config needs Kafka's brokers")
    assert code == 2
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[kafka]\n"sasl.password" = ["hunter2"]\n')
    code, out, err, _ = run_groupctl([*base, "--kafka-config", str(wrong), "--bootstrap-servers",
                                      kafka_cluster.bootstrap_servers, "topics", "list"], subprocess_env)
    assert_one_line_error(code, out, err, "sasl.password must be a string")
    assert "hunter2" not in err


def test_consume_takes_kafka_settings_from_its_config_file(kafka_cluster, topic, zk_connect, subprocess_env, tmp_path):
    config = tmp_path / "consumer.toml"
    config.write_text(f'[consumer]\nbootstrap_servers = "{kafka_cluster.bootstrap_servers}"\n'
                      '[consumer.kafka]\n"client.id" = "from-the-file"\n')
    # Kafka from the file: a topic Kafka does not have is one line (the embedded log would wait for it).
    code, out, err, _ = run_groupctl(["--zk", zk_connect, "consume", "g", "missing", "--config", str(config)],
                                     subprocess_env)
    assert code == 1
    assert_one_line_error(code, out, err, "topic 'missing' does not exist")
    config.write_text('[consumer]\nbootstrap_servers = "no-port"\n')
    code, out, err, _ = run_groupctl(["--zk", zk_connect, "consume", "g", topic, "--config", str(config)],
                                     subprocess_env)
    assert_one_line_error(code, out, err, "is not host:port")
