"""Segment files (:mod:`consumer.log.segment`): names by base offset; the index of an intact
file; damaged bytes followed by an intact batch indexed as a hole, so the batches after it stay
readable; a torn tail left unindexed. On files the log writes in a temporary directory: no
server."""
import os

import pytest

from consumer.log import Log
from consumer.log.segment import HOLE, Segment, segment_base, segment_name


def test_a_segment_is_named_by_its_base_offset_and_nothing_else_is_one():
    assert segment_name(42) == "00000000000000000042.log" and segment_base(segment_name(42)) == 42
    for other in ("42.log", "00000000000000000042.index", "0000000000000000004x.log"):
        assert segment_base(other) is None


@pytest.fixture
def three_batches(tmp_path):
    """A segment of three batches of ten records (offsets 0-29) and its indexed positions."""
    with Log(str(tmp_path)) as log:
        for i in range(3):
            log.append("t", 0, [(None, b"v" * 20, 1000 * i + o, ()) for o in range(10)])
    path = str(tmp_path / "t-0" / segment_name(0))
    intact = Segment(0, path)
    assert intact.scan(verify=True) == os.path.getsize(path)
    intact.close()
    return path, list(intact.positions)


def test_an_intact_file_is_indexed_batch_by_batch(three_batches):
    path, positions = three_batches
    s = Segment(0, path)
    s.scan(verify=True)
    assert list(s.bases) == [0, 10, 20] and s.next_offset == 30 and s.damaged is None
    assert s.max_timestamp == 2009 and s.entry_span(1) == "offsets 10..19"
    s.close()


def test_damage_followed_by_an_intact_batch_is_a_hole_and_the_batch_after_it_stays_readable(three_batches):
    path, positions = three_batches
    with open(path, "r+b") as f:
        f.seek(positions[1] + 60)
        f.write(b"\xff\xff\xff\xff")
    s = Segment(0, path)
    assert s.scan(verify=True) == os.path.getsize(path) and s.end == os.path.getsize(path)
    assert s.damaged == 1 and s.max_ts[1] == HOLE and list(s.bases) == [0, 10, 20] and s.next_offset == 30
    assert s.valid_after(0)  # entry 0 is no torn tail: something valid follows
    s.close()


def test_a_torn_tail_is_left_unindexed(three_batches):
    path, positions = three_batches
    with open(path, "r+b") as f:
        f.truncate(positions[2] + 30)  # the last batch half written
    s = Segment(0, path)
    size = s.scan(verify=True)
    assert s.end == positions[2] < size and s.next_offset == 20 and s.damaged is None
    assert not s.valid_after(1)
    s.close()
