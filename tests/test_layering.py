"""The import rule the package docstrings state: ``coordinator`` never imports ``consumer``,
and no runtime module imports ``tests``. Read from the source (every import statement, at any
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


@pytest.mark.parametrize("package,forbidden", [("coordinator", ("consumer", "tests")), ("consumer", ("tests",))])
def test_imports_go_one_way(package, forbidden):
    broken = [(path, name) for path in modules(package) for name in imported(path)
              if name.split(".")[0] in forbidden]
    assert not broken, f"{package} must not import {' or '.join(forbidden)}: {broken}"
