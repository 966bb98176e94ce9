"""The decisions of a rebalance run's named steps (coordinator.rebalance, coordinator.plan), from
fixture snapshots: which plan an attempt uses, which generation it writes, what it blames when
acks are late, whether returning static members are all a group needs, and the group state each
step writes; a registration decoded once. No ZooKeeper."""
import pytest

from coordinator import protocol, static
from coordinator.errors import CorruptZnode
from coordinator.plan import (Plan, Snapshot, acked_state, compute_plan, failed_state, late_partitions,
                              rebalancing_state, restorable, settled_state, static_hold)
from coordinator.protocol import GroupState, Registration
from coordinator.rebalance import choose_plan, decode_registration, next_generation

ASSIGNED = {"t": {0: "a-0", 1: "a-0", 2: "b-0", 3: "b-0"}}
#: A state verified when ids/ and channel/ were at pzxids 10 and 11 and t had 4 partitions.
VERIFIED = {"ids": 10, "channel": 11, "owners": {"t": 12}, "topics": {"t": 4}}


def snapshot(members=("a", "b"), state=None, ids_pzxid=10, topics=None, rejected=None, statics=()):
    regs = {cid: Registration({"t": 1}, strategies=["range"]) for cid in members}
    regs.update({cid: Registration({"t": 1}, strategies=["range"], group_instance_id=cid, static_grace_ms=5000,
                                   session_timeout_ms=1000) for cid in statics})
    state = state or GroupState(3, protocol.STABLE, sorted(regs), ASSIGNED, "range", verified=dict(VERIFIED))
    return Snapshot("g", regs, dict(rejected or {}), dict(topics or {"t": 4}), state, 7, ids_pzxid, 11, 99)


def no_hold():
    return static.Hold()


# ---------------------------------------------------------------- _plan: choose_plan

def test_a_verified_state_whose_inputs_did_not_change_is_the_plan():
    """The recorded plan is the state's own: its strategy and assignment, even one the
    strategy would not compute (the assignors are pure; it was computed from the same inputs)."""
    state = GroupState(3, protocol.STABLE, ["a", "b"], {"t": {0: "b-0", 1: "b-0", 2: "a-0", 3: "a-0"}}, "range",
                       verified=dict(VERIFIED))
    plan = choose_plan(snapshot(state=state), set(), {}, no_hold())
    assert plan.assignment == state.assignment and plan.strategy == "range"


def test_the_plan_is_computed_when_the_members_changed_since_the_verification():
    snap = snapshot(state=GroupState(3, protocol.STABLE, ["a", "b"], {"t": {0: "b-0", 1: "b-0", 2: "a-0", 3: "a-0"}},
                                     "range", verified=dict(VERIFIED)), ids_pzxid=20)
    assert choose_plan(snap, set(), {}, no_hold()).assignment == ASSIGNED


def test_the_plan_is_computed_with_a_member_left_out_or_a_partition_squatted():
    snap = snapshot()
    assert set(choose_plan(snap, {"b"}, {}, no_hold()).members) == {"a"}
    assert 3 not in choose_plan(snap, set(), {("t", 3): 0x1F}, no_hold()).assignment["t"]


def test_a_group_with_static_members_is_always_computed():
    state = GroupState(3, protocol.STABLE, ["a", "s"], {"t": {0: "x-0"}}, "range", verified=dict(VERIFIED))
    snap = snapshot(members=("a",), statics=("s",), state=state)
    hold = static_hold(snap, 0)
    assert choose_plan(snap, set(), {}, hold).assignment == compute_plan(snap, hold=hold).assignment


# ---------------------------------------------------------------- _next: next_generation

def test_generations_only_grow():
    assert next_generation(3, 0) == 4
    assert next_generation(0, 7) == 8   # the state znode was deleted: this node wrote 7 before
    assert next_generation(9, 7) == 10  # another node wrote 9 since


# ---------------------------------------------------------------- _blame: late_partitions

def test_late_partitions_are_those_given_to_the_late_members():
    plan = Plan({"a": {"t": 1}, "b": {"t": 1}}, "range", ASSIGNED)
    assert sorted(late_partitions(plan, {"b"})) == [("t", 2), ("t", 3)]
    assert late_partitions(plan, {"gone"}) == []


# ---------------------------------------------------------------- _diff: restorable

def test_returning_static_members_alone_get_their_share_back():
    state = GroupState(3, protocol.STABLE, ["a", "s"], {"t": {0: "a-0", 1: "a-0", 2: "s-0", 3: "s-0"}}, "range")
    snap = snapshot(members=("a",), statics=("s",), state=state)
    plan = compute_plan(snap, hold=static_hold(snap, 0))
    assert plan.assignment == state.assignment and set(plan.static) == {"s"}
    assert restorable(snap, plan, {"t": {0: "a-0", 1: "a-0"}}) == {"s"}
    assert restorable(snap, plan, {"t": {0: "a-0"}}) == set()  # a misses one too: a rebalance


# ---------------------------------------------------------------- the states each step writes

def test_the_state_of_a_generation_written_is_rebalancing():
    snap = snapshot(state=GroupState())
    plan = compute_plan(snap)
    state = rebalancing_state(snap, plan, 4, epoch=2)
    assert (state.generation, state.state, state.members, state.assignment, state.epoch) == \
        (4, protocol.REBALANCING, ["a", "b"], ASSIGNED, 2)


def test_the_state_once_acked_is_stable_or_empty_with_what_was_verified():
    snap = snapshot(state=GroupState())
    state = acked_state(snap, compute_plan(snap), 4, epoch=2, verified=VERIFIED)
    assert (state.state, state.generation, state.verified) == (protocol.STABLE, 4, VERIFIED)
    empty = snapshot(members=(), state=GroupState())
    assert acked_state(empty, compute_plan(empty), 5, epoch=2).state == protocol.EMPTY


def test_a_settled_group_writes_only_what_changed_and_keeps_its_generation():
    snap = snapshot()
    plan = compute_plan(snap)
    assert settled_state(snap, plan, 2, verified=VERIFIED) is None  # the state says it all already
    rewritten = settled_state(snap, plan, 2, verified={})            # a check that could not verify
    assert (rewritten.generation, rewritten.assignment, rewritten.state, rewritten.verified) == \
        (3, ASSIGNED, protocol.STABLE, {})
    failed = snapshot(state=GroupState(3, protocol.FAILED, ["a", "b"], ASSIGNED, "range", "no ack"))
    assert settled_state(failed, compute_plan(failed), 2).state == protocol.STABLE


def test_the_state_out_of_retries_is_failed_with_the_last_generation_and_assignment():
    snap = snapshot(members=("a", "b", "c"))
    state = failed_state(snap, compute_plan(snap), "members ['c'] did not ack", epoch=2)
    assert (state.state, state.generation, state.assignment, state.members, state.error) == \
        (protocol.FAILED, 3, ASSIGNED, ["a", "b", "c"], "members ['c'] did not ack")


# ---------------------------------------------------------------- read_snapshot: decode_registration

def test_a_registration_is_decoded_once_and_a_damaged_one_every_time():
    raw = Registration({"t": 1}, strategies=["sticky"], timestamp=1).encode()
    first = decode_registration(raw, "ids/a")
    assert first == Registration.decode(raw, "ids/a") and decode_registration(raw, "ids/b") is first
    for _ in range(2):
        with pytest.raises(CorruptZnode, match="ids/c"):
            decode_registration(b"{not json", "ids/c")
