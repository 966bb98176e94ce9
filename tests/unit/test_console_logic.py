"""The console's pure parts: catch-up estimates, the lag history and its charts, the election's
order, and the groups page's filter, sort and paging (fast; no ZooKeeper)."""
import pytest

from coordinator import protocol
from coordinator.console.app import Console
from coordinator.console.lag import HISTORY, History, LagSampler, catch_up, sparkline
from coordinator.console.snapshot import ClusterSnapshot, GroupView, contender_order
from coordinator.protocol import GroupState

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


def test_contenders_in_the_election_order():
    children = ["b0__lock__0000000012", "a1__lock__0000000003", "zz", "c2__lock__0000000007"]
    assert contender_order(children) == ["a1__lock__0000000003", "c2__lock__0000000007", "b0__lock__0000000012"]


class _Snapshot(ClusterSnapshot):
    def __init__(self, views):
        super().__init__(client=None)
        self._groups = {v.name: v for v in views}


class _Sampler(LagSampler):
    def __init__(self, lags):
        super().__init__(None, None, None)
        self._reading.total_lag = lags
        self._reading.at = 1.0


def _console(n=250):
    views = [GroupView(f"g{i:04d}", GroupState(i % 7, protocol.STABLE if i % 3 else protocol.EMPTY), ids=("m",) * (i % 4))
             for i in range(n)] + [GroupView("broken", state_error="not JSON")]
    return Console(_Snapshot(views), _Sampler({f"g{i:04d}": i * 10 % 97 for i in range(n)}), "n1")


def test_groups_filter_sort_and_page():
    console = _console()
    rows, total, chosen = console._select({"q": "G00", "state": protocol.EMPTY, "sort": "lag"})
    assert total == len(rows) == sum(1 for i in range(100) if i % 3 == 0)
    assert chosen["order"] == "desc" and [r["lag"] for r in rows] == sorted((r["lag"] for r in rows), reverse=True)
    rows, total, _ = console._select({"state": "unreadable"})
    assert [r["group"] for r in rows] == ["broken"] and rows[0]["error"] == "not JSON"
    page = console.route("/ui/groups", "sort=members&order=asc&size=25&page=3")
    assert page.status == 200 and b"page 3 of 11" in page.body
    api = console.route("/api/v1/groups", "state=Stable&limit=5&offset=5")
    assert api.status == 200 and b'"total": 166' in api.body
    assert console.route("/api/v1/groups", "").body.count(b'"group":') == 251
    assert console.route("/elsewhere", "") is None and console.route("/ui/nothing", "").status == 404
