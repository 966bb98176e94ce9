"""The console's pages and API (:mod:`coordinator.console.app`): the groups page's filter, sort
and paging, routes. Fast; no ZooKeeper."""
from coordinator import protocol
from coordinator.console.app import Console
from coordinator.console.lag import LagSampler
from coordinator.console.snapshot import ClusterSnapshot, GroupView
from coordinator.protocol import GroupState


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
