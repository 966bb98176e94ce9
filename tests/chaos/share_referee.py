"""The share round's referee: a share group's records, judged by ZooKeeper's own log.

Inputs: every version of each share-partition znode in the transaction logs (decoded with
:meth:`~coordinator.protocol.share.SharePartitionState.decode`, in zxid order, only what
applied), the topic's records (their keys say what the workers were told to do with them), the
dead-letter topic's records, and the lines the workers printed (``groupctl share-consume``:
partition, offset, value, ``delivery_count``, ``acknowledgement``). Checks, each a
:class:`~tests.chaos.referee.CheckResult`:

a. ``share-lost``: at the end every share-partition's start is the log's end; every offset
   below it became done exactly once, accepted or archived, after it was delivered (none skipped:
   a record done without ever being acquired); an accepted record was printed with ``accept``;
   records keyed ``reject`` were archived as rejected, those keyed ``retry`` at the delivery
   limit, and no other record was archived as rejected;
b. ``share-locks``: between two successive versions no offset acquired by one holder is
   acquired by another (a release, an expiry or a holder gone must come between; the same
   holder acquiring it again in one write is allowed);
c. ``share-deliveries``: no delivery count in any version, nor in a printed line or a dead
   letter, exceeds the group's limit;
d. ``share-accepts``: an offset that is done (accepted, archived, or below the start) never
   changes again: at most one ACCEPT takes effect, and nothing done comes back; the start and
   the end never move back;
e. ``share-dead-letters``: the dead-letter topic holds each archived record once (by its
   ``zkgroups.dlq.*`` headers, with the record's value, its reason and delivery count), and
   nothing else. A second copy is the documented exception (a writer paused between its append
   and its mark, past its claim's lock) only if the record's letters were claimed under two
   tokens or more, i.e. a claim was taken over; else it fails. An archived record leaves the
   window only from ``ar`` or ``dw`` (the mark of its letter), never from ``dq`` (unclaimed);
f. ``share-delays``: a record released with a delay was not acquired again before it (ZooKeeper
   times of the release and of the next acquisition; both are the leader's wall clock, the same
   machine's).

Anything in the evidence that does not decode, or a share-partition deleted, fails
``share-evidence``.
"""
from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

from consumer.log import Log
from coordinator.errors import CorruptZnode
from coordinator.protocol.share import (ACCEPTED, ACQUIRED, ARCHIVED, AVAILABLE, DEAD_LETTER, DELAYED,
                                        DELIVERY_LIMIT, HELD_STATES, REASONS, REJECTED, WRITING,
                                        SharePartitionState, share_partitions_path)
from tests.chaos.referee import CheckResult
from tests.chaos.txnlog import CREATES, DELETES, SET_DATA, Txn

#: The dead letters' headers (:mod:`consumer.share_exchange`).
DLQ_GROUP, DLQ_TOPIC, DLQ_PARTITION, DLQ_OFFSET, DLQ_COUNT, DLQ_REASON = (
    "zkgroups.dlq.group", "zkgroups.dlq.topic", "zkgroups.dlq.partition", "zkgroups.dlq.offset",
    "zkgroups.dlq.delivery.count", "zkgroups.dlq.reason")
#: A delayed record's next acquisition may be stamped this much early (ZooKeeper's whole ms).
DELAY_SLACK_MS = 2
#: Details kept per check (the count is always exact).
MAX_DETAILS = 200


@dataclass(frozen=True)
class Version:
    zxid: int
    time_ms: int
    session: int
    state: SharePartitionState


@dataclass
class Printed:
    partition: int
    offset: int
    value: Optional[str]
    delivery_count: int
    acknowledgement: str
    source: str


@dataclass
class Findings:
    """Per check, what went wrong (and the figures of the summary)."""
    problems: Dict[str, List[str]] = field(default_factory=lambda: defaultdict(list))
    counts: Counter = field(default_factory=Counter)

    def add(self, check: str, text: str) -> None:
        self.counts[check] += 1
        if len(self.problems[check]) < MAX_DETAILS:
            self.problems[check].append(text)


def share_versions(txns: Sequence[Txn], chroot: str, group: str, topic: str,
                   findings: Findings) -> Dict[int, List[Version]]:
    """{partition: every version of its share-partition znode, in zxid order}."""
    base = chroot + share_partitions_path(group, topic) + "/"
    out: Dict[int, List[Version]] = defaultdict(list)
    for txn in txns:
        if txn.failed:
            continue
        for op in txn.ops:
            if not op.path.startswith(base) or not op.path[len(base):].isdigit():
                continue
            partition = int(op.path[len(base):])
            if op.type in DELETES:
                findings.add("share-evidence", f"zxid {txn.zxid:#x}: {op.path} deleted")
            elif op.type in CREATES + (SET_DATA,) and op.data is not None:
                try:
                    state = SharePartitionState.decode(op.data, op.path)
                except CorruptZnode as e:
                    findings.add("share-evidence", f"zxid {txn.zxid:#x}: {e}")
                    continue
                out[partition].append(Version(txn.zxid, txn.time_ms, txn.session, state))
    return out


def _expand(state: SharePartitionState) -> Dict[int, tuple]:
    """{offset: (state, holder, deliveries, token, extra)} of the window."""
    out = {}
    for first, last, s, deliveries, token, extra in state.ranges:
        holder = state.held.get(token, [None])[0] if s in HELD_STATES else None
        item = (s, holder, deliveries, token, extra)
        for o in range(first, last + 1):
            out[o] = item
    return out


@dataclass
class PartitionFacts:
    """What the versions of one share-partition say of its offsets."""
    delivered: Set[int] = field(default_factory=set)
    accepted: Counter = field(default_factory=Counter)       # offset -> ACCEPTs that took effect
    archived: Dict[int, int] = field(default_factory=dict)   # offset -> reason (0: unknown)
    left_archived: Set[int] = field(default_factory=set)     # archived offsets that left the window as done
    claims: Dict[int, Set[int]] = field(default_factory=lambda: defaultdict(set))  # offset -> dead-letter tokens
    max_deliveries: Dict[int, int] = field(default_factory=dict)
    delays: int = 0
    final: Optional[SharePartitionState] = None


def replay(partition: int, versions: Sequence[Version], limit: int, findings: Findings) -> PartitionFacts:
    facts = PartitionFacts()
    where = f"partition {partition}"
    prev: Dict[int, tuple] = {}
    prev_start = prev_end = 0
    delayed_since: Dict[int, Tuple[int, int, int]] = {}   # offset -> (time ms, delay ms, zxid)

    def accept(o: int, zxid: int) -> None:
        facts.accepted[o] += 1
        if facts.accepted[o] > 1:
            findings.add("share-accepts", f"{where} offset {o}: accepted a second time (zxid {zxid:#x})")
        if o in facts.archived:
            findings.add("share-accepts", f"{where} offset {o}: accepted after it was archived (zxid {zxid:#x})")
        if o not in facts.delivered:
            findings.add("share-lost", f"{where} offset {o}: done (accepted) without ever being delivered "
                                       f"(zxid {zxid:#x})")

    for v in versions:
        s, zxid = v.state, v.zxid
        cur = _expand(s)
        if s.start < prev_start or s.end < prev_end:
            findings.add("share-accepts", f"{where}: window moved back from [{prev_start}, {prev_end}) to "
                                          f"[{s.start}, {s.end}) (zxid {zxid:#x})")
        # offsets done without ever being in a window (skipped over)
        for o in range(max(prev_end, 0), min(s.start, s.end)):
            if o not in cur and o not in prev:
                findings.add("share-lost", f"{where} offset {o}: below the start without ever being delivered "
                                           f"(zxid {zxid:#x})")
        for o, (st, holder, deliveries, token, extra) in cur.items():
            p = prev.get(o)
            if o < prev_start:
                findings.add("share-accepts", f"{where} offset {o}: done, back in the window as {st} (zxid {zxid:#x})")
            if p is not None and p[0] in (ACCEPTED, ARCHIVED) and st != p[0]:
                findings.add("share-accepts", f"{where} offset {o}: done ({p[0]}), then {st} (zxid {zxid:#x})")
            if st in (AVAILABLE, ACQUIRED, DELAYED, DEAD_LETTER, WRITING):
                facts.max_deliveries[o] = max(facts.max_deliveries.get(o, 0), deliveries)
                if deliveries > limit:
                    findings.add("share-deliveries", f"{where} offset {o}: {st} with {deliveries} deliveries, the "
                                                     f"limit is {limit} (zxid {zxid:#x})")
            if st == ACQUIRED:
                facts.delivered.add(o)
                if p is not None and p[0] == ACQUIRED and p[1] != holder:
                    findings.add("share-locks", f"{where} offset {o}: acquired by {holder} while {p[1]} held it "
                                                f"(token {p[3]} -> {token}, zxid {zxid:#x})")
                since = delayed_since.pop(o, None)
                if since is not None and v.time_ms < since[0] + since[1] - DELAY_SLACK_MS:
                    findings.add("share-delays", f"{where} offset {o}: released with a delay of {since[1]} ms "
                                                 f"(zxid {since[2]:#x}), acquired again after "
                                                 f"{v.time_ms - since[0]} ms (zxid {zxid:#x})")
            elif st == DELAYED and (p is None or p[0] != DELAYED or p[3] != token):
                delayed_since[o] = (v.time_ms, extra, zxid)
                facts.delays += 1
            elif st in (DEAD_LETTER, WRITING):
                if facts.accepted.get(o):
                    findings.add("share-accepts", f"{where} offset {o}: archived after it was accepted "
                                                  f"(zxid {zxid:#x})")
                facts.archived[o] = extra
                if st == WRITING:
                    facts.claims[o].add(token)
            elif st == ARCHIVED:
                facts.archived.setdefault(o, 0)
            elif st == ACCEPTED and (p is None or p[0] != ACCEPTED):
                accept(o, zxid)
        for o, p in prev.items():
            if o in cur:
                continue
            if o >= s.start:
                findings.add("share-accepts", f"{where} offset {o}: left the window above its start "
                                              f"(zxid {zxid:#x})")
            elif p[0] == DEAD_LETTER:
                findings.add("share-dead-letters", f"{where} offset {o}: done while its dead letter was pending "
                                                   f"(never claimed; zxid {zxid:#x})")
                facts.left_archived.add(o)
            elif p[0] in (ARCHIVED, WRITING):   # WRITING: the mark of its letter, in this write
                facts.left_archived.add(o)
            elif p[0] == ACCEPTED:
                pass
            else:
                if p[0] != ACQUIRED:
                    findings.add("share-accepts", f"{where} offset {o}: done from {p[0]}, never acquired then "
                                                  f"(zxid {zxid:#x})")
                accept(o, zxid)
        prev, prev_start, prev_end = cur, s.start, s.end
        facts.final = s
    return facts


def read_printed(path: str, findings: Findings) -> List[Printed]:
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    out = []
    for number, line in enumerate(lines[:-1], 1):   # a last line without its newline: cut short by SIGKILL
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            out.append(Printed(int(obj["partition"]), int(obj["offset"]), obj.get("value"),
                               int(obj["delivery_count"]), str(obj["acknowledgement"]),
                               f"{os.path.basename(path)}:{number}"))
        except (ValueError, KeyError, TypeError):
            findings.add("share-evidence", f"{os.path.basename(path)}:{number}: not a record line: {line[:120]!r}")
    return out


def read_topic_keys(data_dir: str, topic: str, partitions: int) -> Dict[int, List[Optional[bytes]]]:
    log = Log(data_dir)
    try:
        out = {}
        for p in range(partitions):
            keys, offset, end = [], log.earliest_offset(topic, p), log.latest_offset(topic, p)
            while offset < end:
                batch = log.fetch(topic, p, offset, max_records=10_000)
                keys.extend(r.key for r in batch)
                offset += len(batch)
            out[p] = keys
        return out
    finally:
        log.close()


def read_dead_letters(data_dir: str, topic: str, partitions: int) -> List[Tuple[int, int, Dict[str, str], str]]:
    """(letter partition, letter offset, headers, value) of every record of the dead-letter topic."""
    log = Log(data_dir)
    out = []
    try:
        for p in range(partitions):
            offset, end = log.earliest_offset(topic, p), log.latest_offset(topic, p)
            while offset < end:
                batch = log.fetch(topic, p, offset, max_records=10_000)
                for r in batch:
                    headers = {k: v.decode("utf-8", "replace") for k, v in (r.headers or ())}
                    out.append((p, r.offset, headers, r.value.decode("utf-8", "replace")))
                offset += len(batch)
        return out
    finally:
        log.close()


AS_TOLD, LATE_REJECT, WRONG_REASON = "as told", "late reject", "wrong reason"


def archive_verdict(expected: Optional[int], reason: int, deliveries: int, limit: int) -> str:
    """Whether a record archived for ``reason`` was archived as its key told the worker to
    (``expected``: REJECTED, DELIVERY_LIMIT or None for a record to accept). A reject-keyed record
    delivered ``limit`` times may end at the limit: each of its locks ended before its REJECT came
    (a slow or cut worker), which the protocol allows."""
    if expected == REJECTED and reason == DELIVERY_LIMIT and deliveries >= limit:
        return LATE_REJECT
    if (expected is not None and reason != expected) or (expected is None and reason == REJECTED):
        return WRONG_REASON
    return AS_TOLD


def judge_share(run_dir: str, share, txns: Sequence[Txn], chroot: str, topic: str, partitions: int,
                produced: Dict[Tuple[str, int], List[str]]) -> List[CheckResult]:
    """Every check of the share round (``share`` is the run's :class:`tests.chaos.judge.ShareRound`)."""
    findings = Findings()
    limit = share.delivery_limit
    data_dir = os.path.join(run_dir, "data")
    versions = share_versions(txns, chroot, share.group, topic, findings)
    facts = {p: replay(p, versions.get(p, []), limit, findings) for p in range(partitions)}
    keys = read_topic_keys(data_dir, topic, partitions)
    printed: List[Printed] = []
    for path in share.outputs:
        printed += read_printed(os.path.join(run_dir, path), findings)

    # printed lines: the record's value, the delivery count
    printed_acks: Dict[Tuple[int, int], Set[str]] = defaultdict(set)
    deliveries_printed: Counter = Counter()
    for r in printed:
        values = produced.get((topic, r.partition), [])
        if not 0 <= r.offset < len(values) or values[r.offset] != r.value:
            findings.add("share-lost", f"{r.source}: printed {topic}/{r.partition} offset {r.offset} value "
                                       f"{r.value!r}, which the log does not have there")
        if not 1 <= r.delivery_count <= limit:
            findings.add("share-deliveries", f"{r.source}: {topic}/{r.partition} offset {r.offset} printed with "
                                             f"delivery_count {r.delivery_count} (limit {limit})")
        printed_acks[(r.partition, r.offset)].add(r.acknowledgement)
        deliveries_printed[(r.partition, r.offset, r.delivery_count)] += 1
    for (p, o, n), times in deliveries_printed.items():
        if times > 1:
            findings.add("share-locks", f"{topic}/{p} offset {o}: delivery {n} printed {times} times (one "
                                        f"acquisition handed out twice)")

    # a: none lost, each done once, as the workers were told
    accepted = archived = rejected = at_limit = rejects_late = 0
    for p in range(partitions):
        f, end = facts[p], len(produced.get((topic, p), []))
        start = f.final.start if f.final is not None else None
        if start != end:
            findings.add("share-lost", f"{topic}/{p}: the share-partition's start is {start} at the end, the log "
                                       f"ends at {end}")
        live = (share.live or {}).get(p)
        if share.live is not None and f.final is not None and live != [f.final.start, f.final.end]:
            findings.add("share-evidence", f"{topic}/{p}: ZooKeeper answered [start, end] {live} at the end, the "
                                           f"transaction log says [{f.final.start}, {f.final.end}]")
        for o in range(min(start or 0, end)):
            key = keys[p][o] if o < len(keys[p]) else None
            was_archived, times = o in f.archived, f.accepted.get(o, 0)
            if was_archived == bool(times):
                findings.add("share-lost", f"{topic}/{p} offset {o}: below the start, "
                                           + ("both accepted and archived" if times else "neither accepted nor archived"))
                continue
            if times:
                accepted += 1
                if "accept" not in printed_acks.get((p, o), ()):
                    findings.add("share-lost", f"{topic}/{p} offset {o}: accepted, never printed with accept")
                if key in (share.reject_key.encode(), share.retry_key.encode()):
                    findings.add("share-lost", f"{topic}/{p} offset {o}: key {key.decode()}, accepted")
                continue
            archived += 1
            reason = f.archived[o]
            rejected += reason == REJECTED
            at_limit += reason == DELIVERY_LIMIT
            expected = {share.reject_key.encode(): REJECTED, share.retry_key.encode(): DELIVERY_LIMIT}.get(key)
            verdict = archive_verdict(expected, reason, f.max_deliveries.get(o, 0), limit)
            rejects_late += verdict == LATE_REJECT
            if verdict == WRONG_REASON:
                findings.add("share-lost", f"{topic}/{p} offset {o}: key {key!r}, archived as "
                                           f"{REASONS.get(reason, reason)}")

    # e: the dead-letter topic holds exactly the archived records
    letters: Dict[Tuple[int, int], List[tuple]] = defaultdict(list)
    for lp, lo, headers, value in read_dead_letters(data_dir, share.dead_letter_topic, share.dead_letter_partitions):
        where = f"{share.dead_letter_topic}/{lp} offset {lo}"
        try:
            if headers.get(DLQ_GROUP) != share.group or headers.get(DLQ_TOPIC) != topic:
                raise ValueError(f"group/topic headers {headers.get(DLQ_GROUP)!r}/{headers.get(DLQ_TOPIC)!r}")
            p, o = int(headers[DLQ_PARTITION]), int(headers[DLQ_OFFSET])
            count, reason = int(headers[DLQ_COUNT]), headers[DLQ_REASON]
        except (KeyError, ValueError) as e:
            findings.add("share-dead-letters", f"{where}: not a dead letter of this group ({e})")
            continue
        letters[(p, o)].append((where, lp, count, reason, value))
    duplicates_explained = 0
    archived_all = {(p, o): f.archived[o] for p, f in facts.items() for o in f.archived if o < (f.final.start if f.final else 0)}
    for (p, o), copies in sorted(letters.items()):
        where = copies[0][0]
        if (p, o) not in archived_all:
            findings.add("share-dead-letters", f"{where}: a letter of {topic}/{p} offset {o}, which was not archived")
            continue
        values = produced.get((topic, p), [])
        for w, lp, count, reason, value in copies:
            if lp != p % share.dead_letter_partitions or (o < len(values) and value != values[o]):
                findings.add("share-dead-letters", f"{w}: the letter of {topic}/{p} offset {o} has value {value!r} "
                                                   f"in partition {lp}")
            if reason != REASONS.get(archived_all[(p, o)]):
                findings.add("share-dead-letters", f"{w}: reason {reason}, archived as "
                                                   f"{REASONS.get(archived_all[(p, o)], '?')}")
            if not 1 <= count <= limit:
                findings.add("share-deliveries", f"{w}: delivery count {count} (limit {limit})")
        if len(copies) > 1:
            claims = facts[p].claims.get(o, set())
            if len(claims) >= 2:
                duplicates_explained += len(copies) - 1
            else:
                findings.add("share-dead-letters", f"{topic}/{p} offset {o}: {len(copies)} letters "
                                                   f"({', '.join(c[0] for c in copies)}), claimed under "
                                                   f"{len(claims)} token(s): no claim was taken over")
    for (p, o) in sorted(set(archived_all) - set(letters)):
        findings.add("share-dead-letters", f"{topic}/{p} offset {o}: archived, no dead letter")

    redelivered = sum(1 for f in facts.values() for n in f.max_deliveries.values() if n > 1)
    writes = sum(len(v) for v in versions.values())
    figures = (f"share-accepted={accepted} share-archived={archived} (rejected {rejected}, at the limit {at_limit}"
               + (f", {rejects_late} of them keyed reject, each REJECT after its lock ended" if rejects_late else "")
               + ") "
               f"dead-letters={sum(len(c) for c in letters.values())}"
               + (f" (second copies explained: {duplicates_explained})" if duplicates_explained else "")
               + f" redelivered={redelivered} share-writes={writes}")
    results = []
    for name in ("share-lost", "share-locks", "share-deliveries", "share-accepts", "share-dead-letters",
                 "share-delays", "share-evidence"):
        n = findings.counts[name]
        summary = figures if name == "share-lost" and not n else (f"{name}={n}" if n else "")
        details = findings.problems[name] + ([f"... {n - MAX_DETAILS} more"] if n > MAX_DETAILS else [])
        if name == "share-delays" and not n:
            summary = ""
            details = [f"delayed releases: {sum(f.delays for f in facts.values())}"]
        results.append(CheckResult(name, n == 0, summary, details))
    return results
