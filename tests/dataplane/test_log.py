"""The embedded log: round trips, crash recovery, concurrent processes, segments, retention."""
from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time

import pytest

from consumer.log import Log
from coordinator.errors import (IllegalStateError, InvalidConfig, InvalidName, InvalidPartitions,
                                LogCorrupted, OffsetOutOfRange)
from tests.support.helpers import start_together

T = "t"


def value_of(offset: int) -> bytes:
    """A value that encodes its offset, with a length that varies."""
    return b"%010d" % offset + b"x" * (offset % 97)


def records(start: int, n: int, ts: int = 1_000):
    return [(None, value_of(o), ts, ()) for o in range(start, start + n)]


def read_all(log: Log, topic: str = T, partition: int = 0, start: int = None):
    offset = log.earliest_offset(topic, partition) if start is None else start
    out = []
    while True:
        batch = log.fetch(topic, partition, offset, max_records=10_000, max_bytes=1 << 30)
        if not batch:
            return out
        out += batch
        offset = batch[-1].offset + 1


def segment_files(data_dir: str, topic: str = T, partition: int = 0):
    path = os.path.join(data_dir, f"{topic}-{partition}")
    return sorted(n for n in os.listdir(path) if n.endswith(".log"))


def segment_path(data_dir: str, name: str, topic: str = T, partition: int = 0) -> str:
    return os.path.join(data_dir, f"{topic}-{partition}", name)


# ---------------------------------------------------------------- round trips

def test_round_trip_keeps_every_field(data_dir):
    batch = [(b"k0", b"v0", 1_000, ()),
             (None, b"", 1_001, (("h", b"x"), ("empty", b""), ("none", None))),
             (b"", b"v2" * 300, 999, ()),
             (b"\x00\xff", b"\n", 2 ** 40, (("\u00e9", b"\x01"),))]
    with Log(data_dir) as log:
        assert log.append(T, 0, batch) == 0
        assert log.append(T, 0, [(None, b"last", 5, ())]) == 4
        got = log.fetch(T, 0, 0)
    assert [(r.key, r.value, r.timestamp, r.headers) for r in got] == \
        [(k, v, ts, tuple(h)) for k, v, ts, h in batch] + [(None, b"last", 5, ())]
    assert [r.offset for r in got] == [0, 1, 2, 3, 4]
    assert {(r.topic, r.partition) for r in got} == {(T, 0)}


@pytest.mark.parametrize("timestamps", ["constant", "runs", "distinct"])
def test_large_batches_round_trip(data_dir, timestamps):
    n = 5_000
    ts = {"constant": lambda i: 7, "runs": lambda i: 1_000 + i // 700, "distinct": lambda i: 10 ** 12 - i}[timestamps]
    fixed = [(None, b"%099d" % i, ts(i), ()) for i in range(n)]           # fixed-size values
    keyed = [(b"key-%d" % i, value_of(i), ts(i), ()) for i in range(n)]  # variable sizes, keys
    with Log(data_dir) as log:
        log.append(T, 0, fixed)
        log.append(T, 1, keyed)
        for partition, batch in ((0, fixed), (1, keyed)):
            got = read_all(log, partition=partition)
            assert [(r.key, r.value, r.timestamp) for r in got] == [(k, v, t) for k, v, t, _ in batch]
            middle = log.fetch(T, partition, 1234, max_records=3)
            assert [r.offset for r in middle] == [1234, 1235, 1236]
            assert middle[0].timestamp == ts(1234)


def test_fetch_limits_and_offset_range(data_dir):
    with Log(data_dir) as log:
        for start in range(0, 100, 10):
            log.append(T, 0, [(None, b"x" * 100, 1, ())] * 10)
        assert [r.offset for r in log.fetch(T, 0, 5, max_records=12)] == list(range(5, 17))
        assert len(log.fetch(T, 0, 0, max_bytes=350)) == 3    # stops before exceeding max_bytes
        assert len(log.fetch(T, 0, 0, max_bytes=1)) == 1      # but returns at least one record
        assert len(log.fetch(T, 0, 95)) == 5
        assert log.fetch(T, 0, 100) == []                      # offset == latest
        for bad in (101, -1):
            with pytest.raises(OffsetOutOfRange) as e:
                log.fetch(T, 0, bad)
            assert (e.value.earliest, e.value.latest, e.value.offset) == (0, 100, bad)


def test_empty_partition_reads_create_nothing(data_dir):
    with Log(data_dir) as log:
        assert (log.earliest_offset(T, 3), log.latest_offset(T, 3), log.size_bytes(T, 3)) == (0, 0, 0)
        assert log.fetch(T, 3, 0) == []
        assert log.offset_for_time(T, 3, 0) is None
        with pytest.raises(OffsetOutOfRange):
            log.fetch(T, 3, 1)
    assert os.listdir(data_dir) == []


def test_reopen_keeps_records_and_continues_offsets(data_dir):
    with Log(data_dir) as log:
        log.append(T, 0, records(0, 10))
    with Log(data_dir) as log:
        assert log.latest_offset(T, 0) == 10
        assert log.append(T, 0, records(10, 5)) == 10
        assert [r.value for r in read_all(log)] == [value_of(o) for o in range(15)]


def test_other_log_instances_see_appends(data_dir):
    with Log(data_dir) as writer, Log(data_dir) as reader:
        assert reader.latest_offset(T, 0) == 0
        writer.append(T, 0, records(0, 3))
        assert reader.latest_offset(T, 0) == 3
        assert len(reader.fetch(T, 0, 0)) == 3
        writer.append(T, 0, records(3, 4))
        assert [r.offset for r in reader.fetch(T, 0, 3)] == [3, 4, 5, 6]


@pytest.mark.parametrize("fsync", ["batch", "interval", "never"])
def test_fsync_policies(data_dir, fsync):
    with Log(data_dir, fsync=fsync, fsync_interval_ms=0) as log:
        for start in range(0, 30, 10):
            log.append(T, 0, records(start, 10))
        log.flush()
        assert log.latest_offset(T, 0) == 30


def test_invalid_arguments(data_dir):
    with pytest.raises(InvalidConfig, match="fsync"):
        Log(data_dir, fsync="sometimes")
    with pytest.raises(InvalidConfig, match="segment_bytes"):
        Log(data_dir, segment_bytes=-1)
    log = Log(data_dir)
    with pytest.raises(InvalidName):
        log.append("../escape", 0, records(0, 1))
    with pytest.raises(InvalidPartitions):
        log.fetch(T, -1, 0)
    with pytest.raises(ValueError):
        log.append(T, 0, [])
    with pytest.raises(TypeError, match="records must be"):
        log.append(T, 0, [(None, "text", 1, ())])
    with pytest.raises(TypeError, match="records must be"):
        log.append(T, 0, [(None, b"v", 1)])
    log.close()
    with pytest.raises(IllegalStateError):
        log.fetch(T, 0, 0)


# ---------------------------------------------------------------- crash recovery

def next_batch_bytes(data_dir: str, tmp_path, batch) -> bytes:
    """The bytes a Log would append to ``data_dir``'s single segment for ``batch``."""
    scratch = str(tmp_path / "scratch")
    shutil.copytree(data_dir, scratch)
    name = segment_files(scratch)[0]
    size = os.path.getsize(segment_path(scratch, name))
    with Log(scratch) as log:
        log.append(T, 0, batch)
    with open(segment_path(scratch, name), "rb") as f:
        f.seek(size)
        return f.read()


def test_a_reader_stops_at_a_batch_being_written_and_reads_it_once_complete(data_dir, tmp_path):
    with Log(data_dir) as log:
        log.append(T, 0, records(0, 30))
    batch = next_batch_bytes(data_dir, tmp_path, records(30, 20))
    path = segment_path(data_dir, segment_files(data_dir)[0])
    size = os.path.getsize(path)
    with Log(data_dir) as reader:
        for cut in (10, 40, len(batch) // 2, len(batch) - 1):  # header, then body, partly written
            with open(path, "ab") as f:
                f.write(batch[:cut])
            assert reader.latest_offset(T, 0) == 30
            assert reader.fetch(T, 0, 30) == []
            assert [r.offset for r in read_all(reader)] == list(range(30))
            os.truncate(path, size)
        with open(path, "ab") as f:
            f.write(batch)
        assert [r.value for r in reader.fetch(T, 0, 30)] == [value_of(o) for o in range(30, 50)]


@pytest.mark.parametrize("tail", ["partial batch", "partial batch + garbage", "garbage", "few bytes"])
def test_torn_tail_is_cut_once_and_appends_continue(data_dir, tmp_path, caplog, tail):
    with Log(data_dir) as log:
        log.append(T, 0, records(0, 30))
        log.append(T, 0, records(30, 30))
    batch = next_batch_bytes(data_dir, tmp_path, records(60, 50))
    junk = {"partial batch": batch[:len(batch) // 2],
            "partial batch + garbage": batch[:len(batch) // 2] + random.randbytes(5000),
            "garbage": random.randbytes(3000),
            "few bytes": b"\x01\x02\x03"}[tail]
    path = segment_path(data_dir, segment_files(data_dir)[0])
    good_size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(junk)

    # A reader sees every good record, stops at the tail and leaves the file alone.
    with Log(data_dir) as reader:
        assert [r.value for r in read_all(reader)] == [value_of(o) for o in range(60)]
        assert reader.latest_offset(T, 0) == 60
    assert os.path.getsize(path) == good_size + len(junk)

    # The first writer cuts the tail (one warning) and appends right after the last good batch.
    caplog.set_level(logging.WARNING, logger="zkgroups.log")
    with Log(data_dir) as writer:
        assert writer.append(T, 0, records(60, 10)) == 60
        assert writer.append(T, 0, records(70, 10)) == 70
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "torn or corrupt" in warnings[0].getMessage()
    with Log(data_dir) as log:
        assert [r.value for r in read_all(log)] == [value_of(o) for o in range(80)]


def test_corrupt_last_batch_is_cut_by_the_writer(data_dir, caplog):
    with Log(data_dir) as log:
        log.append(T, 0, records(0, 10))
        log.append(T, 0, records(10, 10))
    path = segment_path(data_dir, segment_files(data_dir)[0])
    with open(path, "r+b") as f:  # flip a byte in the body of the last batch
        f.seek(-5, os.SEEK_END)
        byte = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with Log(data_dir) as reader:
        assert [r.offset for r in read_all(reader)] == list(range(10))
    caplog.set_level(logging.WARNING, logger="zkgroups.log")
    with Log(data_dir) as writer:
        assert writer.append(T, 0, records(10, 1)) == 10
    assert sum("torn or corrupt" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("damage", ["body byte", "header"])
def test_damage_in_an_earlier_segment_is_an_error_not_a_repair(data_dir, damage):
    with Log(data_dir, segment_bytes=2_000) as log:
        for start in range(0, 200, 20):
            log.append(T, 0, records(start, 20))
    names = segment_files(data_dir)
    assert len(names) > 2
    first = segment_path(data_dir, names[0])
    with open(first, "r+b") as f:
        f.seek(100 if damage == "body byte" else 0)
        f.write(b"\xff\xff\xff\xff")
    with Log(data_dir, segment_bytes=2_000) as log:
        with pytest.raises(LogCorrupted, match=names[0]):
            log.fetch(T, 0, 0)
        second = int(names[1][:-4])
        assert log.fetch(T, 0, second)[0].offset == second  # later segments still readable
        assert log.append(T, 0, records(200, 1)) == 200        # and appends continue
    assert os.path.getsize(first) > 0


# ---------------------------------------------------------------- other processes

READER = """
import json, sys, time
from consumer.log import Log
data_dir, total = sys.argv[1], int(sys.argv[2])
log = Log(data_dir)
log.latest_offset("t", 0)
print("ready", flush=True)
offset, polls, midway, deadline = 0, 0, 0, time.monotonic() + 60
while offset < total and time.monotonic() < deadline:
    batch = log.fetch("t", 0, offset, max_records=7000)
    polls += 1
    midway += 0 < offset < total
    for r in batch:
        if r.offset != offset or r.value != b"%010d" % offset + b"x" * (offset % 97):
            print(json.dumps({"error": f"bad record at {offset}: {r.offset} {r.value[:20]!r}"}))
            sys.exit(1)
        offset += 1
    if not batch:
        time.sleep(0.001)  # poll interval while caught up
print(json.dumps({"read": offset, "midway": midway}))
"""


def test_reader_process_never_sees_a_partial_batch(data_dir, subprocess_env):
    total = 150_000
    reader = subprocess.Popen([sys.executable, "-c", READER, data_dir, str(total)], env=subprocess_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert reader.stdout.readline().strip() == "ready", reader.stderr.read()
    rng = random.Random(7)
    with Log(data_dir, fsync="never") as log:
        offset = 0
        while offset < total:
            n = min(total - offset, rng.choice([1, 10, 500, 4000, 9000]))  # up to ~500 KB per batch
            log.append(T, 0, records(offset, n))
            offset += n
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, out + err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["read"] == total
    assert result["midway"] > 10  # it really read while the appends went on


WRITER = """
import sys
from consumer.log import Log
data_dir, name, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Log(data_dir, fsync="never", segment_bytes=200_000) as log:
    log.latest_offset("t", 0)
    print("ready", flush=True)
    sys.stdin.readline()  # both start together
    for b in range(batches):
        log.append("t", 0, [(name.encode(), b"%d:%d" % (b, i), 1, ()) for i in range(50)])
"""


def test_two_writer_processes_share_a_partition(data_dir, subprocess_env):
    batches = 300
    start_together(WRITER, [(data_dir, name, str(batches)) for name in ("a", "b")], subprocess_env)
    with Log(data_dir) as log:
        got = read_all(log)
    assert [r.offset for r in got] == list(range(2 * batches * 50))  # dense, nothing lost
    assert len(segment_files(data_dir)) > 1
    keys = [r.key for r in got[::50]]
    assert sum(a != b for a, b in zip(keys, keys[1:])) > 2  # the two really wrote at the same time
    for name in (b"a", b"b"):
        mine = [tuple(map(int, r.value.split(b":"))) for r in got if r.key == name]
        assert mine == [(b, i) for b in range(batches) for i in range(50)]  # each writer's order kept


# ---------------------------------------------------------------- segments and retention

def test_segments_roll_and_are_named_by_base_offset(data_dir):
    with Log(data_dir, segment_bytes=3_000) as log:
        for start in range(0, 300, 15):
            log.append(T, 0, records(start, 15))
        names = segment_files(data_dir)
        assert len(names) > 3
        assert names[0] == "00000000000000000000.log"
        for name in names:
            base = int(name[:-4])
            assert len(name) == 24 and log.fetch(T, 0, base)[0].offset == base
        assert [r.value for r in read_all(log)] == [value_of(o) for o in range(300)]
    with Log(data_dir, segment_bytes=3_000) as log:  # reopened: same content, across segments
        assert [r.offset for r in read_all(log)] == list(range(300))


def test_a_batch_larger_than_a_segment_gets_its_own(data_dir):
    with Log(data_dir, segment_bytes=1_000) as log:
        log.append(T, 0, records(0, 5))
        log.append(T, 0, records(5, 100))
        log.append(T, 0, records(105, 5))
        assert segment_files(data_dir) == [f"{b:020d}.log" for b in (0, 5, 105)]
        assert len(read_all(log)) == 110


def test_retention_by_size(data_dir):
    with Log(data_dir, segment_bytes=2_000, retention_bytes=5_000) as log:
        for start in range(0, 500, 10):
            log.append(T, 0, records(start, 10))
        earliest = log.earliest_offset(T, 0)
        assert earliest > 0 and int(segment_files(data_dir)[0][:-4]) == earliest
        # Checked at each roll (as in Kafka): at most the limit, one old segment and the active one.
        assert log.size_bytes(T, 0) <= 5_000 + 2 * 2_000
        with pytest.raises(OffsetOutOfRange) as e:
            log.fetch(T, 0, 0)
        assert (e.value.earliest, e.value.latest) == (earliest, 500)
        assert [r.offset for r in read_all(log)] == list(range(earliest, 500))


def test_retention_by_age(data_dir):
    now = int(time.time() * 1000)
    old, new = now - 2 * 3600_000, now
    with Log(data_dir, segment_bytes=2_000, retention_ms=3600_000) as log:
        for start in range(0, 100, 10):
            log.append(T, 0, records(start, 10, ts=old))
        for start in range(100, 200, 10):
            log.append(T, 0, records(start, 10, ts=new))
        log.enforce_retention(T, 0)
        earliest = log.earliest_offset(T, 0)
        assert 0 < earliest <= 100
        assert all(r.timestamp == new for r in read_all(log) if r.offset >= 100)
        assert all(r.offset >= earliest for r in read_all(log))


def test_retention_by_age_can_empty_the_partition(data_dir):
    old = int(time.time() * 1000) - 3600_000
    with Log(data_dir, retention_ms=1_000) as log:
        log.append(T, 0, records(0, 10, ts=old))
        log.enforce_retention(T, 0)
        assert (log.earliest_offset(T, 0), log.latest_offset(T, 0)) == (10, 10)
        assert log.fetch(T, 0, 10) == []
        assert log.append(T, 0, records(10, 1)) == 10


def test_a_reader_notices_segments_deleted_by_another_process(data_dir):
    with Log(data_dir, segment_bytes=2_000) as writer, Log(data_dir) as reader:
        for start in range(0, 100, 10):
            writer.append(T, 0, records(start, 10))
        assert reader.fetch(T, 0, 0)[0].offset == 0  # the reader has the first segment open
        with Log(data_dir, segment_bytes=2_000, retention_bytes=0) as cleaner:
            cleaner.enforce_retention(T, 0)
        with pytest.raises(OffsetOutOfRange):
            reader.fetch(T, 0, 0)
        assert reader.earliest_offset(T, 0) > 0


# ---------------------------------------------------------------- time index

def test_offset_for_time(data_dir):
    with Log(data_dir, segment_bytes=2_000) as log:
        assert log.offset_for_time(T, 0, 0) is None
        for start in range(0, 100, 10):  # timestamps 1000, 1010, ... one per record
            log.append(T, 0, [(None, b"v", 1_000 + o * 10, ()) for o in range(start, start + 10)])
        log.append(T, 0, [(None, b"late", 500, ())])  # out of order: offset 100 has an older ts
        assert log.offset_for_time(T, 0, 0) == 0
        assert log.offset_for_time(T, 0, 1_000) == 0
        assert log.offset_for_time(T, 0, 1_001) == 1
        assert log.offset_for_time(T, 0, 1_555) == 56
        assert log.offset_for_time(T, 0, 1_990) == 99
        assert log.offset_for_time(T, 0, 1_991) is None
