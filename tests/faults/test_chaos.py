"""Short chaos rounds (``bin/chaos``) with fixed seeds, judged by the referee: every fault kind
at least once; a partition round (two consumers and a controller cut from ZooKeeper with
their processes running); and a share round (share-group workers paused past their locks,
killed and stopped, the coordinator killed: :mod:`tests.chaos.share_referee`'s checks, and every
share-partition write a step of the share model, :mod:`tests.model.share_trace`). The
first two have the share round's workers too (``bin/chaos`` starts 4 by default). Where the
machine allows no network namespaces, ``bin/chaos`` says so in one line (repeated here as a
warning) and the cuts are stood in for by process faults.
Run directories stay under pytest's tmp_path."""
from __future__ import annotations

import os
import re
import subprocess
import warnings

import pytest

from coordinator.testing.zkserver import local_classpath
from tests.chaos.judge import PARTITION_KINDS, PROCESS_KINDS

pytestmark = [pytest.mark.slow, pytest.mark.zk, pytest.mark.timeout(400),  # starts ZooKeeper servers of its own
              pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")]

CHAOS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bin", "chaos")


def chaos_round(tmp_path, *args: str):
    """Run bin/chaos; (verdict line, faults by kind, whether links were cut, the whole report)."""
    done = subprocess.run([CHAOS, *args, "--run-dir", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=380)
    report = f"{done.stdout}\n{done.stderr[-3000:]}"
    verdict = next((line for line in done.stdout.splitlines() if line.startswith("chaos ")), "")
    assert verdict, report
    notice = next((line for line in done.stderr.splitlines() if "network namespaces are not available" in line), "")
    if notice:
        warnings.warn(notice)
    faults = dict((kind, int(n)) for kind, n in re.findall(r"([a-z-]+):(\d+)", verdict.split("faults=", 1)[1]))
    assert done.returncode == 0 and verdict.startswith("chaos PASS"), report
    return verdict, faults, "network=namespaces" in verdict, report


def test_chaos_round_passes(tmp_path):
    # every kind comes first (the nemesis runs over until each happened); then a few more
    verdict, faults, cut, report = chaos_round(tmp_path, "--seed", "7", "--duration", "40")
    assert set(faults) == set(PROCESS_KINDS) | (set(PARTITION_KINDS) if cut else set()), report
    assert all(n >= 1 for n in faults.values()) and faults["quorum-loss"] == 1, report


def test_partition_round_passes(tmp_path):
    verdict, faults, cut, report = chaos_round(
        tmp_path, "--seed", "11", "--duration", "20", "--faults", "cut-consumer,cut-controller,cut-consumer")
    if cut:
        assert faults["cut-consumer"] >= 2 and faults["cut-controller"] >= 1, report
    else:  # stood in for: a consumer paused, the controller killed
        assert faults["pause"] >= 2 and faults["leader-kill"] >= 1, report


def test_share_round_passes(tmp_path):
    # pauses (3-5 s) outlast the 3 s locks: expiries, refused acknowledgements, redeliveries
    verdict, faults, cut, report = chaos_round(
        tmp_path, "--seed", "5", "--duration", "20", "--consumers", "2", "--share-consumers", "4",
        "--faults", "pause,kill,pause,term,leader-kill,pause")
    figures = dict(re.findall(r"(share-accepted|share-archived|dead-letters|redelivered|share-writes|"
                              r"share-model-steps)=(\d+)", verdict))
    assert int(figures["share-accepted"]) > 0 and int(figures["share-archived"]) > 0, report
    # every share-partition write was judged a step of the share model (tests/model/share_trace.py)
    assert int(figures["share-model-steps"]) == int(figures["share-writes"]) > 0, report
    assert int(figures["dead-letters"]) >= int(figures["share-archived"]) and int(figures["redelivered"]) > 0, report
    assert faults["pause"] >= 3 and faults["kill"] >= 1 and faults["leader-kill"] >= 1, report
