"""One short chaos round (``bin/chaos``) with a fixed seed: every fault kind at least once, and
the referee's verdict must be a pass. The run directory stays under pytest's tmp_path."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from coordinator.testing.zkserver import local_classpath

pytestmark = [pytest.mark.slow, pytest.mark.zk, pytest.mark.timeout(400),  # starts ZooKeeper servers of its own
              pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")]

CHAOS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin", "chaos")
SEED = 7
DURATION_S = 40  # the six kinds come first (the nemesis runs over until each happened); then a few more


def test_chaos_round_passes(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run([CHAOS, "--seed", str(SEED), "--duration", str(DURATION_S),
                           "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=380)
    report = f"{done.stdout}\n{done.stderr[-2000:]}"
    verdict = next((line for line in done.stdout.splitlines() if line.startswith("chaos ")), "")
    assert verdict, report
    faults = dict((kind, int(n)) for kind, n in re.findall(r"([a-z-]+):(\d+)", verdict.split("faults=", 1)[1]))
    assert set(faults) == {"kill", "term", "pause", "leader-kill", "zk-restart", "quorum-loss"}, report
    assert all(n >= 1 for n in faults.values()) and faults["quorum-loss"] == 1, report
    assert done.returncode == 0 and verdict.startswith("chaos PASS"), report
