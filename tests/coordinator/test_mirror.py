"""Topic discovery: a KRaft Kafka cluster's topics mirrored into /brokers/topics by the leading
coordinator (coordinator/mirror.py), and topic znodes as a Kafka in ZooKeeper mode writes them.

The pure part (what to write for a given Kafka answer and registry) is a table without servers.
The rest runs a real ZooKeeper and librdkafka's mock Kafka cluster (marked ``kafka``); the mock
has no ZooKeeper registry of its own, so it plays a KRaft cluster. The mock cannot grow a topic
in place (no CreatePartitions), so growth is a delete and a re-create with more partitions.
"""
import logging
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from coordinator import protocol
from coordinator.config import build
from coordinator.coordinator import CoordinatorConfig
from coordinator.errors import InvalidConfig
from coordinator.fencing import Fence
from coordinator.mirror import KafkaTopics, MirrorPlan, MirrorState, TopicMirror, check_mirror_config, plan_mirror
from coordinator.protocol import TopicZnode
from coordinator.testing.zkserver import free_port
from coordinator.topics import TopicRegistry
from tests.support.groups import Cluster, wait_stable
from tests.support.helpers import wait_for

CLUSTER = "mock-cluster-1"


def mirrored(n, cluster=CLUSTER):
    return TopicZnode(n, cluster)


def plain(n):
    return TopicZnode(n, None)


# ---------------------------------------------------------------- the plan (pure)

PLANS = [
    ("a new topic is created",
     {"a": 3}, {}, MirrorPlan(create={"a": 3})),
    ("a known topic is left as it is",
     {"a": 3}, {"a": mirrored(3)}, MirrorPlan()),
    ("a topic that grew in Kafka grows",
     {"a": 5}, {"a": mirrored(3)}, MirrorPlan(grow={"a": (3, 5)})),
    ("fewer partitions in Kafka: the known count is kept",
     {"a": 2}, {"a": mirrored(3)}, MirrorPlan(kept={"a": (3, 2)})),
    ("a mirrored topic deleted in Kafka is removed",
     {}, {"a": mirrored(3)}, MirrorPlan(remove=["a"])),
    ("a znode the mirror did not write is never removed",
     {}, {"local": plain(3)}, MirrorPlan()),
    ("a znode mirrored from another cluster is never removed",
     {}, {"a": mirrored(3, "other-cluster")}, MirrorPlan()),
    ("a znode the mirror did not write is not grown, and said once",
     {"a": 5}, {"a": plain(3)},
     MirrorPlan(left_alone={"a": "it was not written by the mirror (it says 3 partitions, Kafka says 5)"})),
    ("a znode from another cluster is not grown",
     {"a": 5}, {"a": mirrored(3, "other-cluster")},
     MirrorPlan(left_alone={"a": "it was mirrored from Kafka cluster 'other-cluster' (it says 3 partitions, "
                                 "Kafka says 5)"})),
    ("a znode the mirror did not write that agrees with Kafka is quietly left",
     {"a": 3}, {"a": plain(3)}, MirrorPlan()),
    ("an unreadable znode is left alone",
     {"a": 3}, {"a": None}, MirrorPlan(left_alone={"a": "its znode is unreadable"})),
    ("a topic whose metadata has an error is neither written nor removed",
     {"a": None, "b": None}, {"a": mirrored(3)}, MirrorPlan()),
    ("more partitions than a topic may have here",
     {"big": protocol.MAX_PARTITIONS + 1}, {},
     MirrorPlan(left_alone={"big": "it has 10,001 partitions in Kafka, more than the 10,000 a topic may have here"})),
    ("everything at once, in name order",
     {"new": 1, "grown": 4, "same": 2, "shrunk": 1},
     {"grown": mirrored(2), "same": mirrored(2), "shrunk": mirrored(3), "gone": mirrored(1), "zz-gone": mirrored(1),
      "local": plain(7)},
     MirrorPlan(create={"new": 1}, grow={"grown": (2, 4)}, remove=["gone", "zz-gone"], kept={"shrunk": (3, 1)})),
]


@pytest.mark.parametrize("kafka,registry,expected", [p[1:] for p in PLANS], ids=[p[0] for p in PLANS])
def test_plan(kafka, registry, expected):
    plan = plan_mirror(kafka, registry, CLUSTER)
    assert plan == expected
    assert plan.writes == len(expected.create) + len(expected.grow) + len(expected.remove)


def _metadata(cluster_id, topics):
    """A stand-in for librdkafka's ClusterMetadata: topic -> (error, {partition: replicas})."""
    return SimpleNamespace(cluster_id=cluster_id, topics={
        name: SimpleNamespace(error=error, partitions={p: SimpleNamespace(id=p, replicas=r) for p, r in parts.items()})
        for name, (error, parts) in topics.items()})


def test_kafka_answer_leaves_out_internal_topics_and_marks_broken_ones():
    answer = KafkaTopics.from_metadata(_metadata("c1", {
        "orders": (None, {0: [1, 2], 1: [2, 3]}),
        "__consumer_offsets": (None, {0: [1]}),
        "__transaction_state": (None, {0: [1]}),
        "leaderless": ("LEADER_NOT_AVAILABLE", {0: [1]}),
        "gappy": (None, {0: [1], 2: [1]}),
        "empty": (None, {}),
    }))
    assert answer.cluster_id == "c1"
    assert answer.counts() == {"orders": 2, "leaderless": None, "gappy": None, "empty": None}
    assert answer.replicas["orders"] == {0: [1, 2], 1: [2, 3]}
    assert KafkaTopics.from_metadata(_metadata(None, {})).cluster_id == ""


def test_mirrored_znode_is_kafkas_format_with_a_mark():
    raw = protocol.encode_mirrored_topic({1: [2, 3], 0: [1, 2]}, "c1")
    assert protocol.decode_topic_znode(raw, "/brokers/topics/t") == TopicZnode(2, "c1")
    assert protocol.decode_topic(raw, "/brokers/topics/t") == 2
    # What Kafka's own decoder reads is there as Kafka writes it; the mark is one more key.
    import json
    obj = json.loads(raw)
    assert obj["version"] == 1 and obj["partitions"] == {"0": [1, 2], "1": [2, 3]}
    assert set(obj) == {"version", "partitions", protocol.MIRROR_MARK}
    # Anyone who rewrites it (groupctl, Kafka) drops the mark: no longer the mirror's.
    assert protocol.decode_topic_znode(protocol.encode_topic(2), "/p").mirrored_from is None
    # A mark that is not the mirror's shape is no mark (never removed), and the topic still reads.
    odd = json.dumps({"version": 1, "partitions": {"0": [1]}, protocol.MIRROR_MARK: "yes"}).encode()
    assert protocol.decode_topic_znode(odd, "/p") == TopicZnode(1, None)


# ---------------------------------------------------------------- configuration (pure)

def test_mirror_settings_in_the_coordinator_config():
    config = build(CoordinatorConfig, {"bootstrap-servers": " k1:9092, k2:9092", "mirror_interval_ms": 500,
                                       "kafka": {"security.protocol": "SASL_SSL", "sasl": {"password": "hunter2"}}})
    assert config.bootstrap_servers == "k1:9092,k2:9092" and config.mirror_interval_ms == 500
    # TOML reads an unquoted sasl.password as a nested table: flattened back into its name.
    assert config.kafka == {"security.protocol": "SASL_SSL", "sasl.password": "hunter2"}
    assert "hunter2" not in repr(config)
    assert CoordinatorConfig().bootstrap_servers == "" and CoordinatorConfig().mirror_interval_ms == 10000


def test_a_coordinator_checks_a_config_made_in_code():
    from coordinator.coordinator import Coordinator
    with pytest.raises(InvalidConfig, match="is not host:port"):
        Coordinator("127.0.0.1:1", "n", CoordinatorConfig(bootstrap_servers="k1"))  # before connecting


@pytest.mark.parametrize("values,problem", [
    ({"kafka": {"security.protocol": "SSL"}}, "bootstrap_servers is not"),
    ({"bootstrap_servers": "k1"}, "is not host:port"),
    ({"bootstrap_servers": "k1:9092", "kafka": "security.protocol=SSL"}, "must be a table"),
    ({"bootstrap_servers": "k1:9092", "kafka": {"ssl.ca.location": ["a"]}}, "ssl.ca.location must be a string"),
    ({"bootstrap_servers": "k1:9092", "mirror_interval_ms": 0}, "mirror_interval_ms must be > 0"),
    ({"bootstrap_servers": 9092}, "bootstrap_servers must be str"),
])
def test_bad_mirror_settings_are_one_line(values, problem):
    with pytest.raises(InvalidConfig) as info:
        build(CoordinatorConfig, values, "c.toml")
    assert problem in str(info.value) and "\n" not in str(info.value)


@pytest.mark.kafka
def test_properties_librdkafka_refuses_are_one_line_without_their_value():
    pytest.importorskip("confluent_kafka")
    with pytest.raises(InvalidConfig, match="No such configuration property"):
        check_mirror_config("k1:9092", {"sasl.pasword": "hunter2"})
    with pytest.raises(InvalidConfig) as info:
        check_mirror_config("k1:9092", {"security.protocol": "hunter2"})
    assert "security.protocol" in str(info.value) and "hunter2" not in str(info.value)
    with pytest.raises(InvalidConfig, match="set by zkgroups"):
        check_mirror_config("k1:9092", {"bootstrap.servers": "k2:9092"})
    check_mirror_config("k1:9092", {"sasl.password": "hunter2", "socket.timeout.ms": 5000})  # sends nothing


def _coordinatord(args, env):
    return subprocess.run([sys.executable, "-m", "consumer.cli.coordinatord", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_coordinatord_mirrors_only_when_asked(tmp_path, subprocess_env):
    """KAFKA_BOOTSTRAP_SERVERS is not read (mirroring into a ZooKeeper-mode Kafka's registry
    would fight it); mirror settings are checked before ZooKeeper is contacted (none answers
    at port 1 here: every run ends on its configuration)."""
    kafka_file = tmp_path / "kafka.toml"
    kafka_file.write_text('[kafka]\nsecurity.protocol = "SASL_SSL"\n"sasl.password" = "hunter2"\n')
    env = {**subprocess_env, "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092"}
    r = _coordinatord(["--zk", "127.0.0.1:1", "--kafka-config", str(kafka_file)], env)
    assert r.returncode == 1 and "bootstrap_servers is not" in r.stderr and "Traceback" not in r.stderr
    r = _coordinatord(["--zk", "127.0.0.1:1", "--bootstrap-servers", "k1", "--zk-timeout", "0.5"], env)
    assert r.returncode == 1 and "'k1' is not host:port" in r.stderr
    r = _coordinatord(["--zk", "127.0.0.1:1", "--bootstrap-servers", "k1:9092", "--mirror-interval-ms", "0"], env)
    assert r.returncode == 1 and "mirror_interval_ms must be > 0" in r.stderr
    config = tmp_path / "c.toml"
    config.write_text('[coordinator]\nbootstrap_servers = "k1:9092"\n[coordinator.kafka]\n"sasl.pasword" = "hunter2"\n')
    r = _coordinatord(["--zk", "127.0.0.1:1", "--config", str(config)], env)
    if "confluent-kafka" in r.stderr:
        pytest.skip("confluent-kafka is not installed")
    assert r.returncode == 1 and "No such configuration property" in r.stderr and "hunter2" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.kafka
def test_coordinatord_mirrors_a_kraft_cluster(tmp_path, subprocess_env, zk_connect, zk, kafka_cluster,
                                              kafka_topic_name):
    """The options reach the leader's mirror; a secret never reaches the log, at DEBUG either."""
    from tests.cli.test_coordinatord_cli import node_process
    kafka_cluster.create_topic(kafka_topic_name, 3)
    kafka_file = tmp_path / "kafka.toml"
    kafka_file.write_text('client.id = "zkgroups-mirror-test"\nsasl.password = "hunter2"\n')
    log_path = tmp_path / "node.log"
    args = ["--zk", zk_connect, "--bootstrap-servers", kafka_cluster.bootstrap_servers, "--kafka-config",
            str(kafka_file), "--mirror-interval-ms", "500", "--log-level", "DEBUG"]
    with node_process(args, subprocess_env, log_path) as node:
        wait_for(lambda: _znode(zk, kafka_topic_name), 20, message="the topic mirrored by coordinatord")
        node.send_signal(signal.SIGTERM)
        assert node.wait(20) == 0
    text = log_path.read_text()
    assert "mirrors the topics of Kafka at" in text and "hunter2" not in text and "Traceback" not in text


# ---------------------------------------------------------------- against ZooKeeper and the mock cluster

def _znode(zk, topic):
    """The topic's znode as decoded, or None when there is none."""
    path = protocol.topic_path(topic)
    return protocol.decode_topic_znode(zk.get(path)[0], path) if zk.exists(path) else None


def _mirror_lines(caplog, text, level=logging.INFO):
    return [r for r in caplog.records
            if r.name == "zkgroups.mirror" and r.levelno >= level and text in r.getMessage()]


@pytest.fixture
def mirroring(zk_connect, kafka_cluster):
    """Start coordinators that mirror the session's mock cluster: ``mirroring(interval_ms)``."""
    clusters = []

    def start(interval_ms=300, servers=None, nodes=1):
        c = Cluster(zk_connect, bootstrap_servers=servers or kafka_cluster.bootstrap_servers,
                    mirror_interval_ms=interval_ms)
        clusters.append(c)
        for i in range(nodes):
            c.node(f"n{i}")
        c.leader()
        return c

    yield start
    for c in clusters:
        c.close()


@pytest.mark.kafka
def test_a_topic_created_in_kafka_appears_within_the_interval(mirroring, kafka_cluster, kafka_topic_name, zk):
    mirroring(interval_ms=300)
    kafka_cluster.create_topic(kafka_topic_name, 3)
    znode = wait_for(lambda: _znode(zk, kafka_topic_name), 10, message="the topic mirrored")
    assert znode.partitions == 3 and znode.mirrored_from  # carries the cluster's mark
    raw, _ = zk.get(protocol.topic_path(kafka_topic_name))
    assert protocol.decode_topic(raw, protocol.topic_path(kafka_topic_name)) == 3


@pytest.mark.kafka
def test_a_member_subscribing_to_a_new_kafka_topic_gets_it_at_once(mirroring, kafka_cluster, kafka_topic_name, zk,
                                                                    caplog):
    """The interval is a minute; the topic is there within seconds because the member's
    registration made the leader ask the mirror."""
    caplog.set_level(logging.INFO, logger="zkgroups")
    before, new = f"{kafka_topic_name}-before", f"{kafka_topic_name}-new"
    kafka_cluster.create_topic(before, 1)
    cluster = mirroring(interval_ms=60_000)
    wait_for(lambda: _znode(zk, before), 10, message="the mirror's first refresh (at the start of the term)")
    kafka_cluster.create_topic(new, 4)
    started = time.monotonic()
    member = cluster.member("g", [new])
    wait_for(lambda: _znode(zk, new), 10, message="the new topic mirrored on demand")
    mirrored_after = time.monotonic() - started
    wait_for(lambda: len(member.recorder.owned) == 4, 15, message="the member owns the new topic's 4 partitions")
    print(f"member registered -> topic mirrored {mirrored_after * 1000:.0f} ms, "
          f"-> partitions owned {(time.monotonic() - started) * 1000:.0f} ms")
    assert {tp.topic for tp in member.recorder.owned} == {new}


@pytest.mark.kafka
def test_a_regex_matching_nothing_asks_the_mirror_too(mirroring, kafka_cluster, kafka_topic_name, zk):
    cluster = mirroring(interval_ms=60_000)
    wait_for(lambda: zk.exists(protocol.BROKER_TOPICS) and TopicRegistry(zk).list(), 10,
             message="the mirror's first refresh")
    kafka_cluster.create_topic(f"{kafka_topic_name}-rx", 2)
    member = cluster.member("g", {f"{kafka_topic_name}-r.*": 1}, pattern=protocol.PATTERN_WHITE_LIST)
    wait_for(lambda: len(member.recorder.owned) == 2, 15, message="the regex's member owns the new topic")


@pytest.mark.kafka
def test_a_topic_recreated_with_more_partitions_grows_and_the_group_rebalances(mirroring, kafka_cluster,
                                                                               kafka_topic_name, zk):
    kafka_cluster.create_topic(kafka_topic_name, 2)
    cluster = mirroring(interval_ms=300)
    m1, m2 = cluster.member("g", [kafka_topic_name]), cluster.member("g", [kafka_topic_name])
    state = wait_stable(zk, "g", 2)
    wait_for(lambda: sorted(len(m.recorder.owned) for m in (m1, m2)) == [1, 1], message="one partition each")
    # The mock cannot add partitions to a topic: delete it and create it again, larger. A refresh
    # may fall between the two (the topic is then removed and mirrored again): either way the
    # registry ends with the larger count.
    kafka_cluster.delete_topic(kafka_topic_name)
    kafka_cluster.create_topic(kafka_topic_name, 6)
    wait_for(lambda: (_znode(zk, kafka_topic_name) or plain(0)).partitions == 6, 10, message="6 partitions mirrored")
    wait_stable(zk, "g", 2, after_generation=state.generation)
    wait_for(lambda: sorted(len(m.recorder.owned) for m in (m1, m2)) == [3, 3], 15, message="three partitions each")
    owned = sorted(tp.partition for m in (m1, m2) for tp in m.recorder.owned)
    assert owned == list(range(6))


@pytest.mark.kafka
def test_a_topic_deleted_in_kafka_is_removed_and_the_group_rebalances_away(mirroring, kafka_cluster,
                                                                          kafka_topic_name, zk, caplog):
    caplog.set_level(logging.INFO, logger="zkgroups")
    keep, gone = f"{kafka_topic_name}-keep", f"{kafka_topic_name}-gone"
    kafka_cluster.create_topic(keep, 2)
    kafka_cluster.create_topic(gone, 2)
    TopicRegistry(zk).create("local-only", 3)  # not the mirror's: never removed
    cluster = mirroring(interval_ms=300)
    member = cluster.member("g", [keep, gone])
    wait_for(lambda: len(member.recorder.owned) == 4, 15, message="the member owns both topics")
    state = wait_stable(zk, "g", 1)
    kafka_cluster.delete_topic(gone)
    wait_for(lambda: not zk.exists(protocol.topic_path(gone)), 10, message="the deleted topic's znode removed")
    state = wait_stable(zk, "g", 1, after_generation=state.generation)
    assert set(state.assignment) == {keep}
    wait_for(lambda: {tp.topic for tp in member.recorder.owned} == {keep}, 10, message="the member lets it go")
    assert len(_mirror_lines(caplog, f"topic {gone} was deleted in Kafka")) == 1
    assert _znode(zk, "local-only") == plain(3)


@pytest.fixture
def epoch_znode(zk):
    zk.ensure_path(protocol.COORDINATOR)
    if not zk.exists(protocol.EPOCH):
        zk.create(protocol.EPOCH, b"0")
    zk.ensure_path(protocol.BROKER_TOPICS)
    return Fence(protocol.EPOCH, zk.exists(protocol.EPOCH).version)


@pytest.mark.kafka
def test_a_deposed_leaders_mirror_writes_nothing(zk, epoch_znode, kafka_cluster, kafka_topic_name):
    """The mirror alone, at the current epoch; then the epoch moves on under it (another node
    was elected): its next write is refused, it stops and reports itself deposed."""
    first, later = f"{kafka_topic_name}-first", f"{kafka_topic_name}-later"
    kafka_cluster.create_topic(first, 1)
    deposed = []
    mirror = TopicMirror(zk, epoch_znode, kafka_cluster.bootstrap_servers, interval_ms=60_000,
                         on_deposed=deposed.append).start()
    try:
        wait_for(lambda: _znode(zk, first), 10, message="a write at the current epoch")
        zk.set(protocol.EPOCH, b"next leader")
        kafka_cluster.create_topic(later, 2)
        mirror.request_refresh()
        wait_for(lambda: deposed, 10, message="the mirror finds itself deposed")
        assert "no longer current" in deposed[0] and mirror.state is MirrorState.STOPPED
        mirror.stop(timeout=5)
        refreshes = mirror.refreshes
        mirror.request_refresh()  # a stopped mirror does nothing more
        assert not zk.exists(protocol.topic_path(later)) and mirror.refreshes == refreshes
    finally:
        mirror.stop()


@pytest.mark.kafka
def test_no_mirroring_into_the_zookeeper_of_a_zookeeper_mode_kafka(zk, epoch_znode, kafka_cluster, kafka_topic_name,
                                                                   caplog):
    """Brokers registered under /brokers/ids: a Kafka in ZooKeeper mode writes /brokers/topics
    itself, so a mirror configured by mistake writes nothing, says so once, and mirrors once
    that Kafka is gone."""
    caplog.set_level(logging.INFO, logger="zkgroups.mirror")
    broker = zk.create(protocol.BROKER_IDS + "/1", b"{}", ephemeral=True, makepath=True)
    kafka_cluster.create_topic(kafka_topic_name, 2)
    mirror = TopicMirror(zk, epoch_znode, kafka_cluster.bootstrap_servers, interval_ms=100).start()
    try:
        wait_for(lambda: mirror.refreshes >= 3, 20, message="three refreshes")
        assert not zk.exists(protocol.topic_path(kafka_topic_name))
        assert len(_mirror_lines(caplog, "a Kafka in ZooKeeper mode is registered here")) == 1
        zk.delete(broker)
        wait_for(lambda: _znode(zk, kafka_topic_name), 10, message="mirrored once no broker is registered")
    finally:
        mirror.stop()


@pytest.mark.kafka
def test_a_deposed_leader_steps_down_and_the_next_term_mirrors(mirroring, kafka_cluster, kafka_topic_name, zk):
    cluster = mirroring(interval_ms=60_000)
    node = cluster.leader()
    epoch = node.epoch
    wait_for(lambda: TopicRegistry(zk).list(), 10, message="the mirror's first refresh")
    zk.set(protocol.EPOCH, b"someone else")  # the node's term is over, though it does not know yet
    kafka_cluster.create_topic(kafka_topic_name, 2)
    cluster.member("g", [kafka_topic_name])   # on demand: the mirror writes, is refused, the node steps down
    wait_for(lambda: node.epoch is not None and node.epoch > epoch + 1, 15, message="a new term")
    wait_for(lambda: _znode(zk, kafka_topic_name), 10, message="mirrored in the new term")


@pytest.mark.kafka
def test_kafka_down_keeps_the_last_topics_with_one_line(zk_connect, zk, kafka_topic_name, caplog):
    """Every broker down: the mirror says so once and writes nothing; the group keeps its
    partitions; when Kafka is back it says so and picks up what changed."""
    from coordinator.testing.kafkamock import ALL_BROKERS, MockKafkaCluster
    caplog.set_level(logging.DEBUG, logger="zkgroups.mirror")
    with MockKafkaCluster(brokers=2) as kafka:
        kafka.create_topic(kafka_topic_name, 2)
        cluster = Cluster(zk_connect, bootstrap_servers=kafka.bootstrap_servers, mirror_interval_ms=200)
        try:
            cluster.node("n")
            member = cluster.member("g", [kafka_topic_name])
            wait_for(lambda: len(member.recorder.owned) == 2, 15, message="the member owns the topic")
            state = wait_stable(zk, "g", 1)
            kafka.broker_down(ALL_BROKERS)
            wait_for(lambda: len(_mirror_lines(caplog, "did not answer", logging.DEBUG)) >= 4, 30,
                     message="several refreshes while Kafka is down")
            warnings = [r for r in caplog.records if r.name.startswith("zkgroups.mirror")
                        and r.levelno >= logging.WARNING]
            assert len(warnings) == 1 and "the topics mirrored so far are kept" in warnings[0].getMessage(), warnings
            assert _znode(zk, kafka_topic_name).partitions == 2
            assert len(member.recorder.owned) == 2
            assert wait_stable(zk, "g", 1).generation == state.generation
            kafka.broker_up(ALL_BROKERS)
            kafka.create_topic(f"{kafka_topic_name}-after", 1)
            wait_for(lambda: _znode(zk, f"{kafka_topic_name}-after"), 20, message="mirroring resumed")
            assert len(_mirror_lines(caplog, "answers again")) == 1
        finally:
            cluster.close()


@pytest.mark.kafka
def test_a_mirror_pointed_where_nobody_listens_is_bounded(zk, epoch_znode, caplog):
    pytest.importorskip("confluent_kafka")
    caplog.set_level(logging.DEBUG, logger="zkgroups.mirror")
    TopicRegistry(zk).create("local-only", 2)
    mirror = TopicMirror(zk, epoch_znode, f"127.0.0.1:{free_port()}", interval_ms=100).start()
    try:
        wait_for(lambda: mirror.refreshes >= 3, 30, message="three refreshes")
    finally:
        mirror.stop(timeout=5)
    warnings = [r for r in caplog.records if r.name.startswith("zkgroups.mirror") and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "did not answer" in warnings[0].getMessage()
    assert TopicRegistry(zk).list() == ["local-only"]


def test_zookeeper_mode_znodes_drive_rebalances_without_a_mirror(cluster, zk):
    """What Kafka in ZooKeeper mode writes (version 2 with the reassignment fields, version 3
    with a topic id after partitions were added) is read as is; no mirror is configured."""
    import json
    path = protocol.topic_path("zkmode")
    zk.create(path, json.dumps({"version": 2, "partitions": {"0": [1, 2], "1": [2, 3]},
                                "adding_replicas": {}, "removing_replicas": {}}).encode(), makepath=True)
    cluster.node("n")
    m1, m2 = cluster.member("g", ["zkmode"]), cluster.member("g", ["zkmode"])
    state = wait_stable(zk, "g", 2)
    wait_for(lambda: sorted(len(m.recorder.owned) for m in (m1, m2)) == [1, 1], message="one partition each")
    zk.set(path, json.dumps({"version": 3, "topic_id": "3sRZ7yWwTsC9O2ieIS7tDA",
                             "partitions": {str(p): [1 + p % 3, 1 + (p + 1) % 3] for p in range(4)},
                             "adding_replicas": {"0": [3]}, "removing_replicas": {"0": [1]}}).encode())
    wait_stable(zk, "g", 2, after_generation=state.generation)
    wait_for(lambda: sorted(len(m.recorder.owned) for m in (m1, m2)) == [2, 2], message="two partitions each")
    assert not cluster.nodes[0].config.bootstrap_servers
