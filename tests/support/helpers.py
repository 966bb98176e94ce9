"""Small helpers shared by the tests: bounded waits on conditions (never blind sleeps), and
processes started together."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter


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


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP took effect on every thread)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def freeze_until_dropped(pid: int, client) -> None:
    """SIGSTOP the ZooKeeper server ``pid`` now and SIGCONT it once ``client`` has dropped its
    connection (after its read timeout, as over a cut link or a server that lost its quorum):
    requests ``client`` sends meanwhile get no answer and fail with ConnectionLoss."""
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: stopped(pid), message="the server stopped")

    def resume():
        try:
            wait_for(lambda: not client.connected, 60, message="the client dropped its connection")
        finally:
            os.kill(pid, signal.SIGCONT)
    threading.Thread(target=resume, daemon=True).start()


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


def fetcher_parked(fetcher, tp) -> bool:
    """Whether a fetch of ``tp`` failed and parked it (the fetcher's own state: nothing shows it
    before the records buffered in front of it are handed out, which tests wait for)."""
    with fetcher._lock:
        st = fetcher._parts.get(tp)
        return st is not None and st.error is not None


#: groupctl as a child process (with the ``subprocess_env`` fixture's environment).
GROUPCTL = [sys.executable, "-m", "consumer.cli.groupctl"]


def fill(data_dir: str, topic: str, counts, *, zk=None, key=None, ts=lambda offset: 1000 + offset,
         chunk: int = 1000, first: int = 0) -> None:
    """Append ``counts[p]`` records to partition p of ``topic`` in the embedded log under
    ``data_dir``; record o of partition p has the value ``"<topic>-<p>-<o>"`` and the timestamp
    ``ts(o)``, o counted from ``first`` (a partition's end offset, to append more of the same
    kind). ``key``: bytes for every record, a function of the offset, or None. With ``zk``
    the topic is registered first (``len(counts)`` partitions, or as many as it has)."""
    from consumer.log import Log
    from coordinator.topics import TopicRegistry
    if zk is not None:
        TopicRegistry(zk).ensure(topic, len(counts))
    key_of = key if callable(key) else (lambda offset: key)
    with Log(data_dir) as log:
        for p, n in enumerate(counts):
            for base in range(first, first + n, chunk):
                log.append(topic, p, [(key_of(o), f"{topic}-{p}-{o}".encode(), ts(o), ())
                                      for o in range(base, min(first + n, base + chunk))])


def committed(zk, group: str, topic: str, partitions: int) -> dict:
    """{partition: the offset committed in ZooKeeper, None where nothing is}."""
    from coordinator import protocol
    out = {}
    for p in range(partitions):
        path = protocol.offsets_path(group, topic, p)
        out[p] = protocol.decode_offset(zk.get(path)[0], path) if zk.exists(path) else None
    return out


def ok(result) -> str:
    """The stdout of a CliRunner result that succeeded (no traceback)."""
    assert result.exit_code == 0, (result.output, result.exception)
    assert "Traceback" not in result.output
    return result.stdout


def assert_one_line_error(exit_code: int, stdout: str, stderr: str, match: str) -> None:
    assert exit_code != 0
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and match in lines[0], lines[0]
    assert "Traceback" not in stdout + stderr


def assert_failed(result, match: str, exit_code: int = 1) -> None:
    """A CliRunner result that failed with one line ``error: ...`` containing ``match``."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == exit_code, result.output
    assert_one_line_error(result.exit_code, result.stdout, result.stderr, match)


def check_consumed(outputs, ends, victim_output, windows) -> None:
    """Judge ``groupctl consume --format json`` outputs (paths) of one group against the log
    ends ({partition: end offset}): every record was consumed, and a record printed twice was
    printed by the victim (the SIGKILLed member, output ``victim_output``) at or after its
    partition's redelivery window start (``windows``: {partition: first offset that may repeat})."""
    seen, by_victim = Counter(), {}
    for path in outputs:
        for line in open(path).read().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue  # the SIGKILLed process may leave half a line
            seen[(r["partition"], r["offset"])] += 1
            if path == victim_output:
                by_victim.setdefault(r["partition"], set()).add(r["offset"])
    expected = {(p, o) for p, end in ends.items() for o in range(end)}
    assert expected - set(seen) == set(), "records never consumed"
    for (p, o), n in seen.items():
        if n > 1:
            assert p in windows and o >= windows[p] and o in by_victim.get(p, ()), \
                f"duplicate {p}/{o} outside the allowed window"
