"""The import rules the package docstrings state: ``coordinator`` never imports ``consumer`` (not
even the daemon: its entry point on the client side hands it the data plane), no runtime module
imports ``tests``, no import cycle, and each package's module map lists every module bottom up
in an order its imports keep. Read from the source (every import statement, at any
depth), not from what happens to be loaded."""
import ast
import os
import re

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


@pytest.mark.parametrize("package,forbidden", [("coordinator", ("consumer", "tests")), ("consumer", ("tests",))])
def test_imports_go_one_way(package, forbidden):
    broken = [(path, name) for path in modules(package) for name in imported(path)
              if name.split(".")[0] in forbidden]
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


def module_map(package):
    """The top-level modules and subpackages the package docstring lists, bottom up."""
    with open(os.path.join(ROOT, package, "__init__.py")) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    return [name for name in re.findall(rf":mod:`~?{package}\.(\w+)`", doc.split("Modules, from the bottom up")[1])]


def top_level(package):
    names = set()
    for entry in os.listdir(os.path.join(ROOT, package)):
        if entry.endswith(".py") and entry != "__init__.py":
            names.add(entry[:-3])
        elif os.path.isfile(os.path.join(ROOT, package, entry, "__init__.py")):
            names.add(entry)
    return names


@pytest.mark.parametrize("package", ["coordinator", "consumer"])
def test_the_module_map_lists_every_module_in_an_order_the_imports_keep(package):
    """The package docstring's map names every module and subpackage once, bottom up, and no
    module imports one listed above it in the map (below means: may be imported). A module of
    a subpackage counts as its subpackage; imports for annotations only do not count."""
    order = module_map(package)
    assert sorted(order) == sorted(top_level(package)), "the map and the tree differ"
    rank = {name: i for i, name in enumerate(order)}
    upward = []
    for path in modules(package):
        parts = os.path.relpath(path, package).split(os.sep)
        here = parts[0][:-3] if len(parts) == 1 else parts[0]
        if here == "__init__":
            continue
        with open(os.path.join(ROOT, path)) as f:
            tree = ast.parse(f.read(), path)
        type_only = {id(n) for block in ast.walk(tree) if _is_type_checking_block(block) for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in type_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] + [f"{node.module}.{a.name}" for a in node.names] if node.level == 0 and node.module \
                else []
            for name in names:
                target = name.split(".")[1] if name.startswith(package + ".") else None
                if target in rank and target != here and rank[target] > rank[here]:
                    upward.append(f"{path} imports {package}.{target}")
    assert upward == []


# ---------------------------------------------------------------- the layer table

def layer_table():
    """{layer: {module}} as coordinator's package docstring lists them (``* **layer**: ``a``, ...``)."""
    import coordinator
    text = coordinator.__doc__
    table = {}
    for layer, names in re.findall(r"^\* \*\*(\w+)\*\*: ((?:``\w+``(?:,\s*)?)+)", text, re.M):
        table[layer] = set(re.findall(r"``(\w+)``", names))
    return table


CLIENT_TOOLS = ("consumer/cli/", "consumer/spark/cluster.py")


def test_the_layer_table_names_every_coordinator_module_once():
    table = layer_table()
    assert set(table) == {"contract", "node", "tools"}
    listed = [m for names in table.values() for m in names]
    assert len(listed) == len(set(listed)), "a module in two layers"
    assert set(listed) == set(top_level("coordinator")), "the table and the tree differ"


def test_the_layers_hold_lazy_imports_included():
    """contract imports no node or tools module, node no tools module; the client side's library
    imports only the contract, its tools the contract and the tools. Imports under
    ``TYPE_CHECKING`` are annotations and may cross."""
    table = layer_table()
    below = {"contract": table["contract"], "node": table["contract"] | table["node"]}
    broken = []
    for package in ("coordinator", "consumer"):
        for path in modules(package):
            rel = path.replace(os.sep, "/")
            if package == "coordinator":
                mine = rel.split("/")[1].removesuffix(".py")
                layer = next((name for name, names in table.items() if mine in names), None)
                allowed = below.get(layer)  # tools (and the package itself): anything
            else:
                allowed = table["contract"] | (table["tools"] if rel.startswith(CLIENT_TOOLS) else set())
            if allowed is None:
                continue
            for name in runtime_imports(path):
                parts = name.split(".")
                if parts[0] == "coordinator" and len(parts) > 1 and parts[1] not in allowed:
                    broken.append((rel, name))
    assert broken == []


def runtime_imports(path):
    """Every module an import statement of ``path`` names (at any depth; ``from coordinator import
    x`` as ``coordinator.x``), but those under ``if TYPE_CHECKING:``."""
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read(), path)
    type_only = {id(n) for block in ast.walk(tree) if _is_type_checking_block(block) for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in ("coordinator", "consumer"):
                yield from (f"{node.module}.{alias.name}" for alias in node.names)
            else:
                yield node.module

