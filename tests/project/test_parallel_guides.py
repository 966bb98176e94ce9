"""docs/guides/parallel.md, asyncio.md and share-groups.md: their examples run as written (against
this test's ZooKeeper, with its coordinator, on the embedded log)."""
import os
import re

import pytest

from tests.support.helpers import fill

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def example(page: str) -> str:
    with open(os.path.join(ROOT, "docs", "guides", page)) as f:
        blocks = [b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S) if b.startswith("# zkgroups:")]
    assert len(blocks) == 1
    return blocks[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page, expected", [("parallel.md", "processed 100 records"),
                                            ("asyncio.md", "consumed 100 last offset"),
                                            ("share-groups.md", "accepted 86 rejected 14")])
def test_the_guide_example_runs(page, expected, cluster, zk, zk_connect, data_dir, monkeypatch, capsys):
    cluster.node("n")
    fill(data_dir, "orders", [50, 50], zk=zk, key=lambda o: f"customer-{o % 7}".encode())
    fill(data_dir, "orders.dead", [0], zk=zk)
    monkeypatch.chdir(os.path.dirname(data_dir))  # the examples use ./data
    exec(compile(example(page).replace('"127.0.0.1:2181"', repr(zk_connect)), page, "exec"), {})
    assert expected in capsys.readouterr().out
    if page == "share-groups.md":   # the rejected records are in the dead-letter topic, once each
        from consumer.log import Log
        from tests.support.helpers import wait_for
        with Log(data_dir) as log:
            wait_for(lambda: log.latest_offset("orders.dead", 0) == 14, 10, message="14 dead letters")
