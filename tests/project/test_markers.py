"""The markers (tests/conftest.py) keep the fast subset free of ZooKeeper: a test that starts a
server gets the ``zk`` marker however it starts it (the ``zk_server`` fixture, or the harness's
``Ensemble``/``provide_zookeeper``/``start_container`` in its code or its fixtures'), and in a
test without that marker the harness refuses to start one. Every run of the suite runs the
no-server subset with a ``java`` on PATH that records each call and fails (tests/conftest.py);
the larger fast subset, the tools' processes included, is run that way by hand (``-m slow``)."""
from __future__ import annotations

import os
import re  # noqa: F401 (the skipif condition's)
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The fast subset: no ZooKeeper, no Kafka, no Spark, nothing long.
FAST = "not zk and not kafka and not spark and not slow"
#: Tests that started a server of their own by hand and so escaped the fixture's marker.
BY_HAND = [
    "tests/cli/test_coordinatord_cli.py::test_wait_for_zk_waits_with_one_line_per_interval_then_leads",
    "tests/cli/test_groupctl_consume.py::test_consume_started_before_zookeeper_waits_for_it_then_consumes",
    "tests/console/test_console_api.py::test_readyz_follows_the_zookeeper_session",
]
REFUSAL = "starts a ZooKeeper server but has no zk marker"


def failing_java(tmp_path):
    """(environment with a ``java`` first on PATH that records its arguments and exits 1, the record)."""
    folder = tmp_path / "java-bin"
    folder.mkdir()
    calls = tmp_path / "java-calls"
    java = folder / "java"
    java.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\necho "java: not in the fast subset" >&2\nexit 1\n')
    java.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("ZK_CONNECT", "PYTEST_ADDOPTS")}
    env["PATH"] = f"{folder}{os.pathsep}{env['PATH']}"
    return env, calls


def pytest_run(args, env, timeout):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)


def test_tests_that_start_a_server_by_hand_are_not_in_the_fast_subset():
    done = pytest_run(["--collect-only", "-q", "-m", FAST, *BY_HAND], dict(os.environ), 120)
    assert done.returncode == 5, done.stdout[-2000:]  # 5: every test deselected
    assert "3 deselected" in done.stdout, done.stdout[-2000:]


def test_a_server_started_where_the_marking_cannot_see_it_is_refused(tmp_path):
    """A server started through a helper function escapes the marking; the harness refuses it
    in one line, and no JVM runs."""
    test_file = tmp_path / "test_helper_server.py"
    test_file.write_text(
        "from coordinator.testing import zkserver\n\n\n"
        "def helper(workdir):  # the marking reads the test's own code, not what it calls\n"
        "    return zkserver.Ensemble(1, workdir=workdir).start(timeout=5)\n\n\n"
        "def test_it(tmp_path):\n"
        "    helper(str(tmp_path))\n")
    env, calls = failing_java(tmp_path)
    done = pytest_run(["-q", "-p", "tests.conftest", "--rootdir", str(tmp_path), "-c", os.devnull, str(test_file)],
                      env, 120)
    assert done.returncode == 1, done.stdout[-2000:]
    assert f"test_helper_server.py::test_it {REFUSAL}: add @pytest.mark.zk" in done.stdout, done.stdout[-2000:]
    assert not calls.exists()


#: Only when asked for (``-m slow``): the fast subset with the tools' processes takes minutes.
by_hand = pytest.mark.skipif("not re.search(r'(?<!not )\\bslow\\b', config.getoption('markexpr') or '')",
                             reason="the fast subset with processes runs by hand: -m slow")


def test_a_jvm_started_in_the_no_server_subset_fails_the_test(tmp_path):
    """Every run of the suite runs the no-server subset with a failing ``java`` first on PATH
    (tests/conftest.py): a test there that starts one fails, naming the call; a marked one may."""
    test_file = tmp_path / "test_starts_java.py"
    test_file.write_text(
        "import subprocess\n\nimport pytest\n\n\n"
        "def test_unmarked():\n"
        "    subprocess.run(['java', '-version'], capture_output=True)\n\n\n"
        "@pytest.mark.spark\n"
        "def test_marked():\n"
        "    assert __import__('os').environ['PATH'] == __import__('os').environ['GIVEN_PATH']\n")
    env = {k: v for k, v in os.environ.items() if k not in ("ZK_CONNECT", "PYTEST_ADDOPTS")}
    env["GIVEN_PATH"] = env["PATH"]
    done = pytest_run(["-q", "-p", "tests.conftest", "-W", "ignore::pytest.PytestUnknownMarkWarning", "--rootdir",
                       str(tmp_path), "-c", os.devnull, str(test_file)], env, 120)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "2 passed, 1 error" in done.stdout  # test_unmarked passes its call and fails its teardown, done.stdout[-2000:]
    assert "test_unmarked started a JVM (test_starts_java.py::test_unmarked (call): java -version) but has none " \
           "of the markers" in done.stdout, done.stdout[-2000:]


@pytest.mark.timeout(3600)
@pytest.mark.slow
@by_hand
def test_the_fast_subset_with_processes_starts_no_jvm(tmp_path):
    """The larger fast subset, the tools' processes included, with a failing ``java`` (by hand:
    it takes minutes)."""
    env, calls = failing_java(tmp_path)
    done = pytest_run(["-q", "-m", FAST, "-k", "not test_the_fast_subset_with_processes_starts_no_jvm"], env, 3500)
    assert not calls.exists(), "java was started:\n" + calls.read_text()[:2000]
    assert REFUSAL not in done.stdout, done.stdout[-3000:]
    assert done.returncode == 0, done.stdout[-3000:]
