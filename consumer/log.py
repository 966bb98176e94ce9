"""An embedded, durable, partitioned log: where topics keep their records (Kafka is not used).

Layout::

    <data_dir>/<topic>-<partition>/00000000000000000000.log   segments, named by base offset
    <data_dir>/<topic>-<partition>/writer.lock                flock'ed by whoever appends

A segment is a sequence of *batches*; one :meth:`Log.append` call writes exactly one batch.
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

Guarantees
----------
* Offsets are dense from 0 in every partition; a batch is visible whole or not at all.
* **One writer at a time per partition, across processes**: ``append`` holds an exclusive
  ``fcntl.flock`` on ``writer.lock`` for the duration of the call (per batch, so several
  producer processes can share a partition). Under the lock the writer first indexes and
  checksums whatever other writers appended, so offsets stay dense.
* **Readers take no lock.** They index batch headers (lengths, offsets; bodies are skipped,
  except the newest batch, whose CRC is checked so ``latest_offset`` never counts a torn
  batch) and check each batch's CRC when they decode it. A torn tail (below) is treated as
  not written yet: the reader stops before it and never modifies the file.
* **Every intact record can be read.** A ``fetch`` returns the records before damaged or
  missing data and raises :class:`LogCorrupted` only when the offset asked for is itself
  unreadable; the error names the file, the byte and the offset to resume from
  (``resume_offset``), so reading can go on past the damage with a seek. A segment is read up
  to its own last intact batch whatever comes after it, and a gap between two segments (a
  deleted, emptied or truncated segment) is an error only for the offsets inside the gap.
* **A torn tail is only the end of the last segment.** Writers append one whole batch at a
  time, so only the newest batch can be torn: a bad batch (failing header or checksum) counts
  as a torn tail only when no valid batch follows it in the file (one whose header and
  checksum are good and whose base offset continues the sequence). Otherwise it is damage:
  its offsets raise :class:`LogCorrupted` and the batches after it stay readable.
* **Recovery is done by the writer, and never cuts intact data.** The first time a ``Log``
  appends to a partition it checksums the whole last segment. A torn tail is cut back to the
  last good batch, with one warning; nothing before it is lost and appends continue after
  it. If the last segment holds damage with intact batches after it, the writer cuts nothing:
  it leaves the segment as it is and rolls to a new segment starting after the last intact
  offset, with one warning naming the file, byte and offsets. (Rolling rather than refusing
  to append: the damage is already contained, readers see it as they would in any sealed
  segment, and producers keep working; refusing would stop a partition until someone edits
  files by hand, and the only repair it could offer is the same roll.) Damage is never
  repaired silently: the damaged bytes stay on disk and keep raising for their offsets.
* Durability (``fsync``): ``"batch"`` fsyncs every append; ``"interval"`` (default) fsyncs
  when ``fsync_interval_ms`` have passed since the last sync, on the next append, and on
  segment roll, :meth:`Log.flush` and :meth:`Log.close`, so a power failure loses at most the
  appends of the last interval (plus any after a final idle period that no flush covered);
  ``"never"`` leaves it to the OS except on ``flush``/``close``. A process crash loses
  nothing that ``append`` returned, whatever the policy.
* Segments roll at ``segment_bytes``; retention (``retention_bytes`` / ``retention_ms``,
  judged by a segment's largest record timestamp, as in Kafka) deletes whole segments, oldest
  first, on every roll and on :meth:`Log.enforce_retention`. Reading below the earliest
  retained offset raises :class:`OffsetOutOfRange`.

Not provided: an on-disk index (each process indexes batch headers in memory, once per
segment, at 24 bytes per batch), compaction, or deleting a topic's data. Damage cannot be
told from a torn tail when nothing valid follows it: the newest batch of the last segment,
or a whole last segment that is missing, is lost without an error (its offsets are reused).

Damage is found by the search for the next valid batch after bytes that do not parse: one
pass over the rest of that segment file (a regex finds candidate headers; only well-formed
ones are checksummed), made once per damaged spot and process (again by a reader of the last
segment once the file has grown), never on the path of intact data, which costs what it did:
two comparisons per batch read, none per record.

Speed: a batch is read with one ``pread``, checksummed once and parsed into column arrays
(``array.frombytes``, no per-record struct calls); it is kept until read through, and each
``fetch`` builds just the records it returns: values split out of the one ``bytes`` object in
C (``struct`` for fixed-size values), records made by ``map``/``zip`` with no Python frame
per record. Timestamps are stored run-length encoded when runs are long (the usual case).
"""
from __future__ import annotations

import fcntl
import gc
import logging
import os
import re
import struct
import sys
import threading
import time
import zlib
from array import array
from bisect import bisect_left, bisect_right
from contextlib import contextmanager
from functools import lru_cache
from itertools import accumulate, chain, groupby, islice, repeat
from typing import Dict, List, Optional, Sequence, Tuple

from consumer.records import ConsumerRecord
from coordinator.errors import (IllegalStateError, InvalidConfig, InvalidPartitions, LogCorrupted,
                                OffsetOutOfRange)
from coordinator.protocol import validate_name

log = logging.getLogger(__name__)

Record = Tuple[Optional[bytes], bytes, int, Sequence[Tuple[str, Optional[bytes]]]]

MAGIC = 1
HEADER = struct.Struct("<IIBBHqIqq")
HEADER_SIZE = HEADER.size            # 40
_CRC_FROM = 8                        # the CRC covers the body, then header bytes [8:40]
_HEADER_REST = struct.Struct("<BBHqIqq")
_LEN_CRC = struct.Struct("<II")
FLAG_TIMESTAMPS, FLAG_KEYS, FLAG_HEADERS, FLAG_FIXED_VALUES, FLAG_TIMESTAMP_RUNS = 1, 2, 4, 8, 16
MAX_BATCH_BYTES = (1 << 31) - 1

SEGMENT_SUFFIX = ".log"
LOCK_FILE = "writer.lock"
FSYNC_POLICIES = ("batch", "interval", "never")
DEFAULT_SEGMENT_BYTES = 64 << 20
_SCAN_CHUNK = 64 << 10              # read-ahead when indexing batch headers
_PROBE_CHUNK = 1 << 20              # read size when searching damaged bytes for the next batch
# What the search for the next batch after damaged bytes looks for, at a header's magic byte
# (byte 8): a length (bytes 0..3) of at least 36 and below 2**31, then magic, flags below 32
# and zero reserved bytes (8..11). The regex does in C what would otherwise be Python work per
# candidate; each match is then parsed and checksummed. Only the magic byte is consumed, so
# overlapping candidates are all found.
_HEADER_MARK = re.compile(rb"\x01(?=[\x00-\x1f]\x00\x00)"  # the magic byte first: a fast literal search
                          rb"(?<![\x00-\x23]\x00\x00\x00[\s\S]{4}\x01)(?<=[\x00-\x7f][\s\S]{4}\x01)")
_MARK_AT, _MARK_LEN = 8, 4
_HOLE = -(1 << 63)                  # max timestamp of an index entry that stands for damaged bytes
_FIXED_CHUNK = 64                    # values split per struct call on the fixed-size path

_LITTLE = sys.byteorder == "little"
_fdatasync = getattr(os, "fdatasync", os.fsync)


# ---------------------------------------------------------------- encoding

def _column(typecode: str, values) -> bytes:
    a = array(typecode, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def _read_column(typecode: str, buf, pos: int, count: int) -> array:
    a = array(typecode)
    a.frombytes(buf[pos:pos + count * a.itemsize])
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


class _Encoded:
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

@contextmanager
def _gc_paused():
    """Defer the cyclic GC while records are built.

    Building allocates one tuple per record; with the GC on, a collection every 700 of them
    makes it about a third slower. None of these objects can form a cycle, so deferring the
    collection loses nothing (it runs at the next allocation after).
    """
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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


class _Batch:
    """One checksummed batch, parsed into columns; records are built on demand.

    Building records a fetch at a time (rather than the whole batch at once) keeps the live
    set small: the memory of the records a consumer has dropped is reused while still in
    the CPU cache, which is worth about a third of the read time.
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

    def records(self, i: int, j: int) -> List[ConsumerRecord]:
        """Records ``i`` to ``j - 1`` of the batch."""
        buf = self.buf
        if self.value_starts is None:
            values = _split_fixed(buf, self.value_pos + i * self.value_size, self.value_size, j - i)
        else:
            starts = self.value_starts[i:j + 1]
            values = [buf[a:b] for a, b in zip(starts, islice(starts, 1, None))]
        keys = repeat(None)
        if self.key_starts is not None:
            keys = [None if n < 0 else buf[a:a + n]
                    for a, n in zip(self.key_starts[i:j], self.key_lengths[i:j])]
        headers = repeat(())
        if self.header_starts is not None:
            starts = self.header_starts[i:j + 1]
            try:
                headers = [_decode_headers(buf[a:b]) if b > a else ()
                           for a, b in zip(starts, islice(starts, 1, None))]
            except ValueError as e:  # checksummed, so written like this: the whole batch is unreadable
                end = self.base + self.count
                raise LogCorrupted(self.topic, self.partition, self.base + i, self.path, self.position,
                                   f"the record headers of {_span(self.base, end)} cannot be "
                                   f"decoded ({e})", end) from None
        with _gc_paused():
            # tuple.__new__ straight from map: C all the way, no Python frame per record.
            return list(map(tuple.__new__, repeat(ConsumerRecord), zip(
                repeat(self.topic), repeat(self.partition), range(self.base + i, self.base + j),
                self.timestamps(i, j), keys, values, headers)))


def _checksum_ok(data) -> bool:
    """Whether ``data`` is one whole batch whose CRC matches."""
    if len(data) < HEADER_SIZE:
        return False
    length, crc = _LEN_CRC.unpack_from(data)
    view = memoryview(data)
    return (length + 4 == len(data)
            and zlib.crc32(view[_CRC_FROM:HEADER_SIZE], zlib.crc32(view[HEADER_SIZE:])) == crc)


def _decode(buf: bytes, topic: str, partition: int, path: str, position: int) -> Optional[_Batch]:
    """Parse one whole batch (header + body); None if its checksum fails, ValueError or
    struct.error if it passes but its columns are inconsistent."""
    if not _checksum_ok(buf):
        return None
    _, _, _, flags, _, base, count, min_ts, _ = HEADER.unpack_from(buf)
    return _Batch(buf, topic, partition, path, position, flags, base, count, min_ts)


def _plausible(head, pos: int, size: int) -> Optional[Tuple[int, int, int, int]]:
    """``(total bytes, base offset, count, max timestamp)`` of the batch header ``head`` found
    at byte ``pos`` of a file of ``size`` bytes, if it is well formed and fits; else None."""
    length, _, magic, _, _, base, count, min_ts, max_ts = HEADER.unpack_from(head)
    total = length + 4
    if magic != MAGIC or total < HEADER_SIZE or count < 1 or min_ts > max_ts or pos + total > size:
        return None
    return total, base, count, max_ts


def _find_batch(fd: int, start: int, size: int, expected: int) -> Optional[Tuple[int, int, int, int, int]]:
    """The first whole batch at or after byte ``start`` whose checksum is good and whose base
    offset is at least ``expected``, as ``(position, total bytes, base, count, max timestamp)``.

    Only for damaged bytes (never on the read path of intact data): one pass over the rest of
    the file, read ``_PROBE_CHUNK`` at a time; a regex finds candidate headers by their fixed
    bytes, so only candidates are parsed and only well-formed ones checksummed.
    """
    chunk_at = start
    while chunk_at + HEADER_SIZE <= size:
        chunk = os.pread(fd, min(_PROBE_CHUNK, size - chunk_at), chunk_at)
        if len(chunk) < HEADER_SIZE:
            return None
        for mark in _HEADER_MARK.finditer(chunk, _MARK_AT):
            at = mark.start() - _MARK_AT  # where the candidate header starts, in the chunk
            pos = chunk_at + at
            head = chunk[at:at + HEADER_SIZE] if at + HEADER_SIZE <= len(chunk) else os.pread(fd, HEADER_SIZE, pos)
            if len(head) < HEADER_SIZE:
                return None
            found = _plausible(head, pos, size)
            if found is not None and found[1] >= expected and _checksum_ok(os.pread(fd, found[0], pos)):
                return (pos, *found)
        # The next chunk starts so that its first candidate mark is the one after the last
        # mark that fitted in this chunk, with the header bytes before it.
        chunk_at += len(chunk) - (_MARK_AT + _MARK_LEN - 1)
    return None


def _span(first: int, end: int) -> str:
    """Offsets ``first`` to ``end - 1``, in words."""
    return f"offsets {first}..{end - 1}" if end > first else f"no offset (at {first})"


# ---------------------------------------------------------------- segments

class _Segment:
    """One segment file and the in-memory index of its batches (base offset, position, max ts).

    Damaged bytes followed by an intact batch are indexed too, as a *hole*: an entry whose max
    timestamp is ``_HOLE``, covering the offsets from the last intact batch before it to the
    next intact one (none, if the damage lost no offset). So every offset up to ``next_offset``
    has an entry, and finding it stays one bisect.
    """

    __slots__ = ("base", "path", "fd", "bases", "positions", "max_ts", "end", "next_offset",
                 "verified", "sealed", "damaged", "probed")

    def __init__(self, base: int, path: str):
        self.base, self.path, self.fd = base, path, None
        self.bases, self.positions, self.max_ts = array("q"), array("q"), array("q")
        self.end = 0                 # byte position after the last indexed batch
        self.next_offset = base      # offset after the last indexed batch
        self.verified = 0            # batches before this position had their CRC checked
        self.sealed = False          # fully indexed and known to be followed by another segment
        self.damaged: Optional[int] = None  # index of the first hole, if any
        self.probed = None           # (end, file size) of the last search that found no batch after end

    def open(self) -> int:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return self.fd

    def add(self, base: int, pos: int, max_ts: int, end: int, next_offset: int) -> None:
        self.bases.append(base)
        self.positions.append(pos)
        self.max_ts.append(max_ts)
        self.end, self.next_offset = end, next_offset

    def add_hole(self, pos: int, end: int, next_offset: int) -> None:
        """Index bytes ``pos..end`` as damaged; the next intact batch starts at ``next_offset``."""
        if self.damaged is None:
            self.damaged = len(self.bases)
        self.add(self.next_offset, pos, _HOLE, end, next_offset)

    def cut(self, k: int) -> None:
        """Forget batch ``k`` and everything after it."""
        if k < len(self.bases):
            self.end, self.next_offset = self.positions[k], self.bases[k]
            del self.bases[k:], self.positions[k:], self.max_ts[k:]
        self.verified = min(self.verified, self.end)
        self.sealed = False
        if self.damaged is not None and self.damaged >= len(self.bases):
            self.damaged = None

    def batch_end(self, k: int) -> int:
        return self.positions[k + 1] if k + 1 < len(self.positions) else self.end

    @property
    def max_timestamp(self) -> int:
        return max(self.max_ts) if self.max_ts else -1

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Chunks:
    """Sequential reads through a read-ahead buffer: few syscalls for small batches, and only
    the header region (not the body) of a batch larger than the buffer."""

    def __init__(self, fd: int):
        self.fd, self.buf, self.start = fd, b"", 0

    def read(self, pos: int, n: int):
        off = pos - self.start
        if off < 0 or off + n > len(self.buf):
            if n >= _SCAN_CHUNK:
                return os.pread(self.fd, n, pos)
            self.buf, self.start, off = os.pread(self.fd, _SCAN_CHUNK, pos), pos, 0
        return memoryview(self.buf)[off:off + n]


def _segment_name(base: int) -> str:
    return f"{base:020d}{SEGMENT_SUFFIX}"


def _segment_base(name: str) -> Optional[int]:
    stem = name[:-len(SEGMENT_SUFFIX)]
    if name.endswith(SEGMENT_SUFFIX) and len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


class _Partition:
    """Per-partition state of one :class:`Log`; every field is guarded by ``lock``."""

    def __init__(self, topic: str, partition: int, path: str):
        self.topic, self.partition, self.dir = topic, partition, path
        self.lock = threading.RLock()
        self.segments: List[_Segment] = []
        self.bases: List[int] = []         # segment base offsets, for bisect
        self.cache: Optional[_Batch] = None
        self.lock_fd: Optional[int] = None
        self.wfd: Optional[int] = None     # write handle of the active segment
        self.wbase: Optional[int] = None
        self.dirty = False                 # appended since the last fsync
        self.synced_at = time.monotonic()

    @property
    def earliest(self) -> int:
        return self.segments[0].base if self.segments else 0

    @property
    def latest(self) -> int:
        return self.segments[-1].next_offset if self.segments else 0


# ---------------------------------------------------------------- the log

class Log:
    """All partitions under ``data_dir``; safe to share between threads.

    ``fsync``: ``"interval"`` (default, at most every ``fsync_interval_ms``), ``"batch"``
    (every append) or ``"never"`` (only on flush/close). See the module docstring.
    """

    def __init__(self, data_dir: str, fsync: str = "interval", fsync_interval_ms: int = 1000,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES, retention_bytes: Optional[int] = None,
                 retention_ms: Optional[int] = None):
        if fsync not in FSYNC_POLICIES:
            raise InvalidConfig(f"fsync must be one of {', '.join(FSYNC_POLICIES)}; got {fsync!r}")
        for name, value in (("fsync_interval_ms", fsync_interval_ms), ("segment_bytes", segment_bytes),
                            ("retention_bytes", retention_bytes), ("retention_ms", retention_ms)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise InvalidConfig(f"{name} must be a whole number >= 0, got {value!r}")
        self.data_dir = str(data_dir)
        self.fsync = fsync
        self.fsync_interval = fsync_interval_ms / 1000.0
        self.segment_bytes = segment_bytes
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms
        self._parts: Dict[Tuple[str, int], _Partition] = {}
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------ public API

    def append(self, topic: str, partition: int, records: Sequence[Record]) -> int:
        """Write ``records`` as one checksummed batch; return the offset of the first one.

        Each record is ``(key: bytes | None, value: bytes, timestamp_ms: int, headers)`` with
        ``headers`` a sequence of ``(str, bytes)`` (empty for none).
        """
        if not records:
            raise ValueError("append needs at least one record")
        batch = _Encoded(records)  # encoded and checksummed before any lock is taken
        p = self._partition(topic, partition)
        with p.lock, self._writer_lock(p):
            seg = self._prepare_write(p, batch.size)
            base, pos = seg.next_offset, seg.end
            self._write(p, [batch.header(base), *batch.parts], pos)
            seg.add(base, pos, batch.max_ts, pos + batch.size, base + batch.count)
            seg.verified = seg.end
            self._synced_after_write(p)
        return base

    def fetch(self, topic: str, partition: int, offset: int, max_records: int = 500,
              max_bytes: int = 1 << 20) -> List[ConsumerRecord]:
        """Records from ``offset`` on, in offset order.

        At most ``max_records``; stops before the record that would take the key+value+header
        bytes past ``max_bytes``, but returns at least one record when one exists. ``offset ==
        latest`` returns ``[]``; below the earliest or above the latest offset raises
        :class:`OffsetOutOfRange`.
        """
        p = self._partition(topic, partition)
        with p.lock:
            try:
                return self._read(p, offset, max_records, max_bytes)
            except FileNotFoundError:  # a segment went away under us (retention elsewhere)
                self._refresh(p)
                return self._read(p, offset, max_records, max_bytes)

    def earliest_offset(self, topic: str, partition: int) -> int:
        """The first retained offset (``latest_offset`` when the partition is empty)."""
        p = self._partition(topic, partition)
        with p.lock:
            self._refresh(p)
            return p.earliest

    def latest_offset(self, topic: str, partition: int) -> int:
        """The offset the next append gets ("end offset"), as on disk now."""
        p = self._partition(topic, partition)
        with p.lock:
            self._refresh(p)
            return p.latest

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> Optional[int]:
        """The earliest offset whose record timestamp is >= ``timestamp_ms``; None if none."""
        p = self._partition(topic, partition)
        with p.lock:
            self._refresh(p)
            for seg in list(p.segments):
                self._index(p, seg)
                if seg.max_timestamp < timestamp_ms:
                    continue
                k = next(k for k, ts in enumerate(seg.max_ts) if ts >= timestamp_ms)
                batch = self._batch_at(p, seg.bases[k])
                if batch is None:
                    return None
                return batch.base + next(i for i, ts in enumerate(batch.timestamps(0, batch.count))
                                         if ts >= timestamp_ms)
            return None

    def has_data(self, topic: str) -> bool:
        """Whether anything was ever written to ``topic`` here (a partition directory exists)."""
        prefix = f"{validate_name(topic)}-"
        try:
            return any(name.startswith(prefix) and name[len(prefix):].isdigit() for name in os.listdir(self.data_dir))
        except FileNotFoundError:
            return False

    def size_bytes(self, topic: str, partition: int) -> int:
        """Bytes of the retained segments (the readable part of the last one)."""
        p = self._partition(topic, partition)
        with p.lock:
            self._refresh(p)
            return sum(self._segment_size(p, seg) for seg in p.segments)

    def enforce_retention(self, topic: str, partition: int) -> None:
        """Delete the oldest segments beyond ``retention_bytes`` / older than ``retention_ms``."""
        if self.retention_bytes is None and self.retention_ms is None:
            return
        p = self._partition(topic, partition)
        with p.lock:
            if not os.path.isdir(p.dir):
                return
            with self._writer_lock(p):
                self._recover(p)
                self._apply_retention(p)

    def flush(self) -> None:
        """fsync everything appended through this ``Log`` (whatever the fsync policy)."""
        for p in self._all_partitions():
            with p.lock:
                if p.dirty and p.wfd is not None:
                    _fdatasync(p.wfd)
                    p.dirty, p.synced_at = False, time.monotonic()

    def close(self) -> None:
        """Flush and release every file handle; later calls raise IllegalStateError."""
        if self._closed:
            return
        self.flush()
        with self._lock:
            self._closed = True
            parts, self._parts = list(self._parts.values()), {}
        for p in parts:
            with p.lock:
                for seg in p.segments:
                    seg.close()
                for fd in (p.wfd, p.lock_fd):
                    if fd is not None:
                        os.close(fd)
                p.segments, p.bases, p.cache, p.wfd, p.lock_fd = [], [], None, None, None

    def __enter__(self) -> "Log":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ partitions

    def _partition(self, topic: str, partition: int) -> _Partition:
        p = self._parts.get((topic, partition))
        if p is None or self._closed:
            with self._lock:
                if self._closed:
                    raise IllegalStateError("the log is closed")
                p = self._parts.get((topic, partition))
                if p is None:
                    validate_name(topic)  # also keeps the directory name inside data_dir
                    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
                        raise InvalidPartitions(f"partition must be a whole number >= 0, got {partition!r}")
                    path = os.path.join(self.data_dir, f"{topic}-{partition}")
                    p = self._parts[(topic, partition)] = _Partition(topic, partition, path)
        return p

    def _all_partitions(self) -> List[_Partition]:
        with self._lock:
            return list(self._parts.values())

    # ------------------------------------------------------------ reading

    def _refresh(self, p: _Partition, verify: bool = False) -> int:
        """Re-list the segments and index the last one to the end of its file.

        Returns the size of the last segment file (0 without segments). With ``verify`` the
        CRC of every batch of the last segment not yet verified is checked too (writers).
        """
        try:
            names = os.listdir(p.dir)
        except FileNotFoundError:
            names = []
        bases = sorted(b for b in map(_segment_base, names) if b is not None)
        known = {seg.base: seg for seg in p.segments}
        segments = [known.pop(b, None) or _Segment(b, os.path.join(p.dir, _segment_name(b))) for b in bases]
        for gone in known.values():  # deleted by retention in another process
            gone.close()
            p.cache = None
        p.segments, p.bases = segments, bases
        if not segments:
            return 0
        try:
            return self._scan(segments[-1], verify)
        except FileNotFoundError:  # deleted between listdir and open
            return self._refresh(p, verify)

    def _read(self, p: _Partition, offset: int, max_records: int, max_bytes: int) -> List[ConsumerRecord]:
        self._refresh_for(p, offset)
        if offset == p.latest:
            return []
        if offset < p.earliest or offset > p.latest:
            raise OffsetOutOfRange(p.topic, p.partition, offset, p.earliest, p.latest)
        out: List[ConsumerRecord] = []
        try:
            while max_records > 0 and offset < p.latest:
                batch = self._batch_at(p, offset)
                if batch is None:  # an incomplete tail: not written yet
                    break
                i = offset - batch.base
                j, used = batch.take(i, max_records, max_bytes, at_least_one=not out)
                if j == i:
                    break
                if j == batch.count:
                    p.cache = None  # read through; do not hold on to it
                if out:
                    out += batch.records(i, j)
                else:
                    out = batch.records(i, j)
                max_records -= j - i
                max_bytes -= used
                offset = batch.base + j
        except (LogCorrupted, OSError):
            if not out:
                raise  # the offset asked for is unreadable
            # Hand out what was read; the next read starts at the unreadable offset and raises.
        return out

    def _refresh_for(self, p: _Partition, offset: int) -> None:
        """Refresh when ``offset`` is not inside what this process has indexed (or was deleted)."""
        segs = p.segments
        if not segs or offset >= segs[-1].next_offset or offset < segs[0].base:
            self._refresh(p)
        elif segs[0].fd is not None and (len(segs) == 1 or offset < p.bases[1]) \
                and os.fstat(segs[0].fd).st_nlink == 0:
            self._refresh(p)  # the oldest segment was deleted by retention elsewhere

    def _scan(self, seg: _Segment, verify: bool) -> int:
        """Index the batches after ``seg.end`` to the end of the file.

        Returns the file size; ``seg.end < size`` afterwards means a tail that is not (yet) a
        valid batch and has no valid batch after it. Damaged bytes with a valid batch after
        them are indexed as a hole. Finding that batch takes a search of the rest of the file,
        made only where a batch does not check out (a reader repeats a fruitless search of the
        last segment only once the file has grown).
        """
        fd = seg.open()
        size = os.fstat(fd).st_size
        if size < seg.end:
            seg.cut(0)  # another writer cut a tail we had indexed: index again
        if verify and seg.verified < seg.end:
            seg.cut(bisect_left(seg.positions, seg.verified))
        chunks = _Chunks(fd)
        while True:
            pos, expected, known = seg.end, seg.next_offset, len(seg.bases)
            while size - pos >= HEADER_SIZE:
                head = chunks.read(pos, HEADER_SIZE)
                if len(head) < HEADER_SIZE:
                    break
                found = _plausible(head, pos, size)
                if found is None or found[1] != expected:
                    break
                total, base, count, max_ts = found
                if verify and not _checksum_ok(chunks.read(pos, total)):
                    break
                seg.add(base, pos, max_ts, pos + total, base + count)
                pos += total
                expected = base + count
            if not verify and len(seg.bases) > known:
                # Only the newest batch can be torn (writers append one whole batch at a time and
                # cut a torn tail before appending), so checking it keeps latest_offset honest.
                last = len(seg.bases) - 1
                if not _checksum_ok(chunks.read(seg.positions[last], seg.end - seg.positions[last])):
                    seg.cut(last)
            if seg.end == size or (not verify and seg.probed == (seg.end, size)):
                break
            found = _find_batch(fd, seg.end + 1, size, seg.next_offset)
            if found is None:  # a torn tail, or damage up to the end of the file
                seg.probed = (seg.end, size)
                break
            pos, total, base, count, max_ts = found
            seg.add_hole(seg.end, pos, base)
            seg.add(base, pos, max_ts, pos + total, base + count)
        if verify:
            seg.verified = seg.end
        return size

    def _index(self, p: _Partition, seg: _Segment) -> None:
        """Make sure a segment that is not the last one is indexed to its end (once)."""
        if seg.sealed or seg is p.segments[-1]:
            return
        self._scan(seg, verify=False)
        seg.sealed = True

    def _batch_at(self, p: _Partition, offset: int) -> Optional[_Batch]:
        """The decoded batch holding ``offset`` (cached); None at an incomplete tail;
        LogCorrupted if ``offset`` is in damaged or missing data."""
        cached = p.cache
        if cached is not None and cached.base <= offset < cached.base + cached.count:
            return cached
        i = bisect_right(p.bases, offset) - 1
        seg = p.segments[i]
        self._index(p, seg)
        if offset >= seg.next_offset:  # past what the segment holds (never the last one: offset < latest)
            raise self._gap(p, i, offset)
        k = bisect_right(seg.bases, offset) - 1
        pos, end = seg.positions[k], seg.batch_end(k)
        if seg.max_ts[k] != _HOLE:
            buf = os.pread(seg.open(), end - pos, pos)
            if len(buf) < end - pos:  # the file is shorter than indexed: cut by a writer, or damaged
                seg.cut(k)
                if seg is p.segments[-1]:
                    return None  # look again next time
                return self._batch_at(p, offset)  # index the rest of the segment again
            try:
                batch = _decode(buf, p.topic, p.partition, seg.path, pos)
            except (struct.error, ValueError) as e:
                raise self._damage(p, seg, k, offset, f"the batch of {self._entry_span(seg, k)} "
                                   f"has a valid checksum but cannot be decoded ({e})") from None
            if batch is not None:
                p.cache = batch
                return batch
        return self._unreadable(p, seg, k, offset)

    # ------------------------------------------------------------ damage (never on the path of intact data)

    def _unreadable(self, p: _Partition, seg: _Segment, k: int, offset: int) -> None:
        """Entry ``k`` of ``seg``, which holds ``offset``, is a hole or fails its checksum:
        raise LogCorrupted, unless it is a torn tail (the last segment, no valid batch after
        it), which is dropped from the index (None: not written yet)."""
        hole = seg.max_ts[k] == _HOLE
        if not hole and seg is p.segments[-1] and not self._valid_after(seg, k):
            seg.cut(k)  # a torn tail, or one a writer has since cut: look again next time
            return None
        if hole:
            size = seg.batch_end(k) - seg.positions[k]
            problem = f"{self._entry_span(seg, k)} are in {size} damaged bytes that hold no valid batch"
        else:
            problem = f"the batch of {self._entry_span(seg, k)} fails its checksum"
        raise self._damage(p, seg, k, offset, problem)

    @staticmethod
    def _valid_after(seg: _Segment, k: int) -> bool:
        """Whether an indexed batch after entry ``k`` checks out (so ``k`` is no torn tail)."""
        fd = seg.open()
        for j in range(k + 1, len(seg.bases)):
            if seg.max_ts[j] == _HOLE:
                return True  # a hole is indexed only with the valid batch found after it
            pos, end = seg.positions[j], seg.batch_end(j)
            if _checksum_ok(os.pread(fd, end - pos, pos)):
                return True
        return False

    @staticmethod
    def _entry_end(seg: _Segment, k: int) -> int:
        return seg.bases[k + 1] if k + 1 < len(seg.bases) else seg.next_offset

    def _entry_span(self, seg: _Segment, k: int) -> str:
        return _span(seg.bases[k], self._entry_end(seg, k))

    def _damage(self, p: _Partition, seg: _Segment, k: int, offset: int, problem: str) -> LogCorrupted:
        return LogCorrupted(p.topic, p.partition, offset, seg.path, seg.positions[k], problem,
                            self._entry_end(seg, k))

    @staticmethod
    def _gap(p: _Partition, i: int, offset: int) -> LogCorrupted:
        """The error for ``offset``, between the end of segment ``i`` and the next one."""
        seg, following = p.segments[i], p.segments[i + 1]
        size = os.fstat(seg.open()).st_size
        if seg.end < size:
            why = f"the last {size - seg.end} bytes of the segment hold no valid batch"
        elif size == 0:
            why = "the segment file is empty"
        else:
            why = f"the segment ends after offset {seg.next_offset - 1}"
        return LogCorrupted(p.topic, p.partition, offset, seg.path, seg.end,
                            f"{_span(seg.next_offset, following.base)} are missing: {why}, "
                            f"and the next segment starts at offset {following.base}", following.base)

    def _segment_size(self, p: _Partition, seg: _Segment) -> int:
        return seg.end if seg is p.segments[-1] else os.fstat(seg.open()).st_size

    # ------------------------------------------------------------ writing

    @contextmanager
    def _writer_lock(self, p: _Partition):
        """The cross-process writer lock of a partition, for one append (or retention pass)."""
        if p.lock_fd is None:
            os.makedirs(p.dir, exist_ok=True)
            p.lock_fd = os.open(os.path.join(p.dir, LOCK_FILE),
                                os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        fcntl.flock(p.lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(p.lock_fd, fcntl.LOCK_UN)

    def _recover(self, p: _Partition) -> _Segment:
        """Under the writer lock: see what others wrote, cut a torn tail or roll past damage;
        return the active segment."""
        size = self._refresh(p, verify=True)
        if not p.segments:
            return self._new_segment(p, 0)
        seg = p.segments[-1]
        if seg.damaged is not None:
            # Intact batches follow the damage: cutting it would lose them and hand their
            # offsets out again. Seal the segment as it is and continue in a new one.
            k = seg.damaged
            holes = seg.max_ts.count(_HOLE)
            log.warning("%s: damaged data at byte %d (lost: %s%s) is followed by intact "
                        "batches; nothing is cut, appends continue in a new segment from offset %d",
                        seg.path, seg.positions[k], self._entry_span(seg, k),
                        f"; {holes} damaged ranges in all" if holes > 1 else "", seg.next_offset)
            return self._new_segment(p, seg.next_offset)
        if size > seg.end:
            self._write_handle(p, seg)
            os.ftruncate(p.wfd, seg.end)
            _fdatasync(p.wfd)
            log.warning("%s: cut %d bytes of torn or corrupt data at byte %d (after offset %d); "
                        "earlier records are intact", seg.path, size - seg.end, seg.end, seg.next_offset - 1)
        return seg

    def _prepare_write(self, p: _Partition, size: int) -> _Segment:
        seg = self._recover(p)
        if seg.end > 0 and seg.end + size > self.segment_bytes:
            seg = self._new_segment(p, seg.next_offset)
            self._apply_retention(p)
        self._write_handle(p, seg)
        return seg

    def _write_handle(self, p: _Partition, seg: _Segment) -> None:
        if p.wbase != seg.base:
            self._close_write_handle(p)
            p.wfd = os.open(seg.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
            p.wbase = seg.base

    def _close_write_handle(self, p: _Partition) -> None:
        if p.wfd is not None:
            if p.dirty and self.fsync != "never":
                _fdatasync(p.wfd)  # a segment is durable before the next one starts
            os.close(p.wfd)
            p.wfd, p.wbase, p.dirty = None, None, False

    def _new_segment(self, p: _Partition, base: int) -> _Segment:
        if p.segments:
            p.segments[-1].sealed = True  # complete: verified and written under the lock
        self._close_write_handle(p)
        seg = _Segment(base, os.path.join(p.dir, _segment_name(base)))
        os.close(os.open(seg.path, os.O_WRONLY | os.O_CREAT, 0o644))
        if self.fsync != "never":
            dir_fd = os.open(p.dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # make the new file's directory entry durable
            finally:
                os.close(dir_fd)
        p.segments.append(seg)
        p.bases.append(base)
        return seg

    def _write(self, p: _Partition, buffers: List[bytes], pos: int) -> None:
        total = sum(map(len, buffers))
        try:
            written = os.pwritev(p.wfd, buffers, pos) if hasattr(os, "pwritev") else 0
            if written < total:  # short write (or no pwritev): write the rest plainly
                data = memoryview(b"".join(buffers))
                while written < total:
                    written += os.pwrite(p.wfd, data[written:], pos + written)
        except BaseException:
            # Never leave half a batch behind for readers to stop at: cut back to the last batch.
            try:
                os.ftruncate(p.wfd, pos)
            except OSError:
                pass
            raise
        p.dirty = True

    def _synced_after_write(self, p: _Partition) -> None:
        if self.fsync == "never":
            return
        now = time.monotonic()
        if self.fsync == "batch" or now - p.synced_at >= self.fsync_interval:
            _fdatasync(p.wfd)
            p.dirty, p.synced_at = False, now

    def _apply_retention(self, p: _Partition) -> None:
        """Under the writer lock: delete whole segments, oldest first; never the active one."""
        segs = p.segments
        if self.retention_bytes is not None:
            total = sum(self._segment_size(p, seg) for seg in segs)
            while len(segs) > 1 and total - self._segment_size(p, segs[0]) >= self.retention_bytes:
                total -= self._segment_size(p, segs[0])
                self._delete_oldest(p, "size")
        if self.retention_ms is not None:
            cutoff = int(time.time() * 1000) - self.retention_ms
            while len(segs) > 1:
                self._index(p, segs[0])
                if segs[0].max_timestamp >= cutoff:
                    return
                self._delete_oldest(p, "age")
            active = segs[-1]
            if active.next_offset > active.base and active.max_timestamp < cutoff:
                self._new_segment(p, active.next_offset)  # roll so the expired active one can go
                self._delete_oldest(p, "age")

    def _delete_oldest(self, p: _Partition, reason: str) -> None:
        seg = p.segments.pop(0)
        p.bases.pop(0)
        end = p.segments[0].base
        try:
            os.unlink(seg.path)
        except FileNotFoundError:
            pass
        seg.close()
        if p.cache is not None and p.cache.base < end:
            p.cache = None
        log.info("%s: retention (%s) deleted offsets %d..%d", seg.path, reason, seg.base, end - 1)
