"""coordinatord's command line: configuration errors are one line and a non-zero exit; waiting
for ZooKeeper is bounded (--zk-timeout) or explicit (--wait-for-zk). More bad input:
tests/cli/test_cli_bad_input.py."""
import contextlib
import signal
import subprocess
import sys

import pytest

from coordinator.errors import EXIT_RETRIABLE

from coordinator import protocol
from coordinator.zkclient import close_client, start_client
from coordinator.testing.zkserver import Ensemble, free_port, local_classpath
from tests.support.helpers import wait_for


def run(args, env, timeout=60):
    return subprocess.run([sys.executable, "-m", "consumer.cli.coordinatord", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_unknown_config_key_is_one_line(tmp_path, subprocess_env, zk_connect):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[coordinator]\nrebalance_timout_ms = 5\n")
    r = run(["--zk", zk_connect, "--config", str(cfg)], subprocess_env)
    assert r.returncode == 1
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and "rebalance_timout_ms" in lines[-1] and "rebalance_timeout_ms" in lines[-1]
    assert "Traceback" not in r.stderr


def test_invalid_value_and_bad_toml(tmp_path, subprocess_env, zk_connect):
    r = run(["--zk", zk_connect, "--max-rebalance-retries", "-1"], subprocess_env)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "error: " in r.stderr
    cfg = tmp_path / "bad.toml"
    cfg.write_text("this is = = not toml")
    r = run(["--zk", zk_connect, "--config", str(cfg)], subprocess_env)
    assert r.returncode == 1 and "not valid TOML" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.zk  # about reaching ZooKeeper (none answers here)
def test_unreachable_zookeeper_is_one_line(subprocess_env):
    r = run(["--zk", "127.0.0.1:1", "--session-timeout-ms", "1000", "--zk-timeout", "1"], subprocess_env)
    assert r.returncode == EXIT_RETRIABLE and "did not answer" in r.stderr and "Traceback" not in r.stderr


@contextlib.contextmanager
def node_process(args, env, log_path):
    """A coordinatord process, its stderr in ``log_path``; killed at the end if still running."""
    with open(log_path, "w") as log:
        node = subprocess.Popen([sys.executable, "-m", "consumer.cli.coordinatord", *args], env=env,
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        yield node
    finally:
        if node.poll() is None:
            node.kill()
            node.wait(10)


@pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")
def test_wait_for_zk_waits_with_one_line_per_interval_then_leads(tmp_path, subprocess_env):
    """--wait-for-zk: ZooKeeper is not up yet; the node says so (its own line, no kazoo
    warnings), and leads once ZooKeeper starts. SIGTERM then ends it with status 0."""
    ensemble = Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk"))  # ports chosen, not started
    log_path = tmp_path / "node.log"
    args = ["--zk", ensemble.connect + "/app", "--wait-for-zk", "--zk-timeout", "0.5", "--node-id", "n1"]
    try:
        with node_process(args, subprocess_env, log_path) as node:
            wait_for(lambda: log_path.read_text().count("not reachable yet") >= 2, 20, message="two waiting lines")
            before = log_path.read_text()
            assert node.poll() is None
            assert "kazoo" not in before and "Traceback" not in before, before
            ensemble.start()
            client = start_client(ensemble.connect + "/app", 4000)
            try:
                wait_for(lambda: client.exists(protocol.LEADER), 20, message="n1 leads")
            finally:
                close_client(client)
            node.send_signal(signal.SIGTERM)
            assert node.wait(20) == 0
    finally:
        ensemble.close()


def test_sigterm_while_waiting_for_zookeeper_exits_at_once(tmp_path, subprocess_env):
    log_path = tmp_path / "node.log"
    args = ["--zk", f"127.0.0.1:{free_port()}", "--wait-for-zk", "--zk-timeout", "0.5"]
    with node_process(args, subprocess_env, log_path) as node:
        wait_for(lambda: "not reachable yet" in log_path.read_text(), 20, message="the first waiting line")
        node.send_signal(signal.SIGTERM)
        assert node.wait(10) == 0


def test_config_file_values_and_precedence(tmp_path, subprocess_env, zk_connect):
    """zk and node_id come from the file unless the command line gives them."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[coordinator]\nzk = "{zk_connect}"\nnode-id = "from-file"\nzk_timeout = 0.5\n'
                   'session_timeout_ms = 1000\n')
    dead = f"127.0.0.1:{free_port()}"
    r = run(["--config", str(cfg), "--zk", dead], subprocess_env)
    assert r.returncode == EXIT_RETRIABLE and r.stderr.strip() == f"error: ZooKeeper at {dead} did not answer within 0.5s"
    client = start_client(zk_connect, 4000)
    try:
        with node_process(["--config", str(cfg)], subprocess_env, tmp_path / "node.log") as node:
            info = wait_for(lambda: client.exists(protocol.LEADER) and protocol.LeaderInfo.decode(
                client.get(protocol.LEADER)[0]), 20, message="the node leads")
            assert info.node_id == "from-file"
            node.send_signal(signal.SIGTERM)
            assert node.wait(20) == 0
    finally:
        close_client(client)
