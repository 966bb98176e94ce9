"""One way to write a lifecycle (:mod:`coordinator.lifecycle`): every class of the runtime
packages and their test harness that keeps a state of its own does it through ``Lifecycle``,
read from the source. A class that writes its own ``_set_state``, or assigns ``self.state``,
keeps a state beside the one idiom."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def classes():
    for package in ("coordinator", "consumer", os.path.join("tests", "containers")):  # the last: the engine harness
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path) as f:
                        tree = ast.parse(f.read(), path)
                    for node in ast.walk(tree):
                        if isinstance(node, ast.ClassDef):
                            yield os.path.relpath(path, ROOT), node


def keeps_a_state(cls: ast.ClassDef) -> bool:
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef) and node.name == "_set_state":
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr in ("state", "_state")
                   and isinstance(t.value, ast.Name) and t.value.id == "self" for t in targets):
                return True
    return False


def on_lifecycle(cls: ast.ClassDef) -> bool:
    return any(isinstance(b, ast.Subscript) and getattr(b.value, "id", None) == "Lifecycle" for b in cls.bases)


def test_every_class_that_keeps_a_state_does_it_through_lifecycle():
    beside = [f"{path}: {cls.name}" for path, cls in classes()
              if cls.name != "Lifecycle" and keeps_a_state(cls) and not on_lifecycle(cls)]
    assert beside == []


def test_the_stateful_classes_are_on_lifecycle():
    # The check above would pass on an empty tree: the classes it must find.
    found = {cls.name for _, cls in classes() if on_lifecycle(cls)}
    assert {"Coordinator", "ShardFollower", "RebalanceHandlers", "Controller", "TopicMirror", "Term", "ClusterSnapshot",
            "GroupMember", "Consumer", "Fetcher", "Producer", "DeathBudget", "DockerEngine"} <= found
