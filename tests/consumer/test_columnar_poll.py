"""The columnar poll: ``Columns.slice``/``records``, the fetcher's ``poll_columns`` and
``give_back`` of columns, the batch cutter on column runs (fast, no ZooKeeper), and
``Consumer.poll_columns`` in a group (owned partitions only, the lease, positions, commits)."""
from __future__ import annotations

import random

import pytest

from consumer import Consumer, ConsumerRebalanceListener, TopicPartition
from consumer.fetcher import Fetcher
from consumer.log import Log
from consumer.spark.batching import BatchCutter, ColumnRun, end_offset, first_offset
from coordinator.errors import IllegalStateError
from tests.support.helpers import fill, wait_for

T = "t"
P0, P1 = TopicPartition(T, 0), TopicPartition(T, 1)


def mixed_log(path) -> Log:
    """Partition 0 of ``t``: 123 records in four stored batches of every layout (fixed and
    varying values, keys and none, headers, timestamps constant, in runs and per record)."""
    lg = Log(str(path), fsync="never")
    lg.append(T, 0, [(None, b"v%05d" % i, 1000, ()) for i in range(50)])
    lg.append(T, 0, [(b"k%d" % i if i % 3 else None, b"x" * i, 2000 + i // 10, ()) for i in range(40)])
    lg.append(T, 0, [(b"", b"", 3000 + i * 7, (("h", b"1"), ("n", None)) if i % 2 else ()) for i in range(30)])
    lg.append(T, 0, [(None, b"", 5, ())] * 3)
    return lg


def as_records(tp, parts):
    return [r for c in parts for r in c.records(tp.topic, tp.partition)]


# ---------------------------------------------------------------- Columns and ColumnRun (pure)

def test_columns_slices_give_the_records_the_log_gives(tmp_path):
    with mixed_log(tmp_path) as lg:
        everything = lg.fetch(T, 0, 0, max_records=1000, max_bytes=1 << 30)
        assert len(everything) == 123
        for a, b in [(0, 123), (10, 60), (55, 95), (89, 123), (122, 123), (3, 4)]:
            parts = lg.fetch_columns(T, 0, a, max_records=b - a, max_bytes=1 << 30)
            assert as_records(P0, parts) == everything[a:b]
            for c in parts:  # every slice of a stored batch's columns
                for i, j in [(0, c.count), (0, 1), (c.count - 1, c.count), (c.count // 3, c.count // 2)]:
                    s = c.slice(i, j)
                    assert (s.base, s.count, s.end) == (c.base + i, j - i, c.base + j)
                    assert s.records(T, 0) == everything[c.base + i:c.base + j]


def test_a_column_run_slices_like_a_list_of_records(tmp_path):
    with mixed_log(tmp_path) as lg:
        everything = lg.fetch(T, 0, 0, max_records=1000, max_bytes=1 << 30)
        run = ColumnRun(lg.fetch_columns(T, 0, 7, max_records=110, max_bytes=1 << 30))
    records = everything[7:117]
    assert len(run) == 110 and (first_offset(run), end_offset(run)) == (7, 117)
    assert (first_offset(records), end_offset(records)) == (7, 117)
    for a, b in [(0, 110), (0, 43), (43, 44), (40, 100), (109, 110), (0, 0), (50, 500)]:
        assert run[a:b].records(P0) == records[a:b]
        assert len(run[a:b]) == len(records[a:b])
    copy = run[:]
    del copy[:61]
    assert copy.records(P0) == records[61:] and len(copy) == 49 and len(run) == 110
    copy.extend(ColumnRun())
    del copy[:1000]
    assert len(copy) == 0 and not copy
    with pytest.raises(ValueError):
        run[::2]


def cut_everything(cutter, pieces):
    """Feed ``pieces`` ({tp: run} per poll) to ``cutter``, processing what is ready after each;
    the (tp, start, end) of every batch, in order."""
    out = []
    for polled in pieces:
        cutter.accept(polled)
        ready = cutter.ready()
        while ready:
            out += [(tp, first_offset(r), end_offset(r), len(r)) for tp, r in sorted(ready.items())]
            cutter.processed(ready)
            ready = cutter.ready()
    partial = cutter.partial()
    out += [("partial", tp, first_offset(r), end_offset(r)) for tp, r in sorted(partial.items())]
    return out


@pytest.mark.parametrize("align,snapshot", [(None, None), (17, None), (17, 100), (40, 45), (7, 0)])
def test_the_cutter_cuts_column_runs_as_it_cuts_records(tmp_path, align, snapshot):
    rng = random.Random(align or 0)
    with mixed_log(tmp_path) as lg:
        edges = sorted({0, 123, *rng.sample(range(1, 123), 12)})
        polls = list(zip(edges, edges[1:]))
        as_cols = [{P0: ColumnRun(lg.fetch_columns(T, 0, a, max_records=b - a, max_bytes=1 << 30))} for a, b in polls]
        as_recs = [{P0: lg.fetch(T, 0, a, max_records=b - a, max_bytes=1 << 30)} for a, b in polls]
    snap = None if snapshot is None else {P0: snapshot}
    ends = {30: 52}  # a file written before: the batch from 30 ends at 52
    got = cut_everything(BatchCutter(align, snap, lambda tp, s: ends.get(s)), as_cols)
    want = cut_everything(BatchCutter(align, snap, lambda tp, s: ends.get(s)), as_recs)
    assert got == want and (got or snapshot == 0)


def test_the_cutter_refuses_records_and_columns_in_one_run(tmp_path):
    with mixed_log(tmp_path) as lg:
        cutter = BatchCutter(1000)
        cutter.accept({P0: ColumnRun(lg.fetch_columns(T, 0, 0, max_records=10))})
        with pytest.raises(TypeError):
            cutter.accept({P0: lg.fetch(T, 0, 10, max_records=10)})


# ---------------------------------------------------------------- the fetcher's poll_columns

@pytest.fixture
def two_partitions(tmp_path):
    lg = Log(str(tmp_path / "log"), fsync="never")
    for p in range(2):
        for base in range(0, 3000, 700):  # stored batches of 700: polls span and split them
            lg.append(T, p, [(b"k%d" % o, b"%s-%d-%d" % (T.encode(), p, o), 1000 + o, ())
                             for o in range(base, min(3000, base + 700))])
    yield lg
    lg.close()


@pytest.fixture
def make_fetcher():
    made = []

    def make(log, **kw):
        kw.setdefault("fetch_max_wait_ms", 10)
        f = Fetcher(log, **kw)
        made.append(f)
        return f
    yield make
    for f in made:
        f.close()


def drain_columns(f, want, max_records=None):
    """Poll columns until ``want`` records came; {tp: [records]} and the polls' sizes."""
    got, sizes = {}, []
    for _ in range(10_000):
        if sum(map(len, got.values())) >= want:
            break
        res = f.poll_columns(max_records, timeout=1.0)
        sizes.append(sum(c.count for parts in res.values() for c in parts))
        for tp, parts in res.items():
            assert parts and all(c.count for c in parts)
            got.setdefault(tp, []).extend(as_records(tp, parts))
            assert f.position(tp) == parts[-1].end
    return got, sizes


def test_poll_columns_hands_out_what_poll_does_within_max_poll_records(two_partitions, make_fetcher):
    f = make_fetcher(two_partitions, max_poll_records=450)
    f.assign({P0: 0, P1: 100})
    f.start()
    got, sizes = drain_columns(f, 5900)
    assert max(sizes) <= 450 and sizes.count(450) > 5
    for tp, first in ((P0, 0), (P1, 100)):
        assert got[tp] == two_partitions.fetch(T, tp.partition, first, max_records=5000, max_bytes=1 << 30)
    assert f.poll_columns(timeout=0.05) == {}
    smaller, _ = drain_columns(make_started(make_fetcher, two_partitions), 6000, max_records=33)
    assert sum(map(len, smaller.values())) == 6000


def make_started(make_fetcher, lg):
    f = make_fetcher(lg, max_poll_records=500)
    f.assign({P0: 0, P1: 0})
    f.start()
    return f


def test_poll_columns_skips_paused_and_revoked_partitions_and_seeks(two_partitions, make_fetcher):
    f = make_started(make_fetcher, two_partitions)
    f.pause([P0])
    got, _ = drain_columns(f, 3000)
    assert set(got) == {P1} and f.position(P0) == 0
    f.resume([P0])
    first = f.poll_columns(timeout=1.0)
    assert set(first) == {P0}
    f.revoke([P0])  # buffered columns of P0 are dropped: never handed out after this
    assert f.poll_columns(timeout=0.05) == {}  # P1 is at its end
    f.seek(P1, 2990)
    res = f.poll_columns(timeout=1.0)
    assert set(res) == {P1} and [r.offset for r in as_records(P1, res[P1])] == list(range(2990, 3000))


def test_columns_given_back_are_handed_out_again_from_the_same_position(two_partitions, make_fetcher):
    f = make_started(make_fetcher, two_partitions)
    res = f.poll_columns(max_records=1234, timeout=1.0)
    f.give_back(res)
    assert all(f.position(tp) == parts[0].base for tp, parts in res.items())
    got, _ = drain_columns(f, 6000)  # the records given back come again, in order, once
    for tp in (P0, P1):
        assert [r.offset for r in got[tp]] == list(range(3000))
    f.give_back({P0: two_partitions.fetch_columns(T, 0, 10, max_records=5)})  # not where P0 is: ignored
    assert f.position(P0) == 3000 and f.poll_columns(timeout=0.05) == {}


def test_switching_between_poll_and_poll_columns_loses_and_repeats_nothing(two_partitions, make_fetcher):
    f = make_started(make_fetcher, two_partitions)
    got = {P0: [], P1: []}
    for k in range(500):
        if sum(map(len, got.values())) >= 6000:
            break
        if k % 3:
            for tp, parts in f.poll_columns(max_records=97, timeout=1.0).items():
                got[tp] += as_records(tp, parts)
        else:
            for tp, recs in f.poll(max_records=97, timeout=1.0).items():
                got[tp] += recs
    for tp in (P0, P1):
        assert [r.offset for r in got[tp]] == list(range(3000))


def test_poll_columns_is_refused_on_a_log_without_columns(make_fetcher):
    class RecordsOnly:
        def fetch(self, topic, partition, offset, max_records=500, max_bytes=1 << 20):
            return []

    f = make_fetcher(RecordsOnly())
    assert not f.columnar
    with pytest.raises(IllegalStateError):
        f.poll_columns()


# ---------------------------------------------------------------- Consumer.poll_columns in a group

@pytest.fixture
def make_consumer(zk_connect, data_dir):
    made = []

    def make(group="g", **config):
        config.setdefault("auto_offset_reset", "earliest")
        c = Consumer(group, [T], zk=zk_connect, data_dir=data_dir, session_timeout_ms=2000,
                     enable_auto_commit=False, **config)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def columns_until(consumer, count, timeout=20.0, **poll):
    import time
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for tp, parts in consumer.poll_columns(timeout_ms=100, **poll).items():
            got += as_records(tp, parts)
    return got


@pytest.mark.zk
def test_poll_columns_advances_positions_and_commits_as_poll_does(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, T, [1500, 1500], zk=zk, chunk=400)
    c = make_consumer(max_poll_records=700)
    assert c.columnar
    got = columns_until(c, 3000)
    assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in range(2) for o in range(1500)]
    assert all(r.value == f"{T}-{r.partition}-{r.offset}".encode() for r in got)
    assert {tp: c.position(tp) for tp in (P0, P1)} == {P0: 1500, P1: 1500}
    c.commit()  # the positions of what poll_columns returned
    assert {tp: c.committed(tp) for tp in (P0, P1)} == {P0: 1500, P1: 1500}
    c.seek(P1, 1200)
    c.pause(P0)
    rest = columns_until(c, 300, max_records=50)
    assert [(r.partition, r.offset) for r in rest] == [(1, o) for o in range(1200, 1500)]


@pytest.mark.zk
def test_columns_are_handed_out_only_with_the_lease(cluster, zk, data_dir, make_consumer, monkeypatch):
    """A poll whose lease lapsed while it waited gives the columns back (the positions with
    them); they come again, from the same offsets, once the lease is confirmed."""
    cluster.node("n")
    fill(data_dir, T, [200, 0], zk=zk)
    c = make_consumer()
    wait_for(lambda: c.poll_columns(0) == {} and len(c.assignment()) == 2, message="assigned")
    c.seek(P0, 0)
    member = c._member
    real = member.holds_lease
    refused = []

    def lapsed_once():
        if not refused and c.position(P0) > 0:  # columns were taken: the position moved past them
            refused.append(c.position(P0))
            return False
        return real()
    monkeypatch.setattr(member, "holds_lease", lapsed_once)
    got = columns_until(c, 200)
    assert refused and refused[0] > 0
    assert [r.offset for r in got] == list(range(200)) and c.position(P0) == 200


@pytest.mark.zk
def test_a_partition_moved_away_is_never_in_a_later_poll_of_columns(cluster, zk, data_dir, make_consumer):
    """Consumer a polls columns slowly (a small max_records, so its buffers hold more); b
    joins; once a's revocation ran, no poll of a returns a revoked partition, and what a
    committed before the revocation is where b starts."""
    cluster.node("n")
    fill(data_dir, T, [20_000, 20_000], zk=zk, chunk=1000)
    revoked = set()

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, partitions):
            a.commit({tp: a.position(tp) for tp in partitions})
            revoked.update(partitions)

    a = make_consumer(max_poll_records=100, listener=Listener())
    wait_for(lambda: a.poll_columns(100) is not None and len(a.assignment()) == 2, message="a owns both")
    b = make_consumer()
    b_got = []
    handed_after = []
    for _ in range(2000):
        res = a.poll_columns(timeout_ms=20)
        handed_after += [tp for tp in res if tp in revoked]
        for tp, parts in b.poll_columns(timeout_ms=20).items():
            b_got += as_records(tp, parts)
        if revoked and b_got:
            break
    assert revoked, "a's partition never moved"
    assert not handed_after
    moved = next(iter(revoked))
    start = min(r.offset for r in b_got if r.partition == moved.partition)
    assert start == a.committed(moved)


@pytest.mark.kafka
def test_on_kafka_poll_columns_is_refused_and_poll_goes_on(cluster, zk, zk_connect, kafka_cluster, kafka_topic_name):
    ck = pytest.importorskip("confluent_kafka")
    from coordinator.topics import TopicRegistry

    kafka_cluster.create_topic(kafka_topic_name, 1)
    TopicRegistry(zk).create(kafka_topic_name, 1)
    producer = ck.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    for i in range(20):
        producer.produce(kafka_topic_name, b"v%d" % i, partition=0)
    producer.flush(10)
    cluster.node("n")
    with Consumer("gk", [kafka_topic_name], zk=zk_connect, bootstrap_servers=kafka_cluster.bootstrap_servers,
                  auto_offset_reset="earliest", session_timeout_ms=3000) as c:
        assert not c.columnar
        with pytest.raises(IllegalStateError):
            c.poll_columns(timeout_ms=10)
        got = []
        wait_for(lambda: got.extend(r for recs in c.poll(timeout_ms=100).values() for r in recs) or len(got) >= 20,
                 30, message="records from Kafka")
        assert [r.value for r in got] == [b"v%d" % i for i in range(20)]
