"""A real run's ZooKeeper transactions replayed as steps of the protocol model
(:mod:`tests.model.protocol`): each applied transaction that touches a group's owners or
offsets must be a step the model allows, else the run fails (``bin/chaos``'s referee, check
``model``).

The steps, as the model has them:

* **claim**: the owner node's create and the offsets znode's write (the token) in one
  transaction, on a partition no session holds;
* **commit**: an offsets write outside a claim, by a session of the member whose claim is the
  partition's latest (a member that registered again after an expiry commits on its new
  session: the model's zombie, allowed while nobody else claimed since);
* **release**: the owner node's delete by the session holding it, with the partition's commit
  or token check in the same transaction;
* a closed session's owner nodes go with it.

Writes of sessions that never registered a member (``groupctl groups reset-offsets``, which the
model does not have) are counted, not judged.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

from tests.chaos.history import _Paths
from tests.chaos.referee import CheckResult
from tests.chaos.txnlog import CHECK, CLOSE_SESSION, CREATES, DELETES, SET_DATA, Txn

Partition = Tuple[str, int]


def check_model(txns: Iterable[Txn], group: str, chroot: str = "") -> CheckResult:
    """Replay ``txns`` (zxid order) for ``group``: a failed check names each step the model
    does not allow."""
    paths = _Paths(group, chroot)
    member_of: Dict[int, str] = {}
    holder: Dict[Partition, int] = {}          # partition -> session holding its owner node
    claimer: Dict[Partition, str] = {}         # partition -> member of its latest claim
    problems: List[str] = []
    counts = {"claims": 0, "commits": 0, "releases": 0, "tool writes": 0}
    for txn in txns:
        if txn.failed:
            continue
        if txn.type == CLOSE_SESSION:
            for tp in [tp for tp, s in holder.items() if s == txn.session]:
                del holder[tp]
            continue
        owned = {tp for op in txn.ops if op.type in CREATES for tp in [paths.owner(op.path)] if tp}
        released = {tp for op in txn.ops if op.type in DELETES for tp in [paths.owner(op.path)] if tp}
        written = {tp for op in txn.ops if op.type in CREATES + (SET_DATA,) for tp in [paths.offset(op.path)] if tp}
        checked = {tp for op in txn.ops if op.type == CHECK for tp in [paths.offset(op.path)] if tp}
        for op in txn.ops:
            m = paths.member(op.path) if op.type in CREATES else None
            if m is not None:
                member_of[txn.session] = m
        who = member_of.get(txn.session)
        where = f"zxid {txn.zxid:#x} session {txn.session:#x} ({who or 'no member'})"
        for tp in sorted(owned):
            counts["claims"] += 1
            if tp in holder:
                problems.append(f"{where}: claims {tp} held by session {holder[tp]:#x} (exclusive)")
            if tp not in written:
                problems.append(f"{where}: claims {tp} without writing its token in the same transaction")
            holder[tp] = txn.session
            claimer[tp] = who
        for tp in sorted(written - owned):
            if who is None:
                counts["tool writes"] += 1
                continue
            counts["commits"] += 1
            if claimer.get(tp) != who:
                problems.append(f"{where}: a commit of {tp} landed after {claimer.get(tp) or 'nobody'}'s claim (fenced)")
        for tp in sorted(released):
            counts["releases"] += 1
            if holder.get(tp) != txn.session:
                problems.append(f"{where}: deletes the owner node of {tp}, held by "
                                f"{'nobody' if tp not in holder else f'session {holder[tp]:#x}'}")
            if tp not in written | checked:
                problems.append(f"{where}: releases {tp} without its commit or token check in the same transaction")
            holder.pop(tp, None)
    summary = "model-steps=" + ",".join(f"{k.replace(' ', '-')}:{v}" for k, v in counts.items())
    return CheckResult("model", not problems, summary, problems)
