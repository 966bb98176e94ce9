"""groupctl groups reset-offsets with Kafka's options, against a real ZooKeeper and the
embedded log: --shift-by, --by-duration, --to-current, --topic T:0,2 lists, --all-topics,
--export / --from-file, clamping into [earliest, latest], dry run versus --execute, refusal
while members are live, and a reset too large for one ZooKeeper request.

(The first options, --to-earliest/--to-latest/--to-offset/--to-datetime and the
compare-and-set write, are in test_groupctl_groups.py; the planning itself, unit-tested, in
test_reset_plan.py.)
"""
from __future__ import annotations

import time

import pytest

from coordinator import protocol
from tests.support.helpers import assert_failed, committed, fill, ok, wait_for

HOUR_MS = 3_600_000


def reset(groupctl, *args, group="g", input=None):
    return groupctl("groups", "reset-offsets", group, *args, input=input)


def shown(out: str):
    """{(topic, partition): (CURRENT, NEW)} of the reset table."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("TOPIC"))
    rows = [line.split() for line in lines[start + 1:] if line and not line.startswith(("dry run", "reset "))]
    return {(row[0], int(row[1].replace(",", ""))): (row[2], int(row[3].replace(",", ""))) for row in rows}


def set_offsets(zk, group, topic, offsets):
    for p, offset in offsets.items():
        path = protocol.offsets_path(group, topic, p)
        zk.ensure_path(path)
        zk.set(path, protocol.encode_offset(offset))


def dry_run_then_execute(groupctl, zk, args, topic, partitions, expected):
    """The dry run shows ``expected`` and writes nothing; --execute writes exactly it."""
    before = committed(zk, "g", topic, partitions)
    out = ok(reset(groupctl, *args))
    assert {p: new for (t, p), (_, new) in shown(out).items() if t == topic} == expected, args
    assert out.rstrip().endswith("dry run: nothing changed (add --execute to apply)")
    assert committed(zk, "g", topic, partitions) == before, f"dry run {args} wrote offsets"
    out = ok(reset(groupctl, *args, "--execute"))
    assert "dry run" not in out
    assert {p: o for p, o in committed(zk, "g", topic, partitions).items() if p in expected} == expected


def test_shift_by_forward_and_back_clamped_with_a_warning(groupctl, zk, data_dir):
    fill(data_dir, "t", [10, 4], zk=zk)
    set_offsets(zk, "g", "t", {0: 5, 1: 2})
    dry_run_then_execute(groupctl, zk, ["--topic", "t", "--shift-by", "3"], "t", 2, {0: 8, 1: 4})
    result = reset(groupctl, "--topic", "t", "--shift-by", "-6", "--execute")
    assert shown(ok(result)) == {("t", 0): ("8", 2), ("t", 1): ("4", 0)}
    assert result.stderr.splitlines() == ["warning: t-1: -2 is before the earliest offset 0; using 0"]
    result = reset(groupctl, "--topic", "t", "--shift-by", "100", "--execute")
    assert result.stderr.splitlines() == ["warning: t-0: 102 is after the log end offset 10; using 10",
                                          "warning: t-1: 100 is after the log end offset 4; using 4"]
    assert committed(zk, "g", "t", 2) == {0: 10, 1: 4}


def test_shift_by_needs_a_committed_offset_where_it_shifts(groupctl, zk, data_dir):
    fill(data_dir, "t", [10, 4, 4], zk=zk)
    set_offsets(zk, "g", "t", {0: 5, 2: 1})
    assert_failed(reset(groupctl, "--topic", "t", "--shift-by", "1", "--execute"),
                  "cannot shift t-1: no committed offset to shift from")
    assert committed(zk, "g", "t", 3) == {0: 5, 1: None, 2: 1}
    ok(reset(groupctl, "--topic", "t:0,2", "--shift-by", "1", "--execute"))  # leave t-1 out
    assert committed(zk, "g", "t", 3) == {0: 6, 1: None, 2: 2}


def test_by_duration_finds_the_first_record_that_recent(groupctl, zk, data_dir):
    now = int(time.time() * 1000)
    fill(data_dir, "t", [10, 3], zk=zk, ts=lambda o: now - (10 - o) * HOUR_MS)  # hourly, the last an hour ago
    # t-0: offsets 0..9 at 10 h .. 1 h ago; t-1: offsets 0..2 at 10, 9, 8 h ago
    dry_run_then_execute(groupctl, zk, ["--topic", "t", "--by-duration", "PT3H30M"], "t", 2, {0: 7, 1: 3})
    dry_run_then_execute(groupctl, zk, ["--topic", "t", "--by-duration", "P1D"], "t", 2, {0: 0, 1: 0})
    dry_run_then_execute(groupctl, zk, ["--topic", "t", "--by-duration", "PT9H30M"], "t", 2, {0: 1, 1: 1})
    dry_run_then_execute(groupctl, zk, ["--topic", "t", "--by-duration", "PT30M"], "t", 2, {0: 10, 1: 3})


def test_to_current_keeps_offsets_and_repairs_what_is_out_of_range(groupctl, zk, data_dir):
    fill(data_dir, "t", [10, 4, 6], zk=zk)
    set_offsets(zk, "g", "t", {0: 5, 1: 40})  # t-1 past its end (the log was recreated); t-2 nothing
    result = reset(groupctl, "--topic", "t", "--to-current")
    assert shown(ok(result)) == {("t", 0): ("5", 5), ("t", 1): ("40", 4), ("t", 2): ("-", 6)}
    assert result.stderr.splitlines() == ["warning: t-1: 40 is after the log end offset 4; using 4"]
    ok(reset(groupctl, "--topic", "t", "--to-current", "--execute"))
    assert committed(zk, "g", "t", 3) == {0: 5, 1: 4, 2: 6}


def test_partition_lists_choose_partitions_across_topics_in_one_reset(groupctl, zk, data_dir):
    fill(data_dir, "a", [5, 5, 5, 5], zk=zk)
    fill(data_dir, "b", [7, 7], zk=zk)
    out = ok(reset(groupctl, "--topic", "a:0,2", "--topic", "b", "--topic", "a:3", "--to-latest", "--execute"))
    assert shown(out) == {("a", 0): ("-", 5), ("a", 2): ("-", 5), ("a", 3): ("-", 5), ("b", 0): ("-", 7),
                          ("b", 1): ("-", 7)}
    assert "reset 5 partitions of a, b" in out
    assert committed(zk, "g", "a", 4) == {0: 5, 1: None, 2: 5, 3: 5}
    assert committed(zk, "g", "b", 2) == {0: 7, 1: 7}
    # the whole topic when it is also named alone
    assert len(shown(ok(reset(groupctl, "--topic", "a:1", "--topic", "a", "--to-earliest")))) == 4
    assert_failed(reset(groupctl, "--topic", "a:1,4,9", "--to-earliest"),
                  "topic 'a' has 4 partitions; there is no partition 4, 9")
    assert_failed(reset(groupctl, "--topic", "a:x", "--to-earliest"), "partitions are numbers", 2)
    assert_failed(reset(groupctl, "--topic", "nope:0", "--to-earliest"), "topic 'nope' does not exist")


def test_all_topics_are_the_groups_topics(groupctl, cluster, zk, data_dir):
    fill(data_dir, "a", [3, 3], zk=zk)
    fill(data_dir, "b", [4], zk=zk)
    fill(data_dir, "c", [2], zk=zk)  # not the group's
    set_offsets(zk, "g", "a", {0: 1})
    set_offsets(zk, "g", "b", {0: 2})
    out = ok(reset(groupctl, "--all-topics", "--to-latest", "--execute"))
    assert shown(out) == {("a", 0): ("1", 3), ("a", 1): ("-", 3), ("b", 0): ("2", 4)}
    assert not zk.exists(protocol.offsets_path("g", "c"))
    # a member's subscription counts too (a dry run: it is live)
    cluster.node("n")
    cluster.member("g", ["c"])
    wait_for(lambda: zk.exists(protocol.ids_path("g")) and zk.get_children(protocol.ids_path("g")),
             message="member registered")
    assert ("c", 0) in shown(ok(reset(groupctl, "--all-topics", "--to-earliest")))
    assert_failed(reset(groupctl, "--all-topics", "--to-earliest", "--execute"),
                  "group 'g' has 1 live members; stop them before resetting offsets")
    assert committed(zk, "g", "a", 2) == {0: 3, 1: 3}
    assert_failed(reset(groupctl, "--all-topics", "--to-earliest", group="empty"),
                  "group 'empty' has no topics to reset")


def test_export_then_from_file_round_trip(groupctl, zk, data_dir, tmp_path):
    fill(data_dir, "a", [10, 10], zk=zk)
    fill(data_dir, "b", [5], zk=zk)
    set_offsets(zk, "g", "a", {0: 9, 1: 9})
    result = reset(groupctl, "--topic", "a", "--topic", "b:0", "--to-offset", "4", "--export")
    assert ok(result) == "a,0,4\na,1,4\nb,0,4\n"  # only the CSV on stdout
    assert result.stderr.strip() == "dry run: nothing changed (add --execute to apply)"
    plan = tmp_path / "plan.csv"
    plan.write_text(result.stdout)
    assert committed(zk, "g", "a", 2) == {0: 9, 1: 9}
    out = ok(reset(groupctl, "--from-file", str(plan), "--execute"))
    assert shown(out) == {("a", 0): ("9", 4), ("a", 1): ("9", 4), ("b", 0): ("-", 4)}
    assert committed(zk, "g", "a", 2) == {0: 4, 1: 4} and committed(zk, "g", "b", 1) == {0: 4}
    # export of what is there now, read back from stdin, changes nothing
    current = ok(reset(groupctl, "--topic", "a", "--topic", "b", "--to-current", "--export"))
    assert current == "a,0,4\na,1,4\nb,0,4\n"
    # --export with --execute: applied, and still only the CSV on stdout
    result = reset(groupctl, "--from-file", "-", "--export", "--execute", input="a,1,20\nb,0,-3\n")
    assert ok(result) == "a,1,10\nb,0,0\n"
    assert result.stderr.splitlines() == ["warning: a-1: 20 is after the log end offset 10; using 10",
                                          "warning: b-0: -3 is before the earliest offset 0; using 0",
                                          "reset 2 partitions of a, b"]
    assert committed(zk, "g", "a", 2) == {0: 4, 1: 10} and committed(zk, "g", "b", 1) == {0: 0}


def test_bad_plan_files_change_nothing(groupctl, zk, data_dir, tmp_path):
    fill(data_dir, "a", [10, 10], zk=zk)
    cases = {"a,0\n": "line 1: expected topic,partition,offset",
             "a,0,1\na,0,2\n": "line 2: a-0 is named twice",
             "a,5,1\n": "topic 'a' has 2 partitions; there is no partition 5",
             "nope,0,1\n": "topic 'nope' does not exist",
             "": "no offsets in it"}
    for number, (text, said) in enumerate(cases.items()):
        plan = tmp_path / f"plan{number}.csv"
        plan.write_text(text)
        assert_failed(reset(groupctl, "--from-file", str(plan), "--execute"), said)
    assert_failed(reset(groupctl, "--from-file", str(tmp_path / "missing.csv")), "No such file or directory", 2)
    assert_failed(reset(groupctl, "--from-file", str(tmp_path)), "Is a directory", 2)
    assert_failed(reset(groupctl, "--from-file", str(plan), "--topic", "a"),
                  "--from-file names its own partitions: leave out --topic and --all-topics", 2)
    assert_failed(reset(groupctl, "--from-file", str(plan), "--to-latest"), "give exactly one of", 2)
    assert committed(zk, "g", "a", 2) == {0: None, 1: None}


def test_scope_and_target_usage_errors(groupctl, zk, data_dir):
    fill(data_dir, "t", [3], zk=zk)
    assert_failed(reset(groupctl, "--to-latest"), "Missing option '--topic' (or --all-topics)", 2)
    assert_failed(reset(groupctl, "--topic", "t", "--all-topics", "--to-latest"), "give --topic or --all-topics", 2)
    assert_failed(reset(groupctl, "--topic", "t", "--shift-by", "1", "--to-current"),
                  "give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, --to-current, "
                  "--shift-by, --by-duration, --from-file", 2)
    assert_failed(reset(groupctl, "--topic", "t", "--by-duration", "1 hour"), "is not an ISO-8601 duration", 2)
    assert_failed(reset(groupctl, "--topic", "t", "--shift-by", "many"), "'many' is not a valid integer", 2)
    assert committed(zk, "g", "t", 1) == {0: None}


@pytest.mark.parametrize("kind", [["--shift-by", "1"], ["--to-current"], ["--by-duration", "PT1H"]])
def test_new_targets_are_refused_while_members_are_live(groupctl, cluster, zk, data_dir, kind):
    fill(data_dir, "t", [10, 4], zk=zk)
    set_offsets(zk, "g", "t", {0: 2, 1: 2})
    cluster.member("g", ["t"])
    wait_for(lambda: zk.get_children(protocol.ids_path("g")), message="member registered")
    assert "dry run" in ok(reset(groupctl, "--topic", "t", *kind))
    assert_failed(reset(groupctl, "--topic", "t", *kind, "--execute"),
                  "group 'g' has 1 live members; stop them before resetting offsets")
    assert committed(zk, "g", "t", 2) == {0: 2, 1: 2}


def test_a_reset_larger_than_one_zookeeper_request_is_refused_whole(groupctl, zk, data_dir):
    """10,000 partitions do not fit in one ZooKeeper request (jute.maxbuffer): refused, not split."""
    ok(groupctl("topics", "create", "wide", "--partitions", str(protocol.MAX_PARTITIONS)))
    result = reset(groupctl, "--topic", "wide", "--to-earliest")
    assert len(shown(ok(result))) == protocol.MAX_PARTITIONS
    assert "more than ZooKeeper takes (1,048,575, its jute.maxbuffer)" in result.stderr
    assert_failed(reset(groupctl, "--topic", "wide", "--to-earliest", "--execute"),
                  "resetting 10,000 partitions at once is a ZooKeeper request of")
    assert not zk.exists(protocol.offsets_path("g", "wide"))
    # half of them fit, in one transaction
    half = ",".join(map(str, range(0, protocol.MAX_PARTITIONS, 2)))
    ok(reset(groupctl, "--topic", f"wide:{half}", "--to-earliest", "--execute"))
    assert len(zk.get_children(protocol.offsets_path("g", "wide"))) == protocol.MAX_PARTITIONS // 2
