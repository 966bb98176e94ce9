"""Small helpers shared by the tests: bounded waits on conditions (never blind sleeps), and
processes started together."""
from __future__ import annotations

import subprocess
import sys
import time


def wait_for(condition, timeout: float = 10.0, interval: float = 0.02, message: str = "condition"):
    """Poll ``condition()`` until it returns a truthy value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:  # a condition may read state that is not there yet
            last_error = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {message}"
                         + (f" (last error: {last_error!r})" if last_error else ""))


def start_together(script: str, argvs, env) -> None:
    """Run ``python -c script`` once per argv, release them at once when every one has printed
    'ready', and wait for all to exit 0 (60 s each at most)."""
    procs = [subprocess.Popen([sys.executable, "-c", script, *argv], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in argvs]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err


#: groupctl as a child process (with the ``subprocess_env`` fixture's environment).
GROUPCTL = [sys.executable, "-m", "coordinator.cli.groupctl"]
