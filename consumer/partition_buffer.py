"""One partition's side of the fetcher: where it stands and the records it buffers.

A :class:`PartitionBuffer` holds a partition's two offsets (the next one ``poll()`` returns, the
next one to ask the log for), its buffered chunks (lists of records, or the log's
:class:`~consumer.log.Columns`), its pause, a parked fetch error and when it is next due for
a read. :meth:`PartitionBuffer.take` and :meth:`PartitionBuffer.take_columns` hand records
out of the chunks with no per-record work. The fetcher (:mod:`consumer.fetcher`) owns one per
assigned partition and touches it only under its lock; a data plane's fetcher may subclass it
to buffer its own form of records (``consumer.dataplane.kafka``).

Not thread-safe by itself; no I/O.
"""
from __future__ import annotations

from collections import deque
from typing import List, Optional, Tuple

from consumer.log.batch import Columns
from consumer.records import ConsumerRecord, TopicPartition


class PartitionBuffer:
    """One assigned partition in a fetcher: its positions, buffered chunks, pause, parked error
    and idle schedule. Mutable; only touched under the owning fetcher's lock."""

    __slots__ = ("tp", "position", "fetch_offset", "chunks", "idx", "count", "epoch",
                 "paused", "error", "unreported", "next_fetch", "highwater")

    def __init__(self, tp: TopicPartition, offset: int, epoch: int):
        self.tp = tp
        self.position = offset        # next offset poll() returns
        self.fetch_offset = offset    # next offset to ask the log for
        self.chunks: deque = deque()  # lists of records, or Columns; chunks[0][idx:] is next in line
        self.idx = 0
        self.count = 0                # buffered records
        self.epoch = epoch
        self.paused = False
        self.error: Optional[BaseException] = None  # a fetch failed: parked until seek/assign
        self.unreported: Optional[int] = None  # offset of a parked error waiting for the buffer to drain
        self.next_fetch = 0.0         # monotonic time before which we do not fetch
        self.highwater: Optional[int] = None

    def reset(self, offset: int, epoch: int) -> None:
        self.position = self.fetch_offset = offset
        self.chunks.clear()
        self.idx = self.count = 0
        self.epoch = epoch
        self.error = self.unreported = None
        self.next_fetch = 0.0

    def refetch(self, epoch: int) -> None:
        """Drop the buffer and read again from the position. A parked error stays parked
        unless records read before it are dropped (read again, they lead to it again)."""
        if self.count:
            self.error = self.unreported = None
        self.fetch_offset = self.position
        self.chunks.clear()
        self.idx = self.count = 0
        self.epoch = epoch

    def take(self, n: int) -> List[ConsumerRecord]:
        """Remove and return up to ``n`` (>= 1) buffered records; no per-record work."""
        out = self._take_items(n)
        self.position = out[-1].offset + 1
        return out

    def chunk_of(self, records: List[ConsumerRecord]) -> list:
        """What ``records`` (handed out by :meth:`take`) were as a buffered chunk."""
        return records

    def given_back(self, items: list) -> Tuple[int, int, list]:
        """(first offset, end offset, the chunks to put back in front) of what a poll took
        (:meth:`take`'s records or :meth:`take_columns`' Columns)."""
        if isinstance(items[0], Columns):
            return items[0].base, items[-1].end, list(items)
        return items[0].offset, items[-1].offset + 1, [self.chunk_of(items)]

    def _take_items(self, n: int) -> list:
        """Remove and return up to ``n`` (>= 1) buffered items, in order, from the chunks."""
        chunks = self.chunks
        head = chunks[0]
        i = self.idx
        avail = len(head) - i
        if avail > n:
            out = head[i:i + n]
            self.idx = i + n
        else:
            out = head[i:] if i else head
            chunks.popleft()
            self.idx = 0
            need = n - avail
            copied = bool(i)
            while need and chunks:
                head = chunks[0]
                if not copied:        # never mutate a list the log handed us
                    out = list(out)
                    copied = True
                if len(head) <= need:
                    out.extend(head)
                    chunks.popleft()
                    need -= len(head)
                else:
                    out.extend(head[:need])
                    self.idx = need
                    need = 0
        self.count -= len(out)
        return out

    def take_columns(self, n: int) -> List[Columns]:
        """Remove and return up to ``n`` (>= 1) buffered records held as Columns."""
        chunks, out, left = self.chunks, [], n
        while left and chunks:
            head, i = chunks[0], self.idx
            avail = head.count - i
            if avail > left:
                out.append(head.slice(i, i + left))
                self.idx = i + left
                left = 0
                break
            out.append(head.slice(i, head.count) if i else head)
            chunks.popleft()
            self.idx = 0
            left -= avail
        self.count -= n - left
        self.position = out[-1].end
        return out


def rest_of(chunk, i: int):
    """What is left of a buffered chunk (a list of records or Columns) from its ``i``-th record."""
    return chunk.slice(i, chunk.count) if isinstance(chunk, Columns) else chunk[i:]
