"""coordinatord's command line: configuration errors are one line and a non-zero exit."""
import subprocess
import sys


def run(args, env, timeout=60):
    return subprocess.run([sys.executable, "-m", "coordinator.cli.coordinatord", *args], env=env,
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


def test_unreachable_zookeeper_is_one_line(subprocess_env):
    r = run(["--zk", "127.0.0.1:1", "--session-timeout-ms", "1000"], subprocess_env)
    assert r.returncode == 1 and "did not answer" in r.stderr and "Traceback" not in r.stderr
