"""Where a worker cuts each partition's records into batches: pure logic, no I/O.

Batches
-------
Without ``align`` a batch is whatever one ``poll()`` returned (up to ``max_poll_records``).
With ``align=N`` batch boundaries do not depend on timing: a partition's records are cut at
offsets that are multiples of N, at the drain snapshot, or where ``batch_end(tp, start)``
says (a sink returns the end of a batch it already wrote, so a redone batch is cut exactly
as before). A batch holds at most one contiguous run of records per partition. This is
what an exactly-once sink needs: write each (partition, start, end) range idempotently,
e.g. to a file named by it, and a batch redone after a failure overwrites the same output.

The cut of a batch that starts at offset S (:func:`batch_cut`):

1. ``batch_end(tp, S)``, if it names an end past S: that end, *fixed*;
2. otherwise the next multiple of ``align`` above S (with ``align``; else no cut);
3. in a drain, the partition's snapshot instead if it comes first or there is no multiple:
   *fixed*.

A fixed cut is never moved earlier: a stopping stream does not flush a partial batch whose
end is fixed. In a drain, records at or past a partition's *limit* (:func:`drain_limit`)
are not processed: the limit is the snapshot, or a fixed cut beyond it, so that a redone
batch is rewritten whole. Partitions outside the snapshot have a snapshot of 0: nothing of
them is drained.

Runs
----
A partition's records are a *run*: a list of :class:`~consumer.records.ConsumerRecord`
(what ``poll()`` returns), or a :class:`ColumnRun` (what ``poll_columns()`` returns on the
embedded log: the log's :class:`~consumer.log.Columns`, no object per record). The cutter
takes either, one kind per partition run, and hands out the same kind.

Guaranteed: what :class:`BatchCutter` hands out for a partition is contiguous, starts where
the previous batch of the same run ended and never runs past the cut; with ``align`` it ends
exactly at the cut (a stopping stream's partial batches aside). Not handled here: what was
processed or committed (the worker's business). Records that do not follow the run start a
new one (positions jumped); the caller is told.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from consumer.log import Columns
from consumer.records import ConsumerRecord, TopicPartition

#: ``batch_end(tp, start)``: the end of a batch already written from ``start``, or None.
BatchEnd = Callable[[TopicPartition, int], Optional[int]]


class ColumnRun:
    """A contiguous run of one partition's records held as the log's Columns (``parts``, in
    offset order), with the slice operations a run of records has: ``len``, ``run[a:b]``
    (a new run), ``del run[:k]``, ``extend``. Array slices only, no object per record.
    Threads: none; whoever holds it."""

    __slots__ = ("parts", "count")

    def __init__(self, parts: Sequence[Columns] = ()):
        self.parts: List[Columns] = [c for c in parts if c.count]
        self.count = sum(c.count for c in self.parts)

    @property
    def first_offset(self) -> int:
        return self.parts[0].base

    @property
    def end_offset(self) -> int:
        return self.parts[-1].end

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, item: slice) -> "ColumnRun":
        start, stop, step = item.indices(self.count)
        if step != 1:
            raise ValueError("a run is sliced with step 1 only")
        return ColumnRun(self._between(start, stop))

    def __delitem__(self, item: slice) -> None:
        start, stop, _ = item.indices(self.count)
        if start != 0:
            raise ValueError("only a run's head is deleted")
        self.parts = list(self._between(stop, self.count))
        self.count -= max(0, stop)

    def extend(self, other: "ColumnRun") -> None:
        self.parts.extend(other.parts)
        self.count += other.count

    def records(self, tp: TopicPartition) -> List[ConsumerRecord]:
        """The run's records as objects (for a user function that wants them)."""
        out: List[ConsumerRecord] = []
        for c in self.parts:
            out += c.records(tp.topic, tp.partition)
        return out

    def _between(self, start: int, stop: int) -> Iterator[Columns]:
        """The parts' slices covering records ``start`` to ``stop - 1`` of the run."""
        at = 0
        for c in self.parts:
            i, j = max(start - at, 0), min(stop - at, c.count)
            if i < j:
                yield c if (i, j) == (0, c.count) else c.slice(i, j)
            at += c.count
            if at >= stop:
                break

    def __repr__(self) -> str:
        return f"ColumnRun([{self.first_offset}, {self.end_offset}))" if self.count else "ColumnRun([])"


#: A partition's run of records: record objects, or their columns.
Run = Union[List[ConsumerRecord], ColumnRun]


def first_offset(run: Run) -> int:
    """The offset of a non-empty run's first record."""
    return run.first_offset if isinstance(run, ColumnRun) else run[0].offset


def end_offset(run: Run) -> int:
    """The offset after a non-empty run's last record."""
    return run.end_offset if isinstance(run, ColumnRun) else run[-1].offset + 1


def batch_cut(start: int, align: Optional[int], snapshot: Optional[int],
              known_end: Optional[int]) -> Tuple[Optional[int], bool]:
    """``(cut, fixed)`` of the batch that starts at ``start`` (see the module docstring).
    ``snapshot``: the partition's drain snapshot (None: not draining); ``known_end``: what
    ``batch_end`` said. ``cut`` None: the batch ends wherever the records run out."""
    if known_end is not None and known_end > start:
        return int(known_end), True
    cut = (start // align + 1) * align if align else None
    if snapshot is not None and (cut is None or snapshot <= cut):
        return snapshot, True
    return cut, False


def drain_limit(snapshot: Optional[int], cut: Optional[int], fixed: bool) -> Optional[int]:
    """Offset at which a partition's records stop being processed (None: never)."""
    if snapshot is None:
        return None
    return max(snapshot, cut) if fixed and cut is not None else snapshot


class _Run:
    """Records of one partition fetched but not processed yet, and where the batch ends."""

    __slots__ = ("start", "records", "cut", "fixed")

    def __init__(self, start: int, empty: Run):
        self.start = start
        self.records: Run = empty          # records or columns, as they came
        self.cut: Optional[int] = None   # end offset of the current batch (None: unbounded)
        self.fixed = False               # cut decided by batch_end() or the drain snapshot: never cut earlier

    @property
    def next_offset(self) -> int:
        return self.start + len(self.records)


@dataclass
class Accepted:
    """What :meth:`BatchCutter.accept` found besides the records it kept."""
    #: drain: partitions fetched up to their limit (nothing more of them is needed)
    complete: List[TopicPartition] = field(default_factory=list)
    #: (partition, expected offset, offset received): records that did not follow the run
    jumps: List[Tuple[TopicPartition, int, int]] = field(default_factory=list)


class BatchCutter:
    """The runs of records a worker fetched and has not processed, cut into batches.

    ``snapshot``: the drain snapshot (end offset per partition; None: a stream, no limit).
    ``batch_end`` is the only call out (a sink's lookup of what it already wrote).

    A partition is either absent (its next records start a run) or has a run: ``accept``
    starts or extends it, ``processed`` moves its start past a processed batch and cuts the
    next one, and it becomes absent again when ``forget`` is called (revoked, lost, commit
    refused) or, in a drain, when everything below its limit was processed.

    Threads: none of its own and no lock; only the worker's task thread uses it (the
    consumer's rebalance callbacks, which call ``forget``, run inside ``poll()`` there).
    """

    def __init__(self, align: Optional[int] = None, snapshot: Optional[Dict[TopicPartition, int]] = None,
                 batch_end: Optional[BatchEnd] = None):
        self.align, self.snapshot, self.batch_end = align, snapshot, batch_end
        self.runs: Dict[TopicPartition, _Run] = {}

    def accept(self, records: Dict[TopicPartition, Run]) -> Accepted:
        """Add what ``poll()`` (or ``poll_columns()``, as ColumnRuns) returned; in a drain,
        drop records at or past the limit."""
        found = Accepted()
        for tp, recs in records.items():
            if not recs:
                continue
            first = first_offset(recs)
            run = self.runs.get(tp)
            if run is not None and type(run.records) is not type(recs):
                raise TypeError(f"{tp}: records and columns in one run")  # one poll kind per worker
            if run is None or run.next_offset != first:
                if run is not None:  # cannot happen unless positions jumped (reset): start over
                    found.jumps.append((tp, run.next_offset, first))
                run = self.runs[tp] = _Run(first, recs[:0])
                self._cut(tp, run)
            limit = self._limit(tp, run)
            if limit is not None and end_offset(recs) >= limit:
                recs = recs[:max(0, limit - first)]
                found.complete.append(tp)
            run.records.extend(recs)
            if not run.records and (limit is not None and run.start >= limit):
                del self.runs[tp]
        return found

    def ready(self) -> Dict[TopicPartition, Run]:
        """The next batch: at most one contiguous run per partition whose batch is complete."""
        out = {}
        for tp, run in self.runs.items():
            if not run.records:
                continue
            if run.cut is None:
                take = len(run.records)
            elif run.next_offset >= run.cut:
                take = run.cut - run.start
            elif self.align:
                continue  # wait for the rest of the batch
            else:
                take = len(run.records)
            if take > 0:
                out[tp] = run.records[:take]
        return out

    def partial(self) -> Dict[TopicPartition, Run]:
        """On stop: the incomplete batches, except where the end is fixed."""
        return {tp: run.records[:] for tp, run in self.runs.items() if run.records and not run.fixed}

    def processed(self, batch: Dict[TopicPartition, Run]) -> bool:
        """``batch`` (from ``ready`` or ``partial``) was processed: cut what follows it.
        True if a partition reached its drain limit."""
        finished = False
        for tp, recs in batch.items():
            run = self.runs.get(tp)
            if run is None:
                continue
            end = end_offset(recs)
            del run.records[:end - run.start]
            run.start = end
            limit = self._limit(tp, run)
            if limit is not None and end >= limit:
                finished = True
                if not run.records:
                    del self.runs[tp]
                    continue
            self._cut(tp, run)
        return finished

    def forget(self, partitions) -> None:
        """Drop the runs of ``partitions``: their next records start afresh."""
        for tp in partitions:
            self.runs.pop(tp, None)

    def _snapshot(self, tp: TopicPartition) -> Optional[int]:
        return None if self.snapshot is None else self.snapshot.get(tp, 0)

    def _limit(self, tp: TopicPartition, run: _Run) -> Optional[int]:
        return drain_limit(self._snapshot(tp), run.cut, run.fixed)

    def _cut(self, tp: TopicPartition, run: _Run) -> None:
        known = self.batch_end(tp, run.start) if self.batch_end is not None else None
        run.cut, run.fixed = batch_cut(run.start, self.align, self._snapshot(tp), known)
