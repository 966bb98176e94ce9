"""The chaos run's referee, on small inputs: the transaction-log reader (synthetic files, and
a real server's log compared with ZooKeeper's own TxnLogToolkit), the group history derived
from it (synthetic transactions, and a real group's), and every check on synthetic evidence."""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib

import pytest

from coordinator.topics import TopicRegistry
from coordinator.testing.zkserver import Ensemble, local_classpath
from consumer.records import TopicPartition
from tests.chaos import txnlog
from tests.chaos.history import RELEASED, SESSION_CLOSED, group_history
from tests.chaos.referee import (Printed, ProcessEnd, check_duplicates, check_evidence, check_exits, check_lost,
                                 check_offsets, check_ownership, read_printed)
from tests.chaos.txnlog import (CHECK, CLOSE_SESSION, CREATE, CREATE_SESSION, DELETE, ERROR, MULTI, SET_DATA, Op,
                                Txn, TxnLogError)
from tests.support.helpers import wait_for

def needs_zookeeper(test):
    """A test that starts a ZooKeeper server of its own."""
    return pytest.mark.zk(pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")(test))

# ---------------------------------------------------------------- jute, written by hand


def _int(v):
    return struct.pack(">i", v)


def _long(v):
    return struct.pack(">q", v)


def _buf(b):
    return _int(-1) if b is None else _int(len(b)) + b


def _str(s):
    return _buf(s.encode())


_ACL = _int(1) + _int(31) + _str("world") + _str("anyone")


def rec_create(path, data=b"", ephemeral=False):
    return _str(path) + _buf(data) + _ACL + (b"\x01" if ephemeral else b"\x00") + _int(7)


def rec_set(path, data, version=0):
    return _str(path) + _buf(data) + _int(version)


def rec_multi(*subs):
    return _int(len(subs)) + b"".join(_int(kind) + _buf(raw) for kind, raw in subs)


def raw_txn(zxid, session, kind, record, time_ms=1000, cxid=1, digest=True):
    header = _long(session) + _int(cxid) + _long(zxid) + _long(time_ms) + _int(kind)
    return header + record + (_int(2) + _long(0x1234) if digest else b"")


def entry(raw):
    return _long(zlib.adler32(raw)) + _int(len(raw)) + raw + b"B"


def log_bytes(*raws, padding=64):
    return _int(txnlog.MAGIC) + _int(2) + _long(0) + b"".join(entry(r) for r in raws) + b"\x00" * padding


def write_log(tmp_path, name, data):
    d = tmp_path / name / "version-2"
    d.mkdir(parents=True)
    (d / "log.1").write_bytes(data)
    return str(tmp_path / name)


SAMPLE = [
    raw_txn(1, 0x10, CREATE_SESSION, _int(2000)),
    raw_txn(2, 0x10, CREATE, rec_create("/a/e", b"x", ephemeral=True)),
    raw_txn(3, 0x10, MULTI, rec_multi((CHECK, _str("/a/e") + _int(0)), (SET_DATA, rec_set("/a/o", b"5", 3)),
                                       (DELETE, _str("/a/old")))),
    raw_txn(4, 0x10, MULTI, rec_multi((ERROR, _int(-103)), (ERROR, _int(-2)))),
    raw_txn(5, 0x10, ERROR, _int(-110)),
    raw_txn(6, 0x10, CLOSE_SESSION, _int(1) + _str("/a/e")),
    raw_txn(7, 0x11, CLOSE_SESSION, b"", digest=False),   # closeSessionTxn disabled, no digest
    raw_txn(8, 0x12, CLOSE_SESSION, b""),                 # disabled, digest only
]

# ---------------------------------------------------------------- the reader


def test_reader_decodes_every_kind_of_entry(tmp_path):
    log = txnlog.read_log(write_log(tmp_path, "s1", log_bytes(*SAMPLE)) + "/version-2/log.1")
    assert [t.zxid for t in log.txns] == list(range(1, 9)) and not log.torn_tail
    session, create, multi, refused, error, close, bare, digest_only = log.txns
    assert session.ops == (Op(CREATE_SESSION, timeout_ms=2000),) and session.session == 0x10
    assert create.ops == (Op(CREATE, "/a/e", b"x", ephemeral=True),) and create.time_ms == 1000
    assert [(o.type, o.path, o.data, o.version) for o in multi.ops] == [
        (CHECK, "/a/e", None, 0), (SET_DATA, "/a/o", b"5", 3), (DELETE, "/a/old", None, -1)]
    assert not multi.failed and refused.failed and error.failed
    assert [o.error for o in refused.ops] == [-103, -2]
    assert close.ops == (Op(CLOSE_SESSION, paths=("/a/e",)),)
    assert bare.ops == digest_only.ops == (Op(CLOSE_SESSION),)


def test_reader_stops_at_padding_and_ignores_a_torn_last_entry(tmp_path):
    whole = log_bytes(*SAMPLE[:3], padding=0)
    # Cut inside the checksum, inside the length, inside the txn, before the 'B'; then the
    # file's zero padding, as on disk. A cut before the length is complete reads as the end.
    for cut in (3, 10, 20, len(entry(SAMPLE[3])) - 1):
        data = whole + entry(SAMPLE[3])[:cut] + b"\x00" * 64
        log = txnlog.read_log(write_log(tmp_path, f"cut{cut}", data) + "/version-2/log.1")
        assert [t.zxid for t in log.txns] == [1, 2, 3]
        assert log.torn_tail == (cut >= 12)


def test_reader_treats_a_bad_checksum_as_torn_at_the_end_and_as_damage_before(tmp_path):
    bad = bytearray(entry(SAMPLE[1]))
    bad[-3] ^= 0xFF  # a byte of the txn, not of the framing
    header = _int(txnlog.MAGIC) + _int(2) + _long(0)
    at_end = txnlog.read_log(write_log(tmp_path, "end", header + entry(SAMPLE[0]) + bytes(bad) + b"\x00" * 32)
                             + "/version-2/log.1")
    assert [t.zxid for t in at_end.txns] == [1] and at_end.torn_tail
    with pytest.raises(TxnLogError, match="checksum"):
        txnlog.read_log(write_log(tmp_path, "mid", header + bytes(bad) + entry(SAMPLE[2])) + "/version-2/log.1")


def test_reader_refuses_what_is_not_a_transaction_log(tmp_path):
    with pytest.raises(TxnLogError, match="not a ZooKeeper transaction log"):
        txnlog.read_log(write_log(tmp_path, "junk", b"PK\x03\x04" + b"\x00" * 40) + "/version-2/log.1")
    with pytest.raises(TxnLogError, match="unsupported txn type"):
        txnlog.read_log(write_log(tmp_path, "odd", log_bytes(raw_txn(1, 1, 99, b""))) + "/version-2/log.1")
    with pytest.raises(TxnLogError, match="ends early"):
        txnlog.read_log(write_log(tmp_path, "short", log_bytes(raw_txn(1, 1, CREATE, _str("/x"), digest=False)))
                        + "/version-2/log.1")


def test_merge_orders_by_zxid_keeps_each_once_and_reports_conflicts(tmp_path):
    # A refused multi may be logged with its operations up to the failing one, or all as errors.
    refused_as_asked = raw_txn(4, 0x10, MULTI, rec_multi((CREATE, rec_create("/a/x")), (ERROR, _int(-2))))
    refused_as_errors = raw_txn(4, 0x10, MULTI, rec_multi((ERROR, _int(0)), (ERROR, _int(-2))))
    a = write_log(tmp_path, "a", log_bytes(SAMPLE[0], SAMPLE[2], refused_as_asked, SAMPLE[4]))
    b = write_log(tmp_path, "b", log_bytes(SAMPLE[1], SAMPLE[2], refused_as_errors,
                                           raw_txn(5, 0x10, DELETE, _str("/a/e"))))
    merged = txnlog.read_logs([a, b])
    assert [t.zxid for t in merged.txns] == [1, 2, 3, 4, 5]
    assert len(merged.conflicts) == 1 and merged.conflicts[0][0].zxid == 5


def test_a_proposal_only_a_minority_logged_was_never_committed(tmp_path):
    # Three servers: zxid 0x400000003 (a commit proposed by the old leader, logged by it alone
    # before it lost its quorum) is in one log; the next epoch, logged by the other two, never
    # had it. It changed nothing, so the history leaves it out and names it.
    epoch4 = [raw_txn(0x400000001, 0x10, CREATE_SESSION, _int(2000)),
              raw_txn(0x400000002, 0x10, SET_DATA, rec_set("/a/o", b"7", 1))]
    dropped = raw_txn(0x400000003, 0x10, SET_DATA, rec_set("/a/o", b"9", 2))
    epoch5 = raw_txn(0x500000001, 0x11, CREATE_SESSION, _int(2000))
    dirs = [write_log(tmp_path, "s1", log_bytes(*epoch4, epoch5)),
            write_log(tmp_path, "s2", log_bytes(*epoch4, epoch5)),
            write_log(tmp_path, "s3", log_bytes(*epoch4, dropped))]
    merged = txnlog.read_logs(dirs, quorum=2)
    assert [t.zxid for t in merged.txns] == [0x400000001, 0x400000002, 0x500000001]
    assert [t.zxid for t in merged.never_committed] == [0x400000003]
    assert [t.zxid for t in txnlog.read_logs(dirs).txns][-2:] == [0x400000003, 0x500000001]  # quorum 1: all


def test_log_files_are_in_zxid_order(tmp_path):
    d = tmp_path / "version-2"
    d.mkdir()
    for name in ("log.a", "log.2", "log.100000001", "snapshot.5"):
        (d / name).write_bytes(b"")
    assert [p.rsplit("/", 1)[1] for p in txnlog.log_files(str(tmp_path))] == ["log.2", "log.a", "log.100000001"]

# ---------------------------------------------------------------- the group's history

G = "/app/consumers/groups/g"


def t(zxid, session, *ops, kind=MULTI, time_ms=None):
    return Txn(zxid, session, 0, time_ms if time_ms is not None else zxid * 100, kind, tuple(ops))


def register(zxid, session, member):
    return t(zxid, session, Op(CREATE, f"{G}/ids/{member}", b"{}", ephemeral=True), kind=CREATE)


def claim(zxid, session, member, partition, stream_n=0):
    return t(zxid, session, Op(CREATE, f"{G}/owners/t/{partition}", f"{member}-{stream_n}".encode(), ephemeral=True))


def commit(zxid, session, partition, offset):
    return t(zxid, session, Op(CHECK, f"{G}/owners/t/{partition}", version=0),
             Op(SET_DATA, f"{G}/offsets/t/{partition}", str(offset).encode()))


def release(zxid, session, partition):
    return t(zxid, session, Op(DELETE, f"{G}/owners/t/{partition}"))


def close(zxid, session):
    return t(zxid, session, Op(CLOSE_SESSION), kind=CLOSE_SESSION)


def refused(zxid, session):
    return t(zxid, session, Op(ERROR, error=-101), Op(ERROR, error=-2))


HISTORY = [
    register(1, 0xA, "m1"), register(2, 0xB, "m2"),
    t(3, 0xA, Op(CREATE, f"{G}/offsets/t/0", b"")),                     # a claim's empty fencing node
    claim(4, 0xA, "m1", 0), claim(5, 0xA, "m1", 1),
    commit(6, 0xA, 0, 10), commit(7, 0xA, 1, 4),
    refused(8, 0xA),                                                    # changed nothing
    t(9, 0xA, Op(CHECK, f"{G}/owners/t/1", version=0), Op(SET_DATA, f"{G}/offsets/t/1", b"6"),
      Op(DELETE, f"{G}/owners/t/1")),                                  # revoke: commit + release
    claim(10, 0xB, "m2", 1), commit(11, 0xB, 1, 9),
    close(12, 0xA),                                                     # m1's session expires
    register(13, 0xC, "m1"), claim(14, 0xC, "m1", 0, stream_n=0),      # m1 again, new session
    t(15, 0xD, Op(CREATE, "/app/consumers/groups/other/owners/t/0", b"x-0", ephemeral=True)),  # another group
]


def test_history_sessions_ownerships_and_commits():
    h = group_history(HISTORY, "g", chroot="/app")
    assert h.sessions_of == {"m1": [0xA, 0xC], "m2": [0xB]}
    (first0, again0), (held1, taken1) = h.ownerships[("t", 0)], h.ownerships[("t", 1)]
    assert (first0.session, first0.start_zxid, first0.end_zxid, first0.end_reason) == (0xA, 4, 12, SESSION_CLOSED)
    assert (again0.session, again0.end_zxid) == (0xC, None)
    assert (held1.end_zxid, held1.end_reason, held1.end_ms) == (9, RELEASED, 900)
    assert (taken1.session, taken1.stream, taken1.end_zxid) == (0xB, "m2-0", None)
    assert [(c.zxid, c.session, c.offset) for c in h.commits[("t", 1)]] == [(7, 0xA, 4), (9, 0xA, 6), (11, 0xB, 9)]
    assert [c.offset for c in h.commits[("t", 0)]] == [None, 10]
    assert h.committed() == {("t", 0): 10, ("t", 1): 9}
    assert [o.session for o in h.intervals("m1", ("t", 0))] == [0xA, 0xC]
    assert h.problems == []


def test_history_reports_claims_it_cannot_make_sense_of():
    h = group_history([register(1, 0xA, "m1"), claim(2, 0xA, "m2", 0), claim(3, 0xB, "m3", 0)], "g", "/app")
    assert len(h.problems) == 2
    assert "claimed" in h.problems[0] and "created while held" in h.problems[1]

# ---------------------------------------------------------------- the checks


def printed(member, partition, offset, at_ms, value=None):
    return Printed("t", partition, offset, value if value is not None else f"v{partition}.{offset}", member,
                   at_ms / 1000.0, f"{member}.out:{offset}")


def test_ownership_inside_outside_and_never():
    h = group_history(HISTORY, "g", chroot="/app")
    ok = [printed("m1", 0, 1, 450), printed("m1", 1, 5, 900.5), printed("m2", 1, 7, 1000), printed("m1", 0, 2, 1500)]
    assert check_ownership(ok, h).ok  # 900.5: within the 1 ms allowed for ZooKeeper's truncated times
    zombie = printed("m1", 1, 6, 1250)       # m1 released partition 1 at 900 ms
    stranger = printed("m9", 0, 3, 500)
    result = check_ownership(ok + [zombie, stranger], h)
    assert not result.ok and result.summary == "outside-ownership=2 (max gap never owned)"
    assert any("m1 printed t/1 offset 6 at 1.250, 0.350s after its ownership ended" in d for d in result.details)
    assert check_ownership(ok + [zombie], h).summary == "outside-ownership=1 (max gap 0.350s)"
    early = check_ownership([printed("m2", 1, 7, 980)], h)  # m2 claimed partition 1 at 1000 ms
    assert "0.020s before its ownership began" in early.details[-1]
    # Between two ownerships, the gap counts from the end of the last one.
    between = check_ownership([printed("m1", 0, 12, 1250)], h)  # m1: session A until 1200, C from 1400
    assert "0.050s after its ownership ended" in between.details[-1]


def test_duplicates_explained_only_by_an_ownership_that_ended_without_committing_past():
    h = group_history(HISTORY, "g", chroot="/app")
    # t/0 offset 12: m1 printed it under session A (which committed 10, not past 12), the session
    # closed, m1 printed it again under session C: explained.
    explained = [printed("m1", 0, 12, 1150), printed("m1", 0, 12, 1450)]
    result = check_duplicates(explained, h)
    assert result.ok and result.summary == "duplicates=1 (all explained)"
    assert "after session closed" in result.details[0]
    # t/0 offset 5: session A committed 10 before it lost the partition: the repeat is a bug.
    past = [printed("m1", 0, 5, 450), printed("m1", 0, 5, 1450)]
    result = check_duplicates(past, h)
    assert not result.ok and result.summary == "duplicates=1 (1 unexplained)"
    assert "committed 10 (zxid 0x6)" in result.details[1]
    # t/1 offset 7: m1 released it at 900 after committing 6 (not past 7): explained (released).
    assert check_duplicates([printed("m1", 1, 7, 850), printed("m2", 1, 7, 1050)], h).ok
    # ... but not if the second print was outside ownership (a zombie), nor twice in one ownership.
    zombie = check_duplicates([printed("m2", 1, 8, 1050), printed("m1", 1, 8, 1300)], h)
    assert "did not own the partition" in zombie.details[1]
    twice = check_duplicates([printed("m2", 1, 8, 1050), printed("m2", 1, 8, 1300)], h)
    assert "twice within one ownership" in twice.details[1]


def test_lost_wrong_and_unwritten_records():
    produced = {("t", 0): ["0", "2"], ("t", 1): ["1"]}
    everything = [printed("m", 0, 0, 1, "0"), printed("m", 0, 1, 1, "2"), printed("m", 1, 0, 1, "1")]
    assert check_lost(produced, everything, producer_count=3).ok
    result = check_lost(produced, everything[:2] + [printed("m", 1, 0, 1, "7")], producer_count=4)
    assert not result.ok and result.summary == "lost=1 wrong-value=1"  # the 4th record never reached the log
    assert check_lost(produced, everything[1:], None).summary == "lost=1"


def test_exits_expected_only_when_the_harness_ended_the_process():
    ends = [ProcessEnd("consumer", "a", "a.log", -9, "SIGKILL"), ProcessEnd("consumer", "b", "b.log", 0, "SIGTERM")]
    assert check_exits(ends).ok
    bad = [ProcessEnd("consumer", "c", "c.log", 1, None, "error: commit failed: ConnectionLoss"),
           ProcessEnd("coordinatord", "d", "d.log", 1, "SIGTERM"),
           ProcessEnd("consumer", "e", "e.log", 0, None)]
    result = check_exits(ends + bad)
    assert result.summary == "unexpected-exits=3"
    assert result.details[0] == "consumer c: exit status 1 on its own; error: commit failed: ConnectionLoss (log c.log)"


def test_a_sigterm_before_the_first_log_line_is_an_expected_exit(tmp_path):
    """Killed by SIGTERM's default action: expected only while the process had logged nothing
    (still starting); once it logged, its own handler should have made it exit 0."""
    empty, started = tmp_path / "empty.log", tmp_path / "started.log"
    empty.write_text("")
    started.write_text("info: Connecting to 10.0.0.1:2181\n")
    assert check_exits([ProcessEnd("consumer", "a", str(empty), -15, "SIGTERM")]).ok
    assert not check_exits([ProcessEnd("consumer", "b", str(started), -15, "SIGTERM")]).ok
    assert not check_exits([ProcessEnd("consumer", "c", str(empty), -15, None)]).ok


def test_offsets_must_reach_the_end_and_agree_with_zookeeper():
    h = group_history(HISTORY, "g", chroot="/app")
    assert check_offsets({("t", 0): 10, ("t", 1): 9}, h, {("t", 0): 10, ("t", 1): 9}).ok
    behind = check_offsets({("t", 0): 11, ("t", 1): 9}, h)
    assert not behind.ok and behind.summary == "offsets=1/2 at end"
    disagree = check_offsets({("t", 0): 10, ("t", 1): 9}, h, {("t", 0): 10, ("t", 1): 8})
    assert not disagree.ok and "transaction log says 9" in disagree.details[0]


def test_evidence_problems_fail_the_referee_check():
    h = group_history(HISTORY, "g", chroot="/app")
    assert check_evidence(h, [], []).ok
    assert not check_evidence(h, [], ["x.out:3: ValueError"]).ok


def test_read_printed_skips_a_last_line_cut_short(tmp_path):
    path = tmp_path / "c.out"
    path.write_text('{"topic":"t","partition":0,"offset":1,"key":null,"value":"1","member":"m","generation":2,'
                    '"at":12.5}\nnot json\n{"topic":"t","partit')
    result = read_printed(str(path))
    assert result.cut_last_line and len(result.bad_lines) == 1
    assert result.records == [Printed("t", 0, 1, "1", "m", 12.5, f"{path}:1")]

# ---------------------------------------------------------------- against a real server


@pytest.fixture
def server(tmp_path):
    ensemble = Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk")).start()
    yield ensemble
    ensemble.close()


@needs_zookeeper
def test_real_log_read_as_zookeepers_own_tool_reads_it(server):
    from coordinator.zkclient import close_client, start_client
    from tests.support.groups import expire_session
    a = start_client(server.connect + "/app", 2000)
    a.create("/e", b"x", ephemeral=True)
    a.create("/p", b"1")
    tx = a.transaction()
    tx.check("/e", 0), tx.set_data("/p", b"2"), tx.create("/e2", b"", ephemeral=True)
    tx.commit()
    tx = a.transaction()
    tx.check("/e", 5), tx.set_data("/p", b"3")
    tx.commit()  # refused: a logged multi of errors
    expire_session(a, server.connect)  # its closeSession deletes both ephemeral nodes
    close_client(a)
    server.servers[0].stop()

    logs = txnlog.read_logs([server.servers[0].data_dir])
    ours = [(t.session, t.cxid, t.zxid, txnlog.TYPE_NAMES[t.type]) for t in logs.txns]
    assert not logs.conflicts and not logs.torn_tails
    changes = [(t.type, [(o.name, o.path) for o in t.ops], t.failed) for t in logs.txns
               if t.ops and t.ops[0].path.startswith("/app/")]
    assert changes == [
        (CREATE, [("create", "/app/e")], False), (CREATE, [("create", "/app/p")], False),
        (MULTI, [("check", "/app/e"), ("setData", "/app/p"), ("create", "/app/e2")], False),
    ]
    assert [t.failed for t in logs.txns if t.type == MULTI] == [False, True]
    closed = [t for t in logs.txns if t.type == CLOSE_SESSION and t.ops[0].paths]
    assert len(closed) == 1 and set(closed[0].ops[0].paths) == {"/app/e", "/app/e2"}
    assert closed[0].session == next(t.session for t in logs.txns if t.ops and t.ops[0].path == "/app/e")

    java = shutil.which("java")
    if java is None:
        return
    toolkit = subprocess.run([java, "-cp", local_classpath(), "org.apache.zookeeper.server.persistence.TxnLogToolkit",
                              logs.files[0]], capture_output=True, text=True, timeout=60)
    theirs = [(int(s, 16), int(c, 16), int(z, 16), kind) for s, c, z, kind in
              re.findall(r"session (0x[0-9a-f]+) cxid (0x[0-9a-f]+) zxid (0x[0-9a-f]+) (\w+)", toolkit.stdout)]
    assert theirs == ours and len(ours) == 9  # the chroot's client, ours (its session closed by the twin)


@needs_zookeeper
def test_real_group_history(server):
    """A member claims, commits, loses its session, claims again under a new one, and gives a
    partition to a second member: the history read from the log says exactly that."""
    from tests.support.groups import Cluster, expire_session, wait_stable
    connect = server.connect + "/app"
    cluster = Cluster(connect)
    try:
        admin = cluster.client()
        TopicRegistry(admin).create("t", 2)
        cluster.node("c1")
        m1 = cluster.member("g", ["t"])
        wait_for(lambda: len(m1.recorder.owned) == 2, 15, message="m1 owns both")
        first_session = m1.client.client_id[0]
        m1.commit({TopicPartition("t", 0): 3})
        expire_session(m1.client, connect)
        lost_both = ("lost", frozenset({TopicPartition("t", 0), TopicPartition("t", 1)}))
        wait_for(lambda: lost_both in m1.recorder.events and len(m1.recorder.owned) == 2, 15,
                 message="m1 lost both, then owns both again under a new session")
        m2 = cluster.member("g", ["t"])
        state = wait_stable(admin, "g", 2)
        owned_by_m2 = next(iter(m2.recorder.owned))
    finally:
        cluster.close()
    server.servers[0].stop()

    h = group_history(txnlog.read_logs([server.servers[0].data_dir]).txns, "g", chroot="/app")
    second_session = h.sessions_of[m1.consumer_id][1]
    assert h.sessions_of[m1.consumer_id][0] == first_session and len(h.sessions_of[m1.consumer_id]) == 2
    assert h.problems == []
    for p in (0, 1):
        first, *rest = h.ownerships[("t", p)]
        assert (first.session, first.end_reason) == (first_session, SESSION_CLOSED)
        assert rest[0].session == second_session
    moved = h.ownerships[("t", owned_by_m2.partition)]
    assert moved[1].end_reason == RELEASED and moved[2].session in h.sessions_of[m2.consumer_id]
    # Committed by the first session (a later claim may write the same value again).
    assert [c.session for c in h.commits[("t", 0)] if c.offset == 3][0] == first_session
    assert state.generation >= 2

# ---------------------------------------------------------------- a whole run directory, judged


def fake_run(tmp_path, zombie: bool):
    """A run directory as the harness leaves it: one partition of 3 records; m1 prints and
    commits them, is paused, loses its session; m2 takes over. With ``zombie``, m1 prints
    offset 2 again after its session was closed."""
    from consumer.log import Log
    from tests.chaos.judge import RunRecord
    log = Log(str(tmp_path / "data"))
    log.append("records", 0, [(None, str(i).encode(), 0, ()) for i in range(3)])
    log.close()
    g = "/chaos/consumers/groups/chaos"
    ops = [
        raw_txn(1, 0xA, CREATE_SESSION, _int(2000), time_ms=1000),
        raw_txn(2, 0xA, CREATE, rec_create(f"{g}/ids/m1", b"{}", ephemeral=True), time_ms=1001),
        raw_txn(3, 0xA, MULTI, rec_multi((CREATE, rec_create(f"{g}/owners/records/0", b"m1-0", ephemeral=True)),
                                          (CREATE, rec_create(f"{g}/offsets/records/0", b""))), time_ms=1002),
        raw_txn(4, 0xA, MULTI, rec_multi((CHECK, _str(f"{g}/offsets/records/0") + _int(0)),
                                          (SET_DATA, rec_set(f"{g}/offsets/records/0", b"2", 0))), time_ms=1100),
        raw_txn(5, 0xA, CLOSE_SESSION, _int(2) + _str(f"{g}/ids/m1") + _str(f"{g}/owners/records/0"), time_ms=4000),
        raw_txn(6, 0xB, CREATE_SESSION, _int(2000), time_ms=4001),
        raw_txn(7, 0xB, CREATE, rec_create(f"{g}/ids/m2", b"{}", ephemeral=True), time_ms=4002),
        raw_txn(8, 0xB, MULTI, rec_multi((CREATE, rec_create(f"{g}/owners/records/0", b"m2-0", ephemeral=True)),
                                          (SET_DATA, rec_set(f"{g}/offsets/records/0", b"2", 1))), time_ms=4003),
        raw_txn(9, 0xB, MULTI, rec_multi((CHECK, _str(f"{g}/offsets/records/0") + _int(2)),
                                          (SET_DATA, rec_set(f"{g}/offsets/records/0", b"3", 2))), time_ms=4100),
    ]
    # Three servers: the first stopped early, the second missed the start (it was down) and
    # logged the rest, the third logged everything; each txn was logged by a quorum.
    write_log(tmp_path / "zk" / "server1", "data", log_bytes(*ops[:6]))
    write_log(tmp_path / "zk" / "server2", "data", log_bytes(*ops[4:]))
    write_log(tmp_path / "zk" / "server3", "data", log_bytes(*ops))
    lines = {"m1": [(0, 1.050), (1, 1.050)] + ([(2, 4.500)] if zombie else []), "m2": [(2, 4.050)]}
    (tmp_path / "logs").mkdir()
    for member, prints in lines.items():
        with open(tmp_path / "logs" / f"{member}.out", "w") as f:
            for offset, at in prints:
                f.write(json.dumps({"topic": "records", "partition": 0, "offset": offset, "key": None,
                                    "value": str(offset), "member": member, "generation": 1, "at": at}) + "\n")
    RunRecord(seed=7, duration=10, group="chaos", topic="records", partitions=1, chroot="/chaos",
              faults={"pause": 1}, consumer_outputs=["logs/m1.out", "logs/m2.out"], produced_count=3,
              live_committed={0: 3},
              processes=[ProcessEnd("consumer", "m1", "m1.log", 1 if zombie else 0, None if zombie else "SIGTERM"),
                         ProcessEnd("consumer", "m2", "m2.log", 0, "SIGTERM")]).save(str(tmp_path))
    return str(tmp_path)


def test_judge_a_run_directory(tmp_path):
    from tests.chaos.judge import judge
    (tmp_path / "ok").mkdir()
    outcome = judge(fake_run(tmp_path / "ok", zombie=False))
    assert outcome.passed, outcome.verdict
    assert outcome.verdict == ("chaos PASS seed=7 duration=10s data-plane=embedded network=shared produced=3 "
                               "consumed=3 lost=0 duplicates=0 (all explained) outside-ownership=0 "
                               "unexpected-exits=0 model-steps=claims:2,commits:2,releases:0,tool-writes:0 resets-at-heal=0 "
                               "faults=kill:0 term:0 pause:1 leader-kill:0 "
                               "zk-restart:0 quorum-loss:0")
    assert (tmp_path / "ok" / "referee" / "ownership.txt").read_text().count("session 0x") >= 2

    (tmp_path / "bad").mkdir()
    outcome = judge(fake_run(tmp_path / "bad", zombie=True))
    first, *fails = outcome.verdict.splitlines()
    assert first.startswith("chaos FAIL seed=7") and "duplicates=1 (1 unexplained)" in first
    assert "outside-ownership=1 (max gap 0.500s)" in first and "unexpected-exits=1" in first
    assert [line.split(":")[0].strip() for line in fails] == ["FAIL duplicates", "FAIL outside-ownership",
                                                              "FAIL exits"]
    assert "referee/outside-ownership.txt" in fails[1]


def test_judge_a_kafka_run_by_what_was_read_back_from_kafka(tmp_path):
    """On Kafka the topic is the dump read back from the brokers, not data/; a partition whose
    log no longer starts at 0 makes the evidence doubtful."""
    from tests.chaos import kafkatopic
    from tests.chaos.judge import RunRecord, judge
    run_dir = fake_run(tmp_path, zombie=False)
    shutil.rmtree(tmp_path / "data")
    record = RunRecord.load(run_dir)
    record.data_plane, record.network, record.kinds = "kafka", "namespaces", ["pause", "broker-down"]
    record.save(run_dir)
    kafkatopic.save(run_dir, "records", {0: {"start": 0, "values": ["0", "1", "2"]}})
    outcome = judge(run_dir)
    assert outcome.passed, outcome.verdict
    assert "data-plane=kafka network=namespaces produced=3" in outcome.verdict
    assert outcome.verdict.endswith("faults=pause:1 broker-down:0")

    kafkatopic.save(run_dir, "records", {0: {"start": 1, "values": ["1", "2"]}})
    outcome = judge(run_dir)
    assert not outcome.passed and "FAIL referee" in outcome.verdict
    assert "starts at 1" in (tmp_path / "referee" / "referee.txt").read_text()
