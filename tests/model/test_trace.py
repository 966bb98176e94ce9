"""A run's transactions replayed as model steps (:mod:`tests.model.trace`): the protocol's own
transactions pass, each kind of step the model forbids is named. The chaos rounds run the same
check on real transaction logs (the referee's ``model`` check)."""
from __future__ import annotations

import pytest

from tests.chaos.txnlog import CHECK, CLOSE_SESSION, CREATE, DELETE, MULTI, SET_DATA, Op, Txn
from tests.model.trace import check_model

pytestmark = pytest.mark.model

G = "/app/consumers/groups/g"


def t(zxid, session, *ops, kind=MULTI):
    return Txn(zxid, session, 0, zxid * 100, kind, tuple(ops))


def register(zxid, session, member):
    return t(zxid, session, Op(CREATE, f"{G}/ids/{member}", b"{}", ephemeral=True), kind=CREATE)


def claim(zxid, session, member, p, version=None):
    token = Op(CREATE, f"{G}/offsets/t/{p}", b"") if version is None else \
        Op(SET_DATA, f"{G}/offsets/t/{p}", b"5", version=version)
    return t(zxid, session, Op(CREATE, f"{G}/owners/t/{p}", f"{member}-0".encode(), ephemeral=True), token)


def commit(zxid, session, p, offset):
    return t(zxid, session, Op(SET_DATA, f"{G}/offsets/t/{p}", str(offset).encode()), kind=SET_DATA)


def release(zxid, session, p, check=True):
    ops = [Op(CHECK, f"{G}/offsets/t/{p}", version=3)] if check else []
    return t(zxid, session, *ops, Op(DELETE, f"{G}/owners/t/{p}"))


RUN = [register(1, 0xA, "m1"), register(2, 0xB, "m2"), claim(3, 0xA, "m1", 0), commit(4, 0xA, 0, 5),
       t(5, 0xA, kind=CLOSE_SESSION),                              # m1's session expires
       claim(6, 0xB, "m2", 0, version=2), commit(7, 0xB, 0, 9),
       register(8, 0xC, "m1"),                                      # m1 again, on a new session
       release(9, 0xB, 0), claim(10, 0xC, "m1", 0, version=4), commit(11, 0xC, 0, 12),
       commit(12, 0xD, 0, 0)]                                       # a tool's reset: counted


def test_the_protocols_own_transactions_are_model_steps():
    result = check_model(RUN, "g", chroot="/app")
    assert result.ok, result.details
    assert result.summary == "model-steps=claims:3,commits:3,releases:1,tool-writes:1"


@pytest.mark.parametrize("change, problem", [
    ({6: t(6, 0xB, claim(6, 0xB, "m2", 0).ops[0])}, "without writing its token"),
    ({5: t(5, 0xA, Op(CHECK, f"{G}/ids/m1"))}, "held by session 0xa (exclusive)"),
    ({7: commit(7, 0xA, 0, 9)}, "landed after m2's claim (fenced)"),
    ({9: release(9, 0xB, 0, check=False)}, "without its commit or token check"),
    ({9: release(9, 0xA, 0)}, "held by session 0xb"),
])
def test_each_step_the_model_forbids_fails_the_run(change, problem):
    run = [change.get(txn.zxid, txn) for txn in RUN]
    result = check_model(run, "g", chroot="/app")
    assert not result.ok
    assert any(problem in line for line in result.details), result.details
