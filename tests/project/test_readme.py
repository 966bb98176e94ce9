"""The consumer examples of the README, the docs' quickstart and the consumer guide run as
written (against this test's ZooKeeper, with its coordinator)."""
import os
import re

import pytest

from coordinator.topics import TopicRegistry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = {"README.md": os.path.join(ROOT, "README.md"),
         "docs/quickstart.md": os.path.join(ROOT, "docs", "quickstart.md"),
         "docs/guides/consumer.md": os.path.join(ROOT, "docs", "guides", "consumer.md")}


def consumer_example(path: str) -> str:
    with open(path) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    return next(b for b in blocks if "from consumer import Consumer" in b)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_consumer_library_example_runs(page, cluster, zk, zk_connect, data_dir, monkeypatch, capsys):
    example = consumer_example(PAGES[page])
    cluster.node("n")
    TopicRegistry(zk).create("orders", 2)
    monkeypatch.chdir(os.path.dirname(data_dir))  # the example writes ./data
    code = example.replace('"127.0.0.1:2181"', repr(zk_connect))
    exec(compile(code, page, "exec"), {})
    out = capsys.readouterr().out
    assert "assigned" in out and "b'hello'" in out
