"""Table-driven tests of where a Spark worker cuts partitions into batches
(consumer.spark.batching: pure, no Spark, no ZooKeeper)."""
from __future__ import annotations

import random

import pytest

from consumer.records import ConsumerRecord, TopicPartition
from consumer.spark.batching import BatchCutter, batch_cut, drain_limit


def tp(p: int) -> TopicPartition:
    return TopicPartition("t", p)


def records(p: int, first: int, end: int):
    return [ConsumerRecord("t", p, o, 0, None, b"") for o in range(first, end)]


def ranges(batch):
    """{partition: (start, end)} of a batch, checking that each partition's run is contiguous."""
    out = {}
    for t, recs in batch.items():
        offsets = [r.offset for r in recs]
        assert offsets == list(range(offsets[0], offsets[-1] + 1)), offsets
        out[t.partition] = (offsets[0], offsets[-1] + 1)
    return out


def cut(polls, align=None, snapshot=None, ends=None, stop=False):
    """Feed ``polls`` (each ``{partition: (first offset, end offset)}`` of records) to a
    BatchCutter as a worker does: accept a poll, then process every batch that is ready; on
    ``stop``, process the partial batches too. Returns the batches cut, as ranges."""
    cutter = BatchCutter(align, None if snapshot is None else {tp(p): e for p, e in snapshot.items()},
                         None if ends is None else (lambda t, start: ends.get((t.partition, start))))
    out = []

    def process(batch):
        out.append(ranges(batch))
        cutter.processed(batch)

    for poll in polls:
        cutter.accept({tp(p): records(p, a, b) for p, (a, b) in poll.items()})
        ready = cutter.ready()
        while ready:
            process(ready)
            ready = cutter.ready()
    if stop:
        partial = cutter.partial()
        if partial:
            process(partial)
    return out


# ---------------------------------------------------------------- the cut of one batch

@pytest.mark.parametrize("start,align,snapshot,known,expected", [
    # no align, no snapshot: the batch ends wherever the records run out
    (0, None, None, None, (None, False)),
    # multiples of align, from any start
    (0, 10, None, None, (10, False)),
    (13, 10, None, None, (20, False)),
    (20, 10, None, None, (30, False)),
    # the drain snapshot when it comes first, or when there is no multiple: fixed
    (20, 10, 25, None, (25, True)),
    (20, 10, 30, None, (30, True)),
    (20, 10, 31, None, (30, False)),
    (0, None, 25, None, (25, True)),
    (30, 10, 25, None, (25, True)),      # already past the snapshot
    # a batch the sink already wrote from here: its end, fixed, before any other rule
    (20, 10, None, 27, (27, True)),
    (20, 10, 24, 27, (27, True)),        # even past the snapshot
    (20, None, None, 57, (57, True)),
    # an end that is not past the start is not a batch
    (20, 10, None, 20, (30, False)),
    (20, 10, 25, 3, (25, True)),
])
def test_batch_cut(start, align, snapshot, known, expected):
    assert batch_cut(start, align, snapshot, known) == expected


@pytest.mark.parametrize("snapshot,cut_at,fixed,expected", [
    (None, 30, False, None),             # a stream: no limit
    (None, 27, True, None),
    (25, 30, False, 25),                 # the snapshot
    (25, 20, True, 25),
    (24, 27, True, 27),                  # a redone batch ending past the snapshot is redone whole
    (25, None, False, 25),
])
def test_drain_limit(snapshot, cut_at, fixed, expected):
    assert drain_limit(snapshot, cut_at, fixed) == expected


# ---------------------------------------------------------------- batches cut from polls

CASES = {
    "no align: a batch per poll": dict(
        polls=[{0: (0, 5), 1: (0, 3)}, {0: (5, 8)}],
        batches=[{0: (0, 5), 1: (0, 3)}, {0: (5, 8)}]),
    "align: multiples of the batch size, whatever the polls": dict(
        align=10, polls=[{0: (0, 7)}, {0: (7, 25)}, {0: (25, 31)}],
        batches=[{0: (0, 10)}, {0: (10, 20)}, {0: (20, 30)}]),
    "align: a start between multiples is cut at the next one": dict(
        align=10, polls=[{0: (13, 31)}],
        batches=[{0: (13, 20)}, {0: (20, 30)}]),
    "align: one run per partition per batch": dict(
        align=10, polls=[{0: (0, 25), 1: (0, 10), 2: (0, 4)}],
        batches=[{0: (0, 10), 1: (0, 10)}, {0: (10, 20)}]),
    "align: a stopping stream flushes its partial batches": dict(
        align=10, polls=[{0: (0, 25), 1: (0, 4)}], stop=True,
        batches=[{0: (0, 10)}, {0: (10, 20)}, {0: (20, 25), 1: (0, 4)}]),
    "drain, align: cut at the snapshot, nothing past it": dict(
        align=10, snapshot={0: 25}, polls=[{0: (0, 40)}],
        batches=[{0: (0, 10)}, {0: (10, 20)}, {0: (20, 25)}]),
    "drain, no align: as polled, up to the snapshot": dict(
        snapshot={0: 25}, polls=[{0: (0, 12)}, {0: (12, 30)}],
        batches=[{0: (0, 12)}, {0: (12, 25)}]),
    "drain: a batch ending at the snapshot is not flushed early on stop": dict(
        align=10, snapshot={0: 25}, polls=[{0: (20, 23)}], stop=True,
        batches=[]),
    "drain: a partition outside the snapshot is not drained": dict(
        snapshot={0: 10}, polls=[{0: (0, 10), 1: (0, 5)}],
        batches=[{0: (0, 10)}]),
    "drain: a partition already at its snapshot": dict(
        snapshot={0: 5}, polls=[{0: (5, 9)}],
        batches=[]),
    "redone: cut where the written batch ended, then multiples again": dict(
        align=10, ends={(0, 20): 27}, polls=[{0: (20, 45)}],
        batches=[{0: (20, 27)}, {0: (27, 30)}, {0: (30, 40)}]),
    "redone: waits for the whole written batch": dict(
        align=10, ends={(0, 20): 27}, polls=[{0: (20, 25)}, {0: (25, 26)}, {0: (26, 28)}],
        batches=[{0: (20, 27)}]),
    "redone: a written batch past the snapshot is redone whole": dict(
        align=10, snapshot={0: 24}, ends={(0, 20): 27}, polls=[{0: (20, 40)}],
        batches=[{0: (20, 27)}]),
    "redone: a stopping stream does not flush a written batch partly": dict(
        align=10, ends={(0, 0): 7}, polls=[{0: (0, 5), 1: (0, 5)}], stop=True,
        batches=[{1: (0, 5)}]),
    "no align: a written batch's end caps a batch, nothing waits for it": dict(
        ends={(0, 0): 7, (0, 10): 14}, polls=[{0: (0, 10)}, {0: (10, 12)}],
        batches=[{0: (0, 7)}, {0: (7, 10)}, {0: (10, 12)}]),
    "an end that is not past the start is ignored": dict(
        align=10, ends={(0, 20): 20}, polls=[{0: (20, 30)}],
        batches=[{0: (20, 30)}]),
    "positions jumped: the run starts over where the records are": dict(
        align=10, polls=[{0: (0, 5)}, {0: (8, 12)}],
        batches=[{0: (8, 10)}]),
}


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_batches_cut(case):
    case = dict(case)
    expected = case.pop("batches")
    assert cut(**case) == expected


def test_accept_reports_partitions_fetched_to_their_limit_and_jumps():
    cutter = BatchCutter(10, {tp(0): 25, tp(1): 100})
    found = cutter.accept({tp(0): records(0, 0, 30), tp(1): records(1, 0, 5), tp(2): records(2, 0, 1)})
    assert found.complete == [tp(0), tp(2)]  # t-2 is outside the snapshot: its limit is 0
    assert found.jumps == []
    found = cutter.accept({tp(1): records(1, 7, 9)})
    assert found.jumps == [(tp(1), 5, 7)] and found.complete == []


def test_forget_drops_a_partition_run():
    cutter = BatchCutter(10)
    cutter.accept({tp(0): records(0, 0, 15), tp(1): records(1, 0, 5)})
    cutter.forget([tp(0)])
    assert ranges(cutter.ready()) == {}
    assert ranges(cutter.partial()) == {1: (0, 5)}
    found = cutter.accept({tp(0): records(0, 40, 52)})  # the next owner's position: not a jump
    assert found.jumps == []
    assert ranges(cutter.ready()) == {0: (40, 50)}


def test_processed_says_when_a_partition_reached_the_snapshot():
    cutter = BatchCutter(10, {tp(0): 15})
    cutter.accept({tp(0): records(0, 0, 20)})
    assert cutter.processed(cutter.ready()) is False   # [0, 10)
    assert cutter.processed(cutter.ready()) is True    # [10, 15): the snapshot
    assert cutter.ready() == {} and cutter.partial() == {}


# ---------------------------------------------------------------- property: random polls

@pytest.mark.parametrize("seed", range(200))
def test_random_polls_are_cut_at_multiples_and_the_snapshot(seed):
    """However the records arrive, every partition is processed once, in order, up to its
    snapshot, in batches that end at a multiple of the batch size or at the snapshot."""
    rng = random.Random(seed)
    align = rng.choice([1, 3, 10, 64])
    starts = {p: rng.randrange(0, 50) for p in range(rng.randint(1, 4))}
    snapshot = {p: start + rng.randrange(0, 200) for p, start in starts.items()} if rng.random() < 0.5 else None
    fetched = dict(starts)
    polls = []
    for _ in range(rng.randint(1, 30)):
        poll = {}
        for p in rng.sample(sorted(starts), rng.randint(1, len(starts))):
            n = rng.randint(1, 80)
            poll[p] = (fetched[p], fetched[p] + n)
            fetched[p] += n
        polls.append(poll)
    batches = cut(polls, align, snapshot)
    done = dict(starts)
    for batch in batches:
        for p, (a, b) in batch.items():
            assert a == done[p], (p, a, done[p])  # contiguous with the partition's previous batch
            assert b == (a // align + 1) * align or (snapshot is not None and b == snapshot[p]), (p, a, b)
            done[p] = b
    for p in starts:
        if snapshot is not None and fetched[p] >= snapshot[p]:
            assert done[p] == snapshot[p]
        else:
            assert done[p] == max(starts[p], fetched[p] // align * align)  # the rest waits for its batch
