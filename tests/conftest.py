"""Fixtures: one real ZooKeeper per test session, a fresh chroot per test.

ZK_CONNECT points the suite at an external ZooKeeper; otherwise a local server is started
(tickTime 200 ms, so sessions can be as short as 400 ms) and killed at the end.
"""
from __future__ import annotations

import inspect
import os
import re
import sys
import types
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from coordinator.zkclient import close_client, start_client  # noqa: E402
from coordinator.testing import zkserver  # noqa: E402
from coordinator.testing.zkserver import provide_zookeeper  # noqa: E402


#: Tests that run one after the other on one pytest-xdist worker (``bin/test`` runs two): the
#: Spark jobs (a JVM and Python workers each: two at once would only fight over two cores);
#: every other test runs on the other worker, and on both once the Spark jobs are done.
HEAVY_FOLDERS = ("tests/spark/",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's load scheduling, with the tests under :data:`HEAVY_FOLDERS` as one unit of work
    (one worker runs them in order) and every other test a unit of its own. Chosen by path:
    xdist's own ``xdist_group`` marker does not reach its scheduler under pytest 9."""
    from xdist.scheduler import LoadScopeScheduling

    class HeavyTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "heavy" if nodeid.startswith(HEAVY_FOLDERS) else nodeid

    return HeavyTogether(config, log)


#: The harness's ways to start a ZooKeeper server (coordinator/testing/zkserver.py). A test whose
#: code, or one of its fixtures' code, names one starts a server however the ``zk_server``
#: fixture does not: it gets the ``zk`` marker all the same.
ZOOKEEPER_STARTERS = frozenset({"Ensemble", "provide_zookeeper", "start_container"})


def _names(code: types.CodeType) -> set:
    """The global and attribute names a function's code uses, those of its nested functions too."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def starts_zookeeper(item) -> bool:
    """Whether the test, or a fixture it uses, names a :data:`ZOOKEEPER_STARTERS` entry point."""
    functions = [getattr(item, "obj", None)]
    info = getattr(item, "_fixtureinfo", None)
    for definitions in (info.name2fixturedefs.values() if info is not None else ()):
        functions += [definition.func for definition in definitions]
    codes = [getattr(inspect.unwrap(f), "__code__", None) for f in functions if callable(f)]
    return any(ZOOKEEPER_STARTERS & _names(code) for code in codes if code is not None)


def pytest_collection_modifyitems(items):
    """Tests that need a ZooKeeper server get the ``zk`` marker (by the ``zk_server`` fixture, or
    by naming the harness's server starters) and tests that start processes the ``process``
    marker, so ``-m "not zk and not process and not slow and not kafka and not spark"`` is the
    fast subset (pure logic and the file-system log), which starts no JVM."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "zk_server" in fixtures or starts_zookeeper(item):
            item.add_marker(pytest.mark.zk)
        if "subprocess_env" in fixtures:
            item.add_marker(pytest.mark.process)


@pytest.fixture(autouse=True)
def _zookeeper_only_in_zk_tests(request, monkeypatch):
    """A server started where the marking above did not see it (through a helper, say) would
    start a JVM in the fast subset: in a test without the ``zk`` marker the harness refuses."""
    if request.node.get_closest_marker("zk") is not None:
        return

    def refuse(server):
        pytest.fail(f"{request.node.nodeid} starts a ZooKeeper server but has no zk marker: "
                    "add @pytest.mark.zk (or use the zk_server fixture)", pytrace=False)
    monkeypatch.setattr(zkserver.Server, "start", refuse)


#: The markers of tests that may start a JVM or run for long; a test with none of them is in the
#: no-server subset (docs/development.md), which must start no JVM.
SERVER_MARKERS = ("zk", "kafka", "spark", "slow", "process", "model", "fuzz")


@pytest.fixture(scope="session")
def _failing_java(tmp_path_factory):
    """(a folder holding a ``java`` that records who called it and exits 1, its record)."""
    folder = tmp_path_factory.mktemp("java-bin")
    calls = folder / "calls"
    java = folder / "java"
    java.write_text(f'#!/bin/sh\necho "$PYTEST_CURRENT_TEST: java $*" >> "{calls}"\n'
                    'echo "java: not in the no-server subset" >&2\nexit 1\n')
    java.chmod(0o755)
    return folder, calls


@pytest.fixture(autouse=True)
def _no_jvm_in_the_no_server_subset(request, monkeypatch, _failing_java):
    """Every test of the no-server subset runs with a ``java`` first on PATH that fails and
    records the call, so the subset is known to start no JVM from every run of the suite (not
    from a second run of the subset); a test that called it fails, naming the call."""
    if any(request.node.get_closest_marker(m) is not None for m in SERVER_MARKERS):
        yield
        return
    folder, calls = _failing_java
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    seen = calls.stat().st_size if calls.exists() else 0
    yield
    if calls.exists() and calls.stat().st_size > seen:
        with open(calls) as f:
            f.seek(seen)
            called = f.read().strip().splitlines()[0]
        pytest.fail(f"{request.node.nodeid} started a JVM ({called[:200]}) but has none of the markers "
                    f"{', '.join(SERVER_MARKERS)}: mark it", pytrace=False)


@pytest.fixture(scope="session")
def zk_server():
    with provide_zookeeper(tick_ms=200, fsync=False) as provided:
        yield provided


def _unique_name(request) -> str:
    """This test's name, safe for a znode or a Kafka topic, and unique across runs."""
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", request.node.name)[:60]
    return f"t-{name}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def zk_connect(zk_server, request):
    """A connect string with a chroot of this test's own."""
    return f"{zk_server.connect}/{_unique_name(request)}"


@pytest.fixture
def zk(zk_connect):
    client = start_client(zk_connect, session_timeout_ms=4000)
    yield client
    close_client(client)


@pytest.fixture(scope="session")
def kafka_cluster():
    """librdkafka's mock Kafka cluster, 3 brokers, one per test session (a child process).

    Shared: a test that takes a broker down or injects errors brings it back / uses them up,
    or starts a ``MockKafkaCluster`` of its own."""
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed (pip install -e '.[kafka]')")
    from coordinator.testing.kafkamock import MockKafkaCluster
    with MockKafkaCluster(brokers=3) as cluster:
        yield cluster


@pytest.fixture
def kafka_topic_name(request):
    """A Kafka topic name no other test uses."""
    return _unique_name(request)


@pytest.fixture
def data_dir(tmp_path):
    path = tmp_path / "data"
    path.mkdir()
    return str(path)


@pytest.fixture
def cluster(zk_connect):
    """Coordinators and members in this test's chroot (tests/support/groups.py), closed at the end."""
    from tests.support.groups import Cluster
    c = Cluster(zk_connect)
    yield c
    c.close()


@pytest.fixture
def subprocess_env():
    """Environment for child processes that import the project."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def groupctl(zk_connect, data_dir):
    """Run groupctl in-process (click's CliRunner) against this test's chroot and data directory.
    ``consume`` installs SIGTERM/SIGINT handlers: pytest's are put back afterwards."""
    import signal
    from click.testing import CliRunner
    from consumer.cli.groupctl import main

    def run(*args, input=None):
        saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return CliRunner().invoke(main, ["--zk", zk_connect, "--data-dir", data_dir, *args], input=input)
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
    return run
