"""Static membership's pure logic (coordinator.static, and its part in coordinator.rebalance's
pure stages), from fixture snapshots; the schema of static registrations and group states.
No ZooKeeper."""
import pytest

from coordinator import protocol, static
from coordinator.errors import CorruptZnode, InvalidName
from coordinator.protocol import GroupState, Registration, StaticMember
from coordinator.protocol.codec import dump
from coordinator.plan import Snapshot, compute_plan, reasons_to_rebalance

NOW = 1_000_000


def member(instance, grace=5000, away=None, sub=None):
    return StaticMember(instance, grace, dict(sub or {"t": 1}), away_since=away)


# ---------------------------------------------------------------- hold_departed

@pytest.mark.parametrize("recorded,last,present,registered,held,expired,deadline", [
    # registered: nothing held
    ({"a": member("a")}, ["a"], {"a": member("a")}, ["a"], set(), set(), None),
    # just found away: held, its grace counted from now
    ({"a": member("a")}, ["a", "b"], {}, ["b"], {"a"}, set(), NOW + 5000),
    # away since earlier, still within the grace
    ({"a": member("a", away=NOW - 4999)}, ["a"], {}, [], {"a"}, set(), NOW + 1),
    # the grace ran out: dropped
    ({"a": member("a", away=NOW - 5000)}, ["a"], {}, [], set(), {"a"}, None),
    # not in the last decision's members: forgotten, not held
    ({"a": member("a")}, ["b"], {}, ["b"], set(), set(), None),
    # two away: the earlier deadline
    ({"a": member("a", away=NOW - 1000), "c": member("c", grace=2000)}, ["a", "c"], {}, [], {"a", "c"}, set(),
     NOW + 2000),
])
def test_hold_departed(recorded, last, present, registered, held, expired, deadline):
    hold = static.hold_departed(recorded, last, present, registered, NOW)
    assert hold.held == held and hold.expired == expired and hold.next_deadline_ms == deadline
    for cid in held:
        assert hold.static[cid].away_since == (recorded[cid].away_since or NOW)
    assert set(hold.static) == set(present) | held


def test_a_dynamic_member_that_left_is_never_held():
    assert static.hold_departed({}, ["a"], {}, [], NOW).held == set()


def test_a_returning_member_is_recorded_present_again():
    hold = static.hold_departed({"a": member("a", away=NOW - 10)}, ["a"], {"a": member("a")}, ["a"], NOW)
    assert hold.held == set() and hold.static["a"].away_since is None


# ---------------------------------------------------------------- members_to_restore, only_restores

SHARES = {"a": {"t": {0: "a-0", 1: "a-0"}}, "b": {"t": {2: "b-0", 3: "b-0"}}}


@pytest.mark.parametrize("owners,statics,restore,only", [
    ({"t": {2: "b-0", 3: "b-0"}}, {"a"}, {"a"}, True),                     # a came back: a alone
    ({"t": {2: "b-0", 3: "b-0"}}, set(), set(), False),                    # a is dynamic: a rebalance
    ({"t": {1: "a-0", 2: "b-0", 3: "b-0"}}, {"a"}, set(), False),          # a owns part of it: not a restart
    ({"t": {2: "b-0"}}, {"a"}, {"a"}, False),                              # b misses one too
    ({"t": {0: "b-0", 2: "b-0", 3: "b-0"}}, {"a"}, {"a"}, False),          # someone else holds a's partition
    ({"t": {2: "b-0", 3: "b-0", 9: "x-0"}}, {"a"}, {"a"}, False),          # an owner node nobody is assigned
    ({}, {"a", "b"}, {"a", "b"}, True),                                    # both came back
])
def test_members_to_restore(owners, statics, restore, only):
    got = static.members_to_restore(SHARES, owners, statics)
    assert got == restore
    assert static.only_restores(SHARES, owners, got) is only


# ---------------------------------------------------------------- the rebalance stages with a held member

def snapshot(present, state):
    regs = {cid: Registration({"t": 1}, group_instance_id=cid, static_grace_ms=5000, session_timeout_ms=1000)
            for cid in present}
    return Snapshot("g", regs, {}, {"t": 6}, state, 3)


def settled(members):
    """The state after a rebalance of static members ``members`` (range over t's 6 partitions)."""
    plan = compute_plan(snapshot(members, GroupState()))
    return GroupState(4, protocol.STABLE, list(plan.members), plan.assignment, plan.strategy,
                      static=static.static_of(snapshot(members, GroupState()).members))


def test_a_held_member_keeps_the_assignment_as_it_was():
    state = settled(["a", "b", "c"])
    snap = snapshot(["a", "c"], state)
    hold = static.hold_departed(state.static, state.members, static.static_of(snap.members), snap.members, NOW)
    plan = compute_plan(snap, hold=hold)
    assert plan.assignment == state.assignment and plan.held == {"b"} and plan.recipients() == ["a", "c"]
    assert plan.static["b"].away_since == NOW
    owners = {t: {p: s for p, s in parts.items() if not s.startswith("b")} for t, parts in state.assignment.items()}
    assert reasons_to_rebalance(snap, plan, owners) == []   # b's partitions wait unowned: no rebalance


def test_past_the_grace_the_member_is_dropped():
    state = settled(["a", "b", "c"])
    state.static["b"] = StaticMember("b", 5000, {"t": 1}, away_since=NOW - 5000)
    snap = snapshot(["a", "c"], state)
    hold = static.hold_departed(state.static, state.members, static.static_of(snap.members), snap.members, NOW)
    plan = compute_plan(snap, hold=hold)
    assert set(plan.members) == {"a", "c"} and "b" not in plan.static
    assert "membership changed" in reasons_to_rebalance(snap, plan, None)


# ---------------------------------------------------------------- schema

def test_static_registration_is_version_2_and_round_trips():
    reg = Registration({"t": 2}, group_instance_id="web-1", session_timeout_ms=3000, static_grace_ms=60000)
    raw = reg.encode()
    assert b'"version":2' in raw
    back = Registration.decode(raw, "/p")
    assert (back.group_instance_id, back.session_timeout_ms, back.static_grace_ms) == ("web-1", 3000, 60000)


def test_dynamic_registration_stays_version_1():
    raw = Registration({"t": 1}).encode()
    assert b'"version":1' in raw and b"group_instance_id" not in raw
    assert Registration.decode(raw, "/p").group_instance_id == ""


@pytest.mark.parametrize("extra,problem", [
    ({}, "group_instance_id"),
    ({"group_instance_id": "a/b", "session_timeout_ms": 1, "static_grace_ms": 1}, "group_instance_id"),
    ({"group_instance_id": "a", "session_timeout_ms": 0, "static_grace_ms": 1}, "session_timeout_ms"),
    ({"group_instance_id": "a", "session_timeout_ms": 1, "static_grace_ms": "x"}, "static_grace_ms"),
])
def test_bad_static_registrations_are_named(extra, problem):
    raw = dump({"version": 2, "subscription": {"t": 1}, "pattern": "static", "strategies": ["range"],
                          **extra})
    with pytest.raises(CorruptZnode) as info:
        Registration.decode(raw, "/p")
    assert problem in info.value.problem


def test_group_state_records_static_members():
    state = GroupState(3, protocol.STABLE, ["g_static-a"], {"t": {0: "g_static-a-0"}},
                       static={"g_static-a": StaticMember("a", 5000, {"t": 1}, away_since=NOW)})
    back = GroupState.decode(state.encode(), "/s")
    assert back.static == state.static
    assert b"static" not in GroupState(3, protocol.STABLE).encode()   # absent unless there are static members


def test_static_consumer_ids():
    assert protocol.static_consumer_id("g", "web-1") == "g_static-web-1"
    assert protocol.consumer_of_stream(protocol.stream_id("g_static-web-1", 0)) == "g_static-web-1"
    with pytest.raises(InvalidName):
        protocol.static_consumer_id("g", "bad/id")
