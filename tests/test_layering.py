"""The import rule the package docstrings state: ``coordinator`` never imports ``consumer`` (but
in its one composition root, ``coordinatord``, for the console's log ends), and no runtime module
imports ``tests``. Read from the source (every import statement, at any
depth), not from what happens to be loaded."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules(package):
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
        for name in files:
            if name.endswith(".py"):
                yield os.path.relpath(os.path.join(folder, name), ROOT)


def imported(path):
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


#: The coordinator's composition root: coordinatord builds the console's log-end reader from the
#: data plane (the embedded log or Kafka), and may import exactly these modules of ``consumer``.
COMPOSITION_ROOT = {os.path.join("coordinator", "cli", "coordinatord.py"): {"consumer.dataplane", "consumer.records"}}


@pytest.mark.parametrize("package,forbidden", [("coordinator", ("consumer", "tests")), ("consumer", ("tests",))])
def test_imports_go_one_way(package, forbidden):
    broken = [(path, name) for path in modules(package) for name in imported(path)
              if name.split(".")[0] in forbidden and name not in COMPOSITION_ROOT.get(path, ())]
    assert not broken, f"{package} must not import {' or '.join(forbidden)}: {broken}"
