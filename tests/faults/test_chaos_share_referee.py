"""The share round's referee (:mod:`tests.chaos.share_referee`) on synthetic share-partition
histories: a correct one passes; each rule it enforces fails when broken."""
from __future__ import annotations

from coordinator.protocol.share import DELIVERY_LIMIT, REJECTED, SharePartitionState, share_partitions_path
from tests.chaos.share_referee import (AS_TOLD, LATE_REJECT, WRONG_REASON, Findings, archive_verdict, replay,
                                       share_versions)
from tests.chaos.txnlog import CREATE, MULTI, SET_DATA, Op, Txn

LIMIT = 3


def st(start, end, ranges, held=None, next_token=10):
    return SharePartitionState(start, end, [list(r) for r in ranges], held or {}, next_token)


def run(*states, times=None):
    """Replay ``states`` as successive versions of partition 0: (facts, findings)."""
    path = "/chaos" + share_partitions_path("g", "t", 0)
    txns = [Txn(i + 1, 0x10, i, (times or {}).get(i, 1000 + i), SET_DATA if i else CREATE,
                (Op(SET_DATA if i else CREATE, path, s.encode()),)) for i, s in enumerate(states)]
    findings = Findings()
    versions = share_versions(txns, "/chaos", "g", "t", findings)[0]
    return replay(0, versions, LIMIT, findings), findings


def test_a_correct_history_passes():
    facts, findings = run(
        st(0, 0, []),
        st(0, 3, [[0, 2, "aq", 1, 1, 0]], {1: ["m1", 0]}),                      # m1 acquires 0..2
        st(0, 3, [[0, 0, "ok", 0, 0, 0], [1, 1, "dq", 1, 0, 1], [2, 2, "av", 1, 0, 0]]),  # accept, reject, expire
        st(0, 3, [[0, 0, "ok", 0, 0, 0], [1, 1, "dw", 1, 2, 1], [2, 2, "aq", 2, 3, 0]],
           {2: ["m2", 0], 3: ["m2", 0]}),                                       # m2 claims the letter, takes 2
        st(3, 3, []),                                                           # letter marked, 2 accepted
    )
    assert not findings.counts, findings.problems
    assert facts.final.start == 3 and sorted(facts.accepted) == [0, 2] and facts.archived == {1: 1}


def test_a_second_holder_while_the_first_holds_fails():
    _, findings = run(st(0, 1, [[0, 0, "aq", 1, 1, 0]], {1: ["m1", 0]}),
                      st(0, 1, [[0, 0, "aq", 2, 2, 0]], {2: ["m2", 0]}, next_token=11))
    assert findings.counts["share-locks"] == 1


def test_the_same_holder_acquiring_again_in_one_write_passes():
    _, findings = run(st(0, 1, [[0, 0, "aq", 1, 1, 0]], {1: ["m1", 0]}),
                      st(0, 1, [[0, 0, "aq", 2, 2, 0]], {2: ["m1", 0]}))
    assert not findings.counts


def test_too_many_deliveries_fail():
    _, findings = run(st(0, 1, [[0, 0, "aq", LIMIT + 1, 1, 0]], {1: ["m1", 0]}))
    assert findings.counts["share-deliveries"] == 1


def test_a_done_record_coming_back_fails():
    _, findings = run(st(0, 1, [[0, 0, "aq", 1, 1, 0]], {1: ["m1", 0]}),
                      st(1, 1, []),
                      st(0, 1, [[0, 0, "aq", 2, 2, 0]], {2: ["m2", 0]}))
    assert findings.counts["share-accepts"] >= 1


def test_a_record_done_without_delivery_fails():
    _, findings = run(st(0, 0, []), st(2, 2, []))
    assert findings.counts["share-lost"] == 2


def test_an_early_redelivery_after_a_delay_fails():
    _, findings = run(st(0, 1, [[0, 0, "aq", 1, 1, 0]], {1: ["m1", 0]}),
                      st(0, 1, [[0, 0, "dl", 1, 1, 500]]),
                      st(0, 1, [[0, 0, "av", 1, 0, 0]]),
                      st(0, 1, [[0, 0, "aq", 2, 2, 0]], {2: ["m2", 0]}),
                      times={1: 10_000, 2: 10_100, 3: 10_200})
    assert findings.counts["share-delays"] == 1


def test_an_unclaimed_dead_letter_leaving_the_window_fails():
    _, findings = run(st(0, 1, [[0, 0, "aq", 1, 1, 0]], {1: ["m1", 0]}),
                      st(0, 1, [[0, 0, "dq", 1, 0, 1]]),
                      st(1, 1, []))
    assert findings.counts["share-dead-letters"] == 1


def test_refused_writes_and_other_paths_are_ignored():
    path = "/chaos" + share_partitions_path("g", "t", 0)
    bad = st(0, 1, [[0, 0, "aq", 1, 1, 0]], {1: ["m2", 0]})
    txns = [Txn(1, 1, 1, 1, MULTI, (Op(SET_DATA, path, bad.encode()), Op(-1, error=-101))),
            Txn(2, 1, 2, 2, SET_DATA, (Op(SET_DATA, "/chaos/other", b"x"),))]
    assert share_versions(txns, "/chaos", "g", "t", Findings()) == {}


def test_a_reject_keyed_record_at_the_limit_passes_only_after_limit_deliveries():
    assert archive_verdict(REJECTED, REJECTED, 1, LIMIT) == AS_TOLD
    assert archive_verdict(REJECTED, DELIVERY_LIMIT, LIMIT, LIMIT) == LATE_REJECT
    assert archive_verdict(REJECTED, DELIVERY_LIMIT, LIMIT - 1, LIMIT) == WRONG_REASON
    assert archive_verdict(None, REJECTED, 1, LIMIT) == WRONG_REASON
    assert archive_verdict(DELIVERY_LIMIT, DELIVERY_LIMIT, LIMIT, LIMIT) == AS_TOLD
