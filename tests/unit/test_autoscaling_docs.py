"""The autoscaling page's manifests (docs/operations/autoscaling.md): they parse, query only
metrics zkgroups serves, and cap a consumer group at the partition count they state (fast;
no Kubernetes here)."""
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, "docs", "operations", "autoscaling.md")
#: Where the coordinator builds the names it serves (the exporter serves the same group gauges:
#: tests/console/test_lag_seconds.py).
CONSOLE = os.path.join(ROOT, "coordinator", "console", "app.py")


def manifests():
    with open(PAGE) as f:
        text = f.read()
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def served(name):
    with open(CONSOLE) as f:
        return f'"{name}"' in f.read()


def test_the_manifests_parse_and_query_served_metrics_capped_at_the_partition_count():
    scaled, adapter, hpa = manifests()
    assert scaled["kind"] == "ScaledObject" and hpa["kind"] == "HorizontalPodAutoscaler"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    names = set(re.findall(r"zkgroups_\w+", trigger["metadata"]["query"]))
    names |= set(re.findall(r"zkgroups_\w+", adapter["externalRules"][0]["seriesQuery"]))
    names.add(hpa["spec"]["metrics"][0]["external"]["metric"]["name"])
    assert names == {"zkgroups_group_max_lag_seconds"} and all(served(n) for n in names)
    # the cap: orders has 12 partitions, the page says
    assert scaled["spec"]["maxReplicaCount"] == hpa["spec"]["maxReplicas"] == 12
    with open(PAGE) as f:
        assert "reads `orders` (12 partitions)" in f.read()
