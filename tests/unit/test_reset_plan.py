"""The pure parts of ``groupctl groups reset-offsets`` (consumer.cli.reset): ISO-8601 durations,
``--topic T:0,2`` lists, plan files (Kafka's ``--export`` CSV), and where each target puts each
partition, clamped into [earliest, latest]. No server."""
from __future__ import annotations

import io

import pytest

from consumer.cli import reset
from consumer.cli.reset import Clamped, StoredOffset, Target, plan_targets
from consumer.records import TopicPartition
from coordinator.cli.common import CliUsageError
from coordinator.errors import ZkGroupsError

H, M, S, D = 3_600_000, 60_000, 1000, 86_400_000


@pytest.mark.parametrize("text, ms", [
    ("PT1H", H), ("PT30M", 30 * M), ("PT45S", 45 * S), ("P2D", 2 * D), ("P1DT2H3M4S", D + 2 * H + 3 * M + 4 * S),
    ("PT0H5M0S", 5 * M), ("PT0.5S", 500), ("PT1.25S", 1250), ("PT2,125S", 2125), ("PT0.0001S", 0),
    ("pt1h", H), ("P0D", 0), (" PT10M ", 10 * M), ("PT36H", 36 * H),
])
def test_durations_kafka_takes(text, ms):
    assert reset.parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "P", "PT", "1H", "PT1H ago", "P1Y", "P1M", "P1W", "-PT1H", "PT-1H", "P1DT",
                                  "PT1.5H", "PTS", "P1H", "PT1H1D", "P" + "9" * 19 + "D", "PT1.1234567891S"])
def test_durations_kafka_refuses(text):
    with pytest.raises(CliUsageError, match="is not an ISO-8601 duration PnDTnHnMnS"):
        reset.parse_duration(text)


def test_topic_specs_and_their_union():
    assert reset.parse_topic_spec("orders") == ("orders", None)
    assert reset.parse_topic_spec("orders:2,0,2") == ("orders", [0, 2])
    assert reset.merge_topic_specs(["a:1", "b", "a:0,1", "c:3", "c"]) == {"a": [0, 1], "b": None, "c": None}
    for bad in ("orders:", "orders:a", "orders:1,,2", "orders:-1", "orders:10000", "orders:1:2"):
        with pytest.raises(CliUsageError, match="partitions are numbers from 0 to 9999"):
            reset.parse_topic_spec(bad)
    with pytest.raises(ZkGroupsError, match="topic name '../x' is illegal"):
        reset.parse_topic_spec("../x:0")


def plan(text: bytes):
    return reset.parse_plan(io.BytesIO(text), "plan.csv")


def test_plan_files_round_trip_through_export():
    targets = {TopicPartition("b", 1): 7, TopicPartition("a", 0): 0, TopicPartition("a", 10): 12345678901}
    exported = reset.export_plan(targets)
    assert exported == "a,0,0\na,10,12345678901\nb,1,7\n"
    assert plan(exported.encode()) == targets
    assert plan(b"\n a , 0 , 5 \r\n\nb,2,-3\n") == {TopicPartition("a", 0): 5, TopicPartition("b", 2): -3}


@pytest.mark.parametrize("text, said", [
    (b"a,0\n", "plan.csv, line 1: expected topic,partition,offset"),
    (b"a,0,1\na,x,1\n", "plan.csv, line 2: expected topic,partition,offset"),
    (b"a,0,1,2\n", "line 1: expected"),
    (b"a,0,ten\n", "line 1: expected"),
    (b"a,0," + b"9" * 30 + b"\n", "line 1: expected"),
    (b"a,0,1\nb,0,1\na,0,2\n", "plan.csv, line 3: a-0 is named twice"),
    (b"../x,0,1\n", "plan.csv, line 1: topic name '../x' is illegal"),
    (b"\n\n", "plan.csv: no offsets in it"),
    (b"a,0,1\n\xff\n", "plan.csv: not UTF-8"),
])
def test_bad_plan_files_are_one_line_naming_the_line(text, said):
    with pytest.raises(ZkGroupsError) as e:
        plan(text)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_a_plan_file_is_read_up_to_a_bound(monkeypatch):
    monkeypatch.setattr(reset, "MAX_PLAN_BYTES", 10)
    with pytest.raises(ZkGroupsError, match="larger than"):
        plan(b"a,0,1\na,1,1\n")


T0, T1, T2 = (TopicPartition("t", p) for p in range(3))
TPS = [T0, T1, T2]
EARLIEST = {T0: 0, T1: 5, T2: 0}
LATEST = {T0: 10, T1: 20, T2: 0}
CURRENT = {T0: StoredOffset(4, 1), T1: StoredOffset(30, 3), T2: StoredOffset(None, None)}


def targets_for(target, current=CURRENT, found=None):
    return plan_targets(target, TPS, current, EARLIEST, LATEST, found or {})


@pytest.mark.parametrize("target, expected, clamped", [
    (Target("to-earliest"), {T0: 0, T1: 5, T2: 0}, []),
    (Target("to-latest"), {T0: 10, T1: 20, T2: 0}, []),
    # to-current: the committed offset (clamped: 30 is past t-1's end), the log end where none
    (Target("to-current"), {T0: 4, T1: 20, T2: 0}, [Clamped(T1, 30, 5, 20)]),
    (Target("to-offset", 7), {T0: 7, T1: 7, T2: 0}, [Clamped(T2, 7, 0, 0)]),
    (Target("to-offset", 3), {T0: 3, T1: 5, T2: 0}, [Clamped(T1, 3, 5, 20), Clamped(T2, 3, 0, 0)]),
    (Target("from-file", {T0: -2, T1: 6, T2: 0}), {T0: 0, T1: 6, T2: 0}, [Clamped(T0, -2, 0, 10)]),
])
def test_where_each_target_puts_each_partition(target, expected, clamped):
    assert targets_for(target) == (expected, clamped)


def test_shift_by_moves_from_the_committed_offset_and_needs_one():
    current = {**CURRENT, T2: StoredOffset(0, 0)}
    assert targets_for(Target("shift-by", -6), current) == (
        {T0: 0, T1: 20, T2: 0}, [Clamped(T0, -2, 0, 10), Clamped(T1, 24, 5, 20), Clamped(T2, -6, 0, 0)])
    assert targets_for(Target("shift-by", 2), current)[0] == {T0: 6, T1: 20, T2: 0}
    with pytest.raises(ZkGroupsError, match=r"cannot shift t-2: no committed offset to shift from"):
        targets_for(Target("shift-by", 1))
    unreadable = {**current, T0: StoredOffset(None, 2, "committed offset b'x' is not a decimal number")}
    with pytest.raises(ZkGroupsError, match="cannot shift t-0:"):
        targets_for(Target("shift-by", 1), unreadable)


def test_times_use_the_offset_found_else_the_log_end():
    found = {T0: 3, T1: None, T2: None}
    for kind in ("to-datetime", "by-duration"):
        assert targets_for(Target(kind), found=found) == ({T0: 3, T1: 20, T2: 0}, [])


def test_clamped_targets_say_what_happened_and_many_are_counted():
    assert Clamped(T1, 30, 5, 20).describe() == "t-1: 30 is after the log end offset 20; using 20"
    assert Clamped(T0, -2, 0, 10).describe() == "t-0: -2 is before the earliest offset 0; using 0"
    many = [Clamped(TopicPartition("t", p), 99, 0, 1) for p in range(reset.MAX_CLAMP_LINES + 3)]
    lines = reset.clamp_warnings(many)
    assert len(lines) == reset.MAX_CLAMP_LINES + 1 and lines[0] == "warning: t-0: 99 is after the log end offset 1; " \
                                                                   "using 1"
    assert lines[-1] == "warning: 3 more targets were out of range and clamped to [earliest, latest]"
