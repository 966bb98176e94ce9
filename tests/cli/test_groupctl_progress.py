"""Progress of long admin work: shown on stderr when it is a terminal, silent when piped.

Each case runs groupctl as a real process twice: once with stderr on a pseudo-terminal (stdout
a pipe, as in ``groupctl consume ... > records.jsonl``), once with both piped.
"""
from __future__ import annotations

import json
import os
import pty
import subprocess
import threading

from tests.support.helpers import GROUPCTL, committed, fill

BOUND_S = 60


def run_with_terminal_stderr(args, env):
    """(exit status, stdout, what the terminal showed) of groupctl with stderr on a pty."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*GROUPCTL, *args], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave)
    os.close(slave)
    shown = []

    def drain():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the process (the last holder of the terminal) is gone
                return
            if not data:
                return
            shown.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    os.close(master)
    return proc.returncode, out.decode(), b"".join(shown).decode(errors="replace")


def run_piped(args, env):
    proc = subprocess.run([*GROUPCTL, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=BOUND_S)
    return proc.returncode, proc.stdout, proc.stderr


def test_consume_max_records_shows_records_so_far_only_on_a_terminal(cluster, zk, zk_connect, data_dir,
                                                                    subprocess_env):
    cluster.node("n")
    fill(data_dir, "t", [300, 200], zk=zk)
    base = ["--zk", zk_connect, "--data-dir", data_dir, "consume"]
    code, out, terminal = run_with_terminal_stderr([*base, "g", "t", "--max-records", "500"], subprocess_env)
    assert code == 0, terminal
    assert len([json.loads(line) for line in out.splitlines()]) == 500
    assert "consuming from group g" in terminal and "500/500" in terminal, terminal
    assert "consumed 500 records" in terminal

    code, out, err = run_piped([*base, "g2", "t", "--max-records", "500"], subprocess_env)
    assert code == 0 and len(out.splitlines()) == 500
    assert err.splitlines() == ["consumed 500 records"]


def test_reset_offsets_over_many_partitions_shows_progress_only_on_a_terminal(zk, zk_connect, data_dir,
                                                                             subprocess_env):
    from consumer.cli.groups import RESET_PROGRESS_MIN_PARTITIONS
    partitions = RESET_PROGRESS_MIN_PARTITIONS
    fill(data_dir, "wide", [1] * partitions, zk=zk)
    base = ["--zk", zk_connect, "--data-dir", data_dir, "groups", "reset-offsets"]
    code, out, terminal = run_with_terminal_stderr([*base, "g", "--topic", "wide", "--to-latest", "--execute"],
                                                   subprocess_env)
    assert code == 0, terminal
    assert "reading offsets" in terminal and f"writing {partitions:,} offsets in one transaction" in terminal
    assert out.splitlines()[-1] == f"reset {partitions} partitions of wide"
    assert set(committed(zk, "g", "wide", partitions).values()) == {1}

    code, out, err = run_piped([*base, "g2", "--topic", "wide", "--to-latest", "--execute"], subprocess_env)
    assert code == 0 and err == "" and out.splitlines()[-1] == f"reset {partitions} partitions of wide"
    assert set(committed(zk, "g2", "wide", partitions).values()) == {1}
