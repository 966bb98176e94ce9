"""Fetcher (seed 004, KIP-41): max_poll_records, fair round-robin, bounded prefetch,
revoke/seek/pause safety, wakeup, error reporting. Fast; no ZooKeeper."""
from __future__ import annotations

import collections
import logging
import os
import threading
import time

import pytest

from consumer.fetcher import Fetcher
from consumer.records import ConsumerRecord, TopicPartition
from coordinator.errors import IllegalStateError, LogCorrupted, OffsetOutOfRange
from tests.support.helpers import fetcher_parked, wait_for

T = "events"
P0, P1, P2, P3 = (TopicPartition(T, p) for p in range(4))
ALL = [P0, P1, P2, P3]


class FakeLog:
    """In-memory stand-in for consumer.log.Log with the same read interface.

    Records are synthesized on fetch (offset ``o`` has value ``b"v<o>"``), so a partition can
    hold a huge backlog for free. ``append`` makes new records visible at once, from any
    thread. ``before_fetch(topic, partition, offset)``, if set, runs before every fetch (to
    block or fail it). ``damage`` makes a range of offsets unreadable the way the real log
    does: a fetch stops before it, and a fetch from inside it raises LogCorrupted (or the
    given error).
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.earliest = collections.defaultdict(int)
        self.latest = collections.defaultdict(int)
        self.fetches = collections.Counter()
        self.before_fetch = None
        self.damaged = {}

    def damage(self, topic, partition, first, resume, error=None):
        with self.lock:
            self.damaged[(topic, partition)] = (first, resume, error)

    def repair(self, topic, partition):
        with self.lock:
            self.damaged.pop((topic, partition), None)

    def append(self, topic, partition, n=1):
        with self.lock:
            self.latest[(topic, partition)] += n

    def truncate(self, topic, partition, earliest):
        with self.lock:
            self.earliest[(topic, partition)] = earliest

    def fetch(self, topic, partition, offset, max_records=500, max_bytes=1 << 20):
        hook = self.before_fetch
        if hook is not None:
            hook(topic, partition, offset)
        with self.lock:
            self.fetches[(topic, partition)] += 1
            earliest, latest = self.earliest[(topic, partition)], self.latest[(topic, partition)]
            first, resume, error = self.damaged.get((topic, partition), (latest, latest, None))
        if offset < earliest or offset > latest:
            raise OffsetOutOfRange(topic, partition, offset, earliest, latest)
        if first <= offset < resume:
            if error is not None:
                raise error
            raise LogCorrupted(topic, partition, offset, f"/data/{topic}-{partition}/segment.log", 4096,
                               f"offsets {first}..{resume - 1} are damaged", resume)
        end = min(latest, offset + max_records, first if offset < first else latest)
        return [ConsumerRecord(topic, partition, o, o, None, b"v%d" % o)
                for o in range(offset, end)]

    def earliest_offset(self, topic, partition):
        with self.lock:
            return self.earliest[(topic, partition)]

    def latest_offset(self, topic, partition):
        with self.lock:
            return self.latest[(topic, partition)]

    def offset_for_time(self, topic, partition, timestamp_ms):
        with self.lock:
            latest = self.latest[(topic, partition)]
            return timestamp_ms if timestamp_ms < latest else None


@pytest.fixture
def flog():
    return FakeLog()


@pytest.fixture
def make_fetcher(flog):
    made = []

    def make(log=None, **kw):
        kw.setdefault("fetch_max_wait_ms", 10)
        f = Fetcher(log if log is not None else flog, **kw)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def fetching_all(flog, make_fetcher, per_partition: int, **config):
    """A started fetcher assigned every partition from 0, each holding ``per_partition`` records."""
    for tp in ALL:
        flog.append(T, tp.partition, per_partition)
    f = make_fetcher(**config)
    f.assign({tp: 0 for tp in ALL})
    f.start()
    return f


def poll_until(fetcher, count, max_records=None, timeout=5.0):
    """Poll until ``count`` records were returned in total; return the list of poll results."""
    results, got = [], 0
    deadline = time.monotonic() + timeout
    while got < count:
        assert time.monotonic() < deadline, f"only {got} of {count} records within {timeout}s"
        res = fetcher.poll(max_records=max_records, timeout=0.5)
        if res:
            results.append(res)
            got += sum(len(v) for v in res.values())
    return results


def check_in_order(results, expected_latest):
    """Every partition's records are returned exactly once, in offset order."""
    seen = collections.defaultdict(list)
    for res in results:
        for tp, recs in res.items():
            assert all(r.topic == tp.topic and r.partition == tp.partition for r in recs)
            seen[tp].extend(r.offset for r in recs)
    for tp, latest in expected_latest.items():
        assert seen[tp] == list(range(latest)), tp


def assert_no_longer_fetched(flog, stopped, running):
    """``stopped`` is not fetched any more while ``running`` (an idle partition, re-checked
    every fetch_max_wait_ms) keeps being fetched. One fetch that was already chosen before the
    stop may still start (its result is discarded)."""
    base = flog.fetches[(T, stopped.partition)]
    r0 = flog.fetches[(T, running.partition)]
    wait_for(lambda: flog.fetches[(T, running.partition)] >= r0 + 3, timeout=5)
    mid = flog.fetches[(T, stopped.partition)]
    assert mid <= base + 1
    r1 = flog.fetches[(T, running.partition)]
    wait_for(lambda: flog.fetches[(T, running.partition)] >= r1 + 3, timeout=5)
    assert flog.fetches[(T, stopped.partition)] == mid


# --------------------------------------------------------------------------- max_poll_records

def test_max_poll_records_is_respected(flog, make_fetcher):
    for i, tp in enumerate(ALL):
        flog.append(T, tp.partition, 1000 + 37 * i)
    f = make_fetcher(max_poll_records=100)
    f.assign({tp: 0 for tp in ALL})
    f.start()
    wait_for(lambda: f.buffered() >= 100, timeout=5)
    # a per-call max_records (smaller or larger than the default) is respected too
    first = f.poll(max_records=7, timeout=1)
    assert sum(map(len, first.values())) == 7
    total = sum(1000 + 37 * i for i in range(4))
    results = [first] + poll_until(f, total - 7)
    assert all(sum(map(len, r.values())) <= 100 for r in results[1:])
    check_in_order(results, {tp: 1000 + 37 * i for i, tp in enumerate(ALL)})
    assert f.poll(timeout=0) == {}
    assert all(f.position(tp) == 1000 + 37 * i for i, tp in enumerate(ALL))
    flog.append(T, 3, 2000)
    big = poll_until(f, 2000, max_records=5000)
    assert max(sum(map(len, r.values())) for r in big) > 100  # the per-call limit, not the default


def test_invalid_config_is_rejected(flog):
    from coordinator.errors import InvalidConfig
    with pytest.raises(InvalidConfig):
        Fetcher(flog, max_poll_records=0)
    with pytest.raises(ValueError):
        Fetcher(flog).poll(max_records=0)


# --------------------------------------------------------------------------- fairness

def test_rotating_start_partition(flog, make_fetcher):
    f = fetching_all(flog, make_fetcher, 1000, max_poll_records=5000)  # prefetch everything
    wait_for(lambda: f.buffered() == 4000, timeout=5, message="everything buffered")
    # each poll takes as much as it can from one partition, then the next poll starts at the
    # partition after the one where the previous poll stopped
    order = [list(f.poll(max_records=300).keys()) for _ in range(8)]
    assert order == [[P0], [P1], [P2], [P3], [P0], [P1], [P2], [P3]]
    # greedy across partitions: 400 left in each; 1000 = P0's 400, P1's 400, 200 of P2's
    res = f.poll(max_records=1000)
    assert [(tp, len(v)) for tp, v in res.items()] == [(P0, 400), (P1, 400), (P2, 200)]
    # stopped at P2, so the next poll starts at P3
    res = f.poll(max_records=450)
    assert [(tp, len(v)) for tp, v in res.items()] == [(P3, 400), (P2, 50)]
    res = f.poll(max_records=1000)
    assert [(tp, len(v)) for tp, v in res.items()] == [(P2, 150)]


def test_backlog_never_starves_trickling_partitions(flog, make_fetcher):
    """P0 has a 10M-record backlog, P1..P3 get a trickle. (a) Whenever a partition has
    buffered records before a poll, it is returned within len(assigned) polls; (b) every
    trickled record is consumed promptly while P0's backlog is still far from drained."""
    flog.append(T, 0, 10_000_000)
    f = make_fetcher(max_poll_records=100, fetch_max_wait_ms=2)
    f.assign({tp: 0 for tp in ALL})
    f.start()
    pending_since = {}  # tp -> poll number at which it was first seen with buffered records
    worst = 0
    polls = 0
    trickled = 0
    for _ in range(30):
        for tp in (P1, P2, P3):
            flog.append(T, tp.partition, 2)
        trickled += 2
        deadline = time.monotonic() + 3
        while any(f.position(tp) < trickled for tp in (P1, P2, P3)):
            assert time.monotonic() < deadline, "trickle not consumed within 3s"
            for tp in ALL:
                if f.buffered(tp) and tp not in pending_since:
                    pending_since[tp] = polls
            res = f.poll(timeout=1)
            polls += 1
            for tp in res:
                if tp in pending_since:
                    worst = max(worst, polls - pending_since.pop(tp))
            for tp, since in pending_since.items():
                assert polls - since < len(ALL), f"{tp} buffered but not returned for {polls - since} polls"
            assert sum(map(len, res.values())) <= 100
    assert worst <= len(ALL)
    assert f.position(P0) < 10_000_000 // 2  # the backlog was far from drained
    assert f.position(P0) > 0


def test_poll_reads_by_itself_when_starved(flog, make_fetcher):
    """Without a prefetch thread (or while it sleeps), a starved poll() reads the log itself."""
    flog.append(T, 0, 1200)
    flog.append(T, 1, 10)
    f = make_fetcher(max_poll_records=500)  # not started
    f.assign({P0: 0, P1: 0})
    results = poll_until(f, 1210)
    check_in_order(results, {P0: 1200, P1: 10})
    assert f.poll(timeout=0) == {}
    flog.append(T, 1, 3)
    wait_for(lambda: f.poll(timeout=0.05), timeout=2, message="poll(timeout) re-checks idle partitions")


def test_thread_reads_ahead_while_the_application_is_away(flog, make_fetcher):
    flog.append(T, 0, 100_000)
    readers = collections.Counter()
    flog.before_fetch = lambda *a: readers.update([threading.current_thread().name])
    f = make_fetcher(max_poll_records=500)
    f.assign({P0: 0})
    f.start()
    for i in range(5):
        res = f.poll(timeout=2)
        assert res[P0][0].offset == 500 * i
        # "processing": the application is away from poll(); the thread refills the buffer
        wait_for(lambda: f.buffered() >= 500, timeout=2, message="read-ahead")
    assert readers["zkgroups-fetcher"] >= 5


# --------------------------------------------------------------------------- positions / bound

def test_position_advances_only_for_returned_records(flog, make_fetcher):
    flog.append(T, 0, 1000)
    f = make_fetcher(max_poll_records=500)
    f.assign({P0: 0})
    f.start()
    wait_for(lambda: f.buffered() >= 500, timeout=5, message="a chunk buffered")
    assert f.position(P0) == 0
    before = f.buffered(P0)
    res = f.poll(max_records=7)
    assert [r.offset for r in res[P0]] == list(range(7))
    assert f.position(P0) == 7
    assert f.buffered(P0) <= before - 7 + 500  # nothing returned was lost; at most one refill
    res = f.poll(max_records=3)
    assert [r.offset for r in res[P0]] == [7, 8, 9]
    assert f.position(P0) == 10


def test_retained_records_stay_bounded(flog, make_fetcher):
    for tp in ALL:
        flog.append(T, tp.partition, 1_000_000)
    f = make_fetcher(max_poll_records=100)
    chunk = 500  # max(max_poll_records, 500)
    seen = []

    def sample(topic, partition, offset):  # runs in the prefetch thread, before each fetch
        seen.append(f.buffered())

    flog.before_fetch = sample
    f.assign({tp: 0 for tp in ALL})
    f.start()
    peak = 0
    for _ in range(300):
        peak = max(peak, f.buffered())
        f.poll(timeout=1)
    wait_for(lambda: len(seen) > 10, timeout=2)
    peak = max([peak] + seen)
    assert peak <= 100 + chunk, peak
    # and the thread idles once the buffer is full: no fetches while nobody polls
    wait_for(lambda: f.buffered() >= 100, timeout=2)
    n = sum(flog.fetches.values())
    time.sleep(0.05)  # a window in which a spinning thread would fetch; not a wait for state
    assert sum(flog.fetches.values()) == n
    assert f.buffered() <= 100 + chunk


# --------------------------------------------------------------------------- revoke / seek

def test_revoke_drops_buffer_and_stops_fetching(flog, make_fetcher):
    f = fetching_all(flog, make_fetcher, 300, max_poll_records=5000)
    wait_for(lambda: f.buffered() == 1200, timeout=5)
    f.revoke([P0, P2])
    assert f.assigned() == {P1, P3}
    assert f.buffered(P0) == f.buffered(P2) == 0
    flog.append(T, 0, 100)
    res = poll_until(f, 600)
    assert {tp for r in res for tp in r} == {P1, P3}
    assert_no_longer_fetched(flog, P0, running=P1)
    assert f.poll(timeout=0) == {}
    with pytest.raises(IllegalStateError):
        f.position(P0)
    f.revoke([P0])  # idempotent
    # re-assign from a committed offset: fetching resumes there
    f.assign({P0: 250})
    res = poll_until(f, 150)
    assert [r.offset for r in res[0][P0]][0] == 250


def test_no_revoked_record_is_returned_under_concurrency(flog, make_fetcher):
    f = fetching_all(flog, make_fetcher, 10_000_000, max_poll_records=50)
    gen = [0]  # odd: P0/P1 revoked (set after revoke returned, cleared before assign starts)
    stop = threading.Event()
    errors = []

    def membership():
        try:
            while not stop.is_set():
                f.revoke([P0, P1])
                gen[0] += 1
                for _ in range(200):  # let some polls happen while revoked
                    if stop.is_set():
                        break
                    time.sleep(0)
                gen[0] += 1
                f.assign({P0: 0, P1: 0})
                time.sleep(0.001)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=membership)
    t.start()
    checked = 0
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            g1 = gen[0]
            res = f.poll(timeout=0.05)
            g2 = gen[0]
            if g1 == g2 and g1 % 2 == 1:
                checked += 1
                assert P0 not in res and P1 not in res
    finally:
        stop.set()
        t.join(5)
    assert not errors
    assert checked > 10


def test_inflight_fetch_is_discarded_after_revoke_or_seek(flog, make_fetcher):
    flog.append(T, 0, 1000)
    entered, release = threading.Event(), threading.Event()

    def gate(topic, partition, offset):
        if offset == 0:
            entered.set()
            assert release.wait(5)

    flog.before_fetch = gate
    f = make_fetcher(max_poll_records=100)
    f.assign({P0: 0})
    f.start()
    assert entered.wait(5)           # a fetch from offset 0 is in flight
    f.revoke([P0])                   # returns at once, does not wait for the read
    f.assign({P0: 600})              # a new generation of the same partition
    release.set()
    res = f.poll(timeout=2)
    assert res[P0][0].offset == 600  # the stale read from 0 was thrown away
    assert f.position(P0) == 600 + len(res[P0])

    # same with seek
    entered.clear(), release.clear()
    f.seek(P0, 0)
    assert entered.wait(5)
    f.seek(P0, 900)
    release.set()
    res = f.poll(timeout=2)
    assert res[P0][0].offset == 900


def test_seek(flog, make_fetcher):
    flog.append(T, 0, 1000)
    f = make_fetcher(max_poll_records=100)
    f.assign({P0: 0})
    f.start()
    res = f.poll(timeout=2)
    assert res[P0][0].offset == 0
    f.seek(P0, 700)
    assert f.position(P0) == 700
    assert f.buffered(P0) <= 500  # old buffer dropped (at most one fresh chunk since)
    res = f.poll(timeout=2)
    assert res[P0][0].offset == 700
    f.seek(P0, 5)
    res = f.poll(timeout=2)
    assert [r.offset for r in res[P0]] == list(range(5, 5 + len(res[P0])))
    with pytest.raises(IllegalStateError):
        f.seek(P1, 0)


# --------------------------------------------------------------------------- pause / resume

def test_pause_keeps_buffer_and_stops_fetching(flog, make_fetcher):
    flog.append(T, 0, 1000)
    flog.append(T, 1, 1000)
    f = make_fetcher(max_poll_records=5000)
    f.assign({P0: 0, P1: 0})
    f.start()
    wait_for(lambda: f.buffered() == 2000, timeout=5)
    f.pause([P0])
    assert f.paused() == {P0}
    flog.append(T, 0, 100)
    res = poll_until(f, 1000)
    assert {tp for r in res for tp in r} == {P1}
    assert f.buffered(P0) == 1000 and f.position(P0) == 0
    assert_no_longer_fetched(flog, P0, running=P1)
    assert f.poll(timeout=0) == {}
    f.resume([P0])
    assert f.paused() == set()
    res = poll_until(f, 1100, max_records=5000)
    assert [r.offset for r in res[0][P0]][:3] == [0, 1, 2]
    check_in_order(res, {P0: 1100})
    # unassigned partitions are ignored (a revoke may race with pause/resume); pause ends
    # with revoke
    f.pause([P2, P0])
    f.resume([P3])
    assert f.paused() == {P0}
    f.revoke([P0])
    f.assign({P0: 0})
    assert f.paused() == set()
    # assign(paused=True): paused from the start, nothing returned or fetched until resumed
    n = flog.fetches[(T, 2)]
    flog.append(T, 2, 10)
    f.assign({P2: 0}, paused=True)
    assert f.paused() == {P2}
    assert P2 not in f.poll(max_records=5000, timeout=0.05)
    assert flog.fetches[(T, 2)] == n
    f.revoke([P0])
    f.resume([P2])
    assert [r.offset for r in f.poll(max_records=5000, timeout=2)[P2]] == list(range(10))


def test_paused_buffers_do_not_block_other_partitions(flog, make_fetcher):
    """A paused partition holding >= max_poll_records must not stop prefetch of others."""
    flog.append(T, 0, 1000)
    f = make_fetcher(max_poll_records=100)
    f.assign({P0: 0, P1: 0})
    f.start()
    wait_for(lambda: f.buffered(P0) >= 100, timeout=5)
    f.pause([P0])
    flog.append(T, 1, 50)
    res = f.poll(timeout=2)
    assert list(res) == [P1]


# --------------------------------------------------------------------------- wakeup / latency

def test_wakeup_interrupts_a_blocking_poll(flog, make_fetcher):
    f = make_fetcher()
    f.assign({P0: 0})
    f.start()
    out = {}

    def blocked():
        t0 = time.monotonic()
        out["res"] = f.poll(timeout=None)
        out["took"] = time.monotonic() - t0

    t = threading.Thread(target=blocked)
    t.start()
    wait_for(lambda: f._data_cv._waiters, timeout=5, message="poll blocked")  # noqa: SLF001
    f.wakeup()
    t.join(5)
    assert out["res"] == {} and out["took"] < 5
    # a wakeup with no poll blocked makes the next poll return at once, then it is consumed
    f.wakeup()
    t0 = time.monotonic()
    assert f.poll(timeout=10) == {}
    assert time.monotonic() - t0 < 1
    flog.append(T, 0, 3)
    assert len(f.poll(timeout=5)[P0]) == 3


def test_close_releases_a_blocked_poll(flog, make_fetcher):
    f = make_fetcher()
    f.assign({P0: 0})
    f.start()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("res", f.poll(timeout=30)))
    t.start()
    wait_for(lambda: f._data_cv._waiters, timeout=5, message="poll blocked")  # noqa: SLF001
    f.close()
    t.join(5)
    assert out["res"] == {}
    assert not f._thread.is_alive()  # noqa: SLF001
    with pytest.raises(IllegalStateError):
        f.poll()


def test_new_data_is_picked_up_while_polling(flog, make_fetcher):
    f = make_fetcher(fetch_max_wait_ms=50)
    f.assign({P0: 0, P1: 0})
    f.start()
    wait_for(lambda: f.highwater(P0) == 0 and f.highwater(P1) == 0, timeout=5,
             message="first empty fetch")
    assert f.poll(timeout=0) == {}
    for round_ in range(5):
        appender = threading.Timer(0.02, flog.append, args=(T, 1, 10))
        t0 = time.monotonic()
        appender.start()
        res = f.poll(timeout=5)
        took = time.monotonic() - t0
        appender.join()
        assert [r.offset for r in res[P1]] == list(range(10 * round_, 10 * round_ + 10))
        assert took < 0.02 + 0.05 + 0.5  # appended-after + fetch_max_wait + slack
    assert f.highwater(P1) == 50
    assert f.end_offsets([P0, P1]) == {P0: 0, P1: 50}


# --------------------------------------------------------------------------- errors

def test_offset_out_of_range_is_reported_and_fetching_stops_until_seek(flog, make_fetcher):
    flog.append(T, 0, 1000)
    flog.truncate(T, 0, 400)
    flog.append(T, 1, 10)
    reported = []
    f = make_fetcher(on_error=lambda tp, exc: reported.append((tp, exc)))
    f.assign({P0: 0, P1: 0})
    f.start()
    wait_for(lambda: reported, timeout=5, message="on_error")
    tp, exc = reported[0]
    assert tp == P0 and isinstance(exc, OffsetOutOfRange)
    assert (exc.offset, exc.earliest, exc.latest) == (0, 400, 1000)
    res = poll_until(f, 10)  # other partitions are not affected
    assert set(res[0]) == {P1}
    fetched = flog.fetches[(T, 0)]
    flog.append(T, 1, 5)
    poll_until(f, 5)
    assert flog.fetches[(T, 0)] == fetched and len(reported) == 1
    f.seek(P0, exc.earliest)  # what auto_offset_reset=earliest does
    res = poll_until(f, 600, max_records=5000)
    offsets = [r.offset for r in res[0][P0]]
    assert offsets[0] == 400


def test_on_error_may_seek_from_the_callback(flog, make_fetcher):
    flog.append(T, 0, 100)
    flog.truncate(T, 0, 40)
    holder = {}
    f = make_fetcher(on_error=lambda tp, exc: holder["f"].seek(tp, exc.earliest))
    holder["f"] = f
    f.assign({P0: 0})
    f.start()
    res = poll_until(f, 60)
    assert res[0][P0][0].offset == 40


@pytest.mark.parametrize("error", [None, PermissionError(13, "Permission denied", "/data/events-0"),
                                   OSError(5, "Input/output error")],
                         ids=["LogCorrupted", "PermissionError", "EIO"])
def test_a_failed_fetch_is_reported_once_and_parks_the_partition(flog, make_fetcher, caplog, error):
    flog.append(T, 0, 1000)
    flog.append(T, 1, 10)
    flog.damage(T, 0, 300, 400, error)
    caplog.set_level(logging.INFO, logger="zkgroups.fetcher")
    reported = []
    f = make_fetcher(on_error=lambda tp, exc: reported.append((tp, exc)))
    f.assign({P0: 0, P1: 0})
    f.start()
    res = poll_until(f, 310, max_records=1000)  # fetched before the error: handed out first
    check_in_order(res, {P0: 300, P1: 10})
    wait_for(lambda: reported, timeout=5, message="on_error")
    [(tp, exc)] = reported
    assert tp == P0 and (exc is error if error else isinstance(exc, LogCorrupted) and exc.offset == 300)
    assert_no_longer_fetched(flog, P0, P1)  # parked; the other partition is still fetched
    flog.append(T, 1, 5)
    assert [r.offset for r in poll_until(f, 5)[0][P1]] == list(range(10, 15))
    assert len(reported) == 1 and f.position(P0) == 300
    lines = [r for r in caplog.records if r.name == "zkgroups.fetcher"]  # INFO: on_error's owner reports it
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and lines[0].exc_info is None
    assert "\n" not in lines[0].getMessage()
    assert "events-0" in lines[0].getMessage() and "offset 300" in lines[0].getMessage()

    if error is None:
        resume = exc.resume_offset  # skip the damaged records
    else:
        flog.repair(T, 0)  # e.g. the permission given back: a seek to the same offset resumes
        resume = 300
    f.seek(P0, resume)
    res = poll_until(f, 1000 - resume, max_records=1000)
    assert [r.offset for r in res[0][P0]][:3] == [resume, resume + 1, resume + 2]
    assert len(reported) == 1


def test_records_read_ahead_before_a_failed_fetch_are_handed_out_before_it_is_reported(flog, make_fetcher):
    """The prefetch thread has read everything up to the damage, and failed there, before the
    application polls: every one of those records is handed out first, then the error is
    reported once, by the poll that emptied the buffer (before it returns). The other
    partition keeps flowing."""
    flog.append(T, 0, 1000)
    flog.damage(T, 0, 700, 900)
    flog.append(T, 1, 10)
    reported = []
    f = make_fetcher(max_poll_records=2000, on_error=lambda tp, exc: reported.append((tp, f.buffered(tp))))
    f.assign({P0: 0, P1: 0})
    f.start()
    wait_for(lambda: fetcher_parked(f, P0) and f.buffered(P0) == 700, timeout=5, message="the read-ahead up to the damage")
    assert reported == []
    got = {P0: [], P1: []}
    while len(got[P0]) < 700 or len(got[P1]) < 10:
        for tp, records in f.poll(max_records=64, timeout=1).items():
            got[tp] += [r.offset for r in records]
        assert reported == ([(P0, 0)] if len(got[P0]) == 700 else []), len(got[P0])
    assert got == {P0: list(range(700)), P1: list(range(10))}
    assert len(reported) == 1 and f.position(P0) == 700


def test_a_seek_drops_the_error_still_waiting_behind_buffered_records(flog, make_fetcher):
    flog.append(T, 0, 1000)
    flog.damage(T, 0, 700, 900)
    reported = []
    f = make_fetcher(max_poll_records=2000, on_error=lambda tp, exc: reported.append(exc))
    f.assign({P0: 0})
    f.start()
    wait_for(lambda: fetcher_parked(f, P0) and f.buffered(P0) == 700, timeout=5, message="the read-ahead up to the damage")
    f.seek(P0, 900)  # past the damage: the records before it and their error are dropped together
    assert [r.offset for r in poll_until(f, 100, max_records=1000)[0][P0]] == list(range(900, 1000))
    assert reported == []


def test_a_failed_fetch_without_on_error_is_logged_once(flog, make_fetcher, caplog):
    flog.append(T, 0, 1000)
    flog.damage(T, 0, 300, 400)
    f = make_fetcher()
    f.assign({P0: 0})
    res = poll_until(f, 300, max_records=1000)  # poll() reads itself: no prefetch thread
    assert [r.offset for r in res[0][P0]] == list(range(300))
    for _ in range(5):
        assert f.poll(timeout=0) == {}
    assert flog.fetches[(T, 0)] == 2
    lines = [r.getMessage() for r in caplog.records if r.name == "zkgroups.fetcher"]
    assert len(lines) == 1 and "LogCorrupted" in lines[0] and "offset 300" in lines[0]


# --------------------------------------------------------------------------- the real log

real_log = pytest.mark.skipif(
    not os.path.exists(os.path.join(os.path.dirname(__file__), "..", "..", "consumer", "log", "log.py")),
    reason="consumer/log/log.py not written yet")


@real_log
def test_against_the_real_log(data_dir, make_fetcher):
    from consumer.log import Log

    log = Log(data_dir)
    for p in range(2):
        log.append(T, p, [(b"k%d" % i, b"v%d" % i, 1_000 + i, ()) for i in range(1200)])
    f = make_fetcher(log, max_poll_records=250)
    f.assign({P0: 0, P1: 0})
    f.start()
    results = poll_until(f, 2400)
    assert all(sum(map(len, r.values())) <= 250 for r in results)
    check_in_order(results, {P0: 1200, P1: 1200})
    assert results[0][P0][5].value == b"v5" and results[0][P0][5].key == b"k5"
    # appends become visible while polling
    log.append(T, 1, [(None, b"late", 5_000, ())])
    res = f.poll(timeout=5)
    assert [r.value for r in res[P1]] == [b"late"]
    assert f.highwater(P1) == 1201
