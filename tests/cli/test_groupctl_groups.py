"""groupctl coordinator / groups list|describe|reset-offsets|delete / consume, against a real ZooKeeper.

Commands run in-process through click's CliRunner; the SIGTERM test runs ``groupctl consume``
as a real process. Errors must be one line ``error: ...`` (exit 1, usage errors 2), never a
traceback.
"""
from __future__ import annotations

import datetime as dt
import functools
import json
import signal
import socket
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from consumer import Consumer
from consumer.log import Log
from coordinator import protocol, read
from consumer.cli.groupctl import main
from consumer.cli.reset import StoredOffset, read_offsets, write_offsets
from consumer.records import TopicPartition
from coordinator.errors import ZkGroupsError
from coordinator.topics import TopicRegistry
from tests.support.groups import leader_info, read_state, wait_stable
from tests.support import helpers
from tests.support.helpers import assert_failed, ok, wait_for

# 2026-01-01T00:00:00Z; record i of a partition is stamped BASE_TS + i seconds
BASE_TS = int(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)


# Record o of a partition is stamped BASE_TS + o seconds (the --to-datetime tests rely on it).
fill = functools.partial(helpers.fill, ts=lambda o: BASE_TS + o * 1000)


def committed(zk, group, topic, partitions):
    out = {}
    for p in range(partitions):
        path = protocol.offsets_path(group, topic, p)
        out[p] = int(zk.get(path)[0]) if zk.exists(path) else None
    return out


def table(text: str, header: str):
    """Rows (split on whitespace) of the table whose header line starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    return [line.split() for line in lines[start + 1:] if line and not line.startswith(("dry run", "reset "))]


def members(zk, group):
    return zk.get_children(protocol.ids_path(group)) if zk.exists(protocol.ids_path(group)) else []


# ---------------------------------------------------------------- coordinator

def test_coordinator_without_a_leader(groupctl):
    assert ok(groupctl("coordinator")).splitlines() == ["leader: none", "verified all groups: not yet",
                                                        "contenders: none"]


def test_coordinator_shows_leader_epoch_and_contenders(groupctl, cluster, zk):
    cluster.node("n1")
    leader = cluster.leader()
    cluster.node("n2")
    wait_for(lambda: len(zk.get_children(protocol.ELECTION)) == 2, message="two contenders")
    # n2's arrival moves shards to it, so "verified" may turn back to "not yet" until n2 has
    # verified its own: wait for both to lead shards as well.
    wait_for(lambda: read.all_verified(zk) and {n for n, _, _ in read.shard_leaders(zk).values()} == {"n1", "n2"},
             message="both nodes lead shards, every shard verified")
    info = leader_info(zk)
    out = ok(groupctl("coordinator")).splitlines()
    assert out[0].startswith(f"leader: {leader.node_id} (host {info.host}, pid {info.pid})")
    assert f"epoch: {info.epoch}" in out and info.epoch == leader.epoch
    assert "verified all groups: yes" in out
    assert any(line.startswith("since: 20") for line in out)
    assert f"contenders: {leader.node_id}, n2" in out
    nodes = out[out.index(next(line for line in out if line.startswith("NODE"))) + 1:][:2]
    assert [line.split()[0] for line in nodes] == ["n1", "n2"]  # both lead shards
    assert all(int(line.split()[3]) > 0 for line in nodes)


def test_coordinator_with_a_corrupt_leader_znode(groupctl, zk):
    zk.create(protocol.LEADER, b"{oops", makepath=True)
    assert_failed(groupctl("coordinator"), f"{protocol.LEADER}: leader info is not JSON")


# ---------------------------------------------------------------- groups list / describe

def test_list_and_describe_a_live_group(groupctl, cluster, zk, zk_connect, data_dir):
    cluster.node("n")
    fill(data_dir, "t", [10, 20, 0], zk=zk)
    c = Consumer("g", ["t"], zk=zk_connect, data_dir=data_dir, auto_offset_reset="earliest",
                 enable_auto_commit=False, session_timeout_ms=2000)
    try:
        got, polls = 0, 0
        while got < 30 and polls < 200:  # bounded: at most 200 polls of 100 ms
            got += sum(len(r) for r in c.poll(timeout_ms=100).values())
            polls += 1
        assert got == 30
        c.commit()
        with Log(data_dir) as log:  # 5 more on partition 0: lag 5 there
            log.append("t", 0, [(None, b"late", BASE_TS, ())] * 5)
        state = wait_stable(zk, "g", 1)

        listing = ok(groupctl("groups", "list")).splitlines()
        assert listing[0].split() == ["GROUP", "STATE", "GENERATION", "MEMBERS"]
        assert [line.split() for line in listing[1:]] == [["g", "Stable", str(state.generation), "1"]]

        out = ok(groupctl("groups", "describe", "g"))
        host = socket.gethostname()
        cid = c.consumer_id
        assert [row[:9] for row in table(out, "GROUP")] == [["g", "t", "0", "10", "15", "5", cid, host, "zkgroups"],
                                                            ["g", "t", "1", "20", "20", "0", cid, host, "zkgroups"],
                                                            ["g", "t", "2", "0", "0", "0", cid, host, "zkgroups"]]
        assert [row[9] == "0.0" for row in table(out, "GROUP")] == [False, True, True]  # LAG-SECONDS
        assert table(ok(groupctl("groups", "describe", "g", "--state")), "GROUP") == \
            [["g", "n", "sticky", "Stable", "1", str(state.generation)]]
        assert table(ok(groupctl("groups", "describe", "g", "--members")), "GROUP") == [["g", cid, host, "zkgroups", "3"]]
    finally:
        c.close()
    # after a clean leave: no members, nothing assigned, offsets kept
    wait_for(lambda: read_state(zk, "g").state == protocol.EMPTY, message="group Empty")
    out = ok(groupctl("groups", "describe", "g"))
    assert [row[:9] for row in table(out, "GROUP")] == [["g", "t", "0", "10", "15", "5", "-", "-", "-"],
                                                        ["g", "t", "1", "20", "20", "0", "-", "-", "-"],
                                                        ["g", "t", "2", "0", "0", "0", "-", "-", "-"]]
    assert table(ok(groupctl("groups", "describe", "g", "--state")), "GROUP")[0][3:5] == ["Empty", "0"]
    assert table(ok(groupctl("groups", "describe", "g", "--members")), "GROUP") == []
    assert [line.split() for line in ok(groupctl("groups", "list")).splitlines()[1:]][0][:2] == ["g", "Empty"]
    assert committed(zk, "g", "t", 3) == {0: 10, 1: 20, 2: 0}


def test_describe_shows_members_of_a_groupctl_consume_process(groupctl, cluster, zk, zk_connect, data_dir,
                                                            subprocess_env):
    cluster.node("n")
    fill(data_dir, "t", [3, 3], zk=zk)
    proc = cluster.spawn("-m", "consumer.cli.groupctl", "--zk", zk_connect, "--data-dir", data_dir,
                         "consume", "g", "t", "--strategy", "sticky", "--strategy", "range", env=subprocess_env)
    wait_for(lambda: committed(zk, "g", "t", 2) == {0: 3, 1: 3}, 20, message="consume committed everything")
    state = wait_stable(zk, "g", 1)
    cid = members(zk, "g")[0]
    host = socket.gethostname()
    out = ok(groupctl("groups", "describe", "g"))
    assert table(out, "GROUP") == [["g", "t", "0", "3", "3", "0", cid, host, "zkgroups", "0.0"],
                                   ["g", "t", "1", "3", "3", "0", cid, host, "zkgroups", "0.0"]]
    assert table(ok(groupctl("groups", "describe", "g", "--state")), "GROUP") == \
        [["g", "n", "sticky", "Stable", "1", str(state.generation)]]
    assert table(ok(groupctl("groups", "describe", "g", "--members", "--verbose")), "GROUP") == \
        [["g", cid, host, "zkgroups", "2", "sticky,range", "t", "t(0,1)"]]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_describe_errors_are_one_line(groupctl, zk):
    assert_failed(groupctl("groups", "describe", "nope"), "group 'nope' does not exist")
    assert_failed(groupctl("groups", "describe", "bad name"), "illegal")
    assert_failed(groupctl("groups", "describe"), "Missing argument 'GROUP'", 2)


def test_list_without_groups_prints_only_the_header(groupctl):
    assert ok(groupctl("groups", "list")).split() == ["GROUP", "STATE", "GENERATION", "MEMBERS"]


def test_corrupt_znodes_give_clear_output(groupctl, zk):
    zk.create(protocol.state_path("good"), protocol.GroupState(generation=3, state=protocol.STABLE).encode(),
              makepath=True)
    zk.create(protocol.state_path("bad"), b"not json", makepath=True)
    zk.create(protocol.state_path("odd"), b'{"version": 1, "state": "Dancing"}', makepath=True)

    listing = groupctl("groups", "list")
    rows = [line.split(None, 1) for line in ok(listing).splitlines()[1:]]
    assert [r[0] for r in rows] == ["bad", "good", "odd"]
    assert rows[0][1].startswith("unreadable (group state is not JSON")
    assert rows[1][1].split() == ["Stable", "3", "0"]
    assert rows[2][1].startswith("unreadable (unknown group state 'Dancing')")

    assert_failed(groupctl("groups", "describe", "bad"), f"{protocol.state_path('bad')}: group state is not JSON")
    assert_failed(groupctl("groups", "describe", "odd"), "unknown group state 'Dancing'")

    # a member registration nobody can read is shown as such, the rest still described
    zk.create(protocol.ids_path("good", "ghost"), b"\xff", makepath=True)
    result = groupctl("groups", "describe", "good", "--members")
    assert table(ok(result), "GROUP") == [["good", "ghost", "-", "-", "0"]]
    assert "the registration of member ghost is unreadable" in result.stderr
    assert "registration is not JSON" in result.stderr

    # a corrupt committed offset: that row says so, the rest is still described
    zk.create(protocol.state_path("g2"), protocol.GroupState(
        state=protocol.STABLE, generation=1, assignment={"t": {0: "x-0", 1: "x-0"}}).encode(), makepath=True)
    zk.create(protocol.offsets_path("g2", "t", 0), b"ten", makepath=True)
    zk.create(protocol.offsets_path("g2", "t", 1), b"3", makepath=True)
    out = ok(groupctl("groups", "describe", "g2"))
    assert "unreadable (committed offset b'ten' is not a decimal number)" in out
    assert any(line.split()[:4] == ["g2", "t", "1", "3"] for line in out.splitlines())


def test_describe_warns_once_per_topic_without_data_here(groupctl, zk, data_dir):
    fill(data_dir, "here", [2, 0], zk=zk)  # partition 1 has no records (and no directory): still here
    TopicRegistry(zk).create("away", 2)
    assignment = {t: {0: "x-0", 1: "x-0"} for t in ("here", "away")}
    zk.create(protocol.state_path("g"), protocol.GroupState(state=protocol.STABLE, generation=1,
                                                            assignment=assignment).encode(), makepath=True)
    result = groupctl("groups", "describe", "g")
    assert [row[1:3] for row in table(ok(result), "GROUP")] == [["away", "0"], ["away", "1"], ["here", "0"], ["here", "1"]]
    assert result.stderr.splitlines() == [f"warning: topic away has no data under {data_dir} (is --data-dir right?)"]


# ---------------------------------------------------------------- groups reset-offsets

def reset(groupctl, *args):
    return groupctl("groups", "reset-offsets", "g", "--topic", "t", *args)


def test_reset_offsets_dry_run_then_execute(groupctl, zk, data_dir):
    fill(data_dir, "t", [10, 4], zk=zk)
    for args, targets in ((["--to-earliest"], {0: 0, 1: 0}),
                          (["--to-latest"], {0: 10, 1: 4}),
                          (["--to-offset", "7"], {0: 7, 1: 4}),  # clamped to the end offset
                          (["--to-datetime", "2026-01-01T00:00:03+00:00"], {0: 3, 1: 3}),
                          (["--to-datetime", "2026-01-01T01:00:00+00:00"], {0: 10, 1: 4})):  # after all: latest
        before = committed(zk, "g", "t", 2)
        out = ok(reset(groupctl, *args))
        shown = table(out, "TOPIC")
        assert [[row[1], row[3]] for row in shown] == [[str(p), str(o)] for p, o in targets.items()], args
        assert [row[2] for row in shown] == ["-" if before[p] is None else str(before[p]) for p in (0, 1)]
        assert out.rstrip().endswith("dry run: nothing changed (add --execute to apply)")
        assert committed(zk, "g", "t", 2) == before, f"dry run {args} wrote offsets"

        out = ok(reset(groupctl, *args, "--execute"))
        assert "reset 2 partitions of t" in out and "dry run" not in out
        assert committed(zk, "g", "t", 2) == targets, args
    assert not members(zk, "g")


def test_reset_to_datetime_in_local_time(groupctl, zk, data_dir):
    fill(data_dir, "t", [10], zk=zk)
    local = dt.datetime.fromtimestamp((BASE_TS + 6000) / 1000).isoformat()  # naive: local time
    ok(reset(groupctl, "--to-datetime", local, "--execute"))
    assert committed(zk, "g", "t", 1) == {0: 6}


def test_reset_offsets_refuses_while_a_member_is_live(groupctl, cluster, zk, data_dir):
    fill(data_dir, "t", [10, 4], zk=zk)
    ok(reset(groupctl, "--to-offset", "2", "--execute"))
    cluster.member("g", ["t"])
    wait_for(lambda: members(zk, "g"), message="member registered")
    assert "dry run" in ok(reset(groupctl, "--to-latest"))  # a dry run is fine
    assert_failed(reset(groupctl, "--to-latest", "--execute"),
                  "group 'g' has 1 live members; stop them before resetting offsets")
    assert committed(zk, "g", "t", 2) == {0: 2, 1: 2}


@pytest.mark.parametrize("args", [[], ["--to-earliest", "--to-latest"], ["--to-offset", "3", "--to-datetime", "2026-01-01"],
                                  ["--to-latest", "--to-offset", "0", "--execute"]])
def test_reset_offsets_needs_exactly_one_target(groupctl, zk, data_dir, args):
    fill(data_dir, "t", [1], zk=zk)
    assert_failed(reset(groupctl, *args),
                  "give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime", 2)
    assert committed(zk, "g", "t", 1) == {0: None}


def test_reset_offsets_errors(groupctl, zk, data_dir):
    fill(data_dir, "t", [1], zk=zk)
    assert_failed(groupctl("groups", "reset-offsets", "g", "--topic", "nope", "--to-earliest"),
                  "topic 'nope' does not exist")
    assert_failed(reset(groupctl, "--to-datetime", "yesterday"), "--to-datetime 'yesterday' is not ISO 8601", 2)
    assert_failed(reset(groupctl, "--to-offset", "-1"), "-1 is not in the range x>=0", 2)
    assert_failed(groupctl("groups", "reset-offsets", "g", "--to-earliest"), "Missing option '--topic'", 2)
    assert_failed(groupctl("groups", "reset-offsets", "bad/name", "--topic", "t", "--to-earliest"), "illegal")
    assert not zk.exists(protocol.group_path("g"))


def test_reset_offsets_shows_a_claimed_but_empty_offsets_znode_as_none(groupctl, zk, data_dir):
    fill(data_dir, "t", [10, 4], zk=zk)
    zk.create(protocol.offsets_path("g", "t", 0), protocol.NO_OFFSET, makepath=True)  # a claim, no commit yet
    assert [row[2] for row in table(ok(reset(groupctl, "--to-latest")), "TOPIC")] == ["-", "-"]
    ok(reset(groupctl, "--to-latest", "--execute"))
    assert committed(zk, "g", "t", 2) == {0: 10, 1: 4}


def test_reset_offsets_repairs_an_unreadable_offset(groupctl, zk, data_dir):
    fill(data_dir, "t", [10], zk=zk)
    zk.create(protocol.offsets_path("g", "t", 0), b"ten", makepath=True)
    shown = table(ok(reset(groupctl, "--to-offset", "4")), "TOPIC")
    assert shown[0][:2] == ["t", "0"] and " ".join(shown[0][2:]).startswith("unreadable (committed offset b'ten'")
    ok(reset(groupctl, "--to-offset", "4", "--execute"))
    assert committed(zk, "g", "t", 1) == {0: 4}


def test_reset_offsets_writes_by_compare_and_set(zk, data_dir):
    """What reset-offsets read must be what it overwrites: a change in between (a member's
    commit or claim, another reset) makes the whole write fail, and nothing changes."""
    fill(data_dir, "t", [10, 4, 4], zk=zk)
    zk.create(protocol.offsets_path("g", "t", 0), b"3", makepath=True)
    zk.create(protocol.offsets_path("g", "t", 1), protocol.NO_OFFSET)
    tps = [TopicPartition("t", p) for p in range(3)]
    zeros = {tp: 0 for tp in tps}
    read = read_offsets(zk, "g", tps)
    assert read == {tps[0]: StoredOffset(3, 0), tps[1]: StoredOffset(None, 0), tps[2]: StoredOffset(None, None)}

    def raw():
        return {p: zk.get(protocol.offsets_path("g", "t", p))[0] if zk.exists(protocol.offsets_path("g", "t", p))
                else None for p in range(3)}

    zk.set(protocol.offsets_path("g", "t", 1), b"2")  # a member commits meanwhile
    with pytest.raises(ZkGroupsError, match="the committed offset of t-1 in group 'g' changed while resetting; "
                                            "nothing was written"):
        write_offsets(zk, "g", zeros, read)
    assert raw() == {0: b"3", 1: b"2", 2: None}

    read = read_offsets(zk, "g", tps)
    zk.create(protocol.offsets_path("g", "t", 2), b"1")  # created meanwhile
    with pytest.raises(ZkGroupsError, match="t-2"):
        write_offsets(zk, "g", zeros, read)
    assert raw() == {0: b"3", 1: b"2", 2: b"1"}

    write_offsets(zk, "g", zeros, read_offsets(zk, "g", tps))
    assert raw() == {0: b"0", 1: b"0", 2: b"0"}


# ---------------------------------------------------------------- consume

def json_lines(text: str):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_delete_removes_an_idle_group_and_a_new_member_starts_over(groupctl, cluster, zk, data_dir):
    cluster.node("n")
    fill(data_dir, "t", [3, 3], zk=zk)
    assert len(json_lines(ok(groupctl("consume", "g", "t", "--max-records", "6")))) == 6
    assert committed(zk, "g", "t", 2) == {0: 3, 1: 3}
    wait_for(lambda: read_state(zk, "g").state == protocol.EMPTY, message="the group is Empty")
    assert ok(groupctl("groups", "delete", "g")).strip() == "deleted group g"
    assert not zk.exists(protocol.group_path("g"))
    assert "g" not in [line.split()[0] for line in ok(groupctl("groups", "list")).splitlines()[1:]]
    # The name is free again: a new member starts from the beginning and is assigned at once.
    again = json_lines(ok(groupctl("consume", "g", "t", "--max-records", "6")))
    assert sorted((r["partition"], r["offset"]) for r in again) == [(p, o) for p in (0, 1) for o in range(3)]


def test_delete_is_refused_while_members_are_live_and_for_unknown_groups(groupctl, cluster, zk):
    TopicRegistry(zk).create("t", 1)
    cluster.node("n")
    cluster.member("g", ["t"])
    wait_stable(zk, "g", 1)
    assert_failed(groupctl("groups", "delete", "g"), "group 'g' has 1 live members; stop them before deleting it")
    assert zk.exists(protocol.state_path("g"))
    assert_failed(groupctl("groups", "delete", "nope"), "group 'nope' does not exist")
    assert_failed(groupctl("groups", "delete", "bad name"), "illegal")


def test_consume_max_records_prints_json_and_commits(groupctl, cluster, zk, data_dir):
    cluster.node("n")
    fill(data_dir, "t", [20, 20, 20], zk=zk, key=b"k")
    with Log(data_dir) as log:
        log.append("t", 0, [(None, b"\xff\xfe", BASE_TS, ())])  # no key, not UTF-8
    result = groupctl("consume", "g", "t", "--max-records", "25")
    first = json_lines(ok(result))
    assert len(first) == 25 and result.stderr.strip().endswith("consumed 25 records")
    assert all(set(r) == {"topic", "partition", "offset", "key", "value"} for r in first)
    for r in first:
        assert r["topic"] == "t" and r["value"] == (
            "base64://4=" if (r["partition"], r["offset"]) == (0, 20) else f"t-{r['partition']}-{r['offset']}")
        assert r["key"] == (None if (r["partition"], r["offset"]) == (0, 20) else "k")
    offsets = committed(zk, "g", "t", 3)
    assert sum(offsets.values()) == 25
    for p in range(3):  # what was printed of each partition is exactly what was committed
        assert sorted(r["offset"] for r in first if r["partition"] == p) == list(range(offsets[p]))

    result = groupctl("consume", "g", "t", "--max-records", "36")
    second = json_lines(ok(result))
    assert len(second) == 36
    seen = {(r["partition"], r["offset"]) for r in first + second}
    assert len(seen) == 61, "the second run started from the committed offsets"
    assert committed(zk, "g", "t", 3) == {0: 21, 1: 20, 2: 20}
    assert [r for r in first + second if r["value"].startswith("base64:")] == [
        {"topic": "t", "partition": 0, "offset": 20, "key": None, "value": "base64://4="}]
    wait_for(lambda: not members(zk, "g"), message="consumers left")


def test_consume_idle_exit(groupctl, cluster, zk, data_dir):
    cluster.node("n")
    fill(data_dir, "t", [4, 6], zk=zk)
    result = groupctl("consume", "g", "t", "--idle-exit", "1")
    records = json_lines(ok(result))
    assert sorted((r["partition"], r["offset"]) for r in records) == \
        [(0, o) for o in range(4)] + [(1, o) for o in range(6)]
    assert "consumed 10 records" in result.stderr
    assert committed(zk, "g", "t", 2) == {0: 4, 1: 6}
    assert not members(zk, "g")


def test_consume_pattern(groupctl, cluster, zk, data_dir):
    cluster.node("n")
    fill(data_dir, "orders-eu", [3], zk=zk)
    fill(data_dir, "orders-us", [2, 2], zk=zk)
    fill(data_dir, "other", [5], zk=zk)
    fill(data_dir, "xorders-eu", [1], zk=zk)
    records = json_lines(ok(groupctl("consume", "g", "--pattern", "orders-.*", "--idle-exit", "1")))
    assert sorted((r["topic"], r["partition"], r["offset"]) for r in records) == \
        [("orders-eu", 0, o) for o in range(3)] + [("orders-us", p, o) for p in (0, 1) for o in range(2)]
    assert committed(zk, "g", "orders-us", 2) == {0: 2, 1: 2}
    assert not zk.exists(protocol.offsets_path("g", "other"))


def test_consume_takes_zk_and_data_dir_from_its_config_file(cluster, zk, zk_connect, data_dir, tmp_path):
    cluster.node("n")
    fill(data_dir, "t", [3], zk=zk)
    config = tmp_path / "consumer.toml"
    config.write_text(f'zk = "{zk_connect}"\ndata-dir = "{data_dir}"\nmax_poll_records = 2\n')  # top level
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        result = CliRunner().invoke(main, ["consume", "g", "t", "--config", str(config), "--max-records", "3"],
                                    env={"ZK_CONNECT": None, "ZKGROUPS_DATA_DIR": None})
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert [r["offset"] for r in json_lines(ok(result))] == [0, 1, 2]
    assert committed(zk, "g", "t", 1) == {0: 3}


@pytest.mark.parametrize("args, match, code", [
    (["consume", "g"], "give TOPICS or --pattern (one of them)", 2),
    (["consume", "g", "t", "--pattern", "t.*"], "give TOPICS or --pattern (one of them)", 2),
    (["consume", "g", "bad topic"], "illegal", 1),
    (["consume", "g", "t", "--max-records", "0"], "0 is not in the range x>=1", 2),
    (["consume"], "Missing argument 'GROUP'", 2),
    (["consume", "g", "t", "--strategy", "fastest"], "'fastest' is not one of 'range', 'roundrobin', 'sticky'", 2),
])
def test_consume_usage_errors(groupctl, args, match, code):
    assert_failed(groupctl(*args), match, code)


def test_sigterm_leaves_the_group_cleanly(cluster, zk, zk_connect, data_dir, subprocess_env):
    cluster.node("n")
    fill(data_dir, "t", [30, 20], zk=zk)
    # the default 6 s session: an unclean exit would leave the ids znode for seconds
    proc = subprocess.Popen([sys.executable, "-m", "consumer.cli.groupctl", "--zk", zk_connect,
                             "--data-dir", data_dir, "consume", "g", "t"],
                            env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: committed(zk, "g", "t", 2) == {0: 30, 1: 20}, 20, message="everything committed")
        wait_stable(zk, "g", 1)
        (cid,) = members(zk, "g")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert not zk.exists(protocol.ids_path("g", cid)), "ids znode still there after exit"
        assert zk.get_children(protocol.owners_path("g", "t")) == []
        assert committed(zk, "g", "t", 2) == {0: 30, 1: 20}
        reader.join(5)
        stderr = proc.stderr.read()
        assert "Traceback" not in stderr and "consumed 50 records" in stderr, stderr
        assert len(json_lines("".join(lines))) == 50
        wait_for(lambda: read_state(zk, "g").state == protocol.EMPTY, message="group Empty")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
