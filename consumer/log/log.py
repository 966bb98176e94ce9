"""The :class:`Log`: every partition under one data directory. Reading, appending, recovery
under the writer lock, retention and the fsync policies live here; segment files and their
index in :mod:`consumer.log.segment`, the batch format in :mod:`consumer.log.batch`.

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
"""
from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import time
from bisect import bisect_right
from contextlib import contextmanager
from typing import Dict, List, Optional, Sequence, Tuple

from consumer.log.batch import Batch, Columns, Encoded, Record, decode, span
from consumer.log.segment import HOLE, Segment, segment_base, segment_name
from consumer.records import ConsumerRecord
from coordinator.errors import (IllegalStateError, InvalidConfig, InvalidPartitions, LogCorrupted,
                                OffsetOutOfRange)
from coordinator.protocol import validate_name

log = logging.getLogger("zkgroups.log")

LOCK_FILE = "writer.lock"
FSYNC_POLICIES = ("batch", "interval", "never")
DEFAULT_SEGMENT_BYTES = 64 << 20

_fdatasync = getattr(os, "fdatasync", os.fsync)


class _Partition:
    """Per-partition state of one :class:`Log`; every field is guarded by ``lock``."""

    def __init__(self, topic: str, partition: int, path: str):
        self.topic, self.partition, self.dir = topic, partition, path
        self.lock = threading.RLock()
        self.segments: List[Segment] = []
        self.bases: List[int] = []         # segment base offsets, for bisect
        self.cache: Optional[Batch] = None
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
                 retention_ms: Optional[int] = None) -> None:
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
        batch = Encoded(records)  # encoded and checksummed before any lock is taken
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
        parts = self._locked_read(topic, partition, offset, max_records, max_bytes, Batch.records)
        out = parts[0] if parts else []
        for part in parts[1:]:
            out += part
        return out

    def fetch_columns(self, topic: str, partition: int, offset: int, max_records: int = 500,
                      max_bytes: int = 1 << 20) -> List[Columns]:
        """What :meth:`fetch` returns, column by column (one :class:`Columns` per stored batch
        it spans, in offset order), without building an object per record: for readers that
        want arrays (Arrow), not records."""
        return self._locked_read(topic, partition, offset, max_records, max_bytes, Batch.columns)

    def _locked_read(self, topic: str, partition: int, offset: int, max_records: int, max_bytes: int, build) -> list:
        p = self._partition(topic, partition)
        with p.lock:
            try:
                return self._read(p, offset, max_records, max_bytes, build)
            except FileNotFoundError:  # a segment went away under us (retention elsewhere)
                self._refresh(p)
                return self._read(p, offset, max_records, max_bytes, build)

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

    def __exit__(self, *exc: object) -> None:
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
        bases = sorted(b for b in map(segment_base, names) if b is not None)
        known = {seg.base: seg for seg in p.segments}
        segments = [known.pop(b, None) or Segment(b, os.path.join(p.dir, segment_name(b))) for b in bases]
        for gone in known.values():  # deleted by retention in another process
            gone.close()
            p.cache = None
        p.segments, p.bases = segments, bases
        if not segments:
            return 0
        try:
            return segments[-1].scan(verify)
        except FileNotFoundError:  # deleted between listdir and open
            return self._refresh(p, verify)

    def _read(self, p: _Partition, offset: int, max_records: int, max_bytes: int, build) -> list:
        """``build(batch, i, j)`` of each stored batch's stretch of what is read, in order."""
        self._refresh_for(p, offset)
        if offset == p.latest:
            return []
        if offset < p.earliest or offset > p.latest:
            raise OffsetOutOfRange(p.topic, p.partition, offset, p.earliest, p.latest)
        parts: list = []
        try:
            while max_records > 0 and offset < p.latest:
                batch = self._batch_at(p, offset)
                if batch is None:  # an incomplete tail: not written yet
                    break
                i = offset - batch.base
                j, used = batch.take(i, max_records, max_bytes, at_least_one=not parts)
                if j == i:
                    break
                if j == batch.count:
                    p.cache = None  # read through; do not hold on to it
                parts.append(build(batch, i, j))
                max_records -= j - i
                max_bytes -= used
                offset = batch.base + j
        except (LogCorrupted, OSError):
            if not parts:
                raise  # the offset asked for is unreadable
            # Hand out what was read; the next read starts at the unreadable offset and raises.
        return parts

    def _refresh_for(self, p: _Partition, offset: int) -> None:
        """Refresh when ``offset`` is not inside what this process has indexed (or was deleted)."""
        segs = p.segments
        if not segs or offset >= segs[-1].next_offset or offset < segs[0].base:
            self._refresh(p)
        elif segs[0].fd is not None and (len(segs) == 1 or offset < p.bases[1]) \
                and os.fstat(segs[0].fd).st_nlink == 0:
            self._refresh(p)  # the oldest segment was deleted by retention elsewhere

    def _index(self, p: _Partition, seg: Segment) -> None:
        """Make sure a segment that is not the last one is indexed to its end (once)."""
        if seg.sealed or seg is p.segments[-1]:
            return
        seg.scan(verify=False)
        seg.sealed = True

    def _batch_at(self, p: _Partition, offset: int) -> Optional[Batch]:
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
        if seg.max_ts[k] != HOLE:
            buf = os.pread(seg.open(), end - pos, pos)
            if len(buf) < end - pos:  # the file is shorter than indexed: cut by a writer, or damaged
                seg.cut(k)
                if seg is p.segments[-1]:
                    return None  # look again next time
                return self._batch_at(p, offset)  # index the rest of the segment again
            try:
                batch = decode(buf, p.topic, p.partition, seg.path, pos)
            except (struct.error, ValueError) as e:
                raise self._damage(p, seg, k, offset, f"the batch of {seg.entry_span(k)} "
                                   f"has a valid checksum but cannot be decoded ({e})") from None
            if batch is not None:
                p.cache = batch
                return batch
        return self._unreadable(p, seg, k, offset)

    # ------------------------------------------------------------ damage (never on the path of intact data)

    def _unreadable(self, p: _Partition, seg: Segment, k: int, offset: int) -> None:
        """Entry ``k`` of ``seg``, which holds ``offset``, is a hole or fails its checksum:
        raise LogCorrupted, unless it is a torn tail (the last segment, no valid batch after
        it), which is dropped from the index (None: not written yet)."""
        hole = seg.max_ts[k] == HOLE
        if not hole and seg is p.segments[-1] and not seg.valid_after(k):
            seg.cut(k)  # a torn tail, or one a writer has since cut: look again next time
            return None
        if hole:
            size = seg.batch_end(k) - seg.positions[k]
            problem = f"{seg.entry_span(k)} are in {size} damaged bytes that hold no valid batch"
        else:
            problem = f"the batch of {seg.entry_span(k)} fails its checksum"
        raise self._damage(p, seg, k, offset, problem)

    def _damage(self, p: _Partition, seg: Segment, k: int, offset: int, problem: str) -> LogCorrupted:
        return LogCorrupted(p.topic, p.partition, offset, seg.path, seg.positions[k], problem,
                            seg.entry_end(k))

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
                            f"{span(seg.next_offset, following.base)} are missing: {why}, "
                            f"and the next segment starts at offset {following.base}", following.base)

    def _segment_size(self, p: _Partition, seg: Segment) -> int:
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

    def _recover(self, p: _Partition) -> Segment:
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
            holes = seg.max_ts.count(HOLE)
            log.warning("%s: damaged data at byte %d (lost: %s%s) is followed by intact "
                        "batches; nothing is cut, appends continue in a new segment from offset %d",
                        seg.path, seg.positions[k], seg.entry_span(k),
                        f"; {holes} damaged ranges in all" if holes > 1 else "", seg.next_offset)
            return self._new_segment(p, seg.next_offset)
        if size > seg.end:
            self._write_handle(p, seg)
            os.ftruncate(p.wfd, seg.end)
            _fdatasync(p.wfd)
            log.warning("%s: cut %d bytes of torn or corrupt data at byte %d (after offset %d); "
                        "earlier records are intact", seg.path, size - seg.end, seg.end, seg.next_offset - 1)
        return seg

    def _prepare_write(self, p: _Partition, size: int) -> Segment:
        seg = self._recover(p)
        if seg.end > 0 and seg.end + size > self.segment_bytes:
            seg = self._new_segment(p, seg.next_offset)
            self._apply_retention(p)
        self._write_handle(p, seg)
        return seg

    def _write_handle(self, p: _Partition, seg: Segment) -> None:
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

    def _new_segment(self, p: _Partition, base: int) -> Segment:
        if p.segments:
            p.segments[-1].sealed = True  # complete: verified and written under the lock
        self._close_write_handle(p)
        seg = Segment(base, os.path.join(p.dir, segment_name(base)))
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
