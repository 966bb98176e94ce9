"""The documentation: the Sphinx site builds without a single warning (every cross-reference
resolves, every docstring parses), offline, from the ``docs`` extra alone (as Read the Docs builds it); the README stays one screen and its links into
docs/ lead somewhere; the wheel carries the license. The quickstart's example runs in
tests/project/test_readme.py; ``--version`` is checked in tests/project/test_install.py."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
README = os.path.join(ROOT, "README.md")
README_MAX_LINES = 200


def docs_virtualenv(path) -> str:
    """A fresh virtualenv with what Read the Docs installs (.readthedocs.yaml): the package's
    dependencies and the extras it names, nothing else; its Python. The package itself is not
    installed: docs/conf.py puts the source tree first on the path either way."""
    import yaml
    with open(os.path.join(ROOT, ".readthedocs.yaml")) as f:
        (install,) = yaml.safe_load(f)["python"]["install"]
    assert install["method"] == "pip" and install["path"] == "."
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120, stdin=subprocess.DEVNULL)
    python = os.path.join(path, "bin", "python")
    proc = subprocess.run([python, os.path.join(ROOT, "docker", "install-dependencies"), os.path.join(ROOT, "setup.cfg"),
                           ",".join(install["extra_requirements"])],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return python


@pytest.mark.process
@pytest.mark.timeout(1200)  # ~30 s of CPU to install, ~45 s to build; much longer on a loaded machine
def test_the_docs_build_without_a_warning(tmp_path):
    """The command a person runs (docs/development.md), in a virtualenv that holds only the
    ``docs`` extra and the package's dependencies, as Read the Docs builds it: -W fails on any
    warning, -n on any reference that does not resolve, and nothing the docs import may need
    pytest or pyspark. A fresh output directory, so nothing is left from before."""
    python = docs_virtualenv(tmp_path / "venv")
    for absent in ("pytest", "pyspark"):
        assert subprocess.run([python, "-c", f"import {absent}"], capture_output=True).returncode != 0, absent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    proc = subprocess.run(
        [python, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), DOCS, str(tmp_path / "html")],
        env=env, cwd=str(tmp_path), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=880)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert proc.stderr.strip() == "", proc.stderr[-5000:]
    for page in ("index", "quickstart", "reference/cli", "reference/configuration", "reference/api/consumer",
                 "operations/troubleshooting", "changelog"):
        assert (tmp_path / "html" / f"{page}.html").is_file(), page


def readme_lines():
    with open(README, encoding="utf-8") as f:
        return f.read().splitlines()


def test_the_readme_is_one_screen_of_reading():
    lines = readme_lines()
    assert len(lines) <= README_MAX_LINES
    assert sum(line.startswith("```") for line in lines) % 2 == 0, "a code block is not closed"


def heading_anchors(path: str) -> set:
    """The anchors MyST gives a Markdown page's headings (myst_heading_anchors): lower case,
    punctuation dropped, spaces as dashes."""
    anchors = set()
    with open(path, encoding="utf-8") as f:
        in_code = False
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            elif not in_code and re.match(r"#{1,6} ", line):
                title = line.lstrip("#").strip().lower()
                anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return anchors


def test_every_readme_link_into_docs_resolves():
    links = re.findall(r"\]\((docs/[^)\s]*)\)", "\n".join(readme_lines()))
    assert links, "the README links into the docs"
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            broken.append(link)
        elif anchor and anchor not in heading_anchors(full):
            broken.append(link)
    assert not broken, broken


def test_the_readme_keeps_the_fresh_machine_commands_first():
    head = "\n".join(readme_lines()[:20])
    assert "\nbin/demo    # installs everything" in head and "\nbin/test    # installs everything" in head


@pytest.mark.timeout(300)
def test_the_wheel_carries_the_license_and_project_urls(subprocess_env, tmp_path):
    """``pip install .`` builds this wheel: its metadata names LICENSE and the file is in it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.cfg", "setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    for package in ("coordinator", "consumer"):
        shutil.copytree(os.path.join(ROOT, package), src / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(src)],
        env=subprocess_env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("zkgroups-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        licenses = [n for n in names if ".dist-info/" in n and n.endswith("/LICENSE")]
        assert licenses, names
        with open(os.path.join(ROOT, "LICENSE"), "rb") as f:
            assert zf.read(licenses[0]) == f.read()
    assert "License-File: LICENSE" in metadata
    assert "Apache-2.0" in metadata
    assert "Project-URL: Documentation, " in metadata
    # The C accelerator is compiled into it (a compiler is here); its source ships in the sdist.
    assert any(n.startswith("consumer/_speedups") and n.endswith(".so") for n in names), names
    # The Docker engine harness runs apt-get as root: it is part of the tests, not of the wheel.
    assert not [n for n in names if "dockerengine" in n or n.startswith("tests/")], names
