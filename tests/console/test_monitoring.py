"""The Grafana dashboard, Prometheus alert rules and example prometheus.yml shipped in monitoring/:
checked offline with ``promtool check rules``, ``promtool test rules`` and ``promtool check
config`` (Debian's ``prometheus`` package; bin/setup installs it), one unit test per alert, and
every query names metrics zkgroups exports. tests/console/test_prometheus.py loads them into a
running Prometheus."""
import json
import os
import re
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import yaml

from consumer.cli.exporter import LagExporter
from consumer.metrics import ConsumerMetrics
from coordinator.console.app import ConsoleCollector
from coordinator.console.lag import LagSampler
from coordinator.console.snapshot import ClusterSnapshot
from coordinator.metrics import CoordinatorMetrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(ROOT, "monitoring", "prometheus", "zkgroups-alerts.yml")
RULE_TESTS = os.path.join(ROOT, "monitoring", "prometheus", "zkgroups-alerts-test.yml")
CONFIG = os.path.join(ROOT, "monitoring", "prometheus", "prometheus.yml")
DASHBOARD = os.path.join(ROOT, "monitoring", "grafana", "zkgroups.json")
METRIC = re.compile(r"\bzkgroups_[a-z0-9_]+\b")
RECORDED = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")  # level:metric:operations
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="no promtool: install Debian's prometheus package "
                                                             "(bin/setup does) to check the alert rules")


class _IdleConsumer:
    """Enough of a Consumer for its metrics' families to be listed."""
    started, group_id, config = True, "g", SimpleNamespace(client_id="c")
    poll_interval = SimpleNamespace(seconds_since_poll=lambda: 0.0)

    def group_metadata(self):
        return SimpleNamespace(member_id="m", generation=1, rebalances=0)

    def assignment(self):
        return set()


def exported_names():
    """Every series name zkgroups' registries expose (counters with _total, histograms' parts)."""
    node = CoordinatorMetrics()
    console = SimpleNamespace(node=SimpleNamespace(groups=None), sampler=LagSampler(None, None, None),
                              snapshot=ClusterSnapshot(None))
    node.registry.register(ConsoleCollector(console))
    idle_cli = SimpleNamespace(data_plane=None)  # enough of a CliContext: nothing is read before a refresh
    registries = [node.registry, ConsumerMetrics(_IdleConsumer()).registry, LagExporter(idle_cli).registry]
    names = set()
    for registry in registries:
        for family in registry.collect():
            names.add(family.name)
            if family.type == "counter":
                names.add(family.name + "_total")
            if family.type == "histogram":
                names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


def rules(kind: str = "alert"):
    """The rules file's alerting rules (``kind="record"``: its recording rules)."""
    with open(RULES) as f:
        return [rule for group in yaml.safe_load(f)["groups"] for rule in group["rules"] if kind in rule]


def dashboard_queries():
    with open(DASHBOARD) as f:
        board = json.load(f)
    return [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel["targets"]]


def test_the_dashboard_loads_and_every_query_names_an_exported_metric():
    with open(DASHBOARD) as f:
        board = json.load(f)
    assert board["uid"] and len({p["id"] for p in board["panels"]}) == len(board["panels"])
    assert board["templating"]["list"][0]["type"] == "datasource"
    known = exported_names()
    queries = dashboard_queries()
    titles = " ".join(t for t, _ in queries).lower()
    for wanted in ("rebalances by outcome", "rebalance duration", "groups by state", "controller", "shard",
                   "lag per group", "zookeeper requests", "zookeeper errors"):
        assert wanted in titles
    for title, expr in queries:
        named = METRIC.findall(expr)
        assert named, f"{title}: {expr} names no zkgroups metric"
        unknown = set(named) - known
        assert not unknown, f"{title}: {expr} names {sorted(unknown)}, which nothing exports"


def test_every_alert_names_exported_metrics_and_has_a_unit_test():
    known = exported_names()
    with open(RULE_TESTS) as f:
        tested = {t["alertname"] for case in yaml.safe_load(f)["tests"] for t in case["alert_rule_test"]
                  if t.get("exp_alerts")}
    alerts = rules()
    assert {"ZkgroupsGroupFailed", "ZkgroupsGroupRebalancingTooLong", "ZkgroupsLagGrowing", "ZkgroupsNoController",
            "ZkgroupsShardWithoutLeader", "ZkgroupsCommitFailures", "ZkgroupsShareLocksExpiring",
            "ZkgroupsShareDeadLettersPending"} <= {r["alert"] for r in alerts}
    recorded = {r["record"] for r in rules("record")}
    for rule in rules("record"):
        assert RECORDED.fullmatch(rule["record"]) and set(METRIC.findall(rule["expr"])) <= known, rule["record"]
    for rule in alerts:
        assert set(RECORDED.findall(rule["expr"])) <= recorded, rule["alert"]
        assert set(METRIC.findall(RECORDED.sub("", rule["expr"]))) <= known, rule["alert"]
        assert rule["alert"] in tested, f"{rule['alert']} has no unit test that fires it"
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"]


@needs_promtool
def test_promtool_checks_the_rules_and_runs_their_unit_tests():
    checked = subprocess.run([PROMTOOL, "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([PROMTOOL, "test", "rules", RULE_TESTS], capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(RULE_TESTS))
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


@needs_promtool
def test_promtool_parses_every_dashboard_query(tmp_path):
    """The dashboard's PromQL, checked by Prometheus' own parser (as recording rules)."""
    records = [{"record": f"zkgroups:dashboard:{i}", "expr": expr} for i, (_, expr) in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_promtool_checks_the_example_prometheus_yml():
    checked = subprocess.run([PROMTOOL, "check", "config", CONFIG], capture_output=True, text=True, timeout=60,
                             cwd=os.path.dirname(CONFIG))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with open(CONFIG) as f:
        config = yaml.safe_load(f)
    assert config["rule_files"] == ["zkgroups-alerts.yml"]
    assert {"zkgroups-coordinators", "zkgroups-consumers", "zkgroups-exporter", "zkgroups-spark"} == \
        {job["job_name"] for job in config["scrape_configs"]}


@needs_promtool
def test_the_rules_rendered_for_a_fast_clock_differ_only_in_durations(tmp_path):
    """What tests/console/test_prometheus.py loads: the shipped rules with each ``for:``, range
    window and seconds threshold divided by 60, every other character the same."""
    from tests.support.prometheus import shortened_rules
    with open(RULES) as f:
        text = f.read()
    short = shortened_rules(text)
    by_name = {r.get("alert") or r["record"]: r for g in yaml.safe_load(short)["groups"] for r in g["rules"]}
    assert by_name["ZkgroupsGroupFailed"]["for"] == "5s" and by_name["ZkgroupsLagGrowing"]["for"] == "15s"
    assert "[10s]" in by_name["ZkgroupsLagGrowing"]["expr"] and "[20s]" in by_name["ZkgroupsGroupFailed"]["expr"]
    assert by_name["ZkgroupsGroupRebalancingTooLong"]["expr"].endswith("> 5")
    duration = re.compile(r"(for:\s*|\[)\d+(ms|s|m|h)|(_seconds\)\s*>\s*)\d+")
    assert duration.sub("D", short) == duration.sub("D", text)
    path = tmp_path / "short.yml"
    path.write_text(short)
    checked = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
