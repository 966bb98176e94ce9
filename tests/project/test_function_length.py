"""No runtime function (``coordinator`` and ``consumer``, the test harness in
``coordinator/testing`` aside) is longer than MAX_LINES, its docstring and signature included:
a longer one is split into named steps, so that it reads like a table of contents; no runtime
module is longer than MAX_MODULE_LINES. Read from the source, not from what happens to be
loaded."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_LINES = 60
HARNESS = os.path.join("coordinator", "testing")

#: (path, qualified name) of functions allowed to be longer, each with its reason.
ALLOWED: set = set()


def functions(tree):
    """(qualified name, node) of every function and method, nested ones included."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                yield from walk(child, name + ".")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def runtime_modules():
    for package in ("coordinator", "consumer"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            if os.path.relpath(folder, ROOT).startswith(HARNESS):
                continue
            yield from (os.path.relpath(os.path.join(folder, f), ROOT) for f in sorted(files) if f.endswith(".py"))


def long_functions():
    for path in runtime_modules():
        with open(os.path.join(ROOT, path)) as f:
            tree = ast.parse(f.read(), path)
        for name, node in functions(tree):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                yield path, name, node.lineno, lines


def test_no_runtime_function_is_longer_than_its_named_steps_would_be():
    offenders = [f"{path}:{line} {name} ({lines} lines)" for path, name, line, lines in long_functions()
                 if (path, name) not in ALLOWED]
    assert offenders == [], f"functions over {MAX_LINES} lines (split them into named steps): {offenders}"


def test_the_allow_list_names_only_long_functions():
    """An entry whose function got shorter (or was renamed) goes."""
    long = {(path, name) for path, name, _, _ in long_functions()}
    assert ALLOWED <= long, f"no longer over {MAX_LINES} lines: {sorted(ALLOWED - long)}"


#: No runtime module is longer than this: past it, a module holds more than one central idea.
MAX_MODULE_LINES = 700


def test_no_runtime_module_is_longer_than_one_idea():
    long = []
    for path in runtime_modules():
        with open(os.path.join(ROOT, path)) as f:
            lines = sum(1 for _ in f)
        if lines > MAX_MODULE_LINES:
            long.append(f"{path} ({lines} lines)")
    assert long == [], f"modules over {MAX_MODULE_LINES} lines (split them along their concerns): {long}"
