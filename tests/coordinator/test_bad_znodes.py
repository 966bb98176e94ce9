"""Stale or hostile znodes never stop a group: each gets one named log line, the victim group
keeps all its partitions with only its real members, and a healthy group keeps rebalancing.

A stranger (an ordinary ZooKeeper client of the test) writes the bad znode; the coordinator and
the members run against a real ZooKeeper. After each case both groups must still follow a
topic that grows.
"""
from __future__ import annotations

import json
import logging

import pytest

from coordinator import protocol, read
from coordinator.topics import TopicRegistry
from tests.support.groups import read_state, wait_stable
from tests.support.helpers import wait_for

V, H = "victim", "healthy"


@pytest.fixture
def groups(cluster, zk, caplog):
    """A coordinator; group V (two members on topic t, 4 partitions) and group H (one member
    on topic h, 2 partitions), both Stable."""
    caplog.set_level(logging.INFO)
    registry = TopicRegistry(zk)
    registry.create("t", 4)
    registry.create("h", 2)
    cluster.node("n")
    victims = [cluster.member(V, ["t"]), cluster.member(V, ["t"])]
    healthy = cluster.member(H, ["h"])
    wait_stable(zk, V, 2)
    wait_stable(zk, H, 1)
    wait_for(lambda: owned(victims) == set(range(4)), message="victims own t")
    return victims, healthy


def owned(members, topic="t"):
    parts = [p.partition for m in members for p in m.recorder.owned if p.topic == topic]
    assert len(parts) == len(set(parts)), f"a partition is owned twice: {sorted(parts)}"
    return set(parts)


def assert_both_groups_follow_a_growing_topic(zk, victims, healthy, t_partitions=5, h_partitions=3):
    registry = TopicRegistry(zk)
    registry.add_partitions("t", t_partitions)
    registry.add_partitions("h", h_partitions)
    wait_for(lambda: owned(victims) == set(range(t_partitions)), 15, message="the victim group follows t")
    wait_for(lambda: owned([healthy], "h") == set(range(h_partitions)), 15, message="the healthy group follows h")


def logged(caplog, *fragments):
    return [r.getMessage() for r in caplog.records if all(f in r.getMessage() for f in fragments)]


def epoch_path(zk, group=V):
    """The epoch znode of the group's shard (its version bounds any command's epoch)."""
    return protocol.shard_epoch_path(protocol.shard_of(group, read.shard_count(zk)))


def current_epoch(zk):
    return zk.exists(epoch_path(zk)).version


def generation(zk, group=V):
    return read_state(zk, group).generation


COMMANDS = [
    ("garbage JSON", lambda e, g, cid: b"{not json", "unreadable"),
    ("not an object", lambda e, g, cid: b"[1, 2]", "unreadable"),
    ("unknown option", lambda e, g, cid: json.dumps(
        {"version": 1, "option": "drop-everything", "generation": g + 1, "epoch": e, "consumer_id": cid}).encode(),
     "unknown command option"),
    ("no generation", lambda e, g, cid: json.dumps(
        {"version": 1, "option": "stop-fetcher", "epoch": e, "consumer_id": cid}).encode(), "unreadable"),
    ("an older generation", lambda e, g, cid: protocol.Command(
        protocol.STOP_FETCHER, g - 1, e, consumer_id=cid).encode(), "stale"),
    ("an older epoch", lambda e, g, cid: protocol.Command(
        protocol.STOP_FETCHER, g, e - 1, consumer_id=cid).encode(), "stale"),
    ("another member's", lambda e, g, cid: protocol.Command(
        protocol.STOP_FETCHER, g + 1, e, consumer_id="victim_someone-else").encode(), "addressed to"),
    ("a future epoch", lambda e, g, cid: protocol.Command(
        protocol.STOP_FETCHER, g + 1, e + 1000, consumer_id=cid).encode(), "from epoch"),
    ("a generation far ahead", lambda e, g, cid: protocol.Command(
        protocol.START_FETCHER, 10 ** 12, e, {"t": {0: f"{cid}-0"}}, consumer_id=cid).encode(), "ahead of"),
]


@pytest.mark.parametrize("write,reason", [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS])
def test_a_command_that_does_not_apply_changes_nothing(zk, groups, caplog, write, reason):
    victims, healthy = groups
    target = victims[0]
    before = owned(victims)
    data = write(current_epoch(zk), generation(zk), target.consumer_id)
    path = zk.create(protocol.command_prefix(V, target.consumer_id), data, sequence=True)
    wait_for(lambda: not zk.exists(path), message="the member acks the command")
    name = path.rsplit("/", 1)[1]
    assert len(logged(caplog, target.consumer_id, name, reason)) == 1
    assert owned(victims) == before == set(range(4))
    assert_both_groups_follow_a_growing_topic(zk, victims, healthy)


def test_a_deleted_epoch_is_restored_above_every_recorded_epoch(zk, groups, caplog):
    victims, healthy = groups
    before = current_epoch(zk)
    zk.delete(epoch_path(zk))
    TopicRegistry(zk).add_partitions("t", 5)  # the leader's next write finds its epoch gone
    wait_for(lambda: zk.exists(epoch_path(zk)) is not None and current_epoch(zk) > before, 15,
             message="a leader at a higher epoch")
    assert logged(caplog, "epoch znode", "was missing")
    wait_for(lambda: owned(victims) == set(range(5)), 15, message="the victims follow the new epoch's commands")
    assert_both_groups_follow_a_growing_topic(zk, victims, healthy, 6, 3)


def test_a_registration_without_a_channel_is_left_out(zk, groups, caplog):
    victims, healthy = groups
    zk.create(protocol.ids_path(V, "victim_ghost"), protocol.Registration({"t": 1}).encode(), ephemeral=True)
    assert_both_groups_follow_a_growing_topic(zk, victims, healthy)
    assert logged(caplog, "victim_ghost", "no command channel")
    state = read_state(zk, V)
    assert "victim_ghost" not in state.members and "victim_ghost" in state.error


def test_a_member_with_no_strategy_in_common_is_left_out(zk, cluster, groups, caplog):
    victims, healthy = groups
    odd = cluster.member(V, ["t"], strategies=("bogus",))
    assert_both_groups_follow_a_growing_topic(zk, victims, healthy)
    # members own their partitions a moment before the coordinator writes Stable
    state = wait_for(lambda: (lambda s: s if s.state == protocol.STABLE else None)(read_state(zk, V)),
                     message="the victim group Stable")
    assert odd.consumer_id not in state.members
    assert not odd.recorder.owned
    assert len(logged(caplog, odd.consumer_id, "lists no strategy this coordinator knows")) == 1


def test_a_catastrophic_regex_never_stalls_the_leader(zk, cluster, groups, caplog):
    victims, healthy = groups
    wild = cluster.member("wild", {"(a+)+$": 1}, pattern=protocol.PATTERN_WHITE_LIST)
    TopicRegistry(zk).create("a" * 40 + "b", 1)
    assert_both_groups_follow_a_growing_topic(zk, victims, healthy)
    wait_stable(zk, "wild", 1)
    assert not wild.recorder.owned  # the regex does not match 'aaa...b'


def test_a_shrunk_topic_keeps_its_partitions(zk, groups, caplog):
    victims, healthy = groups
    zk.set(protocol.topic_path("t"), protocol.encode_topic(2))
    wait_for(lambda: logged(caplog, "topic t", "fewer than the 4 known"), message="the shrink is reported")
    assert owned(victims) == set(range(4))
    assert read_state(zk, V).assignment["t"].keys() == set(range(4))
    assert_both_groups_follow_a_growing_topic(zk, victims, healthy)


def test_a_squatted_owner_node_is_named_and_left_unassigned_until_it_goes(zk, cluster, groups, caplog):
    victims, healthy = groups
    squatter = cluster.client()
    squatter.ensure_path(protocol.owners_path(V, "t"))
    generation_before = generation(zk)
    TopicRegistry(zk).add_partitions("t", 5)
    squatter.create(protocol.owners_path(V, "t", 4), b"nobody-0", ephemeral=True)
    session = f"0x{squatter.client_id[0]:x}"
    wait_for(lambda: logged(caplog, "partition t-4", session), 15, message="the squatter is named")
    state = wait_stable(zk, V, 2, after_generation=generation_before)
    wait_for(lambda: owned(victims) == set(range(4)), message="the rest is owned")
    assert "t-4" in read_state(zk, V).error and session in read_state(zk, V).error
    assert 4 not in read_state(zk, V).assignment["t"]
    squatter.stop()
    wait_for(lambda: owned(victims) == set(range(5)), 15, message="t-4 is assigned once the squatter is gone")
    assert state.state == protocol.STABLE
