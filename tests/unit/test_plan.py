"""The pure stages of a rebalance (coordinator.plan): compute_plan, reasons_to_rebalance,
Plan.shares and problems, from fixture snapshots. No ZooKeeper."""
import pytest

from coordinator import protocol
from coordinator.protocol import GroupState, Registration
from coordinator.plan import Plan, Snapshot, compute_plan, problems, reasons_to_rebalance


def snapshot(members, topics=None, state=None, rejected=None):
    regs = {cid: Registration(dict(sub), strategies=list(strategies))
            for cid, (sub, strategies) in members.items()}
    return Snapshot("g", regs, dict(rejected or {}), dict(topics or {"t": 4}), state or GroupState(), 0)


def assigned(plan):
    return {(t, p): s for t, parts in plan.assignment.items() for p, s in parts.items()}


# ---------------------------------------------------------------- compute_plan

def test_compute_plan_assigns_every_partition_to_a_subscribed_member():
    plan = compute_plan(snapshot({"a": ({"t": 1}, ["range"]), "b": ({"t": 1}, ["range"])}))
    assert plan.strategy == "range" and plan.left_out == {}
    assert assigned(plan) == {("t", 0): "a-0", ("t", 1): "a-0", ("t", 2): "b-0", ("t", 3): "b-0"}
    assert plan.members == {"a": {"t": 1}, "b": {"t": 1}}


def test_compute_plan_without_members_is_empty():
    assert compute_plan(snapshot({})) == Plan({}, "", {})


def test_excluded_members_get_nothing():
    plan = compute_plan(snapshot({"a": ({"t": 1}, ["range"]), "b": ({"t": 1}, ["range"])}), excluded={"b"})
    assert set(assigned(plan).values()) == {"a-0"} and list(plan.members) == ["a"]


def test_unavailable_partitions_stay_unassigned():
    plan = compute_plan(snapshot({"a": ({"t": 1}, ["range"])}), unavailable={("t", 2)})
    assert sorted(assigned(plan)) == [("t", 0), ("t", 1), ("t", 3)]


def test_subscriptions_to_missing_topics_are_ignored():
    plan = compute_plan(snapshot({"a": ({"t": 1, "missing": 1}, ["range"])}))
    assert plan.members == {"a": {"t": 1}} and set(plan.assignment) == {"t"}


@pytest.mark.parametrize("members,strategy,left_out", [
    ({"a": ({"t": 1}, ["range"]), "b": ({"t": 1}, ["bogus"])}, "range", {"b": "lists no strategy"}),
    ({"a": ({"t": 1}, ["range"]), "b": ({"t": 1}, ["roundrobin"]), "c": ({"t": 1}, ["roundrobin"])}, "roundrobin",
     {"a": "does not support the group's strategy roundrobin"}),
    ({"a": ({"t": 1}, ["x"])}, "", {"a": "lists no strategy"}),
])
def test_members_that_cannot_use_the_strategy_are_left_out(members, strategy, left_out):
    plan = compute_plan(snapshot(members))
    assert plan.strategy == strategy
    assert set(plan.left_out) == set(left_out)
    for cid, fragment in left_out.items():
        assert fragment in plan.left_out[cid]
        assert cid not in plan.members and not any(s.startswith(cid) for s in assigned(plan).values())


def test_the_group_keeps_its_strategy_when_members_disagree():
    members = {"a": ({"t": 1}, ["range"]), "b": ({"t": 1}, ["roundrobin"])}
    plan = compute_plan(snapshot(members, state=GroupState(strategy="roundrobin")))
    assert plan.strategy == "roundrobin" and set(plan.left_out) == {"a"}


def test_sticky_keeps_the_previous_assignment():
    previous = {"t": {0: "b-0", 1: "b-0", 2: "a-0", 3: "a-0"}}
    plan = compute_plan(snapshot({"a": ({"t": 1}, ["sticky"]), "b": ({"t": 1}, ["sticky"])},
                                 state=GroupState(assignment=previous)))
    assert plan.assignment == previous


# ---------------------------------------------------------------- Plan.shares

def test_shares_split_the_assignment_by_member_and_include_members_with_nothing():
    plan = Plan({"a": {"t": 1}, "b": {"t": 1}, "c": {"t": 1}}, "range",
                {"t": {0: "a-0", 1: "b-0", 2: "a-1"}, "u": {0: "b-0"}})
    assert plan.shares() == {"a": {"t": {0: "a-0", 2: "a-1"}}, "b": {"t": {1: "b-0"}, "u": {0: "b-0"}}, "c": {}}


# ---------------------------------------------------------------- reasons_to_rebalance

STABLE_STATE = GroupState(3, protocol.STABLE, ["a", "b"], {"t": {0: "a-0", 1: "a-0", 2: "b-0", 3: "b-0"}}, "range")
OWNERS_RIGHT = {"t": {0: "a-0", 1: "a-0", 2: "b-0", 3: "b-0"}}


@pytest.mark.parametrize("members,state,owners,reasons", [
    ({"a", "b"}, STABLE_STATE, None, []),
    ({"a", "b"}, STABLE_STATE, OWNERS_RIGHT, []),
    ({"a", "b", "c"}, STABLE_STATE, None, ["membership changed", "ownership differs from the computed assignment"]),
    ({"a", "b"}, GroupState(), None, ["membership changed", "no ownership registered"]),
    ({"a", "b"}, STABLE_STATE, {"t": {0: "a-0", 1: "a-0", 2: "b-0"}}, ["partitions not owned"]),
    ({"a", "b"}, STABLE_STATE, {**OWNERS_RIGHT, "u": {0: "a-0"}}, ["owned partitions no longer assigned"]),
    ({"a", "b"}, STABLE_STATE, {"t": {0: "b-0", 1: "a-0", 2: "b-0", 3: "b-0"}}, ["partitions owned by the wrong stream"]),
], ids=["unchanged", "unchanged, owners checked", "a member joined", "no state yet", "an owner node missing",
        "a stray owner node", "an owner node of the wrong stream"])
def test_reasons_to_rebalance(members, state, owners, reasons):
    snap = snapshot({cid: ({"t": 1}, ["range"]) for cid in members}, state=state)
    assert reasons_to_rebalance(snap, compute_plan(snap), owners) == reasons


# ---------------------------------------------------------------- problems

def test_problems_name_every_member_left_out_and_every_squatter_on_one_line():
    snap = snapshot({"a": ({"t": 1}, ["range"]), "b": ({"t": 1}, ["bogus"])}, rejected={"z": "has no command channel"})
    text = problems(snap, compute_plan(snap), {("t", 3): 0x1F})
    assert text == ("member b left out: lists no strategy this coordinator knows (bogus); "
                    "member z left out: has no command channel; "
                    "partition t-3 held by session 0x1f, which is not a member")
    assert problems(snapshot({"a": ({"t": 1}, ["range"])}), compute_plan(snapshot({"a": ({"t": 1}, ["range"])}))) == ""
