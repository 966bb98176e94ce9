"""Each fuzz target for a fixed number of inputs from a fixed seed (``bin/fuzz`` runs them
longer), and the inputs the fuzzers found, as regression tests of the decoders."""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

from consumer.log import batch as log_batch
from tests.fuzz.targets import TARGETS, fix_checksum

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Inputs per target: each run takes seconds (the log's target writes a file per input).
RUNS = {"batch": 10_000, "log": 1_000, "znode": 10_000, "config": 1_000}

pytestmark = pytest.mark.fuzz


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target_finds_nothing_in_a_fixed_budget(target, tmp_path):
    pytest.importorskip("atheris")
    proc = subprocess.run([sys.executable, "-m", "tests.fuzz.run", target, f"--runs={RUNS[target]}", "--seed=1",
                           f"--artifacts={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"Done {RUNS[target]} runs" in proc.stderr


def _batch(flags: int, count: int, body: bytes) -> bytes:
    rest = struct.pack("<BBHqIqq", log_batch.MAGIC, flags, 0, 7, count, 1, 1)
    return fix_checksum(b"\0" * 8 + rest + body)


def test_a_timestamp_run_column_longer_than_the_batch_is_a_decoding_error():
    # Found by the batch fuzzer: 5 runs announced, none present (was an IndexError).
    buf = _batch(log_batch.FLAG_TIMESTAMP_RUNS | log_batch.FLAG_FIXED_VALUES, 1, struct.pack("<I", 5))
    with pytest.raises(ValueError, match="overruns"):
        log_batch.decode(buf, "t", 0, "f.log", 0)


def test_a_column_longer_than_the_batch_is_a_decoding_error():
    buf = _batch(0, 3, struct.pack("<I", 1))  # three value lengths announced, one present
    with pytest.raises(ValueError, match="overruns"):
        log_batch.decode(buf, "t", 0, "f.log", 0)


def test_a_checksummed_batch_of_no_record_is_a_decoding_error():
    # Found by the batch fuzzer: a reader's take() then pointed past the batch (an IndexError).
    buf = _batch(0, 0, b"")
    with pytest.raises(ValueError, match="no record"):
        log_batch.decode(buf, "t", 0, "f.log", 0)


@pytest.mark.parametrize("raw", [
    b'{"version":1,"node_id":"n","epoch":1e999}',     # an infinite number: int() raised OverflowError
    b'{"version":1,"node_id":"n","epoch":NaN}',
    b'{"version":1,"node_id":"n","epoch":-Infinity}',
    b"[" * 100_000,                                    # nesting past the parser: RecursionError
])
def test_a_znode_of_numbers_json_cannot_hold_or_of_deep_nesting_is_corrupt(raw):
    from coordinator import protocol
    from coordinator.errors import CorruptZnode
    for decode in (lambda r: protocol.ShardAssignment.decode(r, "/s"),
                   lambda r: protocol.decode_spark_progress(r.replace(b"epoch", b"records"), "/p"),
                   lambda r: protocol.GroupState.decode(r.replace(b"epoch", b"generation"), "/g")):
        with pytest.raises(CorruptZnode):
            decode(raw)


def test_a_registration_whose_timestamp_is_no_number_is_corrupt():
    # Found by the znode fuzzer (bin/fuzz): int("i") raised ValueError out of the decoder.
    from coordinator import protocol
    from coordinator.errors import CorruptZnode
    raw = (b'{"version":1,"subscription":{"t":2},"pattern":"static","strategies":["range"],'
           b'"host":"","client_id":"","timestamp":"i"}')
    with pytest.raises(CorruptZnode, match="timestamp"):
        protocol.Registration.decode(raw, "/ids/m")
    assert protocol.Registration.decode(raw.replace(b'"i"', b'"17"'), "/ids/m").timestamp == 17
