"""A share round's ZooKeeper transactions replayed as steps of the share model
(:mod:`tests.model.share_protocol`): every successful write of a share-partition znode must be
a step the model allows from the state before it, else the run fails (``bin/chaos``'s verdict,
check ``share-model``, figure ``share-model-steps=N``).

Each write's state before (the znode's previous version, decoded) and after is mapped to the
model's abstract state (:func:`abstract`: the model's :class:`~tests.model.share_protocol.Part`,
member ids renamed to the model's ``m0``, ``m1``, ... in order of appearance), the write is
classified as a sequence of the model's actions, and those actions are applied to the state
before by the model's own transition function (:func:`tests.model.share_protocol.apply`: the
real rules of :mod:`coordinator.share_partition`, then the decode check of invariant 6). The
write is allowed only if that gives exactly the state written, and the actions' guards hold:

* **a member's write** (a plain compare-and-set carrying one new write id, ``<member id>:<n>``):
  for each token the member held, the model's
  acknowledgements (ACCEPT, RELEASE with or without a delay, REJECT, RENEW) and gives-back
  (``release_undelivered``) its records' new states say; then one acquisition under the next
  token (never-delivered records only the log's next ones, when the log's ends are given), then
  one dead-letter claim; or the mark of its dead letters written (``dead_letters_written``). As
  in the model, a member writes whether or not its member znode exists (a member whose session
  expired may acquire on its new session before it registers again: counted, allowed);
* **the decider's write** (a transaction whose check is the group's shard epoch, at the epoch
  that znode has then: a deposed decider writes nothing): a token is released only when its
  holder's member znode was gone at some moment since the version it replaces, or when the lock
  has run out: ``share.record.lock.duration.ms`` since the write that acquired or last renewed
  it (ZooKeeper's times, the leader's wall clock); a delayed range is promoted only once its
  delay has passed since the write that delayed it;
* **a tool's write**: the znode's creation as an empty window, or an operator's reset
  (``groupctl share-groups reset``: nothing held, the state started over).

Besides, every state written keeps the model's invariants 4 and 6: no delivery count past
``share.delivery.count.limit``, no window wider than ``share.partition.max.record.locks``.

Not checked here (the share referee, :mod:`tests.chaos.share_referee`, checks what it can): what
members handed to the application and the dead-letter topic's contents (the model's ghosts);
that a write a member makes is one it *chose* (any acknowledgement of records it holds is a
step); gaps of the log when its ends are not given; history before the oldest log entry.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from coordinator import protocol
from coordinator.errors import CorruptZnode
from coordinator.protocol.share import (ACCEPTED, ACQUIRED, ARCHIVED, AVAILABLE, DEAD_LETTER, DELAYED, REASONS,
                                        RECENT_WRITES, REJECTED, WRITING, ShareGroupConfig, SharePartitionState,
                                        share_group_path, share_members_path, share_partitions_path)
from coordinator.share_partition import AcknowledgeType
from tests.chaos.referee import CheckResult
from tests.chaos.txnlog import CHECK, CLOSE_SESSION, CREATES, DELETES, SET_DATA, Op, Txn
from tests.model import share_protocol as model

A = AcknowledgeType
#: ZooKeeper's times are whole ms: a lock or a delay may look this much short.
SLACK_MS = 2
#: Problems kept (the count is always exact).
MAX_DETAILS = 200
STATE_NAMES = {AVAILABLE: "available", ACQUIRED: "acquired", DELAYED: "delayed", ACCEPTED: "accepted",
               ARCHIVED: "archived", DEAD_LETTER: "a pending dead letter", WRITING: "a dead letter being written"}
#: (rule of coordinator.share_partition, its arguments after the state, what the step is called)
Action = Tuple[str, tuple, str]


class Names:
    """Member ids and the model's member names (``m0``, ``m1``, ... in order of first appearance)."""

    def __init__(self):
        self.index: Dict[str, int] = {}

    def of(self, member_id: str) -> str:
        return model.name(self.index.setdefault(member_id, len(self.index)))

    def member(self, name: str) -> str:
        return next(m for m, i in self.index.items() if model.name(i) == name)


def abstract(state: SharePartitionState, names: Names) -> model.Part:
    """The model's state of ``state`` (its recent write ids aside)."""
    renamed = SharePartitionState(state.start, state.end, state.ranges,
                                  {t: [names.of(h), r] for t, (h, r) in state.held.items()},
                                  state.next_token, state.dlq_scan)
    return model.back(renamed)


def expand(part: model.Part) -> Dict[int, tuple]:
    """{offset: (state, deliveries, token, extra)} of the window."""
    return {o: r[2:] for r in part.ranges for o in range(r[0], r[1] + 1)}


def runs(offsets) -> List[Tuple[int, int]]:
    return model.runs(offsets)


def show_runs(offsets) -> str:
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs(offsets))


# ---------------------------------------------------------------- a member's write as the model's steps

def _ack_kind(before: tuple, after: Optional[tuple], start: int, o: int, token: int,
              acquired: Optional[int]) -> Optional[tuple]:
    """What the holder of ``token`` said of offset ``o`` (acquired under it), from its state after
    the write: (kind, delay), "undelivered" (given back uncounted), None (kept, or unexplained)."""
    _, deliveries, _, _ = before
    if after is None:
        return (A.ACCEPT, 0) if o < start else None
    st, d, t, extra = after
    if st == ACQUIRED and acquired is not None and t == acquired:   # released or given back, then acquired again
        st, d = AVAILABLE, d - 1
    if st == ACCEPTED:
        return A.ACCEPT, 0
    if st == AVAILABLE:
        return (A.RELEASE, 0) if d == deliveries else "undelivered" if d == deliveries - 1 else None
    if st == DELAYED and t == token:
        return A.RELEASE, extra
    if st in (DEAD_LETTER, WRITING):
        return (A.REJECT, 0) if extra == REJECTED else (A.RELEASE, 0)
    if st == ARCHIVED:
        return A.REJECT, 0
    return None


def member_actions(before: model.Part, after: model.Part, me: str, config: ShareGroupConfig) -> List[Action]:
    """The model's steps of member ``me`` that may have made ``after`` from ``before``."""
    bx, ax = expand(before), expand(after)
    held_before = {t: r for t, _, r in before.held}
    held_after = {t: r for t, _, r in after.held}
    fresh_tokens = sorted(set(held_after) - set(held_before))
    acquired = next((t for t in fresh_tokens if any(v[0] == ACQUIRED and v[2] == t for v in ax.values())), None)
    claimed = next((t for t in fresh_tokens if any(v[0] == WRITING and v[2] == t for v in ax.values())), None)
    actions: List[Action] = []
    for token, h, renewals in before.held:
        if model.name(h) != me:
            continue
        if token in held_after and held_after[token] > renewals:
            n = held_after[token] - renewals
            actions.append(("acknowledge", (me, token, ((0, 0, A.RENEW, 0),) * n, config), f"RENEW token {token}"))
        kinds: Dict[object, List[int]] = defaultdict(list)
        for o, v in sorted(bx.items()):
            if v[0] == ACQUIRED and v[2] == token:
                kind = _ack_kind(v, ax.get(o), after.start, o, token, acquired)
                if kind is not None:
                    kinds[kind].append(o)
        for kind, offsets in sorted(kinds.items(), key=lambda kv: kv[1][0]):
            if kind == "undelivered":
                actions += [("release_undelivered", (me, token, a, b), f"gives back {show_runs(offsets)} of token "
                             f"{token} uncounted") for a, b in runs(offsets)]
                continue
            acks = tuple((a, b, kind[0], kind[1]) for a, b in runs(offsets))
            delay = f" (delay {kind[1]} ms)" if kind[1] else ""
            actions.append(("acknowledge", (me, token, acks, config),
                            f"{kind[0].name} {show_runs(offsets)}{delay} (token {token})"))
        if token not in held_after and any(v[0] == WRITING and v[2] == token for v in bx.values()):
            actions.append(("dead_letters_written", (me, token), f"marks the dead letters of token {token} written"))
    if acquired is not None:
        offsets = [o for o, v in sorted(ax.items()) if v[0] == ACQUIRED and v[2] == acquired]
        fresh = tuple(o for o in offsets if o >= before.end)
        actions.append(("acquire", (me, len(offsets), fresh, config),
                        f"acquires {show_runs(offsets)} under token {acquired}"))
    if claimed is not None:
        offsets = [o for o, v in sorted(ax.items()) if v[0] == WRITING and v[2] == claimed]
        actions.append(("claim_dead_letters", (me, len(offsets), max(after.dlq_scan, 0)),
                        f"claims the dead letters of {show_runs(offsets)} under token {claimed}"))
    return actions


# ---------------------------------------------------------------- the decider's write as the model's steps

class Clocks:
    """What the decider's clocks may say, from ZooKeeper's times: when each lock last started (its
    acquisition or renewal was written) and when each delayed range was delayed."""

    def __init__(self):
        self.locks: Dict[Tuple[int, int], Tuple[int, int]] = {}   # (partition, token) -> (renewals, since ms)
        self.delays: Dict[Tuple[int, int, int], int] = {}         # (partition, first, token) -> since ms

    def note(self, partition: int, part: model.Part, time_ms: int) -> None:
        for token, _, renewals in part.held:
            seen = self.locks.get((partition, token))
            if seen is None or seen[0] != renewals:
                self.locks[(partition, token)] = (renewals, time_ms)
        for r in part.ranges:
            if r[2] == DELAYED:
                self.delays.setdefault((partition, r[0], r[4]), time_ms)


def decider_actions(partition: int, before: model.Part, after: model.Part, time_ms: int, config: ShareGroupConfig,
                    clocks: Clocks, gone: Callable[[int], bool], names: Names) -> Tuple[List[Action], List[str]]:
    """The decider's steps that may have made ``after`` from ``before``, and the guards they break
    (``gone(holder)``: its member znode was gone since ``before`` was written)."""
    actions: List[Action] = []
    broken: List[str] = []
    held_after = {t for t, _, _ in after.held}
    for token, h, renewals in before.held:
        if token in held_after:
            continue
        who = names.member(model.name(h))
        if gone(h):
            actions.append(("expire", (token, config), f"releases token {token} ({who}'s member znode is gone)"))
            continue
        since = clocks.locks.get((partition, token))
        age = None if since is None else time_ms - since[1]
        actions.append(("expire", (token, config), f"the lock of token {token} ({who}) ran out"
                        + ("" if age is None else f" after {age} ms")))
        if age is not None and age < config.lock_duration_ms - SLACK_MS:
            broken.append(f"the lock of token {token} ended {age} ms after it started (the lock is "
                          f"{config.lock_duration_ms} ms) while {who} was registered")
    ax = expand(after)
    for r in before.ranges:
        if r[2] != DELAYED or (ax.get(r[0]) == r[2:] and any(a[0] == r[0] for a in after.ranges)):
            continue
        since = clocks.delays.get((partition, r[0], r[4]))
        age = None if since is None else time_ms - since
        actions.append(("promote", (r[0], r[4]), f"the delay at {r[0]} (token {r[4]}) ended"
                        + ("" if age is None else f" after {age} ms")))
        if age is not None and age < r[5] - SLACK_MS:
            broken.append(f"the delayed range at {r[0]} (token {r[4]}) was promoted {age} ms after it was "
                          f"delayed, its delay is {r[5]} ms")
    return actions, broken


# ---------------------------------------------------------------- the model's verdict on one write

def replay(before: model.Part, actions: Sequence[Action]) -> Tuple[model.Part, Optional[str]]:
    """The model's steps applied to ``before`` (:func:`tests.model.share_protocol.apply`)."""
    part = before
    for rule, args, label in actions:
        part, answer, problem = model.apply(part, rule, *args)
        if problem:
            return part, f"{label}: {problem}"
        if rule in ("promote", "dead_letters_written") and answer is False:
            return part, f"{label}: the rule refused it"
    return part, None


def _show(v: Optional[tuple]) -> str:
    if v is None:
        return "outside the window"
    st, d, t, extra = v
    why = f", delay {extra} ms" if st == DELAYED else f", {REASONS.get(extra, extra)}" if extra else ""
    counted = f", deliveries {d}" if d or st not in (ACCEPTED, ARCHIVED) else ""
    return STATE_NAMES.get(st, repr(st)) + counted + (f", token {t}" if t else "") + why


def difference(want: model.Part, got: model.Part, names: Names) -> str:
    """What the state written has that the model's step does not give, in words."""
    if (want.start, want.end) != (got.start, got.end):
        return f"the window is [{got.start}, {got.end}), the model's step gives [{want.start}, {want.end})"
    wx, gx = expand(want), expand(got)
    for o in sorted(set(wx) | set(gx)):
        if wx.get(o) != gx.get(o):
            return f"offset {o} is {_show(gx.get(o))}; the model's step makes it {_show(wx.get(o))}"

    def held(p):
        return ", ".join(f"{t}: {names.member(model.name(h))}" for t, h, _ in p.held) or "none"
    if {(t, h) for t, h, _ in want.held} != {(t, h) for t, h, _ in got.held}:
        return f"tokens held {held(got)}; the model's step gives {held(want)}"
    if want.held != got.held:
        return (f"renewals {[(t, r) for t, _, r in got.held]}; the model's step gives "
                f"{[(t, r) for t, _, r in want.held]}")
    if want.next_token != got.next_token:
        return f"next token {got.next_token}; the model's step gives {want.next_token}"
    if want.dlq_scan != got.dlq_scan:
        return f"dead-letter scan from {got.dlq_scan}; the model's step gives {want.dlq_scan}"
    return "its ranges are cut differently from the model's step's"


def invariants(part: model.Part, config: ShareGroupConfig) -> Optional[str]:
    """The model's invariants 4 (delivery limit) and 6 (window) on a state written."""
    if part.end - part.start > config.max_record_locks:
        return (f"6 window: [{part.start}, {part.end}) is wider than share.partition.max.record.locks "
                f"{config.max_record_locks}")
    for first, last, st, deliveries, _, _ in part.ranges:
        if deliveries > config.delivery_count_limit:
            return (f"4 limit: [{first}, {last}] is {STATE_NAMES.get(st, st)} after {deliveries} deliveries "
                    f"(limit {config.delivery_count_limit})")
    return None


# ---------------------------------------------------------------- a run's transactions

class ShareTrace:
    """Feed a run's transactions (zxid order) with :meth:`feed`; :meth:`result` is the verdict.
    ``log_ends`` ({partition: end offset} of a log without gaps, the embedded log's): the records a
    member acquires for the first time must be the log's next ones."""

    def __init__(self, group: str, topic: str, chroot: str = "", log_ends: Optional[Dict[int, int]] = None):
        self.group, self.chroot, self.log_ends = group, chroot, log_ends
        self.base = chroot + share_partitions_path(group, topic) + "/"
        self.members_base = chroot + share_members_path(group) + "/"
        self.config_path = chroot + share_group_path(group)
        self.shards_path = chroot + protocol.SHARDS
        self.config = ShareGroupConfig()
        self.names, self.clocks = Names(), Clocks()
        self.states: Dict[int, Tuple[SharePartitionState, int, model.Part]] = {}   # partition -> (state, zxid, part)
        self.present: Dict[str, int] = {}          # member id -> zxid its znode was created at
        self.owner: Dict[str, int] = {}            # member id -> the session of its znode
        self.registered: Dict[int, set] = defaultdict(set)   # session -> member ids it registered
        self.epochs: Dict[str, int] = {}           # epoch znode -> its version
        self.shard_count: Optional[int] = None
        self.counts: Counter = Counter()
        self.problems: List[str] = []
        self.failed = 0

    def feed(self, txn: Txn) -> None:
        if txn.failed:
            return
        if txn.type == CLOSE_SESSION:
            for who in [m for m, s in self.owner.items() if s == txn.session and m in self.present]:
                del self.present[who]
            return
        fences = [op for op in txn.ops if op.type == CHECK and op.path.startswith(self.shards_path + "/")
                  and op.path.endswith("/epoch")]
        for op in txn.ops:
            if op.path.startswith(self.base) and op.path[len(self.base):].isdigit():
                self._write(txn, op, int(op.path[len(self.base):]), fences)
        for op in txn.ops:
            self._track(txn, op)

    def _track(self, txn: Txn, op: Op) -> None:
        """What the guards need: epochs, the shard count, the group's settings, its members."""
        if op.path.startswith(self.shards_path + "/") and op.path.endswith("/epoch"):
            if op.type in CREATES:
                self.epochs[op.path] = 0
            elif op.type == SET_DATA:
                self.epochs[op.path] = op.version   # the log has the version the write made
        elif op.path == self.shards_path and op.type in CREATES + (SET_DATA,) and op.data:
            try:
                self.shard_count = protocol.ShardsInfo.decode(op.data).count
            except CorruptZnode:
                pass
        elif op.path == self.config_path and op.type in CREATES + (SET_DATA,):
            try:
                self.config = ShareGroupConfig.decode(op.data or b"", op.path)
            except CorruptZnode:
                pass
        elif op.path.startswith(self.members_base):
            who = op.path[len(self.members_base):]
            if op.type in CREATES:
                self.present[who], self.owner[who] = txn.zxid, txn.session
                self.registered[txn.session].add(who)
            elif op.type in DELETES:
                self.present.pop(who, None)

    # ------------------------------------------------------------ one write

    def _write(self, txn: Txn, op: Op, partition: int, fences: List[Op]) -> None:
        where = f"zxid {txn.zxid:#x} {op.path}"
        if op.type in DELETES:
            self.states.pop(partition, None)
            self.counts["deleted"] += 1
            return
        if op.type not in CREATES + (SET_DATA,) or op.data is None:
            return
        try:
            state = SharePartitionState.decode(op.data, op.path)
        except CorruptZnode:
            self.states.pop(partition, None)   # the share referee's evidence check names it
            self.counts["not judged"] += 1
            return
        known, after = self.states.get(partition), abstract(state, self.names)
        self.states[partition] = (state, txn.zxid, after)
        if known is None and op.type == SET_DATA:
            self.counts["not judged"] += 1     # no earlier version in the logs
            return
        label, why = self._judge(txn, partition, None if op.type in CREATES else known, state, after, fences)
        self.clocks.note(partition, after, txn.time_ms)
        if why is not None:
            self.failed += 1
            if len(self.problems) < MAX_DETAILS:
                self.problems.append(f"{where}: {label}: not a step the share model allows: {why}")

    def _judge(self, txn: Txn, partition: int, known: Optional[Tuple[SharePartitionState, int, model.Part]],
               state: SharePartitionState, after: model.Part, fences: List[Op]) -> Tuple[str, Optional[str]]:
        """(what the write is, as the model's steps; why the model does not allow it, or None)."""
        broken = invariants(after, self.config)
        if known is None:
            self.counts["created"] += 1
            empty = SharePartitionState(state.start, state.end)
            ok = state == empty and (self.log_ends is None or state.start <= self.log_ends.get(partition, 0))
            return f"created at {state.start}", broken or (None if ok else f"the first state is not an empty "
                                                                            f"window within the log: {state}")
        before_state, before_zxid, before = known
        new_id = bool(state.writes) and state.writes[-1] not in before_state.writes
        if fences:
            label, actions, why = self._decider(txn, partition, before, after, before_zxid, fences)
        elif new_id:
            label, actions, why = self._member(txn, partition, before_state, state, before, after)
        else:
            return self._tool(before_state, state, broken)
        if why is None and broken:
            why = broken
        if why is None:
            want, why = replay(before, actions)
            if why is None and want != after:
                why = difference(want, after, self.names)
        return label, why

    def _member(self, txn: Txn, partition: int, before_state: SharePartitionState, state: SharePartitionState,
                before: model.Part, after: model.Part) -> Tuple[str, List[Action], Optional[str]]:
        who = state.writes[-1].rpartition(":")[0]
        actions = member_actions(before, after, self.names.of(who), self.config)
        steps = "; ".join(label for _, _, label in actions) or "no change (its acknowledgements refused)"
        label = f"member {who}: {steps}"
        self.counts["member writes"] += 1
        for rule, _, _ in actions:
            self.counts[rule] += 1
        if state.writes != (before_state.writes + [state.writes[-1]])[-RECENT_WRITES:]:
            return label, actions, (f"its recent writes go from {before_state.writes[-3:]} to {state.writes[-3:]}: "
                                    "a member's write adds its own id")
        if who not in self.registered.get(txn.session, ()):
            self.counts["member writes before its session registered"] += 1   # allowed: the model's zombie
        fresh = next((args[2] for rule, args, _ in actions if rule == "acquire"), ())
        if fresh and self.log_ends is not None:
            expected = tuple(range(before.end, min(before.end + len(fresh), self.log_ends.get(partition, 0))))
            if fresh != expected:
                return label, actions, (f"records acquired for the first time are {show_runs(fresh)}, the log's "
                                        f"next ones are {show_runs(expected) or 'none'}")
        return label, actions, None

    def _decider(self, txn: Txn, partition: int, before: model.Part, after: model.Part, before_zxid: int,
                 fences: List[Op]) -> Tuple[str, List[Action], Optional[str]]:
        def gone(h: int) -> bool:
            who = self.names.member(model.name(h))
            return not (who in self.present and self.present[who] <= before_zxid)
        actions, broken = decider_actions(partition, before, after, txn.time_ms, self.config, self.clocks, gone,
                                          self.names)
        label = "the decider: " + ("; ".join(label for _, _, label in actions) or "no change")
        self.counts["decider writes"] += 1
        for rule, args, text in actions:
            self.counts["released, member gone" if "is gone" in text else "lock ran out" if rule == "expire"
                        else rule] += 1
        fence = fences[0]
        shard = fence.path[len(self.shards_path) + 1:].split("/")[0]
        mine = None if self.shard_count is None else \
            self.chroot + protocol.shard_epoch_path(protocol.shard_of(self.group, self.shard_count))
        current = self.epochs.get(fence.path)
        if mine is not None and fence.path != mine:
            return label, actions, f"the write is fenced by shard {shard}'s epoch, the group is on {mine}"
        if current is not None and fence.version - 1 != current:   # the log has the version found, plus one
            return label, actions, (f"the write checks epoch {fence.version - 1} of shard {shard}, which is at "
                                    f"epoch {current}: a deposed decider's write")
        return label, actions, (broken[0] if broken else None)

    def _tool(self, before: SharePartitionState, state: SharePartitionState,
              broken: Optional[str]) -> Tuple[str, Optional[str]]:
        """A write with neither a member's id nor the decider's fence: only a reset is one."""
        self.counts["reset"] += 1
        label = f"a write without a member's id or the decider's fence (a reset to {state.start}?)"
        if before.held:
            return label, "records are held: a reset is refused then"
        if state != SharePartitionState(state.start, state.end) or state.start != state.end:
            return label, f"the state written is not an empty window: {state}"
        return f"reset to {state.start}", broken

    def result(self) -> CheckResult:
        judged = sum(self.counts[k] for k in ("member writes", "decider writes", "created", "reset"))
        details = list(self.problems) + ([f"... {self.failed - MAX_DETAILS} more"] if self.failed > MAX_DETAILS else [])
        details.append("writes judged by the share model: "
                       + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())))
        return CheckResult("share-model", self.failed == 0, f"share-model-steps={judged}", details)


def check_share_model(txns: Sequence[Txn], group: str, topic: str, chroot: str = "",
                      log_ends: Optional[Dict[int, int]] = None) -> CheckResult:
    """Every write of ``group``'s share-partitions of ``topic`` in ``txns`` (zxid order), judged."""
    trace = ShareTrace(group, topic, chroot, log_ends)
    for txn in txns:
        trace.feed(txn)
    return trace.result()
