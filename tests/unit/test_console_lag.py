"""The console's lag (:mod:`coordinator.console.lag`): catch-up estimates, the lag history and
its charts. Fast; no ZooKeeper."""
import pytest

from coordinator.console.lag import HISTORY, History, catch_up, sparkline

T = [0.0, 10.0, 20.0, 30.0]


@pytest.mark.parametrize("committed, ends, status, eta", [
    ([100, 100, 100, 100], [100, 100, 100, 100], "caught up", 0.0),
    ([0, 100, 200, 300], [500, 500, 500, 500], "catching up", 20.0),      # 200 behind, 10/s faster than produced
    ([0, 100, 200, 300], [400, 510, 620, 730], "falling behind", None),   # lag 400 -> 430
    ([0, 100, 200, 300], [2, 101, 203, 302], "keeping up", None),         # lag about 2 all along
    ([0, 100, 200, 300], [0, 100, 200, 303], "keeping up", None),         # grew by 3 of 303 arrived: noise
    ([50, 50, 50, 50], [60, 70, 80, 90], "not consuming", None),
    ([None, None, None, None], [1, 2, 3, 4], "unknown", None),
    ([0, None, 200, 300], [500, 500, None, 500], "catching up", 20.0),    # gaps are skipped
])
def test_catch_up(committed, ends, status, eta):
    estimate = catch_up(T, committed, ends)
    assert (estimate.status, estimate.eta_s) == (status, eta)


def test_history_keeps_the_newest_samples_of_each_partition():
    history = History(size=3)
    for i in range(5):
        rows = {"g": [{"topic": "t", "partition": 0, "current_offset": i, "log_end_offset": 10 + i}]}
        if i == 4:
            rows["g"].append({"topic": "t", "partition": 1, "current_offset": None, "log_end_offset": 7})
        history.add(float(i), rows)
    assert history.series("g", "t", 0) == ([2.0, 3.0, 4.0], [2, 3, 4], [12, 13, 14])
    assert history.series("g", "t", 1) == ([2.0, 3.0, 4.0], [None, None, None], [None, None, 7])
    history.add(5.0, {})
    assert history.series("g", "t", 0)[1] == [None, None, None]  # a partition gone from the group is forgotten
    assert HISTORY >= 30


def test_sparkline_scales_into_the_box():
    assert sparkline([None, 5]) == ""
    points = [tuple(map(float, p.split(","))) for p in sparkline([0, 10, None, 5], 100, 20).split()]
    assert points[0] == (0.0, 19.0) and points[1][1] == 1.0 and points[-1][0] == 100.0 and len(points) == 3
