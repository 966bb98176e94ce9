"""Segment files: one file of batches (see :mod:`consumer.log.batch`), its in-memory index,
and the search for the next valid batch after damaged bytes.

A segment is named by its base offset (``00000000000000000000.log``) and holds whole batches
back to back, their offsets continuing one another. :class:`Segment` indexes the batch headers
of its file (24 bytes per batch: base offset, byte position, max timestamp), reading bodies
only to check a CRC, and tells a torn tail from damage: a bad batch (failing header or
checksum) is a tail when no valid batch follows it in the file, else *damage*, indexed as a
hole so the batches after it stay readable. What a torn tail or damage means for readers and
writers of a partition is :class:`~consumer.log.Log`'s business.

Damage is found by the search for the next valid batch after bytes that do not parse: one
pass over the rest of that segment file (a regex finds candidate headers; only well-formed
ones are checksummed), made once per damaged spot and process (again by a reader of the last
segment once the file has grown), never on the path of intact data, which costs what it did:
two comparisons per batch read, none per record.
"""
from __future__ import annotations

import os
import re
from array import array
from bisect import bisect_left
from typing import Optional, Tuple

from consumer.log.batch import HEADER_SIZE, checksum_ok, plausible, span

SEGMENT_SUFFIX = ".log"
HOLE = -(1 << 63)                   # max timestamp of an index entry that stands for damaged bytes
_SCAN_CHUNK = 64 << 10              # read-ahead when indexing batch headers
_PROBE_CHUNK = 1 << 20              # read size when searching damaged bytes for the next batch
# What the search for the next batch after damaged bytes looks for, at a header's magic byte
# (byte 8; the header layout is batch.py's, magic 1): a length (bytes 0..3) of at least 36 and
# below 2**31, then magic, flags below 32 and zero reserved bytes (8..11). The regex does in C
# what would otherwise be Python work per candidate; each match is then parsed and checksummed.
# Only the magic byte is consumed, so overlapping candidates are all found.
_HEADER_MARK = re.compile(rb"\x01(?=[\x00-\x1f]\x00\x00)"  # the magic byte first: a fast literal search
                          rb"(?<![\x00-\x23]\x00\x00\x00[\s\S]{4}\x01)(?<=[\x00-\x7f][\s\S]{4}\x01)")
_MARK_AT, _MARK_LEN = 8, 4


def segment_name(base: int) -> str:
    return f"{base:020d}{SEGMENT_SUFFIX}"


def segment_base(name: str) -> Optional[int]:
    stem = name[:-len(SEGMENT_SUFFIX)]
    if name.endswith(SEGMENT_SUFFIX) and len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


class Segment:
    """One segment file and the in-memory index of its batches (base offset, position, max ts).

    Damaged bytes followed by an intact batch are indexed too, as a *hole*: an entry whose max
    timestamp is ``HOLE``, covering the offsets from the last intact batch before it to the
    next intact one (none, if the damage lost no offset). So every offset up to ``next_offset``
    has an entry, and finding it stays one bisect.

    The index only grows at its end (``add``, ``add_hole``) or is cut back (``cut``); ``sealed``
    once it is known complete. Not locked itself: its partition's lock guards it.
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
        self.add(self.next_offset, pos, HOLE, end, next_offset)

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

    def scan(self, verify: bool) -> int:
        """Index the batches after ``end`` to the end of the file.

        Returns the file size; ``end < size`` afterwards means a tail that is not (yet) a
        valid batch and has no valid batch after it. Damaged bytes with a valid batch after
        them are indexed as a hole. Finding that batch takes a search of the rest of the file,
        made only where a batch does not check out (a reader repeats a fruitless search of the
        last segment only once the file has grown).
        """
        fd = self.open()
        size = os.fstat(fd).st_size
        if size < self.end:
            self.cut(0)  # another writer cut a tail we had indexed: index again
        if verify and self.verified < self.end:
            self.cut(bisect_left(self.positions, self.verified))
        chunks = _Chunks(fd)
        while True:
            pos, expected, known = self.end, self.next_offset, len(self.bases)
            while size - pos >= HEADER_SIZE:
                head = chunks.read(pos, HEADER_SIZE)
                if len(head) < HEADER_SIZE:
                    break
                found = plausible(head, pos, size)
                if found is None or found[1] != expected:
                    break
                total, base, count, max_ts = found
                if verify and not checksum_ok(chunks.read(pos, total)):
                    break
                self.add(base, pos, max_ts, pos + total, base + count)
                pos += total
                expected = base + count
            if not verify and len(self.bases) > known:
                # Only the newest batch can be torn (writers append one whole batch at a time and
                # cut a torn tail before appending), so checking it keeps latest_offset honest.
                last = len(self.bases) - 1
                if not checksum_ok(chunks.read(self.positions[last], self.end - self.positions[last])):
                    self.cut(last)
            if self.end == size or (not verify and self.probed == (self.end, size)):
                break
            found = _find_batch(fd, self.end + 1, size, self.next_offset)
            if found is None:  # a torn tail, or damage up to the end of the file
                self.probed = (self.end, size)
                break
            pos, total, base, count, max_ts = found
            self.add_hole(self.end, pos, base)
            self.add(base, pos, max_ts, pos + total, base + count)
        if verify:
            self.verified = self.end
        return size

    def valid_after(self, k: int) -> bool:
        """Whether an indexed batch after entry ``k`` checks out (so ``k`` is no torn tail)."""
        fd = self.open()
        for j in range(k + 1, len(self.bases)):
            if self.max_ts[j] == HOLE:
                return True  # a hole is indexed only with the valid batch found after it
            pos, end = self.positions[j], self.batch_end(j)
            if checksum_ok(os.pread(fd, end - pos, pos)):
                return True
        return False

    def entry_end(self, k: int) -> int:
        """The offset after index entry ``k``: where reading resumes past it."""
        return self.bases[k + 1] if k + 1 < len(self.bases) else self.next_offset

    def entry_span(self, k: int) -> str:
        """The offsets of index entry ``k``, in words."""
        return span(self.bases[k], self.entry_end(k))


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
            found = plausible(head, pos, size)
            if found is not None and found[1] >= expected and checksum_ok(os.pread(fd, found[0], pos)):
                return (pos, *found)
        # The next chunk starts so that its first candidate mark is the one after the last
        # mark that fitted in this chunk, with the header bytes before it.
        chunk_at += len(chunk) - (_MARK_AT + _MARK_LEN - 1)
    return None
