"""The embedded log with damaged files: every intact record is delivered, each damage is named
once (file, byte, offsets), and a writer never cuts intact data or reuses a readable offset.

One table of damage, applied to a fresh topic of 12 batches of 100 records in four segments
of three batches (offsets 0..299, 300..599, 600..899 and the active 900..1199). Pure file
system, no ZooKeeper, except the last tests: a consumer whose fetcher has read ahead up to
the damage hands out every intact record before it raises the error.
"""
from __future__ import annotations

import logging
import os
import shutil
import struct
import zlib
from dataclasses import dataclass
from typing import Callable, Optional

import pytest

from consumer.fetcher import Fetcher
from consumer.log import Log
from consumer.records import TopicPartition
from coordinator.errors import LogCorrupted
from tests.support.helpers import fetcher_parked, wait_for

T = "t"
BATCH = 100                      # records per batch
BATCHES = 12
TOTAL = BATCH * BATCHES
PER_SEGMENT = 3                  # batches per segment
BATCH_BYTES = 40 + 4 + BATCH * 50  # header, one value length (all values 50 bytes), values
SEGMENT_BYTES = 16_000           # room for three batches, not four


def value_of(offset: int) -> bytes:
    return b"%010d" % offset + b"v" * 40


def records(start: int, n: int = BATCH):
    return [(None, value_of(o), 1_000, ()) for o in range(start, start + n)]


def segment(data_dir: str, base: int) -> str:
    return os.path.join(data_dir, f"{T}-0", f"{base:020d}.log")


def segment_of(offset: int) -> int:
    """Base offset of the segment that holds ``offset`` in the fresh topic."""
    return offset // (BATCH * PER_SEGMENT) * BATCH * PER_SEGMENT


def position(offset: int) -> int:
    """Byte position, in its segment, of the batch that holds ``offset``."""
    return (offset // BATCH % PER_SEGMENT) * BATCH_BYTES


def write_topic(data_dir: str) -> None:
    with Log(data_dir, segment_bytes=SEGMENT_BYTES) as log:
        for start in range(0, TOTAL, BATCH):
            log.append(T, 0, records(start))
    bases = range(0, TOTAL, BATCH * PER_SEGMENT)
    assert sorted(os.listdir(os.path.join(data_dir, f"{T}-0"))) == \
        sorted([os.path.basename(segment(data_dir, b)) for b in bases] + ["writer.lock"])
    assert all(os.path.getsize(segment(data_dir, b)) == PER_SEGMENT * BATCH_BYTES for b in bases)


def walk(log: Log):
    """Read the partition from offset 0 the way a consumer does, seeking past each damaged
    range to the error's ``resume_offset``. Returns (offsets delivered, errors raised); stops
    at an error that names no offset (an OSError)."""
    offset, delivered, errors = 0, [], []
    for _ in range(1_000):
        try:
            got = log.fetch(T, 0, offset, max_records=250)  # fetches that straddle batches
        except LogCorrupted as e:
            assert e.offset == offset and e.resume_offset > offset, e
            errors.append(e)
            offset = e.resume_offset
            continue
        except OSError as e:
            errors.append(e)
            return delivered, errors
        if not got:
            return delivered, errors
        assert [r.offset for r in got] == list(range(offset, offset + len(got)))
        assert [r.value for r in got] == [value_of(r.offset) for r in got]
        delivered += [r.offset for r in got]
        offset = got[-1].offset + 1
    raise AssertionError("the walk did not reach the end of the partition")


# ---------------------------------------------------------------- ways to damage a topic

def flip(path: str, pos: int, n: int = 4) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        data = f.read(n)
        f.seek(pos)
        f.write(bytes(b ^ 0xFF for b in data))


def set_length(path: str, pos: int, length: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(struct.pack("<I", length))


def insert(path: str, pos: int, data: bytes) -> None:
    with open(path, "rb") as f:
        content = f.read()
    with open(path, "wb") as f:
        f.write(content[:pos] + data + content[pos:])


def roll_then_lose_the_active_segment(data_dir: str) -> None:
    """An empty segment at 1200 (as a roll leaves it), and the one before it deleted."""
    with open(segment(data_dir, TOTAL), "wb"):
        pass
    os.unlink(segment(data_dir, 900))


def append_bytes(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def torn_batch(data_dir: str, scratch: str) -> bytes:
    """The first half of the batch a writer would append next (as a crash mid-write leaves it)."""
    shutil.copytree(data_dir, scratch)
    path = segment(scratch, 900)
    size = os.path.getsize(path)
    with Log(scratch, segment_bytes=1 << 20) as log:
        log.append(T, 0, records(TOTAL, 10))
    with open(path, "rb") as f:
        f.seek(size)
        batch = f.read()
    return batch[:len(batch) // 2]


@dataclass
class Damage:
    apply: Callable[[str, str], None]   # (data_dir, scratch dir)
    lost: Optional[range] = None        # offsets that cannot be read any more
    file: Optional[int] = None          # base of the segment the error names
    at: Optional[int] = None            # the byte it names
    writer: Optional[str] = None        # what the first writer's one warning says, if any
    running: bool = True                # a reader that had the files open sees it the same way


HEADER_BYTES = 40
GARBAGE = b"\xee" * 300
CASES = {
    "body of a batch in a sealed segment": Damage(
        lambda d, s: flip(segment(d, 300), position(400) + HEADER_BYTES + 100),
        range(400, 500), 300, position(400)),
    "length field made too long, sealed segment": Damage(
        lambda d, s: flip(segment(d, 300), position(400) + 3, 1),
        range(400, 500), 300, position(400)),
    "length field made too short, sealed segment": Damage(
        lambda d, s: set_length(segment(d, 300), position(400), 96),
        range(400, 500), 300, position(400)),
    "last batch of a sealed segment": Damage(
        lambda d, s: flip(segment(d, 300), position(500) + HEADER_BYTES + 7),
        range(500, 600), 300, position(500)),
    "truncated middle segment": Damage(
        lambda d, s: os.truncate(segment(d, 300), position(400) + 2_000),
        range(400, 600), 300, position(400)),
    "sealed segment truncated after its first batch": Damage(
        lambda d, s: os.truncate(segment(d, 600), BATCH_BYTES),
        range(700, 900), 600, BATCH_BYTES),
    "zero-length middle segment": Damage(
        lambda d, s: os.truncate(segment(d, 300), 0),
        range(300, 600), 300, 0),
    # A process that has a deleted file open reads it still, as on any Unix: fresh readers only.
    "deleted middle segment": Damage(
        lambda d, s: os.unlink(segment(d, 300)),
        range(300, 600), 0, PER_SEGMENT * BATCH_BYTES, running=False),
    "empty segment past a gap": Damage(
        lambda d, s: roll_then_lose_the_active_segment(d),
        range(900, 1200), 600, PER_SEGMENT * BATCH_BYTES, running=False),
    # Inserting bytes rewrites the file: a reader that indexed it before reads stale positions.
    "garbage between two batches of a sealed segment": Damage(
        lambda d, s: insert(segment(d, 300), position(400), GARBAGE), running=False),
    "body of a batch mid-active segment": Damage(
        lambda d, s: flip(segment(d, 900), position(1000) + HEADER_BYTES + 100),
        range(1000, 1100), 900, position(1000), writer="damaged"),
    "length field made too long, mid-active segment": Damage(
        lambda d, s: flip(segment(d, 900), position(1000) + 3, 1),
        range(1000, 1100), 900, position(1000), writer="damaged"),
    "garbage between two batches of the active segment": Damage(
        lambda d, s: insert(segment(d, 900), position(1100), GARBAGE), writer="damaged", running=False),
    "torn tail": Damage(
        lambda d, s: append_bytes(segment(d, 900), torn_batch(d, s)), writer="torn"),
}


def check_walk(delivered, errors, damage: Damage, data_dir: str) -> None:
    lost = damage.lost or range(0)
    assert delivered == [o for o in range(TOTAL) if o not in lost]
    if damage.lost is None:
        assert errors == []
        return
    assert len(errors) == 1, [str(e) for e in errors]
    e = errors[0]
    assert (e.topic, e.partition, e.offset, e.resume_offset) == (T, 0, lost.start, lost.stop)
    assert (e.path, e.position) == (segment(data_dir, damage.file), damage.at)
    message = str(e)
    assert "\n" not in message
    for part in (f"{T}-0", f"offset {lost.start}", f"byte {damage.at}", e.path, f"offset {lost.stop}"):
        assert part in message


@pytest.mark.parametrize("name", list(CASES))
def test_damage_loses_only_the_damaged_records_and_names_it_once(data_dir, tmp_path, caplog, name):
    damage = CASES[name]
    write_topic(data_dir)
    damage.apply(data_dir, str(tmp_path / "scratch"))

    with Log(data_dir, segment_bytes=SEGMENT_BYTES) as reader:
        delivered, errors = walk(reader)
        check_walk(delivered, errors, damage, data_dir)
        assert reader.latest_offset(T, 0) == TOTAL

    # The first writer: one warning at most, and the next offset after everything readable.
    caplog.set_level(logging.WARNING, logger="zkgroups.log")
    with Log(data_dir, segment_bytes=SEGMENT_BYTES) as writer:
        assert writer.append(T, 0, records(TOTAL)) == TOTAL
        assert writer.append(T, 0, records(TOTAL + BATCH)) == TOTAL + BATCH
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if damage.writer is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and damage.writer in warnings[0], warnings
    if damage.writer == "damaged":  # names the file, the byte and the offsets; the segment is kept
        assert segment(data_dir, 900) in warnings[0] and f"offset {TOTAL}" in warnings[0]
        if damage.lost is not None:
            assert f"byte {damage.at}" in warnings[0]
            assert f"{damage.lost.start}..{damage.lost.stop - 1}" in warnings[0]
        assert os.path.getsize(segment(data_dir, 900)) >= PER_SEGMENT * BATCH_BYTES
        assert os.path.exists(segment(data_dir, TOTAL))  # rolled

    # Nothing that was readable changed; the new records come after it.
    with Log(data_dir, segment_bytes=SEGMENT_BYTES) as reader:
        more, errors_after = walk(reader)
    assert more == delivered + list(range(TOTAL, TOTAL + 2 * BATCH))
    assert [(e.offset, e.path, e.position) for e in errors_after] == \
        [(e.offset, e.path, e.position) for e in errors]


@pytest.mark.parametrize("name", [name for name, damage in CASES.items() if damage.running])
def test_a_running_reader_sees_damage_the_same_way(data_dir, tmp_path, name):
    damage = CASES[name]
    write_topic(data_dir)
    with Log(data_dir, segment_bytes=SEGMENT_BYTES) as reader:
        assert walk(reader) == (list(range(TOTAL)), [])  # indexed, files open
        damage.apply(data_dir, str(tmp_path / "scratch"))
        delivered, errors = walk(reader)
        check_walk(delivered, errors, damage, data_dir)


def test_a_fetch_returns_the_records_before_the_damage(data_dir):
    write_topic(data_dir)
    flip(segment(data_dir, 300), position(400) + HEADER_BYTES + 100)
    with Log(data_dir) as log:
        got = log.fetch(T, 0, 250, max_records=1_000)
        assert [r.offset for r in got] == list(range(250, 400))  # across a segment boundary
        with pytest.raises(LogCorrupted) as e:
            log.fetch(T, 0, 450)
        assert (e.value.offset, e.value.resume_offset) == (450, 500)  # the offset asked for
        assert log.fetch(T, 0, 500, max_records=1)[0].offset == 500


def test_an_unreadable_partition_directory(data_dir):
    write_topic(data_dir)
    part = os.path.join(data_dir, f"{T}-0")
    with Log(data_dir) as running:
        assert walk(running) == (list(range(TOTAL)), [])
        os.chmod(part, 0)
        try:
            if os.access(part, os.R_OK):
                pytest.skip("chmod does not take read permission away here (running as root)")
            # A reader with the files open reads what it indexed, then cannot look for more.
            delivered, errors = walk(running)
            assert delivered == list(range(TOTAL))
            assert len(errors) == 1 and isinstance(errors[0], PermissionError) and errors[0].filename == part
            with Log(data_dir) as fresh:
                delivered, errors = walk(fresh)
                assert delivered == [] and len(errors) == 1 and errors[0].filename == part
                with pytest.raises(PermissionError):
                    fresh.append(T, 0, records(TOTAL))
        finally:
            os.chmod(part, 0o755)
    with Log(data_dir, segment_bytes=SEGMENT_BYTES) as log:
        assert log.append(T, 0, records(TOTAL)) == TOTAL
        assert walk(log) == (list(range(TOTAL + BATCH)), [])


# ---------------------------------------------------------------- through the fetcher

def test_the_fetcher_hands_out_every_intact_record_and_reports_the_damage_once(data_dir):
    write_topic(data_dir)
    flip(segment(data_dir, 300), position(400) + HEADER_BYTES + 100)
    p0, p1 = TopicPartition(T, 0), TopicPartition(T, 1)
    reported = []
    with Log(data_dir) as log:
        log.append(T, 1, records(0, 50))
        fetcher = Fetcher(log, fetch_max_wait_ms=10, on_error=lambda tp, exc: reported.append((tp, exc)))
        try:
            fetcher.assign({p0: 0, p1: 0})
            fetcher.start()
            got = {p0: [], p1: []}

            def poll():
                for tp, recs in fetcher.poll(timeout=0.05).items():
                    got[tp] += [r.offset for r in recs]

            wait_for(lambda: poll() or (reported and len(got[p0]) == 400 and len(got[p1]) == 50),
                     timeout=10, message="records up to the damage and one error")
            assert got == {p0: list(range(400)), p1: list(range(50))}
            assert [(tp, type(exc), exc.offset) for tp, exc in reported] == [(p0, LogCorrupted, 400)]
            log.append(T, 1, records(50, 10))  # the other partition keeps flowing
            wait_for(lambda: poll() or len(got[p1]) == 60, timeout=10, message="more of p1")
            assert len(reported) == 1 and fetcher.position(p0) == 400
            fetcher.seek(p0, reported[0][1].resume_offset)
            wait_for(lambda: poll() or len(got[p0]) == TOTAL - 100, timeout=10, message="the rest of p0")
            assert got[p0] == list(range(400)) + list(range(500, TOTAL))
            assert len(reported) == 1
        finally:
            fetcher.close()


def test_a_checksummed_batch_whose_record_headers_cannot_be_decoded(data_dir):
    """Written that way (not damaged later): the batch is unreadable, the records before it are not."""
    with Log(data_dir) as log:
        log.append(T, 0, records(0))
        log.append(T, 0, [(None, b"v", 1_000, (("h", b"x"),))])  # header blob: 01 00 'h' 01 00 00 00 'x'
    path = segment(data_dir, 0)
    with open(path, "r+b") as f:
        f.seek(BATCH_BYTES)
        batch = bytearray(f.read())
        batch[-8:-6] = b"\xff\xff"  # the name length overruns the blob
        body_crc = zlib.crc32(bytes(batch[HEADER_BYTES:]))
        batch[4:8] = struct.pack("<I", zlib.crc32(bytes(batch[8:HEADER_BYTES]), body_crc))
        f.seek(BATCH_BYTES)
        f.write(batch)
    with Log(data_dir) as log:
        assert [r.offset for r in log.fetch(T, 0, 0)] == list(range(BATCH))
        with pytest.raises(LogCorrupted) as e:
            log.fetch(T, 0, BATCH)
        assert (e.value.offset, e.value.resume_offset) == (BATCH, BATCH + 1)
        assert (e.value.path, e.value.position) == (path, BATCH_BYTES)
        assert "record headers" in str(e.value)


# ---------------------------------------------------------------- through a consumer (ZooKeeper)

#: Damage where the records before it fill several fetches, so a consumer's prefetch thread has
#: read them all (and failed at the damage) while the application is still polling.
READ_AHEAD_CASES = [("sealed segment truncated after its first batch", "records"),
                    ("zero-length middle segment", "records"),
                    ("empty segment past a gap", "records"),
                    ("sealed segment truncated after its first batch", "columns")]


@pytest.mark.parametrize("name,form", READ_AHEAD_CASES, ids=[f"{n}-{f}" for n, f in READ_AHEAD_CASES])
def test_a_consumer_hands_out_every_intact_record_before_the_error(cluster, zk, zk_connect, data_dir, tmp_path,
                                                                   name, form):
    """The fetcher holds every intact record before the damage, and its fetch at the damage has
    failed, before the application polls them (one batch a fetch; no timing): poll() returns
    them all, then raises the error once."""
    from consumer import Consumer
    from coordinator.topics import TopicRegistry
    damage = CASES[name]
    write_topic(data_dir)
    damage.apply(data_dir, str(tmp_path / "scratch"))
    intact = damage.lost.start
    cluster.node("n")
    TopicRegistry(zk).create(T, 1)
    tp = TopicPartition(T, 0)
    with Consumer("g", [T], zk=zk_connect, data_dir=data_dir, auto_offset_reset="earliest",
                  session_timeout_ms=2000, max_poll_records=TOTAL, max_partition_fetch_bytes=BATCH_BYTES) as c:
        poll = c.poll_columns if form == "columns" else c.poll

        def offsets(batch):
            if form == "columns":
                return [o for columns in batch.get(tp, []) for o in range(columns.base, columns.end)]
            return [r.offset for r in batch.get(tp, [])]

        got = wait_for(lambda: offsets(poll(timeout_ms=100, max_records=1)), 20, message="the first record")
        wait_for(lambda: fetcher_parked(c._fetcher, tp), 10, message="the read-ahead up to the damage")
        assert c._fetcher.buffered(tp) == intact - len(got)
        errors = []
        for _ in range(200):
            try:
                got += offsets(poll(timeout_ms=100, max_records=64))
            except LogCorrupted as e:
                errors.append(e)
                break
        assert got == list(range(intact))
        assert [(e.offset, e.resume_offset) for e in errors] == [(intact, damage.lost.stop)]
        assert offsets(poll(timeout_ms=200)) == []  # once: the partition stays parked until a seek

