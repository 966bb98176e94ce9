"""The JSON documents of the read views (:mod:`coordinator.documents`, field names in
docs/reference/output.md): a group's partitions are every one it is assigned, committed or
subscribed to; offsets rows with lag and owner; members rows with what each is assigned (an
unreadable member kept, with its error); shards rows. Pure, from fixtures."""
from coordinator import protocol
from coordinator.documents import (GroupSnapshot, group_partitions, list_row, members_rows, offsets_rows,
                                   partitions_to_read, shard_rows, state_row)
from coordinator.protocol import GroupState, Registration

ASSIGNED = {"t": {0: "a-0", 1: "b-0"}}


def snapshot():
    state = GroupState(3, protocol.STABLE, ["a", "b"], ASSIGNED, "range")
    members = {"a": Registration({"t": 1, "u": 1}, host="h1", client_id="c1"), "b": Registration({"t": 1})}
    return GroupSnapshot("g", state, members, unreadable={"z": "registration is not JSON"})


def test_a_groups_partitions_are_those_assigned_committed_or_subscribed_and_every_partition_of_each():
    found = group_partitions(snapshot(), {"old": {4}}, {"t": 3, "u": 2})
    assert found == {"t": {0, 1, 2}, "u": {0, 1}, "old": {4}}
    assert partitions_to_read(found, {"t": 3, "u": 1}) == {"old": [4], "t": [0, 1, 2], "u": [0]}


def test_an_offsets_row_has_its_lag_and_owner_and_none_where_a_value_is_missing():
    rows = offsets_rows(snapshot(), [("t", 0), ("t", 1), ("t", 2)], {("t", 0): 5, ("t", 1): None},
                        {("t", 1): "offset is not a number"}, {("t", 0): 9, ("t", 1): 4})
    assert [(r["partition"], r["lag"], r["consumer_id"], r["host"], r["error"]) for r in rows] == [
        (0, 4, "a", "h1", None), (1, None, "b", "", "offset is not a number"), (2, None, None, None, None)]
    assert all(r["lag_seconds"] is None and r["estimated_lag_seconds"] is None for r in rows)


def test_members_rows_say_what_each_is_assigned_and_keep_an_unreadable_member_with_its_error():
    rows = {r["consumer_id"]: r for r in members_rows(snapshot())}
    assert rows["a"]["assignment"] == {"t": [0]} and rows["a"]["partitions"] == 1
    assert rows["a"]["subscription"] == {"t": 1, "u": 1} and rows["a"]["client_id"] == "c1"
    assert rows["z"]["error"] == "registration is not JSON" and rows["z"]["host"] is None
    assert state_row(snapshot(), "n1") == {"group": "g", "coordinator": "n1", "assignment_strategy": "range",
                                           "state": protocol.STABLE, "members": 3, "generation": 3, "error": None}


def test_a_group_whose_state_cannot_be_read_is_a_row_with_its_error():
    assert list_row("g", None, None, "not JSON") == {"group": "g", "state": None, "generation": None,
                                                     "members": None, "error": "not JSON"}


def test_shard_rows_name_each_shards_leader_and_groups_and_are_empty_before_a_controller():
    groups = ["g1", "g2", "g3"]
    rows = shard_rows(2, {0: ("n1", 3, True), 1: ("", 2, False)}, groups)
    assert [(r["shard"], r["node"], r["epoch"], r["verified"]) for r in rows] == [(0, "n1", 3, True), (1, None, 2, False)]
    assert sorted(g for r in rows for g in r["groups"]) == groups
    assert all(protocol.shard_of(g, 2) == r["shard"] for r in rows for g in r["groups"])
    assert shard_rows(None, {}, groups) == []
