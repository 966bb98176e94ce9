"""groupctl groups describe in Kafka's three views (--offsets, --members [--verbose], --state),
--all-groups, and --output json on every read command, against real groups on a real
ZooKeeper (the embedded log; Kafka's are in test_groupctl_kafka.py).

Every JSON case parses stdout as one document and checks it says what the table says, row for
row (None in JSON is ``-`` in the table).
"""
from __future__ import annotations

import json
import socket
import time

from coordinator import protocol
from coordinator.topics import TopicRegistry
from tests.support.groups import wait_stable
from tests.support.helpers import assert_failed, fill, ok, wait_for

HOST = socket.gethostname()


def table(text: str):
    """Rows (split on whitespace) of the table whose header starts the output."""
    lines = [line for line in text.splitlines() if line.strip()]
    return [line.split() for line in lines[1:] if not line.startswith("error in group ")]


def header(text: str):
    return text.splitlines()[0].split()


def as_cells(rows, keys):
    """JSON rows as the table shows them: None is "-", numbers as digits."""
    return [["-" if row[k] is None or row[k] == "" else str(row[k]) for k in keys] for row in rows]


def assert_json_is_the_table(groupctl, args, top, keys):
    """``args`` with --output json is one JSON document whose ``top`` list says what the
    table of ``args`` says; returns the JSON rows. Ages (``lag_seconds``) grow between the two
    reads: they agree within a second."""
    shown = table(ok(groupctl(*args)))
    document = json.loads(ok(groupctl(*args, "--output", "json")))
    assert list(document) == [top]
    ages = [i for i, k in enumerate(keys) if k == "lag_seconds"]
    cells = as_cells(document[top], keys)
    for i in ages:
        for row, shown_row in zip(cells, shown):
            assert (row[i] == "-") == (shown_row[i] == "-"), (row, shown_row)
            if row[i] != "-":
                assert abs(float(row[i]) - float(shown_row[i])) <= 1, (row, shown_row)
                row[i] = shown_row[i]
    assert cells == shown, (document, shown)
    return document[top]


OFFSETS_KEYS = ["group", "topic", "partition", "current_offset", "log_end_offset", "lag", "consumer_id", "host",
                "client_id", "lag_seconds"]
MEMBERS_KEYS = ["group", "consumer_id", "host", "client_id", "partitions"]
STATE_KEYS = ["group", "coordinator", "assignment_strategy", "state", "members", "generation"]


def live_group(groupctl, cluster, zk, data_dir):
    """Group g: offsets of t set to 2 and of u to its end before member m (subscribed to t
    only) joins; so t is assigned to m and u has offsets and no owner."""
    fill(data_dir, "t", [5, 3], zk=zk)
    fill(data_dir, "u", [2], zk=zk)
    ok(groupctl("groups", "reset-offsets", "g", "--topic", "t", "--to-offset", "2", "--execute"))
    ok(groupctl("groups", "reset-offsets", "g", "--topic", "u", "--to-latest", "--execute"))
    cluster.node("n1")
    member = cluster.member("g", ["t"], strategies=("sticky", "range"))
    state = wait_stable(zk, "g", 1)
    wait_for(lambda: len(member.owned()) == 2, message="the member owns t")
    return member, state


def test_offsets_view_is_kafkas_describe_and_json_says_the_same(groupctl, cluster, zk, data_dir):
    member, _ = live_group(groupctl, cluster, zk, data_dir)
    cid = member.consumer_id
    out = ok(groupctl("groups", "describe", "g"))
    assert header(out) == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                           "HOST", "CLIENT-ID", "LAG-SECONDS"]
    assert [row[:9] for row in table(out)] == [["g", "t", "0", "2", "5", "3", cid, HOST, "-"],
                                               ["g", "t", "1", "2", "3", "1", cid, HOST, "-"],
                                               ["g", "u", "0", "2", "2", "0", "-", "-", "-"]]
    # the records at offset 2 were stamped 1002 ms after the epoch (fill's); u is caught up
    ages = [row[9] for row in table(out)]
    assert [abs(float(age) - (time.time() - 1.002)) <= 1 for age in ages[:2]] == [True, True] and ages[2] == "0.0"
    assert [row[:9] for row in table(ok(groupctl("groups", "describe", "g", "--offsets")))] == \
        [row[:9] for row in table(out)]
    rows = assert_json_is_the_table(groupctl, ["groups", "describe", "g"], "offsets", OFFSETS_KEYS)
    assert abs(rows[0].pop("lag_seconds") - (time.time() - 1.002)) <= 1
    assert rows[0] == {"group": "g", "topic": "t", "partition": 0, "current_offset": 2, "log_end_offset": 5, "lag": 3,
                       "consumer_id": cid, "host": HOST, "client_id": "", "error": None,
                       "estimated_lag_seconds": None}
    assert rows[2]["consumer_id"] is None and rows[2]["host"] is None


def test_members_view_with_and_without_verbose(groupctl, cluster, zk, data_dir):
    member, _ = live_group(groupctl, cluster, zk, data_dir)
    cid = member.consumer_id
    out = ok(groupctl("groups", "describe", "g", "--members"))
    assert header(out) == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    assert table(out) == [["g", cid, HOST, "-", "2"]]
    verbose = ok(groupctl("groups", "describe", "g", "--members", "--verbose"))
    assert header(verbose) == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "STRATEGIES",
                               "SUBSCRIPTION", "ASSIGNMENT"]
    assert table(verbose) == [["g", cid, HOST, "-", "2", "sticky,range", "t", "t(0,1)"]]
    rows = assert_json_is_the_table(groupctl, ["groups", "describe", "g", "--members"], "members", MEMBERS_KEYS)
    assert rows == [{"group": "g", "consumer_id": cid, "host": HOST, "client_id": "", "partitions": 2,
                     "assignment": {"t": [0, 1]}, "strategies": ["sticky", "range"], "pattern": "static",
                     "subscription": {"t": 1}, "error": None}]
    # --verbose changes the table only: the JSON always carries everything
    assert json.loads(ok(groupctl("groups", "describe", "g", "--members", "--verbose", "-o", "json")))["members"] == rows


def test_state_view_keeps_generation_and_the_groups_error(groupctl, cluster, zk, data_dir):
    _, state = live_group(groupctl, cluster, zk, data_dir)
    out = ok(groupctl("groups", "describe", "g", "--state"))
    assert header(out) == ["GROUP", "COORDINATOR", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS", "GENERATION"]
    assert table(out) == [["g", "n1", "sticky", "Stable", "1", str(state.generation)]]
    assert "error in group" not in out
    rows = assert_json_is_the_table(groupctl, ["groups", "describe", "g", "--state"], "groups", STATE_KEYS)
    assert rows[0]["error"] is None

    # A group the leader marked Failed, with its reason (written as the leader writes it), and no leader.
    zk.create(protocol.state_path("f"), protocol.GroupState(
        generation=4, state=protocol.FAILED, strategy="range",
        error="rebalance failed after 4 attempts: member x did not ack").encode(), makepath=True)
    cluster.close()
    wait_for(lambda: not zk.exists(protocol.LEADER), message="no leader")
    out = ok(groupctl("groups", "describe", "f", "--state"))
    assert table(out) == [["f", "-", "range", "Failed", "0", "4"]]
    assert out.splitlines()[-1] == "error in group f: rebalance failed after 4 attempts: member x did not ack"
    (row,) = json.loads(ok(groupctl("groups", "describe", "f", "--state", "-o", "json")))["groups"]
    assert row == {"group": "f", "coordinator": None, "assignment_strategy": "range", "state": "Failed",
                   "members": 0, "generation": 4, "error": "rebalance failed after 4 attempts: member x did not ack"}


def test_all_groups_in_every_view_leaves_out_an_unreadable_group_with_a_warning(groupctl, cluster, zk, data_dir):
    member, state = live_group(groupctl, cluster, zk, data_dir)
    ok(groupctl("groups", "reset-offsets", "idle", "--topic", "u", "--to-earliest", "--execute"))
    cluster.nodes[0].close()  # no leader from here on: nothing rewrites the broken state below
    wait_for(lambda: not zk.exists(protocol.LEADER), message="no leader")
    zk.create(protocol.state_path("broken"), b"not json", makepath=True)
    result = groupctl("groups", "describe", "--all-groups")
    rows = table(ok(result))
    assert [row[:3] for row in rows] == [["g", "t", "0"], ["g", "t", "1"], ["g", "u", "0"], ["idle", "u", "0"]]
    assert rows[3][3:9] == ["0", "2", "2", "-", "-", "-"] and abs(float(rows[3][9]) - (time.time() - 1.0)) <= 1
    (warning,) = result.stderr.splitlines()
    assert warning.startswith(f"warning: group broken left out: {protocol.state_path('broken')}: group state is not JSON")
    assert_json_is_the_table(groupctl, ["groups", "describe", "--all-groups"], "offsets", OFFSETS_KEYS)
    states = table(ok(groupctl("groups", "describe", "--all-groups", "--state")))
    assert states[0] == ["g", "-", "sticky", "Stable", "1", str(state.generation)]
    assert states[1][0] == "idle" and states[1][1:5] == ["-", "-", "Empty", "0"]
    assert_json_is_the_table(groupctl, ["groups", "describe", "--all-groups", "--state"], "groups", STATE_KEYS)
    members = assert_json_is_the_table(groupctl, ["groups", "describe", "--all-groups", "--members"], "members",
                                       MEMBERS_KEYS)
    assert [m["consumer_id"] for m in members] == [member.consumer_id]
    # the named group itself still fails with one line
    assert_failed(groupctl("groups", "describe", "broken"), "group state is not JSON")


def test_describe_usage_errors(groupctl, zk):
    TopicRegistry(zk).create("t", 1)
    zk.ensure_path(protocol.group_path("g"))
    assert_failed(groupctl("groups", "describe", "g", "--all-groups"), "give GROUP or --all-groups, not both", 2)
    assert_failed(groupctl("groups", "describe", "g", "--members", "--state"),
                  "give at most one of --offsets, --members, --state", 2)
    assert_failed(groupctl("groups", "describe", "g", "--output", "yaml"), "'yaml' is not one of 'table', 'json'", 2)
    # a group with nothing yet: the header alone, and an empty list in JSON
    assert table(ok(groupctl("groups", "describe", "g"))) == []
    assert json.loads(ok(groupctl("groups", "describe", "g", "-o", "json"))) == {"offsets": []}
    assert json.loads(ok(groupctl("groups", "describe", "--all-groups", "--members", "-o", "json"))) == {"members": []}


def test_every_other_read_command_has_json_that_says_what_its_table_says(groupctl, cluster, zk, data_dir):
    member, state = live_group(groupctl, cluster, zk, data_dir)
    zk.create(protocol.topic_path("junk"), b"{", makepath=True)

    listing = assert_json_is_the_table(groupctl, ["groups", "list"], "groups",
                                       ["group", "state", "generation", "members"])
    assert listing == [{"group": "g", "state": "Stable", "generation": state.generation, "members": 1, "error": None}]

    shown = table(ok(groupctl("topics", "list")))
    document = json.loads(ok(groupctl("topics", "list", "-o", "json")))
    assert [[t["topic"], "?" if t["partitions"] is None else str(t["partitions"])] for t in document["topics"]] == shown
    junk = document["topics"].pop(0)
    assert junk["topic"] == "junk" and junk["partitions"] is None
    assert junk["error"].startswith("topic registration is not JSON")
    assert document["topics"] == [{"topic": "t", "partitions": 2, "error": None},
                                  {"topic": "u", "partitions": 1, "error": None}]

    out = ok(groupctl("topics", "describe", "t"))
    document = json.loads(ok(groupctl("topics", "describe", "t", "-o", "json")))
    assert document["topic"] == "t" and document["data_plane"] == "embedded"
    keys = ["partition", "earliest", "latest", "records", "bytes"]
    assert as_cells(document["partitions"], keys) == [line.split() for line in out.splitlines()[2:]]
    assert [p["records"] for p in document["partitions"]] == [5, 3] and all(p["leader"] is None
                                                                          for p in document["partitions"])

    text = ok(groupctl("coordinator")).splitlines()
    document = json.loads(ok(groupctl("coordinator", "-o", "json")))
    leader = document["leader"]
    assert text[0].startswith(f"leader: {leader['node_id']} (host {leader['host']}, pid {leader['pid']}")
    assert f"epoch: {leader['epoch']}" in text and leader["node_id"] == "n1"
    assert f"since: {leader['since'][:19]}" in text and isinstance(leader["since_ms"], int)
    assert f"contenders: {', '.join(document['contenders'])}" in text
    assert document["nodes"] == ["n1"] and {r["node"] for r in document["shards"]} == {"n1"}
    shard_table = text[text.index(next(line for line in text if line.startswith("SHARD"))) + 1:]
    assert [line.split()[:2] for line in shard_table] == [[str(r["shard"]), "n1"] for r in document["shards"]]
    cluster.close()
    wait_for(lambda: not zk.exists(protocol.LEADER), message="no leader")
    document = json.loads(ok(groupctl("coordinator", "-o", "json")))
    assert document["leader"] is None and document["contenders"] == [] and document["nodes"] == []
    assert all(r["node"] is None for r in document["shards"])
