"""The first hour: the bin/ wrappers without a .venv, the console commands ``pip install``
makes, the typing markers, and the public API's signatures. No server."""
from __future__ import annotations

import configparser
import inspect
import os
import shutil
import stat
import subprocess
import sys
import typing

import pytest
from click.testing import CliRunner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRAPPERS = ("groupctl", "coordinatord", "pipeline", "bench", "chaos")


def console_scripts():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    lines = [line.strip() for line in config["options.entry_points"]["console_scripts"].splitlines() if line.strip()]
    return dict(tuple(part.strip() for part in line.split("=", 1)) for line in lines)


def test_the_console_commands_are_there():
    assert {"coordinatord", "groupctl", "zkgroups-pipeline"} <= set(console_scripts())


@pytest.mark.parametrize("name, target", sorted(console_scripts().items()))
def test_each_console_command_imports_and_answers_help(name, target):
    module_name, _, function = target.partition(":")
    module = __import__(module_name, fromlist=[function])
    command = getattr(module, function)
    result = CliRunner().invoke(command, ["--help"], prog_name=name)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: {name} ")


@pytest.mark.parametrize("name, target", sorted(console_scripts().items()))
def test_each_console_command_prints_the_package_version(name, target):
    """``--version`` prints the command's name and the distribution's version, as installed."""
    from importlib.metadata import version

    import coordinator
    module_name, _, function = target.partition(":")
    command = getattr(__import__(module_name, fromlist=[function]), function)
    result = CliRunner().invoke(command, ["--version"], prog_name=name)
    assert result.exit_code == 0, result.output
    assert result.output == f"{name} {coordinator.__version__}\n"
    assert coordinator.__version__ == version("zkgroups")


def test_both_packages_are_typed_and_ship_the_marker():
    for package in ("coordinator", "consumer"):
        assert os.path.isfile(os.path.join(ROOT, package, "py.typed"))
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    data = {k: [p.strip() for p in v.split(",")] for k, v in config["options.package_data"].items()}
    assert set(data) == {"coordinator", "consumer"}
    assert all("py.typed" in patterns for patterns in data.values()), data
    # The console's pages and static files are package data too: a wheel without them serves no console.
    assert {"console/templates/*.html", "console/static/*"} <= set(data["coordinator"]), data


def test_the_public_api_has_signatures_that_resolve():
    """Every exported class's and function's public signatures are annotated, and the hints
    resolve (what a type checker reading py.typed relies on)."""
    import consumer
    missing = []
    for name in consumer.__all__:
        obj = getattr(consumer, name)
        functions = [(name, obj)] if inspect.isfunction(obj) else [
            (f"{name}.{attr}", getattr(obj, attr)) for attr, value in vars(obj).items()
            if (not attr.startswith("_") or attr in ("__init__", "__new__", "__enter__", "__exit__", "__iter__"))
            and (inspect.isfunction(value) or isinstance(value, (classmethod, staticmethod)))]
        for qualname, function in functions:
            if not (inspect.isfunction(function) or inspect.ismethod(function)) or \
                    not function.__module__.startswith(("consumer", "coordinator")):  # e.g. NamedTuple's own
                continue
            typing.get_type_hints(function)  # raises if a hint does not resolve
            signature = inspect.signature(function)
            unannotated = [p.name for p in signature.parameters.values()
                           if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
            if unannotated or signature.return_annotation is inspect.Signature.empty:
                missing.append((qualname, unannotated))
    assert not missing, missing


# ---------------------------------------------------------------- bin/ without a .venv

@pytest.fixture
def bare_root(tmp_path):
    """A copy of bin/ in a root without .venv, and a PATH whose python3 has no third-party
    packages (``-S``: no site-packages), as on a machine where bin/setup never ran."""
    root = tmp_path / "zkgroups"
    shutil.copytree(os.path.join(ROOT, "bin"), root / "bin")
    fake = tmp_path / "path"
    fake.mkdir()
    python3 = fake / "python3"
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python3.chmod(python3.stat().st_mode | stat.S_IXUSR)
    return root, f"{fake}:/usr/bin:/bin"


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_wrapper_without_venv_says_to_run_setup_in_one_line(bare_root, wrapper):
    root, path = bare_root
    assert not (root / ".venv").exists()
    proc = subprocess.run([str(root / "bin" / wrapper), "--help"], env={"PATH": path, "HOME": str(root)},
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"{wrapper}: zkgroups is not set up in {root} (no .venv, and python3 lacks its dependencies): "
        f"run {root}/bin/setup first"]


def test_a_wrapper_without_venv_uses_a_python3_that_has_the_dependencies(bare_root):
    root, path = bare_root
    for package in ("coordinator", "consumer"):
        os.symlink(os.path.join(ROOT, package), root / package)
    with open(os.path.join(os.path.dirname(path.split(":")[0]), "path", "python3"), "w") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this python: the dependencies are there
    proc = subprocess.run([str(root / "bin" / "groupctl"), "--help"], env={"PATH": path, "HOME": str(root)},
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: groupctl ")
