"""The console's API against a real ZooKeeper: every document equals what ``groupctl ...
--output json`` prints for the same state, the rebalance timeline gains each rebalance, and
``/readyz`` follows the node's ZooKeeper session (not ready while ZooKeeper is unreachable,
ready again after). The 10,000-group figures are ``bin/bench console``'s, not a test's."""
import json
import urllib.error
import urllib.request

import pytest

from consumer import Consumer
from coordinator import protocol
from consumer.dataplane.log_ends import DataPlaneEnds
from coordinator.console.app import NodeConsole
from coordinator.http import HttpSettings, NodeHttpServer, node_health, node_readiness
from coordinator.testing.zkserver import Ensemble, local_classpath
from tests.support.groups import Cluster, wait_stable
from tests.support.helpers import fill, ok, wait_for


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class Served:
    """A node's console and HTTP server, in this process."""

    def __init__(self, node, data_dir, lag_interval_s=0.2):
        self.ends = DataPlaneEnds.open("", {}, data_dir)
        self.console = NodeConsole(node, self.ends, lag_interval_s).start()
        self.server = NodeHttpServer(HttpSettings.for_http_addr("127.0.0.1:0"), node.metrics.registry,
                                     lambda: node_health(node, self.console),
                                     lambda: node_readiness(node, self.console), self.console.app.route).start()
        self.url = self.server.base_url

    def api(self, path):
        return get(self.url + "/api/v1" + path)

    def close(self):
        self.server.close()
        self.console.close()
        self.ends.close()


@pytest.fixture
def served(cluster, data_dir):
    node = cluster.node("n1")
    cluster.node("n2")
    s = Served(node, data_dir)
    yield s
    s.close()


def cli_json(groupctl, *args):
    return json.loads(ok(groupctl(*args, "--output", "json")))


def same_but_ages(answer, expected) -> bool:
    """The console's answer is groupctl's document, ages (which grow between two reads, and
    are read at different moments) within a second."""
    status, document = answer
    if status != 200 or not isinstance(document, dict) or "offsets" not in document or "offsets" not in expected:
        return answer == (200, expected)
    got, want = document["offsets"], expected["offsets"]
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        a, b = dict(a), dict(b)
        age_a, age_b = a.pop("lag_seconds"), b.pop("lag_seconds")
        a.pop("estimated_lag_seconds")  # only the console has a rate; groupctl's is None
        b.pop("estimated_lag_seconds")
        if a != b or (age_a is None) != (age_b is None) or (age_a is not None and abs(age_a - age_b) > 1):
            return False
    return True


def test_every_document_is_what_groupctl_prints(served, cluster, zk, zk_connect, data_dir, groupctl):
    fill(data_dir, "orders", [40, 30, 20], zk=zk)
    fill(data_dir, "audit", [5], zk=zk)
    consumers = [Consumer("billing", ["orders"], zk=zk_connect, data_dir=data_dir, session_timeout_ms=2000,
                          max_poll_records=7, client_id=f"billing-{i}", auto_offset_reset="earliest") for i in range(2)]
    consumers.append(Consumer("audit", ["audit", "orders"], zk=zk_connect, data_dir=data_dir,
                              session_timeout_ms=2000, client_id="audit", auto_offset_reset="earliest"))
    try:
        wait_stable(zk, "billing", 2)
        wait_stable(zk, "audit", 1)
        got = {c.consumer_id: 0 for c in consumers}

        def polled():  # every member polls (one of them waiting on another must not stall the loop)
            for c in consumers:
                got[c.consumer_id] += sum(len(r) for r in c.poll(timeout_ms=50).values())
            return all(got.values())
        wait_for(polled, 20, message=f"records for every consumer ({got})")
        for c in consumers:  # some records consumed and committed: lag on what is left
            c.commit()
        zk.ensure_path(protocol.state_path("broken"))
        zk.set(protocol.state_path("broken"), b"not json")  # an unreadable group is listed with its error

        def same(path, *args):
            expected = cli_json(groupctl, *args)
            return wait_for(lambda: same_but_ages(served.api(path), expected) and expected, 15,
                            message=f"{path} == groupctl {' '.join(args)}")

        same("/groups", "groups", "list")
        for group in ("billing", "audit"):
            same(f"/groups/{group}", "groups", "describe", group, "--state")
            same(f"/groups/{group}/members", "groups", "describe", group, "--members")
            offsets = same(f"/groups/{group}/offsets", "groups", "describe", group)
        assert any(row["lag"] for row in offsets["offsets"] + served.api("/groups/billing/offsets")[1]["offsets"])
        same("/topics", "topics", "list")
        same("/topics/orders", "topics", "describe", "orders")
        same("/coordinator", "coordinator")
        status, listed = served.api("/groups?state=Stable&sort=name&order=desc&limit=1")
        assert status == 200 and listed == {"groups": [same("/groups", "groups", "list")["groups"][1]], "total": 2}
        assert served.api("/groups/nope")[0] == 404 and served.api("/groups/broken")[0] == 500
        assert served.api("/nothing")[0] == 404
    finally:
        for c in consumers:
            c.close()


def test_the_timeline_gains_each_rebalance_with_its_reason_and_survives_the_node(served, cluster, zk, data_dir):
    fill(data_dir, "orders", [4, 4, 4, 4], zk=zk)
    first = cluster.member("g", ["orders"])
    wait_stable(zk, "g", 1)
    second = cluster.member("g", ["orders"])
    wait_stable(zk, "g", 2)
    second.close(timeout=5)
    wait_stable(zk, "g", 1, after_generation=2)
    from coordinator.topics import TopicRegistry
    TopicRegistry(zk).add_partitions("orders", 6)

    def timeline():
        status, document = served.api("/groups/g/timeline")
        entries = document.get("timeline", [])
        return entries if status == 200 and entries and entries[-1]["topics"].get("orders") == 6 else None
    entries = wait_for(timeline, 20, message="four rebalances in the timeline")
    stable = [e for e in entries if e["outcome"] == protocol.STABLE]
    assert [e["reasons"] for e in stable][:4] == [["join"], ["join"], ["leave"], ["topic grew"]]
    assert stable[1]["joined"] == [second.consumer_id] and stable[2]["left"] == [second.consumer_id]
    assert [(e["members_before"], e["members_after"]) for e in stable[:4]] == [(0, 1), (1, 2), (2, 1), (1, 1)]
    assert stable[0]["moved"] == 4 and stable[1]["moved"] == 2 and stable[3]["moved"] == 2
    assert all(e["duration_ms"] is not None and e["node"] in ("n1", "n2") for e in stable)
    assert "members" not in entries[0] or len(entries) == 1
    assert served.api("/groups/g/timeline")[1]["capacity"] == protocol.TIMELINE_ENTRIES
    assert first.consumer_id in stable[0]["joined"]


@pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")
def test_readyz_follows_the_zookeeper_session(tmp_path, data_dir):
    """Not ready while ZooKeeper is unreachable, ready again once it is back; /healthz stays 200."""
    ensemble = Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk")).start()
    cluster = Cluster(ensemble.connect + "/app", session_timeout_ms=4000)
    served = None
    try:
        served = Served(cluster.node("n1"), data_dir)
        wait_for(lambda: get(served.url + "/readyz")[0] == 200, 20, message="ready")
        ensemble.servers[0].kill()
        status, body = wait_for(lambda: (lambda r: r if r[0] == 503 else None)(get(served.url + "/readyz")), 20,
                                message="not ready without ZooKeeper")
        assert body["checks"]["zookeeper_connected"] is False
        assert get(served.url + "/healthz")[0] == 200
        assert get(served.url + "/api/v1/groups")[0] == 200  # the last snapshot is still served
        ensemble.restart(0)
        wait_for(lambda: get(served.url + "/readyz")[0] == 200, 30, message="ready again")
    finally:
        if served is not None:
            served.close()
        cluster.close()
        ensemble.close()


def test_coordinatord_takes_the_http_settings_from_its_config_file(tmp_path, subprocess_env, zk_connect):
    """http_addr, console and lag_interval from the TOML file; --no-console serves metrics and probes only."""
    import re
    import subprocess
    import sys
    config = tmp_path / "node.toml"
    config.write_text(f'[coordinator]\nzk = "{zk_connect}"\nhttp_addr = "127.0.0.1:0"\nconsole = false\n'
                      f'lag_interval = 1.5\ndata_dir = "{tmp_path}"\n')
    log_path = tmp_path / "node.log"
    with open(log_path, "w") as log:
        node = subprocess.Popen([sys.executable, "-m", "consumer.cli.coordinatord", "--config", str(config),
                                 "--node-id", "n1"], env=subprocess_env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        url = wait_for(lambda: (re.search(r"metrics served at (http://\S+)/metrics", log_path.read_text()) or [0, 0])[1],
                       30, message="the metrics line")
        wait_for(lambda: get(url + "/readyz")[0] == 200, 30, message="ready")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "/ui/", timeout=5)
        assert e.value.code == 404
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            assert b"zkgroups_shards 16.0" in r.read()
    finally:
        node.terminate()
        assert node.wait(30) == 0
    assert "Traceback" not in log_path.read_text() and "console at" not in log_path.read_text()


def test_a_damaged_timeline_is_shown_as_such_and_started_again(served, cluster, zk, data_dir):
    fill(data_dir, "orders", [2, 2], zk=zk)
    cluster.member("g", ["orders"])
    wait_stable(zk, "g", 1)
    wait_for(lambda: zk.exists(protocol.timeline_path("g")), 10, message="the first entry")  # written after Stable
    zk.set(protocol.timeline_path("g"), b"{not json")
    wait_for(lambda: "not JSON" in (served.console.snapshot.group("g").timeline_error or ""), 10,
             message="the damage shown")
    cluster.member("g", ["orders"])
    wait_stable(zk, "g", 2)
    entries = wait_for(lambda: served.api("/groups/g/timeline")[1]["timeline"], 10, message="a new timeline")
    assert entries and all(e["generation"] >= 2 for e in entries)  # what came before the damage is gone
    wait_for(lambda: served.console.snapshot.group("g").timeline_error is None, 10, message="no damage shown")
