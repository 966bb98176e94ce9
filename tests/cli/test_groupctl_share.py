"""groupctl's share-group commands against a real ZooKeeper and the embedded log: configure,
describe (table and JSON), list, the model worker ``share-consume`` (reject and release rules,
the dead-letter topic, a lock that ends while it works), reset-offsets and delete."""
from __future__ import annotations

import json

import pytest

from consumer import ShareConsumer
from consumer.log import Log
from coordinator.protocol.share import ShareGroupConfig, SharePartitionState, share_group_path, share_partitions_path
from tests.support.helpers import assert_failed, fill, ok

pytestmark = pytest.mark.zk


def lines(output: str):
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def state(zk, group="q", topic="t", partition=0) -> SharePartitionState:
    path = share_partitions_path(group, topic, partition)
    return SharePartitionState.decode(zk.get(path)[0], path)


@pytest.fixture
def member(zk_connect, data_dir):
    """member(): a ShareConsumer of share group q on topic t, closed at the end."""
    made = []

    def make(**config):
        c = ShareConsumer("q", ["t"], zk=zk_connect, data_dir=data_dir, session_timeout_ms=2000, **config)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def test_configure_then_describe_as_a_table_and_as_json(groupctl, zk, data_dir):
    fill(data_dir, "t", [5], zk=zk)
    out = ok(groupctl("share-groups", "configure", "q", "share.auto.offset.reset=earliest",
                      "share.delivery.count.limit=3"))
    assert out.startswith("created share group q")
    assert ["share.delivery.count.limit", "3", "5"] in [line.split()[:3] for line in out.splitlines()]
    config = ShareGroupConfig.decode(zk.get(share_group_path("q"))[0], share_group_path("q"))
    assert (config.auto_offset_reset, config.delivery_count_limit) == ("earliest", 3)
    # a second configure changes what it names and keeps the rest
    assert "configured share group q" in ok(groupctl("share-groups", "configure", "q",
                                                     "share.record.lock.duration.ms=5000"))
    records = lines(ok(groupctl("share-consume", "q", "t", "--max-records", "3")))
    assert [(r["offset"], r["delivery_count"], r["acknowledgement"]) for r in records] == \
        [(0, 1, "accept"), (1, 1, "accept"), (2, 1, "accept")]
    table = ok(groupctl("share-groups", "describe", "q")).splitlines()
    assert table[0].split()[:5] == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]
    assert table[1].split()[:5] == ["q", "t", "0", "3", "2"]
    doc = json.loads(ok(groupctl("share-groups", "describe", "q", "--output", "json")))
    (row,) = doc["partitions"]
    assert (row["start_offset"], row["log_end_offset"], row["lag"], row["acquired"]) == (3, 5, 2, 0)
    assert doc["settings"]["share.record.lock.duration.ms"] == 5000 and doc["members"] == []
    settings = ok(groupctl("share-groups", "describe", "q", "--settings"))
    assert "share.delivery.count.limit" in settings and "deliveries of a record" in settings
    assert ok(groupctl("share-groups", "describe", "q", "--members")).split() == \
        ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "SUBSCRIPTION", "RECORDS-HELD"]
    listed = json.loads(ok(groupctl("share-groups", "list", "-o", "json")))
    (entry,) = listed["share_groups"]
    assert (entry["group"], entry["members"], entry["partitions"], entry["error"]) == ("q", 0, 1, None)
    assert entry["in_flight"] == row["in_flight"]


def test_a_bad_setting_is_one_line_and_changes_nothing(groupctl, zk):
    for args, match in [(["share.delivery.count.limit=11"], "between 2 and 10"),
                        (["share.nope=1"], "unknown share group setting"),
                        (["share.auto.offset.reset=middle"], "must be one of latest, earliest"),
                        (["share.record.lock.duration.ms=soon"], "whole number")]:
        assert_failed(groupctl("share-groups", "configure", "q", *args), match)
    assert_failed(groupctl("share-groups", "configure", "q", "just-a-word"), "is not KEY=VALUE", exit_code=2)
    assert zk.exists(share_group_path("q")) is None
    assert_failed(groupctl("share-groups", "describe", "q"), "share group 'q' does not exist")


def test_share_consume_rejects_and_releases_by_rule_into_the_dead_letter_topic(groupctl, zk, data_dir):
    ok(groupctl("topics", "create", "t"))
    ok(groupctl("topics", "create", "dlq"))
    fill(data_dir, "t", [4], zk=zk)
    ok(groupctl("share-groups", "configure", "q", "share.auto.offset.reset=earliest",
                "share.delivery.count.limit=2", "errors.deadletterqueue.topic.name=dlq"))
    result = groupctl("share-consume", "q", "t", "--reject-when", "value=t-0-2", "--release-when", "value=t-0-1",
                      "--idle-exit", "0.5")
    seen = [(r["offset"], r["delivery_count"], r["acknowledgement"]) for r in lines(ok(result))]
    assert sorted(seen) == [(0, 1, "accept"), (1, 1, "release"), (1, 2, "release"), (2, 1, "reject"),
                            (3, 1, "accept")]
    assert "consumed 5 records (2 accepted, 1 rejected, 2 released)" in result.stderr
    assert state(zk).start == 4   # every record done: accepted, or archived and dead-lettered
    with Log(data_dir) as log:
        letters = log.fetch("dlq", 0, 0, 10)
    reasons = {(r.value, dict(r.headers)["zkgroups.dlq.reason"]) for r in letters}
    assert reasons == {(b"t-0-1", b"delivery-limit"), (b"t-0-2", b"rejected")}


def test_a_worker_slower_than_the_lock_is_refused_and_the_record_comes_again(groupctl, zk, data_dir, cluster):
    cluster.node("n1")   # the group's coordinator: it ends locks, by its own clock
    cluster.leader()
    fill(data_dir, "t", [1], zk=zk)
    ok(groupctl("share-groups", "configure", "q", "share.auto.offset.reset=earliest",
                "share.record.lock.duration.ms=1000", "share.delivery.count.limit=2"))
    # three lock durations of work, so even a late tick of the clock ends the lock first; never waits past 30 s
    result = groupctl("share-consume", "q", "t", "--process-ms", "3000", "--max-records", "2", "--idle-exit", "30")
    assert [(r["offset"], r["delivery_count"]) for r in lines(ok(result))] == [(0, 1), (0, 2)]
    assert "refused: their lock had ended" in result.stderr


def test_reset_offsets_is_refused_with_members_and_done_without(groupctl, zk, data_dir, member):
    fill(data_dir, "t", [6], zk=zk)
    ok(groupctl("share-groups", "configure", "q", "share.auto.offset.reset=earliest"))
    c = member(share_acknowledgement_mode="explicit", max_poll_records=2)
    got = []
    while len(got) < 2:
        got += c.poll(100)
    dry = groupctl("share-groups", "reset-offsets", "q", "--topic", "t", "--to-offset", "4")
    assert ok(dry).splitlines()[1].split()[:4] == ["t", "0", "0", "4"] and "dry run" in dry.stdout
    assert "--execute would be refused" in dry.stderr
    assert_failed(groupctl("share-groups", "reset-offsets", "q", "--topic", "t", "--to-offset", "4", "--execute"),
                  "has 1 members; stop them")
    c.close()
    assert "reset 1 share-partitions of t" in ok(groupctl("share-groups", "reset-offsets", "q", "--all-topics",
                                                          "--to-offset", "4", "--execute"))
    s = state(zk)
    assert (s.start, s.end, s.ranges, s.held) == (4, 4, [], {})
    assert [r["offset"] for r in lines(ok(groupctl("share-consume", "q", "t", "--max-records", "2")))] == [4, 5]
    assert_failed(groupctl("share-groups", "reset-offsets", "q", "--topic", "t"), "exactly one of", exit_code=2)


def test_delete_is_refused_with_members_and_removes_every_znode_without(groupctl, zk, data_dir, member):
    fill(data_dir, "t", [2], zk=zk)
    ok(groupctl("share-groups", "configure", "q", "share.auto.offset.reset=earliest"))
    c = member()
    while not c.poll(100):
        pass
    assert_failed(groupctl("share-groups", "delete", "q"), "has 1 members")
    c.close()
    assert ok(groupctl("share-groups", "delete", "q")) == "deleted share group q\n"
    assert zk.exists(share_group_path("q")) is None
    assert_failed(groupctl("share-groups", "delete", "q"), "share group 'q' does not exist")
    assert "no share groups" in groupctl("share-groups", "list").stderr
