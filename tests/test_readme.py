"""The README's consumer-library example runs as written (against this test's ZooKeeper)."""
import os
import re

from coordinator.topics import TopicRegistry

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def python_blocks():
    with open(README) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_consumer_library_example_runs(cluster, zk, zk_connect, data_dir, monkeypatch, capsys):
    example = next(b for b in python_blocks() if "from consumer import Consumer" in b)
    cluster.node("n")
    TopicRegistry(zk).create("orders", 2)
    monkeypatch.chdir(os.path.dirname(data_dir))  # the example writes ./data
    code = example.replace('"127.0.0.1:2181"', repr(zk_connect))
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "assigned" in out and "b'hello'" in out
