"""The container run's own logic, without an engine: what bin/test-containers counts as
consumed, how it reads build times, the engine harness's refusals, and bad input to the
images' scripts (one line, non-zero exit). The images and the stack themselves run in
bin/test-containers, not in this suite (a build from nothing takes minutes)."""
import datetime as dt
import os
import subprocess
import sys

import pytest

from coordinator.testing import dockerengine
from coordinator.testing.dockerengine import DockerEngine, EngineState, EngineUnavailable, install_missing
from tests.containers.run import _step_name, consumed_records, layer_times, missing_records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UTC = dt.timezone.utc


def test_consumed_records_are_the_printed_records_of_the_topic():
    lines = ['{"topic": "demo", "partition": 2, "offset": 7, "value": "x"}',
             '{"topic": "other", "partition": 2, "offset": 8}',
             "produced 10 records", "", "[1, 2]",
             '{"topic": "demo", "partition": 2, "offset": 7}']  # a redelivery counts once
    assert consumed_records(lines) == {(2, 7)}


@pytest.mark.parametrize("consumed, ends, missing", [
    ({(0, 0), (0, 1), (1, 0)}, {0: 2, 1: 1}, []),
    ({(0, 0), (0, 2)}, {0: 3, 1: 1}, [(0, 1), (1, 0)]),
    (set(), {0: 0}, []),
    ({(0, 5)}, {0: 1}, [(0, 0)]),  # beyond the end does not stand in for what is missing
])
def test_missing_records(consumed, ends, missing):
    assert missing_records(consumed, ends) == missing


def _row(when, size, created_by):
    return {"CreatedAt": when, "Size": str(size), "CreatedBy": created_by}


def test_layer_times_are_gaps_between_layers_made_by_this_build():
    history = [  # newest first, as docker history lists them
        _row("2026-01-01T00:02:00Z", 0, '/bin/sh -c #(nop)  CMD ["groupctl" "--help"]'),
        _row("2026-01-01T00:01:50Z", 2_000, "/bin/sh -c #(nop) COPY dir:abc in /src/coordinator"),
        _row("2026-01-01T00:01:30Z", 70_000_000, "|1 EXTRAS= /bin/sh -c set -eux; apt-get update"),
        _row("2025-06-01T00:00:00Z", 80_000_000, ""),  # the base image's one layer
    ]
    started = dt.datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    assert layer_times(history, 1, started) == [
        (90.0, 70_000_000, "RUN set -eux; apt-get update", False),
        (20.0, 2_000, "COPY dir:abc in /src/coordinator", False),
        (10.0, 0, 'CMD ["groupctl" "--help"]', False)]
    # Built again later: the first two layers came from the cache.
    later = dt.datetime(2026, 1, 1, 0, 1, 55, tzinfo=UTC)
    assert [(seconds, cached) for seconds, _, _, cached in layer_times(history, 1, later)] == [
        (0.0, True), (0.0, True), (5.0, False)]


def test_step_names():
    assert _step_name("/bin/sh -c #(nop)  ENV A=1") == "ENV A=1"
    assert _step_name("|2 BASE=x EXTRAS= /bin/sh -c pip  install .") == "RUN pip install ."
    assert _step_name("/bin/sh -c useradd z") == "RUN useradd z"


def test_install_missing_installs_nothing_when_every_command_is_there():
    assert install_missing({"sh": "dash", os.path.basename(sys.executable): "python3"}) == []


def test_install_missing_without_root_or_apt_is_one_line(monkeypatch):
    monkeypatch.setattr(dockerengine.shutil, "which", lambda cmd: None)
    with pytest.raises(EngineUnavailable, match=r"missing docker.io: install Debian's package\(s\) "
                                                r"\(apt-get install docker.io\) as root"):
        install_missing({"dockerd": "docker.io"})


def test_a_docker_host_that_does_not_answer_is_one_line(monkeypatch, tmp_path):
    url = f"unix://{tmp_path}/nothing.sock"
    monkeypatch.setenv("DOCKER_HOST", url)
    engine = DockerEngine(run_dir=str(tmp_path / "run"), state_dir=str(tmp_path / "state"))
    with pytest.raises(EngineUnavailable, match=f"DOCKER_HOST={url} does not answer; unset it"):
        engine.start()
    engine.close()  # nothing was started: nothing to stop
    assert engine.state is EngineState.CLOSED
    assert not os.path.exists(tmp_path / "run")


def _script(argv, env):
    return subprocess.run(argv, env=dict(os.environ, **env), capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("env, message", [
    ({"ZOO_MY_ID": "x"}, "ZOO_MY_ID must be a whole number from 1 to 255, not 'x'"),
    ({"ZOO_MY_ID": "0"}, "ZOO_MY_ID must be a whole number from 1 to 255, not '0'"),
    ({"ZOO_TICK_TIME": "-5"}, "ZOO_TICK_TIME must be a whole number from 1 to 600000, not '-5'"),
    ({"ZOO_MY_ID": "2", "ZOO_SERVERS": "server.1=zk1:2888:3888;2181"},
     "ZOO_SERVERS has no server.2 (this server's ZOO_MY_ID)"),
    ({"ZOO_SERVERS": "server.1=zk1:2888"},
     "ZOO_SERVERS entry 'server.1=zk1:2888' is not server.N=HOST:QUORUM_PORT:ELECTION_PORT[;CLIENT_PORT]"),
    ({"ZOO_SERVERS": "server.1=zk1:2888:3888;2181 server.2=$(id):1:2"},
     "ZOO_SERVERS entry 'server.2=$(id):1:2' is not server.N=HOST:QUORUM_PORT:ELECTION_PORT[;CLIENT_PORT]"),
    ({"ZOO_LOG_LEVEL": "LOUD"}, "ZOO_LOG_LEVEL must be one of TRACE DEBUG INFO WARN ERROR"),
])
def test_zookeeper_entrypoint_refuses_bad_settings_in_one_line(env, message):
    done = _script(["bash", os.path.join(ROOT, "docker", "zookeeper", "entrypoint.sh")], env)
    assert done.returncode == 1
    assert done.stderr == f"zookeeper-entrypoint: {message}\n"


def test_probe_usage_is_one_line():
    done = _script([sys.executable, os.path.join(ROOT, "docker", "zkgroups-probe"), "nonsense"], {})
    assert done.returncode == 2
    assert done.stderr == "usage: zkgroups-probe coordinator [NODE_ID] | zkgroups-probe URL\n"


def test_probe_of_a_url_that_does_not_answer_says_so(tmp_path):
    done = _script([sys.executable, os.path.join(ROOT, "docker", "zkgroups-probe"), "http://127.0.0.1:9/readyz"], {})
    assert done.returncode == 1
    assert done.stderr.startswith("zkgroups-probe: http://127.0.0.1:9/readyz: ")
    assert len(done.stderr.splitlines()) == 1
