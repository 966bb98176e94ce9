"""Lag in seconds' pure parts (coordinator/lagtime.py): ages, the consumption rate and its
estimate, the spots to read, the timestamp cache and the commits' history (fast; no
ZooKeeper, no data plane)."""
import pytest

from coordinator import lagtime
from coordinator.lagtime import CommitHistory, RecordTimes


def row(group="g", topic="t", partition=0, committed=None, end=None):
    lag = None if committed is None or end is None else end - committed
    return {"group": group, "topic": topic, "partition": partition, "current_offset": committed,
            "log_end_offset": end, "lag": lag, "lag_seconds": None, "estimated_lag_seconds": None}


@pytest.mark.parametrize("lag, at, ts, expected", [
    (None, 100.0, 40_000, None),    # lag unknown: so is its age
    (0, 100.0, None, 0.0),          # caught up: nothing is waiting, whatever the timestamp
    (-3, 100.0, None, 0.0),         # committed past a log end read a moment before
    (5, 100.0, 40_000, 60.0),
    (5, 100.0, 40_250, 59.75),
    (5, 100.0, 130_000, 0.0),       # a producer clock ahead of ours: never negative
    (5, 100.0, None, None),         # the record could not be read
    (5, 100.0, -1, None),           # Kafka: no timestamp
])
def test_lag_seconds(lag, at, ts, expected):
    assert lagtime.lag_seconds(lag, at, ts) == expected


@pytest.mark.parametrize("times, committed, rate", [
    ([0, 10, 20], [0, 100, 200], 10.0),
    ([0, 10, 20], [50, 50, 50], 0.0),
    ([0, 10], [None, 100], None),                       # one known sample: no rate
    ([0, 10, 20, 30], [0, None, 200, 300], 10.0),       # gaps are skipped
    ([0, 10, 20, 30], [500, 600, 0, 50], 5.0),          # reset back: only what came after counts
    ([0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 10, 20, 30, 40, 50], 10.0),  # the newest RATE_WINDOW (6) samples
    ([5, 5], [0, 10], None),                            # no time between them
])
def test_consumption_rate(times, committed, rate):
    assert lagtime.consumption_rate(times, committed) == rate


@pytest.mark.parametrize("lag, rate, expected", [
    (None, 10.0, None), (0, None, 0.0), (100, 10.0, 10.0), (100, 0.0, None), (100, None, None), (1, 3.0, 0.333),
])
def test_estimated_lag_seconds(lag, rate, expected):
    assert lagtime.estimated_lag_seconds(lag, rate) == expected


def test_only_lagging_rows_with_a_committed_offset_are_read_each_spot_once():
    rows = [row(committed=5, end=9), row(partition=1, committed=9, end=9), row(partition=2, end=9),
            row("h", committed=5, end=9), row("h", partition=1, committed=2, end=9)]
    assert lagtime.lagging(rows) == [("t", 0, 5), ("t", 1, 2)]


def test_fill_sets_both_fields_and_group_max_takes_the_latest_partition():
    rows = [row(committed=5, end=9), row(partition=1, committed=9, end=9), row(partition=2, end=9),
            row("h", committed=8, end=9)]
    lagtime.fill(rows, 100.0, {("t", 0, 5): 70_000, ("t", 0, 8): 95_000}, {("g", "t", 0): 2.0})
    assert [(r["lag_seconds"], r["estimated_lag_seconds"]) for r in rows] == \
        [(30.0, 2.0), (0.0, 0.0), (None, None), (5.0, None)]
    assert lagtime.group_max(rows) == {"g": 30.0, "h": 5.0}
    assert lagtime.group_max(rows, "estimated_lag_seconds") == {"g": 2.0, "h": None}
    assert lagtime.group_max([row(end=3)]) == {"g": None}


def test_a_steady_group_costs_no_reads_and_a_moved_commit_one():
    asked = []

    def reader(spots):
        asked.append(list(spots))
        return {s: 1000 * s[2] for s in spots if s[2] != 13}  # offset 13: not readable (yet)

    times = RecordTimes(reader)
    assert times.timestamps([("t", 0, 5), ("t", 1, 7)]) == {("t", 0, 5): 5000, ("t", 1, 7): 7000}
    assert times.timestamps([("t", 0, 5), ("t", 1, 7)]) == {("t", 0, 5): 5000, ("t", 1, 7): 7000}
    assert asked == [[("t", 0, 5), ("t", 1, 7)]]
    assert times.timestamps([("t", 0, 6), ("t", 1, 7)]) == {("t", 0, 6): 6000, ("t", 1, 7): 7000}
    assert asked[-1] == [("t", 0, 6)] and times.reads == 3
    # what could not be read is asked again; what is not wanted any more is forgotten
    assert times.timestamps([("t", 0, 13)]) == {}
    assert times.timestamps([("t", 0, 13), ("t", 1, 7)]) == {("t", 1, 7): 7000}
    assert asked[-2:] == [[("t", 0, 13)], [("t", 0, 13), ("t", 1, 7)]]


def test_a_failed_read_keeps_the_cache():
    calls = []

    def reader(spots):
        calls.append(spots)
        if len(calls) == 2:
            raise RuntimeError("down")
        return {s: 1 for s in spots}

    times = RecordTimes(reader)
    times.timestamps([("t", 0, 1)])
    with pytest.raises(RuntimeError):
        times.timestamps([("t", 0, 1), ("t", 0, 2)])
    assert times.timestamps([("t", 0, 1)]) == {("t", 0, 1): 1} and calls[-1:] == [[("t", 0, 2)]]


def test_commit_history_rates_per_group_partition_and_forgets_the_gone():
    history = CommitHistory(window=3)
    assert history.add(0.0, [row(committed=0, end=50), row("h", committed=10, end=50)]) == {}
    assert history.add(10.0, [row(committed=20, end=50), row("h", committed=10, end=50)]) == \
        {("g", "t", 0): 2.0, ("h", "t", 0): 0.0}
    assert history.add(20.0, [row(committed=60, end=90)]) == {("g", "t", 0): 3.0}
    assert history.add(30.0, [row(committed=60, end=90)]) == {("g", "t", 0): 2.0}  # the window: 20, 60, 60
    assert history.add(40.0, [row("h", committed=10, end=50)]) == {}  # h's samples were dropped


def test_fill_rows_reads_through_the_cache_and_the_history():
    times = RecordTimes(lambda spots: {s: 10_000 for s in spots})
    history = CommitHistory()
    first = [row(committed=0, end=100)]
    lagtime.fill_rows(first, 20.0, times, history)
    assert (first[0]["lag_seconds"], first[0]["estimated_lag_seconds"]) == (10.0, None)
    second = [row(committed=50, end=100)]
    lagtime.fill_rows(second, 30.0, times, history)
    assert (second[0]["lag_seconds"], second[0]["estimated_lag_seconds"]) == (20.0, 10.0)
