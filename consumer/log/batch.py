"""The batch format: how one :meth:`~consumer.log.Log.append` call's records are laid out in a
segment file, encoded, checksummed and decoded. Pure: bytes in, bytes (or records) out; no I/O.

A batch is a 40-byte little-endian header followed by a columnar body::

    u32 length        bytes after this field (the rest of the header + the body)
    u32 crc           CRC32 of the body, continued over the 32 header bytes that follow
    u8  magic (1)     u8 flags       u16 reserved
    i64 base offset   u32 count      i64 min timestamp   i64 max timestamp
    body: [timestamps i64 x count]   if FLAG_TIMESTAMPS, or
          [u32 runs, run timestamps i64 x runs, run lengths u32 x runs]  if FLAG_TIMESTAMP_RUNS
                                     (neither: every record has the min timestamp)
          [key lengths i32 x count]  if FLAG_KEYS (-1 = no key; else no record has a key)
          value lengths u32 x count  (a single u32 if FLAG_FIXED_VALUES)
          [header-blob lengths u32 x count]  if FLAG_HEADERS
          key bytes, value bytes, header blobs (each concatenated)

A header blob holds a record's headers, each as ``u16 name length, name (UTF-8), i32 value
length (-1 = None), value``.

Guarantees: :class:`Encoded` rejects malformed records with one ``TypeError`` (and a batch
over ``MAX_BATCH_BYTES`` with ``ValueError``) before anything is written; :func:`decode`
returns ``None`` for bytes that are not one whole batch with a matching CRC, and raises
``ValueError`` or ``struct.error`` for a batch whose CRC matches but whose columns do not add
up (or that holds no record); :meth:`Batch.records` raises :class:`~coordinator.errors.LogCorrupted` for record headers
that cannot be decoded. Not provided: a version other than magic 1, compression.

Speed: a batch is checksummed once and parsed into column arrays (``array.frombytes``, no
per-record struct calls); it is kept until read through, and each ``fetch`` builds just the
records it returns: values split out of the one ``bytes`` object in C (``struct`` for
fixed-size values), records made by ``map``/``zip`` with no Python frame per record.
Timestamps are stored run-length encoded when runs are long (the usual case).
"""
from __future__ import annotations

import struct
import sys
import zlib
from array import array
from bisect import bisect_right
from functools import lru_cache
from itertools import accumulate, chain, groupby, islice, repeat
from typing import List, NamedTuple, Optional, Sequence, Tuple

from consumer.records import ConsumerRecord, records_built
from coordinator.errors import LogCorrupted

Record = Tuple[Optional[bytes], bytes, int, Sequence[Tuple[str, Optional[bytes]]]]

MAGIC = 1
HEADER = struct.Struct("<IIBBHqIqq")
HEADER_SIZE = HEADER.size            # 40
_CRC_FROM = 8                        # the CRC covers the body, then header bytes [8:40]
_HEADER_REST = struct.Struct("<BBHqIqq")
_LEN_CRC = struct.Struct("<II")
FLAG_TIMESTAMPS, FLAG_KEYS, FLAG_HEADERS, FLAG_FIXED_VALUES, FLAG_TIMESTAMP_RUNS = 1, 2, 4, 8, 16
MAX_BATCH_BYTES = (1 << 31) - 1
_FIXED_CHUNK = 64                    # values split per struct call on the fixed-size path

_LITTLE = sys.byteorder == "little"


# ---------------------------------------------------------------- encoding

def _column(typecode: str, values) -> bytes:
    a = array(typecode, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def _read_column(typecode: str, buf, pos: int, count: int) -> array:
    a = array(typecode)
    end = pos + count * a.itemsize
    if end > len(buf):  # a count the columns do not hold (a short read would pass for one)
        raise ValueError(f"a column of {count} values overruns the batch")
    a.frombytes(buf[pos:end])
    if not _LITTLE:
        a.byteswap()
    return a


def _encode_headers(headers) -> bytes:
    out = []
    for name, value in headers:
        raw = name.encode("utf-8")
        out.append(struct.pack("<H", len(raw)) + raw)
        if value is None:
            out.append(struct.pack("<i", -1))
        elif isinstance(value, (bytes, bytearray)):
            out.append(struct.pack("<i", len(value)) + value)
        else:
            raise TypeError(f"header {name!r} has a {type(value).__name__} value, not bytes")
    return b"".join(out)


def _decode_headers(blob: bytes) -> tuple:
    out, pos, end = [], 0, len(blob)
    try:
        while pos < end:
            (n,) = struct.unpack_from("<H", blob, pos)
            name = blob[pos + 2:pos + 2 + n].decode("utf-8")
            pos += 2 + n
            (m,) = struct.unpack_from("<i", blob, pos)
            pos += 4
            out.append((name, None if m < 0 else blob[pos:pos + m]))
            pos += max(m, 0)
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(str(e)) from None
    if pos != end:
        raise ValueError("they overrun their length")
    return tuple(out)


class Encoded:
    """A batch body plus the header fields that do not depend on the base offset."""

    __slots__ = ("flags", "count", "min_ts", "max_ts", "parts", "body_len", "body_crc")

    def __init__(self, records: Sequence[Record]):
        count = len(records)
        try:
            keys, values, timestamps, headers = zip(*records)
            parts, flags = [], 0
            self.min_ts, self.max_ts = min(timestamps), max(timestamps)
            if self.min_ts != self.max_ts:
                # Producers stamp records with the current millisecond, so runs are long; stored
                # as runs, readers share one int per run instead of allocating one per record.
                limit = count // 8 + 1
                runs = list(islice(((t, len(list(g))) for t, g in groupby(timestamps)), limit))
                if len(runs) < limit:
                    flags |= FLAG_TIMESTAMP_RUNS
                    run_ts, run_lengths = zip(*runs)
                    parts += [_column("I", [len(runs)]), _column("q", run_ts), _column("I", run_lengths)]
                else:
                    flags |= FLAG_TIMESTAMPS
                    parts.append(_column("q", timestamps))
            if keys.count(None) != count:
                flags |= FLAG_KEYS
                key_lengths = [-1 if k is None else len(k) for k in keys]
                key_data = b"".join(filter(None, keys))
                if len(key_data) != sum(n for n in key_lengths if n > 0):
                    raise TypeError("keys must be bytes or None")
                parts.append(_column("i", key_lengths))
            lengths = array("I", map(len, values))
            if lengths.count(lengths[0]) == count:
                flags |= FLAG_FIXED_VALUES
                parts.append(_column("I", lengths[:1]))
                value_bytes = lengths[0] * count
            else:
                parts.append(_column("I", lengths))
                value_bytes = sum(lengths)
            blobs = [_encode_headers(h) if h else b"" for h in headers] if any(headers) else None
            if blobs is not None:
                flags |= FLAG_HEADERS
                parts.append(_column("I", map(len, blobs)))
            if flags & FLAG_KEYS:
                parts.append(key_data)
            data = b"".join(values)
            if len(data) != value_bytes:
                raise TypeError("values must be bytes")
            parts.append(data)
            if blobs is not None:
                parts.append(b"".join(blobs))
        except (TypeError, ValueError, OverflowError, AttributeError, UnicodeError) as e:
            raise TypeError("records must be (key: bytes|None, value: bytes, timestamp_ms: int, "
                            f"headers: ((str, bytes), ...)) tuples: {e}") from None
        self.flags, self.count, self.parts = flags, count, parts
        self.body_len = sum(map(len, parts))
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        self.body_crc = crc
        if HEADER_SIZE + self.body_len > MAX_BATCH_BYTES:
            raise ValueError(f"a batch of {self.body_len} bytes is too large; append fewer records at once")

    @property
    def size(self) -> int:
        return HEADER_SIZE + self.body_len

    def header(self, base_offset: int) -> bytes:
        rest = _HEADER_REST.pack(MAGIC, self.flags, 0, base_offset, self.count, self.min_ts, self.max_ts)
        return _LEN_CRC.pack(self.size - 4, zlib.crc32(rest, self.body_crc)) + rest


# ---------------------------------------------------------------- decoding

@lru_cache(maxsize=256)
def _fixed_struct(size: int, n: int) -> struct.Struct:
    return struct.Struct(f"{size}s" * n)


def _split_fixed(buf: bytes, pos: int, size: int, count: int) -> list:
    """``count`` values of ``size`` bytes from ``buf[pos:]``, split in C by struct."""
    if size == 0:
        return [b""] * count
    whole = count - count % _FIXED_CHUNK
    values = []
    if whole:
        chunk = _fixed_struct(size, _FIXED_CHUNK)
        values = list(chain.from_iterable(chunk.iter_unpack(memoryview(buf)[pos:pos + whole * size])))
    if count > whole:
        values.extend(_fixed_struct(size, count - whole).unpack_from(buf, pos + whole * size))
    return values


class Batch:
    """One checksummed batch, parsed into columns; records are built on demand.

    Building records a fetch at a time (rather than the whole batch at once) keeps the live
    set small: the memory of the records a consumer has dropped is reused while still in
    the CPU cache, which is worth about a third of the read time.

    Not changed once built; the :class:`~consumer.log.Log` keeps one per partition (the batch
    being read through), under that partition's lock.
    """

    __slots__ = ("buf", "topic", "partition", "path", "position", "base", "count", "min_ts", "ts",
                 "run_ts", "run_lengths", "run_ends", "key_lengths", "key_starts", "value_pos",
                 "value_size", "value_starts", "header_starts", "unit", "cum")

    def __init__(self, buf: bytes, topic: str, partition: int, path: str, position: int,
                 flags: int, base: int, count: int, min_ts: int):
        """Parse the columns of ``buf`` (CRC already checked); ValueError/struct.error if inconsistent."""
        self.buf, self.topic, self.partition = buf, topic, partition
        self.path, self.position = path, position  # where the batch is, for errors
        self.base, self.count, self.min_ts = base, count, min_ts
        self.ts = self.run_ts = self.key_starts = self.value_starts = self.header_starts = None
        pos = HEADER_SIZE
        if flags & FLAG_TIMESTAMPS:
            self.ts = _read_column("q", buf, pos, count)
            pos += 8 * count
        elif flags & FLAG_TIMESTAMP_RUNS:
            (runs,) = struct.unpack_from("<I", buf, pos)
            self.run_ts = _read_column("q", buf, pos + 4, runs).tolist()
            self.run_lengths = _read_column("I", buf, pos + 4 + 8 * runs, runs).tolist()
            self.run_ends = list(accumulate(self.run_lengths))
            if not runs or self.run_ends[-1] != count:
                raise ValueError("timestamp runs do not add up to the record count")
            pos += 4 + 12 * runs
        if flags & FLAG_KEYS:
            self.key_lengths = _read_column("i", buf, pos, count)
            pos += 4 * count
        if flags & FLAG_FIXED_VALUES:
            (self.value_size,) = struct.unpack_from("<I", buf, pos)
            pos += 4
        else:
            value_lengths = _read_column("I", buf, pos, count)
            pos += 4 * count
        if flags & FLAG_HEADERS:
            header_lengths = _read_column("I", buf, pos, count)
            pos += 4 * count
        # Byte positions of the data sections: compact arrays, no objects per record.
        if flags & FLAG_KEYS:
            key_bytes = list(map(max, self.key_lengths, repeat(0)))
            self.key_starts = array("q", accumulate(key_bytes, initial=pos))
            pos = self.key_starts[-1]
        if flags & FLAG_FIXED_VALUES:
            self.value_pos = pos
            pos += self.value_size * count
        else:
            self.value_starts = array("q", accumulate(value_lengths, initial=pos))
            pos = self.value_starts[-1]
        if flags & FLAG_HEADERS:
            self.header_starts = array("q", accumulate(header_lengths, initial=pos))
            pos = self.header_starts[-1]
        if pos != len(buf):
            raise ValueError(f"its columns add up to {pos} bytes, not {len(buf)}")
        # Sizes (key + value + headers) for max_bytes: a constant, or cumulative per record.
        if flags & (FLAG_KEYS | FLAG_HEADERS) or not flags & FLAG_FIXED_VALUES:
            self.unit = 0
            sizes = repeat(self.value_size, count) if flags & FLAG_FIXED_VALUES else value_lengths
            if flags & FLAG_KEYS:
                sizes = map(int.__add__, sizes, key_bytes)
            if flags & FLAG_HEADERS:
                sizes = map(int.__add__, sizes, header_lengths)
            self.cum = array("q", accumulate(sizes))
        else:
            self.unit, self.cum = self.value_size, None

    def take(self, i: int, max_records: int, budget: int, at_least_one: bool) -> Tuple[int, int]:
        """End index and byte size of the longest stretch from ``i`` within both limits."""
        j = min(self.count, i + max_records)
        budget = max(budget, 0)
        if self.cum is None:
            if self.unit:
                j = min(j, i + budget // self.unit)
            if at_least_one:
                j = max(j, i + 1)
            return j, (j - i) * self.unit
        start = self.cum[i - 1] if i else 0
        j = min(j, bisect_right(self.cum, start + budget, i, j))
        if at_least_one:
            j = max(j, i + 1)
        return j, (self.cum[j - 1] - start) if j > i else 0

    def timestamps(self, i: int, j: int):
        """An iterable of the timestamps of records ``i`` to ``j - 1`` (may run on past ``j``)."""
        if self.ts is not None:
            return self.ts[i:j]
        if self.run_ts is None:
            return repeat(self.min_ts)
        r = bisect_right(self.run_ends, i)
        return chain(repeat(self.run_ts[r], self.run_ends[r] - i),
                     chain.from_iterable(map(repeat, islice(self.run_ts, r + 1, None),
                                             islice(self.run_lengths, r + 1, None))))

    def _timestamp_array(self, i: int, j: int) -> array:
        """The timestamps of records ``i`` to ``j - 1`` as an array, a run at a time (array
        repetition, in C)."""
        if self.ts is not None:
            return self.ts[i:j]
        if self.run_ts is None:
            return array("q", (self.min_ts,)) * (j - i)
        out = array("q")
        r, at = bisect_right(self.run_ends, i), i
        while at < j:
            end = min(self.run_ends[r], j)
            out += array("q", (self.run_ts[r],)) * (end - at)
            at, r = end, r + 1
        return out

    def records(self, i: int, j: int) -> List[ConsumerRecord]:
        """Records ``i`` to ``j - 1`` of the batch."""
        buf = self.buf
        if self.value_starts is None:
            values = _split_fixed(buf, self.value_pos + i * self.value_size, self.value_size, j - i)
        else:
            starts = self.value_starts[i:j + 1]
            values = [buf[a:b] for a, b in zip(starts, islice(starts, 1, None))]
        return _make_records(self.topic, self.partition, self.base + i, self.timestamps(i, j), self._keys(i, j),
                             values, self._headers(i, j))

    def _keys(self, i: int, j: int) -> Optional[List[Optional[bytes]]]:
        if self.key_starts is None:
            return None
        buf = self.buf
        return [None if n < 0 else buf[a:a + n] for a, n in zip(self.key_starts[i:j], self.key_lengths[i:j])]

    def _headers(self, i: int, j: int) -> Optional[list]:
        if self.header_starts is None:
            return None
        buf, starts = self.buf, self.header_starts[i:j + 1]
        try:
            return [_decode_headers(buf[a:b]) if b > a else () for a, b in zip(starts, islice(starts, 1, None))]
        except ValueError as e:  # checksummed, so written like this: the whole batch is unreadable
            end = self.base + self.count
            raise LogCorrupted(self.topic, self.partition, self.base + i, self.path, self.position,
                               f"the record headers of {span(self.base, end)} cannot be "
                               f"decoded ({e})", end) from None

    def columns(self, i: int, j: int) -> Columns:
        """Records ``i`` to ``j - 1`` as :class:`Columns`: array slices, no object per record
        (headers aside, decoded per record; LogCorrupted as for :meth:`records`)."""
        n = j - i
        fixed = self.value_starts is None
        return Columns(
            self.buf, self.base + i, n,
            self._timestamp_array(i, j),
            None if fixed else self.value_starts[i:j + 1],
            self.value_pos + i * self.value_size if fixed else 0,
            self.value_size if fixed else 0,
            None if self.key_starts is None else self.key_starts[i:j + 1],
            None if self.key_starts is None else self.key_lengths[i:j],
            self._headers(i, j))


class Columns(NamedTuple):
    """Records ``base`` to ``base + count - 1`` of one batch as columns, no object per record
    (:meth:`~consumer.log.Log.fetch_columns`). Byte positions are into ``buf`` (the batch).

    ``value_starts``: ``count + 1`` positions (value k is ``buf[s[k]:s[k+1]]``), or None when
    every value has ``value_size`` bytes from ``value_pos``. ``key_starts`` (``count + 1``) and
    ``key_lengths`` (-1: no key; 0 bytes in ``buf``): None when no record has a key.
    ``timestamps``: ``count`` milliseconds. ``headers``: a tuple per record, None when no
    record has headers."""
    buf: bytes
    base: int
    count: int
    timestamps: array
    value_starts: Optional[array]
    value_pos: int
    value_size: int
    key_starts: Optional[array]
    key_lengths: Optional[array]
    headers: Optional[list]

    @property
    def end(self) -> int:
        """The offset after the last record."""
        return self.base + self.count

    def slice(self, i: int, j: int) -> "Columns":
        """Records ``base + i`` to ``base + j - 1`` (``0 <= i <= j <= count``): array slices,
        the same ``buf``."""
        fixed = self.value_starts is None
        return Columns(
            self.buf, self.base + i, j - i, self.timestamps[i:j],
            None if fixed else self.value_starts[i:j + 1],
            self.value_pos + i * self.value_size if fixed else 0,
            self.value_size if fixed else 0,
            None if self.key_starts is None else self.key_starts[i:j + 1],
            None if self.key_lengths is None else self.key_lengths[i:j],
            None if self.headers is None else self.headers[i:j])

    def records(self, topic: str, partition: int) -> List[ConsumerRecord]:
        """The records these columns hold, as :meth:`Batch.records` builds them (for a reader
        of columns that needs record objects after all)."""
        buf, n = self.buf, self.count
        if self.value_starts is None:
            values = _split_fixed(buf, self.value_pos, self.value_size, n)
        else:
            starts = self.value_starts
            values = [buf[a:b] for a, b in zip(starts, islice(starts, 1, None))]
        keys = None if self.key_starts is None else \
            [None if k < 0 else buf[a:a + k] for a, k in zip(self.key_starts, self.key_lengths)]
        return _make_records(topic, partition, self.base, self.timestamps, keys, values, self.headers)


def _make_records(topic: str, partition: int, base: int, timestamps, keys: Optional[list], values: list,
                  headers: Optional[list]) -> List[ConsumerRecord]:
    """Record objects for ``values`` (offsets from ``base``) and their fields (``keys`` and
    ``headers`` None when the records have none)."""
    with records_built():
        # tuple.__new__ straight from map: C all the way, no Python frame per record.
        return list(map(tuple.__new__, repeat(ConsumerRecord), zip(
            repeat(topic), repeat(partition), range(base, base + len(values)), timestamps,
            repeat(None) if keys is None else keys, values, repeat(()) if headers is None else headers)))


def checksum_ok(data) -> bool:
    """Whether ``data`` is one whole batch whose CRC matches."""
    if len(data) < HEADER_SIZE:
        return False
    length, crc = _LEN_CRC.unpack_from(data)
    view = memoryview(data)
    return (length + 4 == len(data)
            and zlib.crc32(view[_CRC_FROM:HEADER_SIZE], zlib.crc32(view[HEADER_SIZE:])) == crc)


def decode(buf: bytes, topic: str, partition: int, path: str, position: int) -> Optional[Batch]:
    """Parse one whole batch (header + body); None if its checksum fails, ValueError or
    struct.error if it passes but its columns are inconsistent."""
    if not checksum_ok(buf):
        return None
    _, _, _, flags, _, base, count, min_ts, _ = HEADER.unpack_from(buf)
    if count < 1:  # the log never indexes one (plausible); its reads assume a record
        raise ValueError("the batch holds no record")
    return Batch(buf, topic, partition, path, position, flags, base, count, min_ts)


def plausible(head, pos: int, size: int) -> Optional[Tuple[int, int, int, int]]:
    """``(total bytes, base offset, count, max timestamp)`` of the batch header ``head`` found
    at byte ``pos`` of a file of ``size`` bytes, if it is well formed and fits; else None."""
    length, _, magic, _, _, base, count, min_ts, max_ts = HEADER.unpack_from(head)
    total = length + 4
    if magic != MAGIC or total < HEADER_SIZE or count < 1 or min_ts > max_ts or pos + total > size:
        return None
    return total, base, count, max_ts


def span(first: int, end: int) -> str:
    """Offsets ``first`` to ``end - 1``, in words."""
    return f"offsets {first}..{end - 1}" if end > first else f"no offset (at {first})"
