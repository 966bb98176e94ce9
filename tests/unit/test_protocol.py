"""Every codec of the ZooKeeper contract (coordinator.protocol): round trips, and a table of
payloads that are not what zkgroups writes, each rejected as CorruptZnode naming the znode and
the problem on one line. No ZooKeeper."""
import json

import pytest

from coordinator import protocol
from coordinator.errors import CorruptZnode, InvalidName
from coordinator.protocol import Command, GroupState, LeaderInfo, Registration

PATH = "/consumers/groups/g/some/znode"


def dump(obj) -> bytes:
    return json.dumps(obj).encode()


def test_round_trips():
    reg = Registration({"t": 2}, protocol.PATTERN_STATIC, ["sticky", "range"], "h", "client", 5)
    assert Registration.decode(reg.encode(), PATH) == reg
    cmd = Command(protocol.START_FETCHER, 7, 3, {"t": {0: "c-0", 5: "c-1"}}, "c")
    assert Command.decode(cmd.encode(), PATH) == cmd
    stop = Command(protocol.STOP_FETCHER, 7, 3, consumer_id="c")
    assert Command.decode(stop.encode(), PATH) == stop
    state = GroupState(4, protocol.STABLE, ["a", "b"], {"t": {0: "a-0"}}, "range", "", 2, 99)
    assert GroupState.decode(state.encode(), PATH) == state
    leader = LeaderInfo("n", "h", 12, 3, 1000, True)
    assert LeaderInfo.decode(leader.encode(), PATH) == leader
    assert protocol.decode_topic(protocol.encode_topic(3), PATH) == 3
    assert protocol.decode_offset(protocol.encode_offset(42), PATH) == 42
    assert protocol.decode_offset(protocol.encode_offset(None), PATH) is None
    assert GroupState.decode(b"", PATH) == GroupState()


BAD = [
    ("registration", Registration.decode, b"\xff\xfe", "not JSON"),
    ("registration", Registration.decode, b"[]", "not a JSON object"),
    ("registration", Registration.decode, dump({"version": 3, "subscription": {"t": 1}}), "unsupported version"),
    ("registration", Registration.decode, dump({"version": 1, "subscription": {}}), "no subscription"),
    ("registration", Registration.decode, dump({"version": 1, "subscription": {"t": 0}, "pattern": "static",
                                                "strategies": ["range"]}), "streams >= 1"),
    ("registration", Registration.decode, dump({"version": 1, "subscription": {"t": 1}, "pattern": "fuzzy",
                                                "strategies": ["range"]}), "pattern must be one of"),
    ("registration", Registration.decode, dump({"version": 1, "subscription": {"../x": 1}, "pattern": "static",
                                                "strategies": ["range"]}), "illegal"),
    ("registration", Registration.decode, dump({"version": 1, "subscription": {"a": 1, "b": 1},
                                                "pattern": "white_list", "strategies": ["range"]}), "exactly one regex"),
    ("registration", Registration.decode, dump({"version": 1, "subscription": {"(a)\\1": 1}, "pattern": "white_list",
                                                "strategies": ["range"]}), "cannot be evaluated safely"),
    ("registration", Registration.decode, dump({"version": 1, "subscription": {"t": 1}, "pattern": "static",
                                                "strategies": []}), "at least one assignment strategy"),
    ("command", Command.decode, b"{", "not JSON"),
    ("command", Command.decode, dump({"version": 1, "option": "explode", "generation": 1, "epoch": 1}),
     "unknown command option"),
    ("command", Command.decode, dump({"version": 1, "option": "stop-fetcher", "epoch": 1}), "integer generation"),
    ("command", Command.decode, dump({"version": 1, "option": "start-fetcher", "generation": 1, "epoch": 1,
                                      "ownership": []}), "ownership must be a map"),
    ("command", Command.decode, dump({"version": 1, "option": "start-fetcher", "generation": 1, "epoch": 1,
                                      "ownership": {"t": {"x": "s"}}}), "topic -> partition -> stream id"),
    ("group state", GroupState.decode, dump({"version": 1, "state": "Sleeping"}), "unknown group state"),
    ("group state", GroupState.decode, dump({"version": 1, "state": "Stable", "generation": "x"}), "malformed"),
    ("group state", GroupState.decode, dump({"version": 1, "state": "Stable", "assignment": {"t": {"x": 1}}}),
     "malformed"),
    ("leader", LeaderInfo.decode, dump({"version": 1, "node_id": "n"}), "malformed"),
    ("topic", protocol.decode_topic, dump({"version": 1}), "no 'partitions' map"),
    ("topic", protocol.decode_topic, dump({"version": 1, "partitions": {"0": [0], "2": [0]}}), "not numbered 0..n-1"),
    ("topic", protocol.decode_topic, dump({"version": 1, "partitions": {"a": [0]}}), "non-numeric"),
    ("topic", protocol.decode_topic, dump({"version": 1, "partitions": {"1_0": [0]}}), "non-numeric"),
    ("topic", protocol.decode_topic, dump({"version": 1, "partitions": {"0": 1}}), "list their replicas"),
    ("topic", protocol.decode_topic, dump({"version": 1, "partitions": {"0": ["b1"]}}), "list their replicas"),
    ("topic", protocol.decode_topic, dump({"version": "2", "partitions": {"0": [0]}}), "bad version"),
    ("topic", protocol.decode_topic, dump({"version": 2, "partitions": {"0": [0]}, "adding_replicas": []}),
     "'adding_replicas' must map"),
    ("topic", protocol.decode_topic, dump({"version": 3, "partitions": {"0": [0]}, "topic_id": 7}),
     "'topic_id' must be a string"),
    ("offset", protocol.decode_offset, b"ten", "not a decimal number"),
    ("offset", protocol.decode_offset, b"-5", "negative"),
]


#: Topic znodes as Kafka in ZooKeeper mode writes them (kafka.zk.TopicZNode): version 1 until 2.3,
#: version 2 (adding_replicas / removing_replicas, KIP-455) from 2.4, version 3 with an optional
#: topic_id (KIP-516) from 2.8. Kafka's decoder reads the keys it knows and ignores the rest.
KAFKA_TOPIC_ZNODES = [
    ("version 1", {"version": 1, "partitions": {"0": [1], "1": [2]}}, 2),
    ("version 2", {"version": 2, "partitions": {"0": [1, 2]}, "adding_replicas": {}, "removing_replicas": {}}, 1),
    ("version 2 during a reassignment",
     {"version": 2, "partitions": {"0": [1, 2, 3], "1": [2, 3]}, "adding_replicas": {"0": [3]},
      "removing_replicas": {"0": [1]}}, 2),
    ("version 3 with a topic id",
     {"version": 3, "partitions": {"0": [1, 2], "1": [2, 3], "2": [3, 1]}, "adding_replicas": {},
      "removing_replicas": {}, "topic_id": "3sRZ7yWwTsC9O2ieIS7tDA"}, 3),
    ("version 3 without a topic id", {"version": 3, "partitions": {"0": [1]}, "adding_replicas": {},
                                      "removing_replicas": {}}, 1),
    ("partitions in any order", {"version": 1, "partitions": {"2": [1], "0": [1], "1": [1]}}, 3),
    ("keys Kafka does not know", {"version": 4, "partitions": {"0": [1]}, "future": {"x": 1}}, 1),
    ("written by the topic mirror",
     {"version": 1, "partitions": {"0": [1]}, protocol.MIRROR_MARK: {"cluster_id": "c"}}, 1),
]


@pytest.mark.parametrize("obj,partitions", [k[1:] for k in KAFKA_TOPIC_ZNODES], ids=[k[0] for k in KAFKA_TOPIC_ZNODES])
def test_topic_znodes_as_kafka_writes_them(obj, partitions):
    assert protocol.decode_topic(dump(obj), PATH) == partitions


@pytest.mark.parametrize("decode,raw,problem", [b[1:] for b in BAD], ids=[f"{b[0]}: {b[3]}" for b in BAD])
def test_bad_payloads_are_one_named_line(decode, raw, problem):
    with pytest.raises(CorruptZnode) as info:
        decode(raw, PATH)
    assert info.value.path == PATH and problem in info.value.problem
    assert "\n" not in str(info.value) and str(info.value).startswith(PATH)


@pytest.mark.parametrize("name,ok", [("orders", True), ("a.b_c-9", True), ("x" * 249, True), ("", False),
                                     (".", False), ("..", False), ("a/b", False), ("x" * 250, False),
                                     ("ä", False), (None, False)])
def test_names(name, ok):
    if ok:
        assert protocol.validate_name(name) == name
    else:
        with pytest.raises(InvalidName):
            protocol.validate_name(name)


def test_topic_regexes_match_in_linear_time_and_refuse_what_they_cannot_evaluate():
    assert protocol.topic_matcher(r"logs\..*").fullmatch("logs.app")
    assert not protocol.topic_matcher("(a+)+$").fullmatch("a" * 10_000 + "b")  # instant with RE2
    for unsafe in (r"(a)\1", "(?=a)a", "["):
        with pytest.raises(ValueError, match="cannot be evaluated safely"):
            protocol.topic_matcher(unsafe)


def test_paths():
    assert protocol.owners_path("g", "t", 3) == "/consumers/groups/g/owners/t/3"
    assert protocol.offsets_path("g", "t") == "/consumers/groups/g/offsets/t"
    assert protocol.command_prefix("g", "c") == "/consumers/groups/g/channel/c/cmd-"
    assert protocol.consumer_of_stream(protocol.stream_id("g_host-1-ab", 2)) == "g_host-1-ab"
