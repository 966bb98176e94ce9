"""The log's batch format (consumer.log.batch): records survive encoding and decoding in every
column layout, and every malformed batch is rejected the way the readers rely on. Pure: bytes
in, bytes out; no files."""
import struct
import zlib
from itertools import islice

import pytest

from consumer.log import batch as fmt
from consumer.log.batch import (FLAG_FIXED_VALUES, FLAG_HEADERS, FLAG_KEYS, FLAG_TIMESTAMP_RUNS,
                                FLAG_TIMESTAMPS, HEADER, HEADER_SIZE, MAGIC, Encoded, checksum_ok,
                                decode, plausible)
from coordinator.errors import LogCorrupted

TOPIC, PARTITION, PATH, POSITION = "t", 3, "/data/t-3/00000000000000000000.log", 4096


def encode(records, base=0) -> bytes:
    encoded = Encoded(records)
    buf = b"".join([encoded.header(base), *encoded.parts])
    assert len(buf) == encoded.size
    return buf


def decoded(buf):
    return decode(buf, TOPIC, PARTITION, PATH, POSITION)


def seal(flags, base, count, min_ts, max_ts, body) -> bytes:
    """A batch with these header fields and body and a matching CRC, whatever the body holds."""
    rest = HEADER.pack(0, 0, MAGIC, flags, 0, base, count, min_ts, max_ts)[8:]
    return struct.pack("<II", len(rest) + len(body) + 4, zlib.crc32(rest, zlib.crc32(body))) + rest + body


def flags_of(buf) -> int:
    return HEADER.unpack_from(buf)[3]


def read_back(records, base=0):
    batch = decoded(encode(records, base))
    assert batch is not None and batch.base == base and batch.count == len(records)
    return batch.records(0, batch.count)


def expected(records, base=0):
    return [(TOPIC, PARTITION, base + i, ts, key, value, tuple(headers))
            for i, (key, value, ts, headers) in enumerate(records)]


# --------------------------------------------------------------------------- round trips

LAYOUTS = [
    # name, records, flags the encoder picks
    ("one record", [(None, b"v", 7, ())], FLAG_FIXED_VALUES),
    ("fixed-size values, one timestamp", [(None, b"%04d" % i, 5, ()) for i in range(10)], FLAG_FIXED_VALUES),
    ("fixed-size values, more than one struct chunk", [(None, b"%06d" % i, 5, ()) for i in range(64 * 2 + 5)],
     FLAG_FIXED_VALUES),
    ("empty values", [(None, b"", 5, ())] * 70, FLAG_FIXED_VALUES),
    ("values of different sizes", [(None, b"x" * (i % 7), 5, ()) for i in range(20)], 0),
    ("keys, some missing, some empty", [(None if i % 3 == 0 else b"k" * (i % 2), b"v%d" % i, 5, ())
                                        for i in range(20)], FLAG_KEYS),
    ("every record keyed, fixed-size values", [(b"key-%d" % i, b"vv", 5, ()) for i in range(20)],
     FLAG_KEYS | FLAG_FIXED_VALUES),
    ("headers on some records", [(None, b"v", 5, (("trace", b"abc"), ("none", None), ("", b"")) if i % 2 else ())
                                 for i in range(10)], FLAG_HEADERS | FLAG_FIXED_VALUES),
    ("non-ASCII header names", [(None, b"v", 5, (("ключ", b"\x00\xff"),))], FLAG_HEADERS | FLAG_FIXED_VALUES),
    ("timestamps in long runs", [(None, b"v", 1_000 + i // 25, ()) for i in range(100)],
     FLAG_TIMESTAMP_RUNS | FLAG_FIXED_VALUES),
    ("timestamps all different", [(None, b"v", 1_000 + i, ()) for i in range(100)],
     FLAG_TIMESTAMPS | FLAG_FIXED_VALUES),
    ("timestamps out of order, negative", [(None, b"v", (-1) ** i * i, ()) for i in range(10)],
     FLAG_TIMESTAMPS | FLAG_FIXED_VALUES),
    # Runs are kept while there are fewer than count // 8 + 1 of them (3 for 16 records).
    ("two runs in 16 records", [(None, b"v", 1 if i < 8 else 2, ()) for i in range(16)],
     FLAG_TIMESTAMP_RUNS | FLAG_FIXED_VALUES),
    ("three runs in 16 records", [(None, b"v", min(i // 6, 2), ()) for i in range(16)],
     FLAG_TIMESTAMPS | FLAG_FIXED_VALUES),
    ("everything", [(b"k%d" % i if i % 4 else None, b"x" * i, 100 + i // 10, (("h", b"%d" % i),) if i % 5 else ())
                    for i in range(40)], FLAG_KEYS | FLAG_HEADERS | FLAG_TIMESTAMP_RUNS),
]


@pytest.mark.parametrize("records,flags", [case[1:] for case in LAYOUTS], ids=[case[0] for case in LAYOUTS])
def test_records_round_trip(records, flags):
    buf = encode(records, base=1_000_000)
    assert flags_of(buf) == flags
    assert read_back(records, base=1_000_000) == expected(records, base=1_000_000)


@pytest.mark.parametrize("records", [case[1] for case in LAYOUTS], ids=[case[0] for case in LAYOUTS])
def test_any_stretch_of_a_batch_reads_as_that_stretch(records):
    batch = decoded(encode(records, base=50))
    whole = expected(records, base=50)
    n = len(records)
    for i in range(n):
        for j in {i + 1, min(n, i + 3), min(n, i + 26), n}:
            assert batch.records(i, j) == whole[i:j]
            assert list(islice(batch.timestamps(i, j), j - i)) == [r[3] for r in whole[i:j]]


def test_the_header_describes_the_batch():
    records = [(b"k", b"value", 10 + i % 3, ()) for i in range(9)]
    buf = encode(records, base=42)
    length, _, magic, _, reserved, base, count, min_ts, max_ts = HEADER.unpack_from(buf)
    assert (length + 4, magic, reserved, base, count, min_ts, max_ts) == (len(buf), MAGIC, 0, 42, 9, 10, 12)
    assert HEADER_SIZE == 40 and checksum_ok(buf)
    assert plausible(buf[:HEADER_SIZE], 0, len(buf)) == (len(buf), 42, 9, 12)


def test_the_encoding_does_not_depend_on_the_base_offset_except_in_the_header():
    records = [(None, b"v%d" % i, i, ()) for i in range(5)]
    a, b = encode(records, base=0), encode(records, base=7)
    assert a[HEADER_SIZE:] == b[HEADER_SIZE:] and a[:HEADER_SIZE] != b[:HEADER_SIZE]


def test_take_stops_at_the_byte_and_record_limits():
    fixed = decoded(encode([(None, b"x" * 10, 1, ())] * 10))  # 10 bytes a record
    assert fixed.take(0, 100, 35, at_least_one=False) == (3, 30)
    assert fixed.take(0, 4, 1_000, at_least_one=False) == (4, 40)
    assert fixed.take(8, 100, 1_000, at_least_one=False) == (10, 20)
    assert fixed.take(0, 100, 5, at_least_one=False) == (0, 0)
    assert fixed.take(0, 100, 5, at_least_one=True) == (1, 10)
    # Keys and headers count too: record i takes 1 (key) + i + 1 (value) + 8 (header) bytes.
    mixed = decoded(encode([(b"k", b"x" * (i + 1), 1, (("h", b"1"),)) for i in range(10)]))
    assert mixed.take(0, 100, 21, at_least_one=False) == (2, 21)
    assert mixed.take(0, 100, 20, at_least_one=False) == (1, 10)
    assert mixed.take(2, 100, 11, at_least_one=False) == (2, 0)
    assert mixed.take(2, 100, 11, at_least_one=True) == (3, 12)
    assert mixed.take(9, 100, 1_000, at_least_one=False) == (10, 19)


# --------------------------------------------------------------------------- malformed records

@pytest.mark.parametrize("records", [
    [("k", b"v", 1, ())],                         # a str key
    [(None, "v", 1, ())],                         # a str value
    [(None, None, 1, ())],                        # no value
    [(None, b"v", 1, (("h", "text"),))],          # a str header value
    [(None, b"v", 1, ((7, b"x"),))],              # a header name that is not a str
    [(None, b"v", 1)],                            # a record without headers
    [(None, b"v", 1.5, ()), (None, b"v", 2.5, ())],  # timestamps that are not whole numbers
    [(None, b"v", 1, ()), (None, b"v", 2 ** 63, ())],  # a timestamp out of range
], ids=["str key", "str value", "no value", "str header value", "int header name", "three fields",
        "float timestamps", "huge timestamp"])
def test_malformed_records_are_refused_with_one_type_error(records):
    with pytest.raises(TypeError, match="records must be"):
        Encoded(records)


def test_a_batch_too_large_for_the_format_is_refused(monkeypatch):
    monkeypatch.setattr(fmt, "MAX_BATCH_BYTES", HEADER_SIZE + 100)
    Encoded([(None, b"x" * 96, 1, ())])  # 4 + 96 bytes of body fit exactly
    with pytest.raises(ValueError, match="too large"):
        Encoded([(None, b"x" * 97, 1, ())])


# --------------------------------------------------------------------------- malformed batches

GOOD = encode([(b"k%d" % i if i % 2 else None, b"x" * i, 1_000 + i // 2, (("h", b"v"),) if i % 3 else ())
               for i in range(6)], base=10)


def test_every_single_byte_change_fails_the_checksum():
    assert decoded(GOOD) is not None
    for at in range(len(GOOD)):
        damaged = GOOD[:at] + bytes([GOOD[at] ^ 0x5A]) + GOOD[at + 1:]
        assert decoded(damaged) is None, at
        assert not checksum_ok(damaged)


@pytest.mark.parametrize("buf", [b"", GOOD[:HEADER_SIZE - 1], GOOD[:HEADER_SIZE], GOOD[:-1], GOOD + b"\x00",
                                 GOOD + GOOD],
                         ids=["empty", "part of a header", "a header alone", "truncated", "a byte too many",
                              "two batches"])
def test_anything_but_one_whole_batch_fails_the_checksum(buf):
    assert not checksum_ok(buf)
    assert decoded(buf) is None


@pytest.mark.parametrize("flags,count,body", [
    (0, 2, struct.pack("<II", 1, 1)),                                       # value bytes missing
    (0, 2, struct.pack("<II", 1, 1) + b"abc"),                              # a byte too many
    (FLAG_FIXED_VALUES, 3, struct.pack("<I", 2) + b"xx"),                   # fixed-size values missing
    (FLAG_FIXED_VALUES, 1, b""),                                            # no value size at all
    (FLAG_KEYS | FLAG_FIXED_VALUES, 2, struct.pack("<iiI", 5, -1, 1) + b"kk" + b"vv"),  # key bytes missing
    (FLAG_TIMESTAMPS | FLAG_FIXED_VALUES, 2, struct.pack("<qI", 1, 1) + b"vv"),  # a timestamp missing
    (FLAG_TIMESTAMP_RUNS | FLAG_FIXED_VALUES, 2, struct.pack("<IqII", 1, 5, 3, 1) + b"vv"),  # runs of 3, not 2
    (FLAG_TIMESTAMP_RUNS | FLAG_FIXED_VALUES, 2, struct.pack("<II", 0, 1) + b"vv"),  # no runs
    (FLAG_TIMESTAMP_RUNS | FLAG_FIXED_VALUES, 2, b""),                     # no run count at all
    (FLAG_HEADERS | FLAG_FIXED_VALUES, 1, struct.pack("<II", 1, 9) + b"v" + b"\x00"),  # header blob missing
], ids=["value bytes missing", "a byte too many", "fixed-size values missing", "no value size",
        "key bytes missing", "a timestamp missing", "runs too long", "no runs", "no run count",
        "header blob missing"])
def test_a_checksummed_batch_whose_columns_do_not_add_up_is_refused(flags, count, body):
    buf = seal(flags, 0, count, 5, 5, body)
    assert checksum_ok(buf)
    with pytest.raises((ValueError, struct.error)):
        decoded(buf)


@pytest.mark.parametrize("blob,problem", [
    (b"\x05\x00a", "unpack"),                                  # a name longer than the blob
    (b"\x01\x00a" + struct.pack("<i", 10) + b"xy", "overrun"),  # a value longer than the blob
    (b"\x01\x00\xff" + struct.pack("<i", -1), "utf-8"),        # a name that is not UTF-8
    (b"\x01\x00a" + struct.pack("<i", -1) + b"\x00", "unpack"),  # a stray byte after the last header
], ids=["name overruns", "value overruns", "not UTF-8", "stray byte"])
def test_record_headers_that_cannot_be_decoded_make_the_batch_unreadable(blob, problem):
    good = b"\x01\x00a" + struct.pack("<i", 1) + b"z"
    body = struct.pack("<IIII", 1, len(good), len(blob), len(good)) + b"vvv" + good + blob + good
    batch = decoded(seal(FLAG_HEADERS | FLAG_FIXED_VALUES, 20, 3, 5, 5, body))
    assert batch.records(0, 1)[0].headers == (("a", b"z"),)  # records before it read
    with pytest.raises(LogCorrupted, match=f"(?i)record headers of offsets 20..22 cannot be decoded.*{problem}") as e:
        batch.records(1, 3)
    assert (e.value.topic, e.value.partition, e.value.offset) == (TOPIC, PARTITION, 21)
    assert (e.value.path, e.value.position, e.value.resume_offset) == (PATH, POSITION, 23)


# --------------------------------------------------------------------------- headers seen while scanning

def header(length=HEADER_SIZE - 4, magic=MAGIC, base=0, count=1, min_ts=0, max_ts=0):
    return HEADER.pack(length, 0, magic, 0, 0, base, count, min_ts, max_ts)


@pytest.mark.parametrize("head,pos,size", [
    (header(magic=2), 0, 1_000),
    (header(length=HEADER_SIZE - 5), 0, 1_000),
    (header(count=0), 0, 1_000),
    (header(min_ts=2, max_ts=1), 0, 1_000),
    (header(length=100), 0, 103),     # runs past the end of the file
    (header(length=100), 900, 1_000),
], ids=["magic", "shorter than a header", "no records", "timestamps reversed", "past the end",
        "past the end, later in the file"])
def test_implausible_headers_are_not_batches(head, pos, size):
    assert plausible(head, pos, size) is None


def test_a_plausible_header_gives_size_offsets_and_max_timestamp():
    assert plausible(header(length=100, base=7, count=3, min_ts=-5, max_ts=9), 896, 1_000) == (104, 7, 3, 9)
    assert plausible(header(), 0, HEADER_SIZE) == (HEADER_SIZE, 0, 1, 0)
