"""The import rule the package docstrings state: ``coordinator`` never imports ``consumer`` (but
in its one composition root, ``coordinatord``, for the console's log ends), and no runtime module
imports ``tests``. Read from the source (every import statement, at any
depth), not from what happens to be loaded."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def module_name(path):
    name = path[:-3].replace(os.sep, ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def _is_type_checking_block(node) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))


def test_no_import_cycles():
    """No module imports, at any depth of its source, a module that imports it back (directly
    or through others): each package reads bottom-up, and no import has to hide in a function
    to break a cycle. Imports under ``if TYPE_CHECKING:`` (for annotations only, never run)
    do not count."""
    paths = {module_name(p): p for package in ("coordinator", "consumer") for p in modules(package)}

    def local(name):  # the module of ours an import names ("coordinator.protocol.GroupState" -> its module)
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in paths.items():
        graph[name] = set()
        with open(os.path.join(ROOT, path)) as f:
            tree = ast.parse(f.read(), path)
        type_only = {id(n) for block in ast.walk(tree) if _is_type_checking_block(block)
                     for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for target in map(local, targets):
                if target and target != name and not name.startswith(target + "."):  # its own package
                    graph[name].add(target)
    cycles, done = [], set()

    def visit(name, trail):
        if name in trail:
            cycles.append(trail[trail.index(name):] + [name])
            return
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, trail + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert not cycles, f"import cycles: {[' -> '.join(c) for c in cycles]}"
