"""A share round's transactions replayed as steps of the share model (:mod:`tests.model.share_trace`):
a recorded run of real states (each made by the real rules of ``coordinator/share_partition.py``)
passes, and each way a write can break the model fails with its one line. The chaos rounds run the
same check on real transaction logs (the verdict's ``share-model-steps=``)."""
from __future__ import annotations

import pytest

from coordinator import protocol
from coordinator import share_partition as rules
from coordinator.protocol.share import (ACCEPTED, ACQUIRED, AVAILABLE, ShareGroupConfig, share_group_path,
                                        share_members_path, share_partitions_path)
from tests.chaos.txnlog import CHECK, CLOSE_SESSION, CREATE, MULTI, SET_DATA, Op, Txn
from tests.model.share_trace import check_share_model

pytestmark = pytest.mark.model

Ack = rules.AcknowledgeType
GROUP, TOPIC, ROOT = "g", "t", "/app"
PATH = ROOT + share_partitions_path(GROUP, TOPIC, 0)
CONFIG = ShareGroupConfig(lock_duration_ms=1000, delivery_count_limit=2, max_record_locks=100,
                          dead_letter_topic="dead")
SHARDS = 16
EPOCH = ROOT + protocol.shard_epoch_path(protocol.shard_of(GROUP, SHARDS))
MA, MB, TOOL, DECIDER = 0xA, 0xB, 0xC, 0xD       # sessions
NAME = {MA: "m-a", MB: "m-b"}
LOG_ENDS = {0: 7}


def ack(session, token, *acks):
    return lambda s: rules.acknowledge(s, NAME[session], token, acks, CONFIG)


def acquire(session, n, fresh):
    return lambda s: rules.acquire(s, NAME[session], n, fresh, CONFIG)


def both(*changes):
    return lambda s: [change(s) for change in changes]


#: (name, session, time ms, what changes): a member's write (session MA, MB), the decider's
#: (DECIDER), a tool's (TOOL); "close" ends a session; "create" makes the share-partition.
STEPS = [
    ("create", MA, 0, None),
    ("a acquires 0-2", MA, 100, acquire(MA, 3, [0, 1, 2])),                                      # token 1
    ("b acquires 3-4", MB, 150, acquire(MB, 2, [3, 4])),                                         # token 2
    ("a releases 0 delayed, accepts 1, rejects 2", MA, 200,
     ack(MA, 1, (0, 0, Ack.RELEASE, 500), (1, 1, Ack.ACCEPT, 0), (2, 2, Ack.REJECT, 0))),
    ("b renews", MB, 600, ack(MB, 2, (3, 4, Ack.RENEW, 0))),
    ("the delay of 0 ends", DECIDER, 800, lambda s: rules.promote(s, 0, 1)),
    ("b's lock ends", DECIDER, 1700, lambda s: rules.expire(s, 2, CONFIG)),
    ("a acquires 0, 3, 4 and claims the letter of 2", MA, 1800,                                  # tokens 3, 4
     both(acquire(MA, 3, []), lambda s: rules.claim_dead_letters(s, "m-a", 500, 0))),
    ("a's letter written", MA, 1850, lambda s: rules.dead_letters_written(s, "m-a", 4)),
    ("b acquires 5", MB, 1900, acquire(MB, 1, [5])),                                             # token 5
    ("a accepts 0 and 3, releases 4 (the limit)", MA, 2000,
     ack(MA, 3, (0, 0, Ack.ACCEPT, 0), (3, 3, Ack.ACCEPT, 0), (4, 4, Ack.RELEASE, 0))),
    ("b's session ends", MB, 2100, "close"),
    ("b is gone", DECIDER, 2150, lambda s: rules.expire_holder(s, "m-b", CONFIG)),
    ("a acquires 5, 6 and claims the letter of 4", MA, 2200,                                     # tokens 6, 7
     both(acquire(MA, 2, [6]), lambda s: rules.claim_dead_letters(s, "m-a", 500, 1))),
    ("a gives 6 back uncounted", MA, 2250, lambda s: rules.release_undelivered(s, "m-a", 6, 6, 6)),
    ("a accepts 5", MA, 2300, ack(MA, 6, (5, 5, Ack.ACCEPT, 0))),
    ("a's second letter written", MA, 2350, lambda s: rules.dead_letters_written(s, "m-a", 7)),
    ("a acquires 6 again", MA, 2400, acquire(MA, 1, [])),                        # token 8
    ("a accepts 6", MA, 2450, ack(MA, 8, (6, 6, Ack.ACCEPT, 0))),
    ("an operator resets it to 7", TOOL, 3000, lambda s: s.__dict__.update(rules.reset(s, 7).__dict__)),
]


def setup_txns():
    shards = protocol.ShardsInfo(SHARDS).encode()
    ops = [Op(CREATE, ROOT + protocol.SHARDS, shards), Op(CREATE, EPOCH, b""), Op(SET_DATA, EPOCH, b"", version=1),
           Op(CREATE, ROOT + share_group_path(GROUP), CONFIG.encode())]
    txns = [Txn(k + 1, 0xE, 0, 0, op.type, (op,)) for k, op in enumerate(ops)]
    for k, session in enumerate((MA, MB)):
        member = Op(CREATE, ROOT + share_members_path(GROUP, NAME[session]), b"{}", ephemeral=True)
        txns.append(Txn(10 + k, session, 0, 0, CREATE, (member,)))
    return txns


def run(**changes):
    """The run's transactions; ``changes`` ({step name: {what: how}}) mutate it: ``tamper`` (a
    function of the state written), ``time``, ``fresh`` (an acquisition's change instead),
    ``epoch`` (of the decider's check), ``bump`` (the controller moves the shard first),
    ``no_id`` (written without the member's write id), ``skip``."""
    txns, state, sequence, zxid = setup_txns(), None, {MA: 0, MB: 0}, 100
    for name, session, time_ms, change in STEPS:
        how = changes.get(name, {})
        zxid += 1
        if how.get("skip"):
            continue
        if how.get("bump"):
            txns.append(Txn(zxid, 0xE, 0, time_ms, SET_DATA, (Op(SET_DATA, EPOCH, b"", version=2),)))
            zxid += 1
        time_ms = how.get("time", time_ms)
        if change == "close":
            txns.append(Txn(zxid, session, 0, time_ms, CLOSE_SESSION))
            continue
        if change is None:
            state = rules.initial(0)
            txns.append(Txn(zxid, session, 0, time_ms, CREATE, (Op(CREATE, PATH, state.encode()),)))
            continue
        state, before = rules.copy(state), state
        try:
            how.get("fresh", change)(state)
        except ValueError:     # the reset, refused while a mutation left records held
            state = before
            continue
        if session in NAME and not how.get("no_id"):
            sequence[session] += 1
            rules.note_write(state, f"{NAME[session]}:{sequence[session]}")
        if "tamper" in how:
            how["tamper"](state)
        write = Op(SET_DATA, PATH, state.encode(), version=zxid)
        if session == DECIDER:
            fence = Op(CHECK, EPOCH, version=how.get("epoch", 1) + 1)   # the log has the version found, plus one
            txns.append(Txn(zxid, session, 0, time_ms, MULTI, (fence, write)))
        else:
            txns.append(Txn(zxid, session, 0, time_ms, SET_DATA, (write,)))
    return txns


def judged(**changes):
    return check_share_model(run(**changes), GROUP, TOPIC, ROOT, LOG_ENDS)


def test_the_rules_own_writes_are_steps_of_the_model():
    result = judged()
    assert result.ok, result.details
    assert result.summary == f"share-model-steps={len(STEPS) - 1}"   # every write (the close is none)
    figures = result.details[-1]
    for figure in ("acquire 6", "acknowledge 8", "member writes 14", "decider writes 3", "claim_dead_letters 2",
                   "dead_letters_written 2", "promote 1", "lock ran out 1", "released, member gone 1", "release_undelivered 1", "reset 1", "created 1"):
        assert figure in figures, figures


def relabel(offset, st, token, deliveries):
    return lambda s: rules._set(s, offset, offset, st, token, deliveries=deliveries)


MUTATIONS = {
    "an accepted record acquired again (to be accepted twice)": (
        {"a acquires 0, 3, 4 and claims the letter of 2": {"tamper": relabel(1, ACQUIRED, 3, 1)}},
        "zxid 0x6c", "member m-a: acquires 0-1, 3-4 under token 3",
        "offset 1 is acquired, deliveries 1, token 3; the model's step makes it accepted"),
    "a record delivered past the limit": (
        {"a acquires 0, 3, 4 and claims the letter of 2": {"tamper": relabel(0, ACQUIRED, 3, 3)}},
        "zxid 0x6c", "acquires 0, 3-4 under token 3", "4 limit: [0, 0] is acquired after 3 deliveries (limit 2)"),
    "a record at the limit released for another delivery": (
        {"a accepts 0 and 3, releases 4 (the limit)": {"tamper": relabel(4, AVAILABLE, 0, 2)}},
        "zxid 0x6f", "RELEASE 4 (token 3)",
        "offset 4 is available, deliveries 2; the model's step makes it a pending dead letter, deliveries 2, "
        "delivery-limit"),
    "a lock ended early (the renewal restarts its clock)": (
        {"b's lock ends": {"time": 1300}}, "zxid 0x6b",
        "the decider: the lock of token 2 (m-b) ran out after 700 ms",
        "the lock of token 2 ended 700 ms after it started (the lock is 1000 ms) while m-b was registered"),
    "a holder's records released while it is registered": (
        {"b's session ends": {"skip": True}}, "zxid 0x71",
        "the decider: the lock of token 5 (m-b) ran out after 250 ms",
        "the lock of token 5 ended 250 ms after it started (the lock is 1000 ms) while m-b was registered"),
    "a delay ended early": (
        {"the delay of 0 ends": {"time": 500}}, "zxid 0x6a", "the delay at 0 (token 1) ended after 300 ms",
        "the delayed range at 0 (token 1) was promoted 300 ms after it was delayed, its delay is 500 ms"),
    "a range that vanished without acknowledgement (another member's write)": (
        {"a accepts 0 and 3, releases 4 (the limit)": {"tamper": relabel(5, AVAILABLE, 0, 1)}},
        "zxid 0x6f", "member m-a:", "offset 5 is available, deliveries 1; the model's step makes it acquired, "
                                    "deliveries 1, token 5"),
    "a record accepted by a member that does not hold it": (
        {"a releases 0 delayed, accepts 1, rejects 2": {"tamper": relabel(4, ACCEPTED, 0, 0)}}, "zxid 0x68",
        "member m-a: RELEASE 0 (delay 500 ms) (token 1); ACCEPT 1 (token 1); REJECT 2 (token 1)",
        "offset 4 is accepted; the model's step makes it acquired, deliveries 1, token 2"),
    "a write with a stale epoch from the decider": (
        {"b is gone": {"bump": True, "epoch": 1}}, "zxid 0x72",
        "the decider: releases token 5 (m-b's member znode is gone)",
        f"the write checks epoch 1 of shard {protocol.shard_of(GROUP, SHARDS)}, which is at epoch 2: a deposed "
        "decider's write"),
    "a first delivery that skips a record": (
        {"b acquires 5": {"fresh": acquire(MB, 1, [6])}}, "zxid 0x6e", "member m-b: acquires 6 under token 5",
        "records acquired for the first time are 6, the log's next ones are 5"),
    "a write without its member's id": (
        {"a releases 0 delayed, accepts 1, rejects 2": {"no_id": True}}, "zxid 0x68", "a reset to 0?",
        "records are held: a reset is refused then"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_each_write_the_model_does_not_allow_fails_the_run_with_one_line(mutation):
    changes, zxid, step, why = MUTATIONS[mutation]
    result = judged(**changes)
    assert not result.ok
    first = result.details[0]
    assert first.startswith(f"{zxid} {PATH}: "), first
    assert step in first and f"not a step the share model allows: {why}" in first, first
    assert "\n" not in first


@pytest.mark.parametrize("mutation, zxid", [("ack-ignores-token", "zxid 0x74"), ("expire-uncounted", "zxid 0x6b"),
                                           ("limit-off-by-one", "zxid 0x6f")])
def test_the_steps_are_the_models_own_a_broken_rule_of_the_model_rejects_the_real_run(mutation, zxid):
    """The check applies the model's transition function: with one of the model's broken rules
    patched in (:data:`tests.model.share_protocol.MUTATIONS`), the run the real rules made is no
    longer a run of the model, at the first write that rule makes."""
    from tests.model.share_protocol import mutated
    txns = run()                  # made by the real rules
    with mutated(mutation):
        result = check_share_model(txns, GROUP, TOPIC, ROOT, LOG_ENDS)
    assert not result.ok and result.details[0].startswith(f"{zxid} "), result.details[0]
    assert judged().ok
